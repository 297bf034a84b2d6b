//===- StreamGraph.h - A plan's order as streams and events -----*- C++ -*-===//
//
// How the CUDA executor will order a plan's instructions: every plan stream
// is one CUDA stream (program order within a plan stream is stream order),
// and every ordering the plan requires across streams becomes a wait on an
// event recorded after the earlier instruction. The orderings are the
// instruction's `deps` and, for a collective or transfer, the previous one of
// its communicator (the executor issues a communicator's collectives in
// program order, as `meshplan verify` checked them; NCCL requires it).
//
// The host issues every instruction in program order without waiting (deps
// name earlier instructions, so each event is recorded before any wait on
// it is enqueued), and the GPU runs the streams concurrently. Waits that an
// earlier wait already implies are dropped: each stream carries a vector
// clock (for every stream, the last of its instructions known complete), so
// a dep on an instruction the stream has transitively waited for costs
// nothing, and an event is recorded only after instructions some other
// stream actually waits on.
//
// Pure host logic on the plan, unit-tested without a GPU; no CUDA types.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_LIB_STREAMGRAPH_H
#define MESHPLAN_RUNTIME_LIB_STREAMGRAPH_H

#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"

#include <cstdint>
#include <string>
#include <vector>

namespace meshplan::runtime {

struct StreamGraph {
  /// One entry per instruction, in program order.
  struct Step {
    /// Index into plan.streams (the CUDA stream it is enqueued on).
    int stream = 0;
    /// Events to wait for before it (cudaStreamWaitEvent), by event id.
    std::vector<int> waits;
    /// The event recorded after it, or -1.
    int record = -1;
  };
  std::vector<Step> steps;
  /// The instruction each event is recorded after.
  std::vector<size_t> eventAfter;
  /// Cross-stream orderings the plan states (deps and communicator order),
  /// and how many of them needed a wait (the rest were implied).
  int64_t crossStreamOrderings = 0;
  int64_t waits = 0;
};

/// Builds the graph; fails on an unknown stream or dep, or a dep that does
/// not name an earlier instruction (the executor issues in program order).
Result<StreamGraph> buildStreamGraph(const plan::Plan &plan);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_LIB_STREAMGRAPH_H
