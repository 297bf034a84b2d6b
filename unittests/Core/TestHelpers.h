//===- TestHelpers.h - Small glue between core's API and gtest ------------===//
#ifndef MESHPLAN_UNITTESTS_CORE_TESTHELPERS_H
#define MESHPLAN_UNITTESTS_CORE_TESTHELPERS_H

#include "BruteForce.h"

#include "meshplan/Core/Mesh.h"
#include "meshplan/Core/MeshView.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace testutil {

/// Axis names a, b, c, d, ... for sweeps.
inline std::string axisName(int i) { return std::string(1, char('a' + i)); }

inline std::shared_ptr<const meshplan::Mesh>
makeMesh(const bf::Ints &shape, const std::vector<std::string> &names,
         std::optional<bf::Ints> order = std::nullopt,
         std::vector<bool> managed = {}) {
  std::vector<meshplan::MeshAxis> axes;
  for (size_t i = 0; i < shape.size(); ++i)
    axes.push_back({names[i], shape[i], i < managed.size() && managed[i]});
  auto mesh = meshplan::Mesh::create(axes, order);
  EXPECT_TRUE(mesh.ok()) << (mesh.ok() ? "" : mesh.error().message);
  if (!mesh.ok())
    return nullptr;
  return std::make_shared<const meshplan::Mesh>(std::move(mesh).value());
}

inline std::shared_ptr<const meshplan::Mesh> makeMesh(const bf::Ints &shape) {
  std::vector<std::string> names;
  for (size_t i = 0; i < shape.size(); ++i)
    names.push_back(axisName(static_cast<int>(i)));
  return makeMesh(shape, names);
}

/// The mesh's rank array, built from its definition (not from its queries).
inline bf::NDArray rankArray(const bf::Ints &shape,
                             const std::optional<bf::Ints> &order) {
  if (order)
    return bf::NDArray(shape, *order);
  return bf::NDArray::arange(shape);
}

inline std::string joinNames(const std::vector<std::string> &names,
                             const std::string &sep = ",") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? sep : "") + names[i];
  return out;
}

template <typename T> std::string errorOf(const meshplan::Result<T> &r) {
  return r.ok() ? std::string("(ok)") : r.error().message;
}

} // namespace testutil

#endif // MESHPLAN_UNITTESTS_CORE_TESTHELPERS_H
