//===- TestHelpers.h - Small glue between core's API and gtest ------------===//
#ifndef MESHPLAN_UNITTESTS_CORE_TESTHELPERS_H
#define MESHPLAN_UNITTESTS_CORE_TESTHELPERS_H

#include "BruteForce.h"

#include "meshplan/Core/Mesh.h"
#include "meshplan/Core/MeshView.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <sstream>
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

/// Counts the failures of one sweep and reports only the first few in full,
/// so one bug does not flood the log with thousands of near-identical lines.
class FailureLog {
public:
  explicit FailureLog(std::string what,
                      int64_t limit = getenv("SWEEP_LIMIT")
                                          ? atoll(getenv("SWEEP_LIMIT"))
                                          : 6)
      : what(std::move(what)), limit(limit) {}
  ~FailureLog() {
    if (failures > limit)
      ADD_FAILURE() << what << ": " << failures << " failed checks of "
                    << checks << " (first " << limit << " shown)";
  }
  bool pass(bool ok) {
    ++checks;
    if (!ok)
      ++failures;
    return ok;
  }
  bool shouldReport() const { return failures <= limit; }
  int64_t numFailures() const { return failures; }
  int64_t numChecks() const { return checks; }

private:
  std::string what;
  int64_t limit;
  int64_t checks = 0, failures = 0;
};

class FailureMessage {
public:
  FailureMessage(FailureLog &log, const char *file, int line)
      : log(log), file(file), line(line) {}
  ~FailureMessage() {
    if (log.shouldReport())
      ADD_FAILURE_AT(file, line) << os.str();
  }
  template <typename T> FailureMessage &operator<<(const T &value) {
    os << value;
    return *this;
  }

private:
  FailureLog &log;
  const char *file;
  int line;
  std::ostringstream os;
};

} // namespace testutil

/// Like EXPECT_TRUE, counted in `log`; the streamed message is built only on
/// failure.
/// Brace it inside an enclosing if.
#define SWEEP_EXPECT(log, cond)                                                \
  if ((log).pass(static_cast<bool>(cond))) {                                   \
  } else                                                                       \
    ::testutil::FailureMessage((log), __FILE__, __LINE__)

#endif // MESHPLAN_UNITTESTS_CORE_TESTHELPERS_H
