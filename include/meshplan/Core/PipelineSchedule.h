//===- PipelineSchedule.h - Pipeline-parallel schedules and their check ---===//
//
// A pipeline schedule says, for each rank of the pp axis, in which order it
// runs forward, backward (full, or split into input-gradient "I" and
// weight-gradient "W") per (stage, microbatch), and where it sends and
// receives the activations and activation gradients that cross ranks. This
// is the one implementation the planner, the dialect, the verifier and the
// runtime call; docs/pipeline.md states the rules.
//
// The compute order of gpipe, 1f1b and interleaved_1f1b equals
// torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B and
// ScheduleInterleaved1F1B, and zbv equals ScheduleZBVZeroBubble, so a run
// can be compared with torchtitan's step for step. Send/recv placement
// follows torch's `_add_send_recv` lowering; unlike torch (which runs sends
// asynchronously and checks only action counts), every schedule built here
// is checked before it is returned by simulatePipelineSchedule, which
// proves it runs to completion under blocking rendezvous point-to-point
// semantics; the same check serves action lists that come from elsewhere
// (plans, tests).
//
// Plain C++ with no dependencies beyond core; errors are values (Result.h).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_PIPELINESCHEDULE_H
#define MESHPLAN_CORE_PIPELINESCHEDULE_H

#include "meshplan/Core/Limits.h"
#include "meshplan/Core/Result.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan {

enum class PipelineScheduleKind {
  GPipe,           ///< "gpipe": all forwards, then all backwards (v = 1)
  OneFOneB,        ///< "1f1b": one forward, one backward (v = 1, m >= p)
  Interleaved1F1B, ///< "interleaved_1f1b": v looped stages per rank
  ZeroBubbleV,     ///< "zbv": 2 V-placed stages per rank, backward split I/W
};

/// How stages are laid onto pp ranks. Loop: stage s on rank s mod p. V: the
/// first p stages go down the ranks, the next p come back up (stage s in
/// chunk c = s / p sits on rank s mod p for even c, p - 1 - s mod p for odd
/// c), so the last stage is on rank 0 and stages p-1, p share rank p-1.
enum class StagePlacement { Loop, V };

enum class PipelineOp : uint8_t {
  Forward,        ///< "F"
  Backward,       ///< "B": full backward (input and weight gradients)
  BackwardInput,  ///< "I": input gradient only; sends like B
  BackwardWeight, ///< "W": weight gradient of an earlier I
  SendActivation, ///< "SEND_F": output of F(stage) to rank of stage + 1
  RecvActivation, ///< "RECV_F": input of F(stage) from rank of stage - 1
  SendGrad,       ///< "SEND_B": input grad of B/I(stage) to rank of stage - 1
  RecvGrad,       ///< "RECV_B": output grad for B/I(stage) from stage + 1
};

/// One step of a rank's program. `stage` is always a stage of the rank that
/// holds the action (as in torch: the sender's SEND_F names the producing
/// stage s, the receiver's RECV_F names the consuming stage s + 1), so the
/// message SEND_F(s, mb) is received by RECV_F(s + 1, mb) and SEND_B(s, mb)
/// by RECV_B(s - 1, mb). `peer` is the other pp rank of a send/recv, -1 for
/// compute.
struct PipelineAction {
  PipelineOp op = PipelineOp::Forward;
  int32_t stage = 0;
  int32_t microbatch = 0;
  int32_t peer = -1;

  bool isCompute() const { return op <= PipelineOp::BackwardWeight; }
  bool isSend() const {
    return op == PipelineOp::SendActivation || op == PipelineOp::SendGrad;
  }
  bool isRecv() const {
    return op == PipelineOp::RecvActivation || op == PipelineOp::RecvGrad;
  }
  bool operator==(const PipelineAction &) const = default;
};

struct PipelineScheduleConfig {
  PipelineScheduleKind kind = PipelineScheduleKind::OneFOneB;
  int64_t ranks = 1;         ///< pp degree p
  int64_t microbatches = 1;  ///< m
  int64_t stagesPerRank = 1; ///< v
};

/// Every pp rank's ordered actions. Fields are public so that action lists
/// read from elsewhere (or deliberately broken by tests) can be checked with
/// the same simulator.
struct PipelineSchedule {
  PipelineScheduleConfig config;
  StagePlacement placement = StagePlacement::Loop;
  /// Whether backwards are split into I and W.
  bool splitBackward = false;
  /// ranks[r] is pp rank r's program.
  std::vector<std::vector<PipelineAction>> ranks;

  int64_t numStages() const { return config.ranks * config.stagesPerRank; }
  /// The pp rank that holds `stage`.
  int64_t rankOfStage(int64_t stage) const;
};

