//===- ExecutedTrace.h - What a run did, per rank, and merged -------------===//
//
// Trace.h lays out what the cost model predicts; this is what a real run
// did (docs/observability.md). When asked (SessionOptions::trace), each rank
// of a run writes one file, rank<R>.json, holding for each traced step when
// every instruction of its plan became ready, started and ended, on a clock
// aligned with rank 0's. mergeTraces() turns a directory of them into one
// Chrome/Perfetto trace: a process per rank, a track per stream, the members
// of each collective linked by flow events, and (optionally) the cost
// model's prediction of the same plans as processes of their own.
// summarizeTraces() prints where the time went: per rank and communicator,
// the time in collectives and the part of it no compute hid, and per
// collective the member that arrived last (the straggler) and how long the
// others waited for it.
//
// A rank's file stands alone: it names the instructions it timed (id, op,
// stream, communicator and its members, bytes sent, label), so merging
// needs no plan files, and it carries the run's identity (a nonce rank 0
// drew at the trace's start and every rank read from the store) and a
// digest of the rank's plan, so that files of different runs or plans are
// never merged into one picture.
//
// A fault-tolerant run (version 2 of the format) writes a file per process,
// rank<R>.inc<I>.json for incarnation I, whose steps are attempts: a step
// discarded in epoch E is redone in a later epoch under the same number, and
// the members of a fault_tolerant communicator are recorded per epoch, so
// that only members of one epoch's group are linked.
//
// Plain C++ on the plan layer; nothing here throws.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_EXECUTEDTRACE_H
#define MESHPLAN_PLAN_EXECUTEDTRACE_H

#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Plan/Trace.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshplan::plan {

/// The format's name and version, written into every rank file.
inline constexpr const char *kExecutedTraceFormat = "meshplan-executed-trace";
/// Version 2 added what a fault-tolerant run needs (an incarnation per
/// file, an epoch and a commit flag per step, the members of the
/// fault_tolerant communicators per epoch); version 1 files still read,
/// as incarnation 0 with every step committed.
inline constexpr int kExecutedTraceVersion = 2;

/// One instruction of the traced plan, as the trace needs it.
struct TracedInstruction {
  std::string id;
  std::string op;    ///< opKindName
  int stream = 0;    ///< index into RankTrace::streams
  std::string comm;  ///< collectives and transfers; "" otherwise
  std::string label; ///< "" when the plan has none
  int64_t bytes = 0; ///< sent by this rank (collectives), else read+written
  /// For collectives: this rank's position in its communicator's turn
  /// order (0 for the communicator's first collective of the step, ...):
  /// the same collective on every member has the same ordinal.
  int64_t ordinal = -1;
};

/// One step as the executor ran it. Times are seconds: `start` on the
/// aligned clock (rank 0's monotonic clock), the rest from `start`.
struct ExecutedStep {
  int64_t step = 0; ///< 1-based, as Session::stepsDone after it
  /// A fault-tolerant run's epoch the attempt ran in (0: not fault
  /// tolerant). A step is attempted at most once per epoch: a discarded
  /// step is redone in a later epoch, so (epoch, step) names an attempt.
  int64_t epoch = 0;
  /// False for an attempt the commit vote discarded (its part before the
  /// commit ran; the step was redone later under the same number).
  bool committed = true;
  double start = 0;
  double wall = 0;
  /// Parallel to the plan's program; an instruction that did not run has
  /// start == end == 0 and is left out of merged traces.
  std::vector<double> ready, begin, end;
};

struct RankTrace {
  std::string run;        ///< the run's nonce, the same on every rank
  std::string planDigest; ///< planDigest() of the rank's plan
  int64_t rank = 0;
  int64_t worldSize = 1;
  std::string host; ///< the rank's host name
  /// Seconds added to this rank's monotonic clock to read rank 0's, and
  /// how far that may be off (0 on rank 0's host, whose ranks share
  /// CLOCK_MONOTONIC; half a store round trip otherwise), and how it was
  /// measured ("same host", "store ping").
  double clockOffset = 0;
  double clockUncertainty = 0;
  std::string clockMethod = "same host";
  /// A fault-tolerant rank's process: the launcher's restart count of its
  /// replica group (each incarnation writes its own file); 0 otherwise.
  int64_t incarnation = 0;
  bool faultTolerant = false;
  std::vector<std::string> streams;
  /// Communicator id -> members (ranks in key order).
  std::map<std::string, std::vector<int64_t>> communicators;
  /// Epoch -> fault_tolerant communicator id -> its members in that epoch
  /// (the live replica groups' ranks); they override `communicators` for
  /// the steps of that epoch.
  std::map<int64_t, std::map<std::string, std::vector<int64_t>>>
      epochCommunicators;
  /// The members of `comm` in `epoch`.
  const std::vector<int64_t> &membersOf(const std::string &comm,
                                        int64_t epoch) const;
  /// The clock offset could not be measured (a restarted process on a host
  /// other than rank 0's, where nobody answers a ping any more): its times
  /// are on its own clock.
  bool clockUnknown() const { return clockMethod == "unknown"; }
  std::vector<TracedInstruction> instructions;
  std::vector<ExecutedStep> steps;
};

/// A digest of a plan's contents (its program, buffers, communicators,
/// optimizer; not its estimates), as 16 hex digits: two plans with the same
/// digest run the same step.
std::string planDigest(const Plan &plan);

/// The header of a rank's trace (everything but steps and the clock) from
/// its plan.
RankTrace rankTraceOf(const Plan &plan);

/// The rank file's JSON text.
std::string writeRankTrace(const RankTrace &trace);
/// The same in parts, for a recorder that rewrites the file after each
/// step: one step's text (an element of "steps"), and the file of
/// `header` (its own steps ignored) with `steps` as its steps.
std::string writeRankTraceStep(const RankTrace &trace, const ExecutedStep &s);
std::string writeRankTraceWith(const RankTrace &header,
                               const std::vector<std::string> &steps);

/// Parses a rank file. `path` prefixes every error ("DIR/rank3.json:
/// /steps/4/begin: expected ..."); a truncated file is "line L, column C:
/// ..." with that prefix.
Result<RankTrace> parseRankTrace(std::string_view text,
                                 const std::string &path);

/// The file a rank's trace is written to: rank<R>.json, or for a
/// fault-tolerant process rank<R>.inc<I>.json (a restarted process must not
/// overwrite its predecessor's).
std::string rankTraceFileName(const RankTrace &trace);

/// Every rank<R>.json and rank<R>.inc<I>.json of `dir`, in (rank,
/// incarnation) order. Errors: a directory without one, an unreadable or
/// malformed file (named), files of different runs or world sizes, a file
/// whose name and contents disagree.
Result<std::vector<RankTrace>> readTraceDirectory(const std::string &dir);

/// The ranks of the world with no file in `traces` (a gap the merged trace
/// and the summary mark).
std::vector<int64_t> missingRanks(const std::vector<RankTrace> &traces);

/// One rank's cost-model timeline to put beside the measured ones.
struct Prediction {
  const Plan *plan = nullptr;
  Schedule schedule;
};

/// The merged Chrome trace (JSON text). `predictions` (optional, keyed by
/// rank) must be of the same plans: a plan whose digest differs from the
/// traced one is an error naming the rank.
Result<std::string>
mergeTraces(const std::vector<RankTrace> &traces,
            const std::map<int64_t, Prediction> &predictions = {});

/// The text of `meshplan trace --summary`.
std::string summarizeTraces(const std::vector<RankTrace> &traces);

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_EXECUTEDTRACE_H
