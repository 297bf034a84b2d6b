//===- StepTrace.h - Recording what each step did (executed traces) -------===//
//
// SessionOptions::trace asks a session to record, for the steps in a
// range, when every instruction became ready, started and ended, and to
// write them as DIR/rank<R>.json (meshplan/Plan/ExecutedTrace.h;
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
  static Result<std::unique_ptr<StepTraceRecorder>>
  start(const plan::Plan &plan, const StepTraceOptions &options,
        Backend &backend);

  /// Whether step `step` (1-based) is in the traced range.
  bool wants(int64_t step) const {
    return step >= options.firstStep && step <= options.lastStep;
  }
  /// Records step `step`, which began at `begun` and which `profile`
  /// describes; writes the file after the range's last step.
  Result<void> record(int64_t step, SteadyClock::time_point begun,
                      const StepProfile &profile);
  /// Writes the file if some recorded step is not in it yet (a run that
  /// stopped inside the range).
  Result<void> finish();

private:
  StepTraceRecorder(plan::RankTrace header, StepTraceOptions options)
      : trace(std::move(header)), options(std::move(options)) {}
  Result<void> write();

  plan::RankTrace trace;
  StepTraceOptions options;
  bool written = true;
};

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_STEPTRACE_H
