//===- Parallel.h - Run one worker on several threads ---------------------===//
//
// The plan layer's two parallel loops (reading and writing plan
// directories) hand out ranks from a shared counter; this starts the
// threads, runs the worker on the calling one too, and joins them.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_LIB_PLAN_PARALLEL_H
#define MESHPLAN_LIB_PLAN_PARALLEL_H

#include <functional>
#include <thread>
#include <vector>

namespace meshplan::plan {

/// Runs `worker` on `threads` threads (at least 1, the caller's included)
/// and returns when every one has finished.
inline void runOnThreads(unsigned threads,
                         const std::function<void()> &worker) {
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t)
    pool.emplace_back(worker);
  worker();
  for (std::thread &t : pool)
    t.join();
}

} // namespace meshplan::plan

#endif // MESHPLAN_LIB_PLAN_PARALLEL_H
