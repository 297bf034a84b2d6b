//===- StepTrace.h - Recording what each step did (executed traces) -------===//
//
// SessionOptions::trace asks a session to record, for the steps in a
// range, when every instruction became ready, started and ended, and to
// write them as DIR/rank<R>.json or, fault tolerant, DIR/rank<R>.inc<I>.json
// (meshplan/Plan/ExecutedTrace.h;
// docs/observability.md). The executor already times every instruction of
// every step for StepProfile; recording copies those times, so a session
// that traces does no extra work inside a step, and one that does not
// trace does none at all.
//
// Clocks: the ranks of rank 0's host share CLOCK_MONOTONIC (steady_clock on
// Linux), so their times need no correction. A rank on another host
// measures its offset to rank 0's clock once, at open, through the store
// (rank 0 answers each remote rank's ping with its clock; the offset is
// rank 0's reading minus the midpoint of the ping's round trip, good to
// half that round trip, which is written into the file).
//
// A fault-tolerant process (docs/observability.md, "Fault-tolerant runs")
// writes rank<R>.inc<I>.json, its incarnation's own file, and appends every
// traced attempt to it at once, so that a process killed mid-run leaves the
// steps it finished. A restarted process (incarnation > 0) reads the run's
// nonce from the store, where it stays; rank 0 answered pings only at the job's
// open, so it takes the clock offset its incarnation 0 measured on the same
// host (one CLOCK_MONOTONIC), and marks it unknown on another host.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_STEPTRACE_H
#define MESHPLAN_RUNTIME_STEPTRACE_H

#include "meshplan/Plan/ExecutedTrace.h"
#include "meshplan/Runtime/Backend.h"
#include "meshplan/Runtime/Session.h"
#include "meshplan/Support/Timing.h"

#include <memory>

namespace meshplan::runtime {

class StepTraceRecorder {
public:
  /// Agrees the run's nonce and this rank's clock offset with the other
  /// ranks through `backend`'s store (every rank of the job must open with
  /// the same trace options) and checks that the directory can be written.
  /// `incarnation`: a fault-tolerant process's (nullopt otherwise).
  static Result<std::unique_ptr<StepTraceRecorder>>
  start(const plan::Plan &plan, const StepTraceOptions &options,
        Backend &backend, std::optional<int64_t> incarnation = std::nullopt);

  /// Whether step `step` (1-based) is in the traced range.
  bool wants(int64_t step) const {
    return step >= options.firstStep && step <= options.lastStep;
  }
  /// Records step `step`, which began at `begun` and which `profile`
  /// describes; writes the file after the range's last step.
  /// A fault-tolerant attempt also gives its epoch and whether the vote
  /// committed it; each is written at once.
  Result<void> record(int64_t step, SteadyClock::time_point begun,
                      const StepProfile &profile, int64_t epoch = 0,
                      bool committed = true);
  /// Whether the members of epoch `epoch`'s fault_tolerant communicators
  /// are recorded yet, and recording them.
  bool knowsEpoch(int64_t epoch) const {
    return trace.epochCommunicators.count(epoch) != 0;
  }
  void setEpochMembers(int64_t epoch,
                       std::map<std::string, std::vector<int64_t>> members) {
    trace.epochCommunicators[epoch] = std::move(members);
  }
  /// Writes the file if some recorded step is not in it yet (a run that
  /// stopped inside the range).
  Result<void> finish();
  ~StepTraceRecorder();
  StepTraceRecorder(const StepTraceRecorder &) = delete;
  StepTraceRecorder &operator=(const StepTraceRecorder &) = delete;

private:
  StepTraceRecorder(plan::RankTrace header, StepTraceOptions options)
      : trace(std::move(header)), options(std::move(options)) {}
  Result<void> write();

  plan::RankTrace trace;          ///< the header (its steps are in `steps`)
  std::vector<std::string> steps; ///< writeRankTraceStep of each
  /// A fault-tolerant file once written: open for appending steps, its
  /// size and how many of `steps` it holds.
  int appendFd = -1;
  int64_t fileSize = 0;
  size_t inFile = 0;
  StepTraceOptions options;
  bool written = true;
};

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_STEPTRACE_H
