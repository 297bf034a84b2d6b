//===- Trace.h - One rank's timeline under the cost model -----------------===//
//
// simulate() lays one rank's plan out in time with the durations of
// CostModel.h; chromeTrace() writes the result in the Chrome Trace Event
// Format, which ui.perfetto.dev and chrome://tracing open.
//
// Model: each stream runs its instructions in program order; an instruction
// starts CostModel::dispatchSeconds (0 by default) after the previous
// instruction on its stream and all of its deps have ended. Collectives do not
// wait for peers: every rank runs the same program on symmetric groups, so all
// members reach a collective at the same time in the model (a real run adds
// skew and stragglers).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_TRACE_H
#define MESHPLAN_PLAN_TRACE_H

#include "meshplan/Plan/CostModel.h"
#include "meshplan/Plan/Plan.h"

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshplan::plan {

struct Schedule {
  /// Parallel to plan.program: start, end (seconds from step start), and
  /// bytes: sent by this rank for a collective (bytesSent), read plus written
  /// for a local instruction (local sizes of its inputs and outputs).
  std::vector<double> start, end;
  std::vector<int64_t> bytes;
  /// Parallel to plan.program: the index of its stream in plan.streams.
  std::vector<int> streamIndex;
  /// Parallel to plan.streams: total duration of its instructions.
  std::vector<double> streamBusySeconds;
  /// The end of the last instruction (0 for an empty program).
  double stepSeconds = 0;
  /// The stream whose idle time counts as exposed: "compute" if there is one,
  /// else the first stream (-1 when there are no streams).
  int computeStream = -1;
  /// Time during which some collective runs (on any stream) while the compute
  /// stream runs no local instruction: communication the step waits for.
  double exposedCommSeconds = 0;
  /// The parameters the durations came from (written into the trace).
  CostModel model;
};

/// The timeline of `plan` (which should pass validatePlan). `flops` is empty
/// (all 0) or parallel to plan.program (e.g. PreparedTemplate::flops()).
/// Errors: a bad cost model, a flops list of the wrong length or with a
/// negative or non-finite value, an unknown stream or dep, a wait cycle
/// (never hangs: Kahn's algorithm over stream order plus deps).
Result<Schedule> simulate(const Plan &plan, const std::vector<double> &flops,
                          const CostModel &model);

/// The timelines of several ranks' plans laid out together, as the ranks
/// of one pipeline run them: each plan as in simulate(), except that a recv
/// ends no earlier than the send of the same tag on the peer's plan, when
/// the peer is one of `plans` (the send carries the transfer's duration; a
/// peer outside the set is taken to be on time). Waiting for an upstream
/// stage is then idle time of the receiving rank: the pipeline's bubble
/// under the cost model. `flops` is parallel to `plans`, each entry as in
/// simulate(). Errors as simulate()'s, naming the rank; a wait cycle across
/// plans names every rank and instruction on it.
///
/// `seconds` (optional) replays measured durations: empty, or parallel to
/// `plans`, each entry empty or parallel to that plan's program. An entry
/// >= 0 is the instruction's duration in seconds in place of the cost
/// model's; a negative one keeps the model's. A recv's entry is ignored: it
/// always ends where its send's transfer does, with no dispatch latency
/// before it (a measured recv time is the wait this function is there to
/// predict). Errors: a list of the wrong length, a non-finite entry.
Result<std::vector<Schedule>>
simulateTogether(const std::vector<const Plan *> &plans,
                 const std::vector<std::vector<double>> &flops,
                 const CostModel &model,
                 const std::vector<std::vector<double>> &seconds = {});

/// Chrome Trace Event Format JSON: {"traceEvents": [...], "displayTimeUnit":
/// "ms", "otherData": {...}}. One "X" event per instruction (ts and dur in
/// microseconds, pid = rank, tid = stream index, name = label or id, args:
/// id, op, comm, dtype, count, bytes, label), "M" events naming the process
/// ("rank N") and each stream (thread_name), and otherData holding the cost
/// model parameters, step time and exposed communication time.
std::string chromeTrace(const Plan &plan, const Schedule &schedule);

/// The bytes of every buffer of `plan` on this rank (its local shape),
/// by id; the keys view plan.buffers' ids. What a local instruction reads
/// and writes is the sum over its inputs and outputs (Schedule::bytes).
std::unordered_map<std::string_view, int64_t>
localBufferBytes(const Plan &plan);

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_TRACE_H
