//===- Timing.h - Wall-clock intervals for reports --------------*- C++ -*-===//
//
// The monotonic clock every report of elapsed time uses (the planner's stage
// timings, the CLI's "wrote ... in", the trainer's step figures).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_SUPPORT_TIMING_H
#define MESHPLAN_SUPPORT_TIMING_H

#include <chrono>

namespace meshplan {

using SteadyClock = std::chrono::steady_clock;

/// Seconds from `start` to now.
inline double secondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

} // namespace meshplan

#endif // MESHPLAN_SUPPORT_TIMING_H