/// "gpipe", "1f1b", "interleaved_1f1b", "zbv" (the spec's spelling).
std::string_view pipelineScheduleKindName(PipelineScheduleKind kind);
/// Parses the spec's spelling; the error lists the accepted names.
Result<PipelineScheduleKind> parsePipelineScheduleKind(std::string_view name);
/// Loop for gpipe/1f1b/interleaved_1f1b, V for zbv.
StagePlacement placementOf(PipelineScheduleKind kind);
/// The pp rank of `stage` among `ranks` ranks (0 <= stage; any number of
/// stages per rank). O(1).
int64_t rankOfStage(StagePlacement placement, int64_t ranks, int64_t stage);
/// The stages of `rank`, in increasing order.
std::vector<int64_t> stagesOfRank(StagePlacement placement, int64_t ranks,
                                  int64_t stagesPerRank, int64_t rank);

/// Checks p, m, v against the schedule's rules (docs/pipeline.md) and the
/// size limit, without allocating; the message names the offending value
/// and the rule.
Result<void> checkPipelineScheduleConfig(const PipelineScheduleConfig &config);

/// Every rank's compute actions only (F, B, I, W), in schedule order: the
/// order that equals torch's pipeline_order with its idle slots dropped.
Result<std::vector<std::vector<PipelineAction>>>
buildPipelineComputeOrder(const PipelineScheduleConfig &config);

/// The complete schedule: compute order plus send/recv actions between ranks
/// (none between two stages on the same rank, as in torch's V special case),
/// checked by simulatePipelineSchedule before it is returned.
Result<PipelineSchedule>
buildPipelineSchedule(const PipelineScheduleConfig &config);

//===----------------------------------------------------------------------===//
// Check and simulation
//===----------------------------------------------------------------------===//

/// Duration of each compute action in the simulation; sends and receives take
/// no time (communication cost belongs to the plan's cost model). The
/// defaults are the textbook units: F = 1, B = 2 = I + W.
struct PipelineCosts {
  int64_t forward = 1;
  int64_t backward = 2;
  int64_t backwardInput = 1;
  int64_t backwardWeight = 1;
};

struct PipelineSimulation {
  /// Time at which the last rank finishes.
  int64_t makespan = 0;
  /// Per rank: time spent computing, and time at which it finishes.
  std::vector<int64_t> busy;
  std::vector<int64_t> finish;
  /// Idle time of all ranks over ranks x makespan: the bubble fraction.
  double bubbleFraction = 0;
  /// Per rank: the largest number of (stage, microbatch) whose forward has
  /// run and whose backward (B or I) has not, i.e. activations held at once.
  std::vector<int64_t> peakActivations;
};

/// Checks `schedule` and executes it.
///
/// The static check: every rank's actions name stages of that rank,
/// microbatches in range and the right peer; every (stage, microbatch) has
/// one F and either one B or one I and one W; on each rank every action
/// comes after what it consumes (F(s) after F(s-1) or RECV_F(s), B/I(s)
/// after F(s) and after B/I(s+1) or RECV_B(s), W after its I, a send after
/// what it sends); every needed send and receive exists exactly once.
///
/// The execution decides completion under rendezvous: ranks run their lists
/// in order and a send and its receive complete together, once both ranks
/// have reached them. This is the strictest blocking semantics: a schedule
/// that completes here also completes with buffered or asynchronous sends,
/// and then each pair of ranks exchanges its messages in the same order on
/// both sides, so in-order matching without tags (NCCL) pairs them as the
/// tags do. A run that stops is a deadlock, reported with the cycle of
/// ranks, each with the index and text of the action it is blocked at and
/// of the peer action it waits for.
///
/// Time is measured the way the runtime overlaps communication: sends and
/// receives are posted where they stand and cost nothing, and a compute
/// action starts when its rank is free and its cross-rank input has been
/// computed. (Timing the rendezvous itself would charge torch's early
/// receives as idle time that no real runtime spends.) O(actions).
Result<PipelineSimulation>
simulatePipelineSchedule(const PipelineSchedule &schedule,
                         const PipelineCosts &costs = {});

/// The textbook bubble fraction (idle over total time) under the default
/// costs: (p-1)/(m+p-1) for gpipe and 1f1b; (p-1)/(v m+p-1) for
/// interleaved_1f1b (Narayanan et al. 2021: the bubble divided by v; for
/// large m this is (p-1)/(m+p-1)/v); (p-1)/(6m+p-1) for zbv (ZB-V's zero
/// steady-state bubble at F = I = W plus the fill skew of one chunk forward
/// per hop). The simulation meets these exactly for 1f1b and gpipe, for
/// interleaved_1f1b when m >= p, and for zbv when m >= 2p-1
/// (docs/pipeline.md).
double textbookBubbleFraction(const PipelineScheduleConfig &config);

//===----------------------------------------------------------------------===//
// Text
//===----------------------------------------------------------------------===//

/// torch's notation: "2F0", "1B3", "0I1", "0W1", "0SEND_F1", "1RECV_B2".
std::string formatPipelineAction(const PipelineAction &action);
/// One line per rank: "rank 0: 0F0 0SEND_F0 ...". With computeOnly, sends
/// and receives are left out.
std::string formatPipelineSchedule(const PipelineSchedule &schedule,
                                   bool computeOnly = false);

} // namespace meshplan

#endif // MESHPLAN_CORE_PIPELINESCHEDULE_H
