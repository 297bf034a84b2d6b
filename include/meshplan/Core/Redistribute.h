//===- Redistribute.h - Plans between two layouts -------------------------===//
//
// Turns one layout into another on the same view with a short sequence of
// steps, each a collective over the groups of some refs, or a local slice:
//   all_gather      drop the minor-most refs of a dim (gather over them)
//   reduce_scatter  reduce partial refs and append them to a dim's refs
//   all_reduce      reduce partial refs, result replicated
//   all_to_all      move the minor-most refs of one dim to the end of another
//   local_slice     append replicated refs to a dim (keep one's own chunk)
//   permute         reorder the minor-most refs of a dim when every box keeps
//                   its size: each rank sends its shard to one peer
//   mark_partial    declare replicated refs partial (local; no data moves)
// Each step records the layouts before and after it, so a runtime (or a test
// simulator) can execute it from core's shard arithmetic alone.
//
// Planning works on the finest common factors of both layouts, so sub-axes
// and flattened axes need no special cases. Common transitions take one
// collective: Shard<->Replicate, Partial->Replicate/Shard, Shard(i)->Shard(j),
// and axis reorders such as {dp,tp}->{tp,dp} (one permute when the dim
// splits evenly, else one gather over both and a local slice).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_REDISTRIBUTE_H
#define MESHPLAN_CORE_REDISTRIBUTE_H

#include "meshplan/Core/Layout.h"

#include <string>
#include <string_view>
#include <vector>

namespace meshplan {

enum class StepKind {
  AllGather,
  ReduceScatter,
  AllReduce,
  AllToAll,
  LocalSlice,
  Permute,
  MarkPartial,
  Broadcast ///< not planned by planRedistribute; layout unchanged
};
std::string_view stepKindName(StepKind kind);

struct RedistributeStep {
  StepKind kind = StepKind::AllGather;
  AxisRefList axes; ///< the group: ranks varying along these refs, in order
  /// permute: the same refs in the order the dim is split by afterwards.
  AxisRefList dstAxes;
  int dim = -1;    ///< dim gathered / sliced / scattered; a2a: source dim
  int dstDim = -1; ///< a2a: the dim that becomes split
  ReduceOp op = ReduceOp::Sum;
  Layout before, after;
  int64_t groupSize = 1;
  /// Bytes one rank receives in a bandwidth-optimal (ring) implementation,
  /// from padded shapes (0 for local steps). Saturates at INT64_MAX: a
  /// group of 2^31 ranks over a tensor of 2^50 elements would move more.
  int64_t bytesPerRank = 0;

  bool isCollective() const {
    return kind != StepKind::LocalSlice && kind != StepKind::MarkPartial;
  }
};

/// One step's operands, as a dialect op or a runtime instruction states it.
struct StepSpec {
  StepKind kind = StepKind::AllGather;
  AxisRefList axes;
  int dim = -1;
  int dstDim = -1;
  AxisRefList dstAxes; ///< permute only
  ReduceOp op = ReduceOp::Sum;
};

/// The layout a step produces from `before`, or an error saying why the step
/// does not apply (e.g. the axes are not the minor-most levels of the dim).
/// Steps that append to a dim append their axes as one level; compare
/// results with sameShards. Every step planRedistribute emits satisfies
/// sameShards(applyStep(before, step), step.after).
Result<Layout> applyStep(const View &view, const Layout &before,
                         const StepSpec &step,
                         const std::vector<int64_t> &shape);

/// For a permute step: the rank this rank sends its shard to, and the rank it
/// receives its new shard from. O(number of refs).
struct PermutePeers {
  int64_t sendTo = 0;
  int64_t recvFrom = 0;
};
Result<PermutePeers> permutePeers(const Mesh &mesh,
                                  const RedistributeStep &step, int64_t rank);

struct RedistributePlan {
  std::vector<RedistributeStep> steps;
  int numCollectives() const;
  int64_t totalBytesPerRank() const;
};

Result<RedistributePlan> planRedistribute(const View &view, const Layout &from,
                                          const Layout &to,
                                          const std::vector<int64_t> &shape,
                                          int64_t elementBytes = 4);

} // namespace meshplan

#endif // MESHPLAN_CORE_REDISTRIBUTE_H
