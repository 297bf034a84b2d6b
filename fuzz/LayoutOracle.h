//===- LayoutOracle.h - Comparing two layouts rank by rank ----------------===//
//
// The placement and layout targets check round trips (placements -> layout
// -> placements, layout -> text -> layout): both sides must give every rank
// the same box and leave the same pending reduction. Checked on a few ranks
// (the first, the middle and the last position of the mesh): shardOf is
// O(refs) per rank at any mesh size.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_FUZZ_LAYOUTORACLE_H
#define MESHPLAN_FUZZ_LAYOUTORACLE_H

#include "FuzzSupport.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/MeshView.h"

namespace meshplan::fuzz {

inline void checkSameShards(const View &view, const Layout &a, const Layout &b,
                            const std::vector<int64_t> &shape,
                            const std::string &what) {
  const Mesh &mesh = view.mesh();
  check(a.rank() == b.rank(), what + ": different tensor ranks");
  check(refsSize(a.partial) == refsSize(b.partial) &&
            (refsSize(a.partial) == 1 || a.reduceOp == b.reduceOp),
        what + ": different pending reductions");
  for (int64_t position : {int64_t(0), mesh.size() / 2, mesh.size() - 1}) {
    int64_t rank = mesh.rankAt(position);
    auto boxA = shardOf(view, a, shape, rank);
    auto boxB = shardOf(view, b, shape, rank);
    check(bool(boxA) && bool(boxB),
          what + ": shardOf failed on a layout that verified");
    check(boxA->offset == boxB->offset && boxA->localShape == boxB->localShape,
          what + ": rank " + std::to_string(rank) + " gets different boxes");
  }
}

} // namespace meshplan::fuzz

#endif // MESHPLAN_FUZZ_LAYOUTORACLE_H
