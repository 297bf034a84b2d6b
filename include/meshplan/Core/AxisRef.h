//===- AxisRef.h - References to mesh axes and sub-axes -------------------===//
//
// An axis ref names a whole root-mesh axis ("tp") or a sub-axis of one, in
// OpenXLA Shardy's notation "dp":(pre)size: reshape axis dp of size n to
// (pre, size, n / (pre * size)) and take the middle dimension. The coordinate
// of a rank along it is therefore (c / (n / (pre * size))) % size, where c is
// the rank's coordinate along dp. Flattened and strided axes are lists of refs,
// major to minor, which is why views and layouts never need bookkeeping about
// a parent mesh.
//
// A set of refs is *compatible* when, per root axis, all boundaries {pre,
// pre*size} form a divisibility chain: then the refs are unions of the same
// elementary factors and their coordinates are independent digits.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_AXISREF_H
#define MESHPLAN_CORE_AXISREF_H

#include "meshplan/Core/Mesh.h"

#include <cstdint>
#include <string>
#include <vector>

namespace meshplan {

struct AxisRef {
  int axis = 0;     ///< index of the root-mesh axis
  int64_t pre = 1;  ///< product of the more-major part of the axis
  int64_t size = 1; ///< size of this (sub-)axis

  /// Product of the more-minor part of the axis: n / (pre * size).
  int64_t post(const Mesh &mesh) const {
    return mesh.axis(axis).size / (pre * size);
  }
  bool isWhole(const Mesh &mesh) const {
    return pre == 1 && size == mesh.axis(axis).size;
  }
  /// Digit of a row-major mesh position along this ref.
  int64_t coordinateAt(const Mesh &mesh, int64_t position) const {
    return (mesh.coordinateAt(position, axis) / post(mesh)) % size;
  }
  /// Position offset contributed by digit `d` along this ref.
  int64_t positionStep(const Mesh &mesh) const {
    return post(mesh) * mesh.stride(axis);
  }

  bool operator==(const AxisRef &o) const {
    return axis == o.axis && pre == o.pre && size == o.size;
  }
  bool operator!=(const AxisRef &o) const { return !(*this == o); }
  bool operator<(const AxisRef &o) const {
    if (axis != o.axis)
      return axis < o.axis;
    if (pre != o.pre)
      return pre < o.pre;
    return size < o.size;
  }
};

using AxisRefList = std::vector<AxisRef>;

/// Builds and validates a ref: pre, size >= 1 and pre * size divides the axis.
Result<AxisRef> makeAxisRef(const Mesh &mesh, int axis, int64_t pre,
                            int64_t size);

/// "tp" for a whole axis, "dp:(2)4" for a sub-axis.
std::string formatAxisRef(const Mesh &mesh, const AxisRef &ref);
/// "tp,dp:(2)4"; "" for an empty list.
std::string formatAxisRefs(const Mesh &mesh, const AxisRefList &refs);

/// Product of sizes.
int64_t refsSize(const AxisRefList &refs);

/// Checks only that the refs' boundaries nest (refs may overlap).
Result<void> checkRefsNest(const Mesh &mesh, const AxisRefList &refs,
                           const std::string &what);
/// Checks that the refs are pairwise disjoint and compatible (see above).
/// `what` names the list in the error ("view", "layout").
Result<void> checkRefsCompatible(const Mesh &mesh, const AxisRefList &refs,
                                 const std::string &what);

/// Canonical form of an ordered ref list: size-1 refs dropped, adjacent refs
/// that form one larger (sub-)axis merged ("dp:(1)2,dp:(2)2" -> "dp"). Two
/// lists denote the same ordered group structure iff their canonical forms are
/// equal.
AxisRefList canonicalizeRefs(const Mesh &mesh, const AxisRefList &refs);

/// Splits each ref into the elementary factors induced by all boundaries in
/// `universe` (which must be compatible with `refs`): the result has the same
/// coordinates but is expressed in the finest common factors, so that prefix
/// and membership comparisons between different lists are exact.
AxisRefList splitIntoFactors(const Mesh &mesh, const AxisRefList &refs,
                             const AxisRefList &universe);

/// True when every factor of `inner` lies within the union of `outer`.
bool refsCover(const Mesh &mesh, const AxisRefList &outer,
               const AxisRefList &inner);

/// Splits a ref list of total size N into consecutive parts with the given
/// sizes (product N), cutting refs into sub-axes where needed. Fails when a
/// part boundary does not fall on a divisor of some ref.
Result<std::vector<AxisRefList>> splitRefs(const Mesh &mesh,
                                           const AxisRefList &refs,
                                           const std::vector<int64_t> &sizes);

} // namespace meshplan

#endif // MESHPLAN_CORE_AXISREF_H
