//===- TestHelpers.h - Small glue between core's API and gtest ------------===//
#ifndef MESHPLAN_UNITTESTS_CORE_TESTHELPERS_H
#define MESHPLAN_UNITTESTS_CORE_TESTHELPERS_H

#include "BruteForce.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Mesh.h"
#include "meshplan/Core/MeshView.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
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

/// Digit of a mesh coordinate along a ref, from the ref's definition: reshape
/// the axis (size n) to (pre, size, n / (pre * size)), take the middle index.
inline int64_t refDigit(const bf::Ints &meshShape, const bf::Ints &coord,
                        const meshplan::AxisRef &ref) {
  int64_t post = meshShape[ref.axis] / (ref.pre * ref.size);
  return (coord[ref.axis] / post) % ref.size;
}

/// The tests' own canonical ref list (what normalizeLayout promises within a
/// level): size-1 refs dropped, adjacent refs that form one larger (sub-)axis
/// merged, e.g. b:(1)2,b:(2)2 -> b:(1)4.
inline meshplan::AxisRefList canonicalRefs(const meshplan::AxisRefList &refs) {
  meshplan::AxisRefList out;
  for (const meshplan::AxisRef &r : refs) {
    if (r.size == 1)
      continue;
    if (!out.empty() && out.back().axis == r.axis &&
        out.back().pre * out.back().size == r.pre) {
      out.back().size *= r.size;
      continue;
    }
    out.push_back(r);
  }
  return out;
}

/// Canonical levels: refs canonical within each level, size-1 levels dropped.
inline meshplan::SplitLevels
canonicalLevels(const meshplan::SplitLevels &levels) {
  meshplan::SplitLevels out;
  for (const meshplan::AxisRefList &level : levels) {
    meshplan::AxisRefList refs = canonicalRefs(level);
    if (!refs.empty())
      out.push_back(refs);
  }
  return out;
}

/// Rows of dim 0 that ranks 0..size-1 hold under a 1-D layout (shardOf).
inline std::vector<bf::Ints> rowsOf(const meshplan::View &view,
                                    const meshplan::Layout &layout, int64_t n) {
  std::vector<bf::Ints> out;
  for (int64_t r = 0; r < view.mesh().size(); ++r) {
    auto box = meshplan::shardOf(view, layout, {n}, r);
    EXPECT_TRUE(box.ok());
    bf::Ints rows;
    for (int64_t i = 0; box.ok() && i < box->localShape[0]; ++i)
      rows.push_back(box->offset[0] + i);
    out.push_back(rows);
  }
  return out;
}

/// Every layout of a rank-`rank` tensor on `view` in which each view axis is
/// replicated, partial(sum) (when `withPartial`), or one level of one dim,
/// in every order within a dim. Distinct layouts only.
inline std::vector<meshplan::Layout>
wholeAxisLayouts(const meshplan::View &view, int rank, bool withPartial) {
  std::vector<meshplan::Layout> out;
  int n = view.numAxes();
  int first = withPartial ? 2 : 1; // 0 replicated, 1 partial, then dims
  int choices = first + rank;
  int64_t total = 1;
  for (int i = 0; i < n; ++i)
    total *= choices;
  std::set<std::pair<std::vector<std::vector<int>>, std::vector<int>>> seen;
  for (int64_t code = 0; code < total; ++code) {
    std::vector<int> assign(n);
    int64_t c = code;
    for (int i = 0; i < n; ++i, c /= choices)
      assign[i] = static_cast<int>(c % choices);
    std::vector<int> perm(n);
    for (int i = 0; i < n; ++i)
      perm[i] = i;
    do {
      std::vector<std::vector<int>> dims(rank);
      std::vector<int> partial;
      for (int i : perm) {
        if (assign[i] >= first)
          dims[assign[i] - first].push_back(i);
        else if (assign[i] == 1 && withPartial)
          partial.push_back(i);
      }
      std::sort(partial.begin(), partial.end());
      if (!seen.insert({dims, partial}).second)
        continue;
      meshplan::Layout l = meshplan::replicatedLayout(rank);
      for (int d = 0; d < rank; ++d)
        for (int i : dims[d])
          l.dims[d].push_back(view.axes()[i].refs);
      for (int i : partial)
        l.partial.insert(l.partial.end(), view.axes()[i].refs.begin(),
                         view.axes()[i].refs.end());
      out.push_back(l);
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
  return out;
}

/// The exhaustive sweeps are the suite's heaviest tests. The default build
/// runs every case. The sanitizer build (`asan` test preset) sets
/// MESHPLAN_SWEEP_STRIDE=k and a pair sweep then checks pair (i, j) only when
/// (i + j) % k == 0: every layout is still a source and a target (for
/// different partners), so every code path the sweep reaches is still reached
/// under ASan/UBSan, for 1/k of the time. The semantics are proven by the
/// default build's full sweep; the sanitizers look for memory and UB errors.
inline int64_t sweepStride() {
  const char *s = std::getenv("MESHPLAN_SWEEP_STRIDE");
  int64_t k = s ? std::atoll(s) : 1;
  return k >= 1 ? k : 1;
}

/// Whether a pair sweep checks the pair (i, j) under sweepStride().
inline bool sweepPairSelected(size_t i, size_t j) {
  return (static_cast<int64_t>(i + j) % sweepStride()) == 0;
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
