//===- Mesh.cpp - N-D device mesh -----------------------------------------===//

#include "meshplan/Core/Mesh.h"
#include "meshplan/Core/Text.h"

#include <algorithm>
#include <charconv>
#include <set>

namespace meshplan {

Result<Mesh> Mesh::create(std::vector<MeshAxis> axes,
                          std::optional<std::vector<int64_t>> deviceOrder) {
  if (axes.empty())
    return makeError("a mesh needs at least one axis");
  if (static_cast<int64_t>(axes.size()) > kMaxMeshAxes)
    return makeError("mesh has " + std::to_string(axes.size()) +
                     " axes; meshes have at most " +
                     std::to_string(kMaxMeshAxes) + " (docs/limits.md)");
  Mesh mesh;
  std::set<std::string> seen;
  int64_t product = 1;
  for (const MeshAxis &axis : axes) {
    if (!isIdentifier(axis.name))
      return makeError("axis name \"" + axis.name +
                       "\" is not an identifier (letters, digits, _)");
    if (!seen.insert(axis.name).second)
      return makeError("axis \"" + axis.name + "\" appears twice");
    if (axis.size < 1)
      return makeError("axis \"" + axis.name + "\" has size " +
                       std::to_string(axis.size) + "; sizes must be >= 1");
    // Checked before any allocation that depends on the size (listing
    // ranks, device orders): see docs/limits.md.
    if (axis.size > kMaxMeshDevices)
      return makeError("axis \"" + axis.name + "\" has size " +
                       std::to_string(axis.size) + "; meshes have at most " +
                       kMaxMeshDevicesText + " ranks (docs/limits.md)");
    if (mulOverflows(product, axis.size, &product) || product > kMaxMeshDevices)
      return makeError("mesh has more than " +
                       std::string(kMaxMeshDevicesText) + " ranks at axis \"" +
                       axis.name + "\" (docs/limits.md)");
  }
  mesh.axes = std::move(axes);
  mesh.numDevices = product;
  mesh.strides.assign(mesh.axes.size(), 1);
  for (int i = static_cast<int>(mesh.axes.size()) - 2; i >= 0; --i)
    mesh.strides[i] = mesh.strides[i + 1] * mesh.axes[i + 1].size;

  if (deviceOrder) {
    if (static_cast<int64_t>(deviceOrder->size()) != product)
      return makeError(
          "device order lists " + std::to_string(deviceOrder->size()) +
          " ranks but the mesh has " + std::to_string(product) + " devices");
    mesh.positionOfRank.reserve(deviceOrder->size());
    for (size_t i = 0; i < deviceOrder->size(); ++i) {
      int64_t rank = (*deviceOrder)[i];
      if (rank < 0)
        return makeError("device order entry " + std::to_string(i) +
                         " is negative (" + std::to_string(rank) + ")");
      if (!mesh.positionOfRank.emplace(rank, static_cast<int64_t>(i)).second)
        return makeError("device order lists rank " + std::to_string(rank) +
                         " twice");
    }
    // The identity order is the default; store nothing for it.
    bool identity = true;
    for (size_t i = 0; i < deviceOrder->size() && identity; ++i)
      identity = (*deviceOrder)[i] == static_cast<int64_t>(i);
    if (identity) {
      mesh.positionOfRank.clear();
    } else {
      int64_t maxRank =
          *std::max_element(deviceOrder->begin(), deviceOrder->end());
      if (maxRank < 4 * product) {
        mesh.positionOfRankDense.assign(maxRank + 1, -1);
        for (const auto &[rank, position] : mesh.positionOfRank)
          mesh.positionOfRankDense[rank] = position;
        mesh.positionOfRank.clear();
      }
      mesh.deviceOrder = std::move(*deviceOrder);
    }
  }
  return mesh;
}

std::optional<int> Mesh::findAxis(std::string_view name) const {
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name == name)
      return static_cast<int>(i);
  return std::nullopt;
}

std::string Mesh::axisNameList() const {
  std::string out;
  for (const MeshAxis &axis : axes)
    out += (out.empty() ? "" : ", ") + axis.name;
  return out;
}

bool Mesh::contains(int64_t rank) const { return positionOf(rank).ok(); }

Result<int64_t> Mesh::positionOf(int64_t rank) const {
  if (deviceOrder.empty()) {
    if (rank < 0 || rank >= numDevices)
      return makeError("rank " + std::to_string(rank) +
                       " is not in the mesh (ranks 0.." +
                       std::to_string(numDevices - 1) + ")");
    return rank;
  }
  if (!positionOfRankDense.empty()) {
    if (rank >= 0 && rank < static_cast<int64_t>(positionOfRankDense.size()) &&
        positionOfRankDense[rank] >= 0)
      return positionOfRankDense[rank];
    return makeError("rank " + std::to_string(rank) +
                     " is not in the mesh's device order");
  }
  auto it = positionOfRank.find(rank);
  if (it == positionOfRank.end())
    return makeError("rank " + std::to_string(rank) +
                     " is not in the mesh's device order");
  return it->second;
}

Result<std::vector<int64_t>> Mesh::coordinate(int64_t rank) const {
  auto position = positionOf(rank);
  if (!position)
    return position.error();
  std::vector<int64_t> coord(axes.size());
  for (int i = 0; i < numAxes(); ++i)
    coord[i] = coordinateAt(*position, i);
  return coord;
}

std::string Mesh::str() const {
  std::string out;
  for (const MeshAxis &axis : axes) {
    if (!out.empty())
      out += ",";
    out += axis.name + "=" + std::to_string(axis.size);
    if (axis.managed)
      out += "(managed)";
  }
  return out;
}

Result<std::vector<MeshAxis>> parseMeshAxes(std::string_view text) {
  std::vector<MeshAxis> axes;
  if (trim(text).empty())
    return makeError("empty mesh; expected name=size,... such as dp=2,tp=4");
  for (std::string_view item : splitTopLevel(text, ',')) {
    item = trim(item);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return makeError("mesh entry \"" + std::string(item) +
                       "\" is not name=size");
    std::string name(trim(item.substr(0, eq)));
    auto size = parseInt(trim(item.substr(eq + 1)));
    if (!size)
      return makeError("mesh entry \"" + std::string(item) +
                       "\": size is not an integer");
    axes.push_back({name, *size, false});
  }
  return axes;
}

Result<std::vector<int64_t>> parseIntList(std::string_view text,
                                          std::string_view what) {
  std::vector<int64_t> values;
  if (trim(text).empty())
    return makeError(std::string(what) + " is empty");
  for (std::string_view item : splitTopLevel(text, ',')) {
    auto value = parseInt(trim(item));
    if (!value)
      return makeError(std::string(what) + ": \"" + std::string(trim(item)) +
                       "\" is not an integer");
    values.push_back(*value);
  }
  return values;
}

} // namespace meshplan
