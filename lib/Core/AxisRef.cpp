//===- AxisRef.cpp - Axis and sub-axis references -------------------------===//

#include "meshplan/Core/AxisRef.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

namespace meshplan {

Result<AxisRef> makeAxisRef(const Mesh &mesh, int axis, int64_t pre,
                            int64_t size) {
  const MeshAxis &a = mesh.axis(axis);
  std::string spelled =
      "\"" + a.name + "\":(" + std::to_string(pre) + ")" + std::to_string(size);
  if (pre < 1 || size < 1)
    return makeError("sub-axis " + spelled +
                     ": pre-size and size must be >= 1");
  // pre * size may overflow int64 for hostile input ((2^32)(2^63-1)); the
  // product is only used once it is known to fit.
  int64_t product = 0;
  bool overflows = mulOverflows(pre, size, &product);
  if (overflows || product > a.size || a.size % product != 0)
    return makeError(
        "sub-axis " + spelled + ": pre-size * size (" +
        (overflows ? std::string("more than 2^63") : std::to_string(product)) +
        ") must divide the size of " + a.name + " (" + std::to_string(a.size) +
        ")");
  AxisRef ref{axis, pre, size};
  if (a.managed && !ref.isWhole(mesh) && size > 1)
    return makeError("sub-axis " + spelled + ": managed axis \"" + a.name +
                     "\" has run-time membership and cannot be split");
  return ref;
}

std::string formatAxisRef(const Mesh &mesh, const AxisRef &ref) {
  const std::string &name = mesh.axis(ref.axis).name;
  if (ref.isWhole(mesh))
    return name;
  return name + ":(" + std::to_string(ref.pre) + ")" + std::to_string(ref.size);
}

std::string formatAxisRefs(const Mesh &mesh, const AxisRefList &refs) {
  std::string out;
  for (const AxisRef &ref : refs)
    out += (out.empty() ? "" : ",") + formatAxisRef(mesh, ref);
  return out;
}

int64_t refsSize(const AxisRefList &refs) {
  // Validated refs are disjoint parts of a mesh of at most kMaxMeshDevices,
  // but callers also size lists that are not validated yet (a ref repeated
  // in a hostile layout); saturate instead of overflowing so that the
  // validation that follows sees a too-large size, not a wrapped one.
  int64_t product = 1;
  for (const AxisRef &ref : refs)
    if (mulOverflows(product, ref.size, &product))
      return std::numeric_limits<int64_t>::max();
  return product;
}

/// Sorted boundaries {1, n, pre, pre*size...} of each axis touched by refs.
static std::map<int, std::vector<int64_t>>
boundariesByAxis(const Mesh &mesh, const AxisRefList &refs) {
  std::map<int, std::set<int64_t>> sets;
  for (const AxisRef &ref : refs) {
    auto &s = sets[ref.axis];
    s.insert(1);
    s.insert(mesh.axis(ref.axis).size);
    s.insert(ref.pre);
    s.insert(ref.pre * ref.size);
  }
  std::map<int, std::vector<int64_t>> out;
  for (auto &[axis, s] : sets)
    out[axis] = std::vector<int64_t>(s.begin(), s.end());
  return out;
}

Result<void> checkRefsNest(const Mesh &mesh, const AxisRefList &refs,
                           const std::string &what) {
  for (auto &[axis, bounds] : boundariesByAxis(mesh, refs)) {
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      if (bounds[i + 1] % bounds[i] != 0) {
        std::string used;
        for (const AxisRef &ref : refs)
          if (ref.axis == axis)
            used += (used.empty() ? "" : ", ") + formatAxisRef(mesh, ref);
        return makeError(what + " uses sub-axes of \"" + mesh.axis(axis).name +
                         "\" that do not nest (" + used +
                         "): their boundaries must divide each other");
      }
    }
  }
  return {};
}

Result<void> checkRefsCompatible(const Mesh &mesh, const AxisRefList &refs,
                                 const std::string &what) {
  auto nest = checkRefsNest(mesh, refs, what);
  if (!nest)
    return nest;
  // Disjointness: per axis, intervals [pre, pre*size) must not overlap.
  std::map<int, std::vector<AxisRef>> byAxis;
  for (const AxisRef &ref : refs)
    if (ref.size > 1)
      byAxis[ref.axis].push_back(ref);
  for (auto &[axis, list] : byAxis) {
    std::sort(list.begin(), list.end());
    for (size_t i = 0; i + 1 < list.size(); ++i) {
      if (list[i].pre * list[i].size > list[i + 1].pre) {
        if (list[i] == list[i + 1])
          return makeError(what + " uses axis \"" +
                           formatAxisRef(mesh, list[i]) + "\" twice");
        return makeError(what + " uses overlapping parts of axis \"" +
                         mesh.axis(axis).name +
                         "\": " + formatAxisRef(mesh, list[i]) + " and " +
                         formatAxisRef(mesh, list[i + 1]));
      }
    }
  }
  return {};
}

