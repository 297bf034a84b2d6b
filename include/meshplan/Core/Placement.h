//===- Placement.h - DTensor placement lists <-> layouts ------------------===//
//
// DTensor describes a layout with one placement per mesh dim, applied left to
// right: Shard(d) chunks the current local tensor, _StridedShard(d, sf) splits
// it into sf pieces and takes the same chunk of every piece, Replicate() and
// Partial(op) leave it alone. meshplan converts such lists to layouts exactly:
// for every rank it evaluates DTensor's rule as a union of intervals and
// accepts the list only when each rank's indices are the single box the
// layout gives. Lists that give a rank several disjoint pieces (e.g.
// [Shard(0), _StridedShard(0, 2)]) are rejected with the rank and what it
// would hold; PyTorch reports a wrong (offset, size) for them.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_PLACEMENT_H
#define MESHPLAN_CORE_PLACEMENT_H

#include "meshplan/Core/Layout.h"

#include <string>
#include <string_view>
#include <vector>

namespace meshplan {

struct Placement {
  enum class Kind { Shard, StridedShard, Replicate, Partial };
  Kind kind = Kind::Replicate;
  int dim = 0;             ///< Shard, StridedShard
  int64_t splitFactor = 1; ///< StridedShard
  ReduceOp op = ReduceOp::Sum;

  static Placement shard(int d) { return {Kind::Shard, d, 1, ReduceOp::Sum}; }
  static Placement strided(int d, int64_t sf) {
    return {Kind::StridedShard, d, sf, ReduceOp::Sum};
  }
  static Placement replicate() { return {}; }
  static Placement partial(ReduceOp op) { return {Kind::Partial, 0, 1, op}; }
  bool operator==(const Placement &o) const {
    return kind == o.kind && dim == o.dim && splitFactor == o.splitFactor &&
           op == o.op;
  }
};

/// Parses "SS(0,2),S(0)", "R", "P(sum)" and PyTorch's printed forms
/// "_StridedShard(dim=0, split_factor=2)", "Shard(dim=0)", "Replicate()",
/// "Partial(sum)"; an optional surrounding "[...]" or "(...)" is accepted.
Result<std::vector<Placement>> parsePlacements(std::string_view text);
/// Short form ("SS(0,2),S(0)") or PyTorch's form.
std::string formatPlacements(const std::vector<Placement> &placements,
                             bool torchStyle = false);

/// One placement per view axis (left to right). `shape` is needed because
/// whether a strided list is one box per rank depends on the sizes.
Result<Layout> layoutFromPlacements(const View &view,
                                    const std::vector<Placement> &placements,
                                    const std::vector<int64_t> &shape);
/// The DTensor placement list for a layout, when one exists: every ref must
/// be a whole view axis, and DTensor's rule must give the same boxes.
Result<std::vector<Placement>>
placementsFromLayout(const View &view, const Layout &layout,
                     const std::vector<int64_t> &shape);

} // namespace meshplan

#endif // MESHPLAN_CORE_PLACEMENT_H