AxisRefList canonicalizeRefs(const Mesh &mesh, const AxisRefList &refs) {
  AxisRefList out;
  for (const AxisRef &ref : refs) {
    if (ref.size == 1)
      continue;
    if (!out.empty() && out.back().axis == ref.axis &&
        out.back().pre * out.back().size == ref.pre) {
      out.back().size *= ref.size;
      continue;
    }
    out.push_back(ref);
  }
  (void)mesh;
  return out;
}

AxisRefList splitIntoFactors(const Mesh &mesh, const AxisRefList &refs,
                             const AxisRefList &universe) {
  AxisRefList all = universe;
  all.insert(all.end(), refs.begin(), refs.end());
  auto bounds = boundariesByAxis(mesh, all);
  AxisRefList out;
  for (const AxisRef &ref : refs) {
    if (ref.size == 1)
      continue;
    const std::vector<int64_t> &b = bounds[ref.axis];
    int64_t lo = ref.pre, hi = ref.pre * ref.size;
    int64_t cur = lo;
    for (int64_t bound : b) {
      if (bound <= lo || bound > hi)
        continue;
      out.push_back(AxisRef{ref.axis, cur, bound / cur});
      cur = bound;
    }
  }
  return out;
}

bool refsCover(const Mesh &mesh, const AxisRefList &outer,
               const AxisRefList &inner) {
  std::map<int, std::vector<AxisRef>> byAxis;
  for (const AxisRef &ref : canonicalizeRefs(mesh, outer))
    if (ref.size > 1)
      byAxis[ref.axis].push_back(ref);
  // Merge touching intervals per axis.
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> merged;
  for (auto &[axis, list] : byAxis) {
    std::sort(list.begin(), list.end());
    auto &m = merged[axis];
    for (const AxisRef &ref : list) {
      if (!m.empty() && m.back().second == ref.pre)
        m.back().second = ref.pre * ref.size;
      else
        m.push_back({ref.pre, ref.pre * ref.size});
    }
  }
  for (const AxisRef &ref : inner) {
    if (ref.size == 1)
      continue;
    bool covered = false;
    for (auto [lo, hi] : merged[ref.axis])
      if (lo <= ref.pre && ref.pre * ref.size <= hi && ref.pre % lo == 0 &&
          hi % (ref.pre * ref.size) == 0)
        covered = true;
    if (!covered)
      return false;
  }
  return true;
}

Result<std::vector<AxisRefList>> splitRefs(const Mesh &mesh,
                                           const AxisRefList &refs,
                                           const std::vector<int64_t> &sizes) {
  int64_t total = 1;
  for (int64_t s : sizes) {
    if (s < 1)
      return makeError("part size " + std::to_string(s) + " must be >= 1");
    total *= s;
  }
  if (total != refsSize(refs))
    return makeError("part sizes multiply to " + std::to_string(total) +
                     " but the axis has size " +
                     std::to_string(refsSize(refs)));
  std::vector<AxisRef> queue;
  for (const AxisRef &ref : refs)
    if (ref.size > 1)
      queue.push_back(ref);
  size_t front = 0;
  std::vector<AxisRefList> parts;
  for (int64_t want : sizes) {
    AxisRefList part;
    while (want > 1) {
      AxisRef &head = queue[front];
      if (head.size <= want) {
        if (want % head.size != 0)
          return makeError("a part of size " + std::to_string(want) +
                           " would cut " + formatAxisRef(mesh, head) +
                           " (size " + std::to_string(head.size) +
                           ") unevenly");
        part.push_back(head);
        want /= head.size;
        ++front;
      } else {
        if (head.size % want != 0)
          return makeError("a part of size " + std::to_string(want) +
                           " would cut " + formatAxisRef(mesh, head) +
                           " (size " + std::to_string(head.size) +
                           ") unevenly");
        auto major = makeAxisRef(mesh, head.axis, head.pre, want);
        if (!major)
          return major.error();
        part.push_back(*major);
        head = AxisRef{head.axis, head.pre * want, head.size / want};
        want = 1;
      }
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

} // namespace meshplan
