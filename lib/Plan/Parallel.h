//===- Parallel.h - Run one worker on several threads ---------------------===//
//
// The plan layer's two parallel loops (reading and writing plan
// directories) hand out ranks from a shared counter; this starts the
// threads, runs the worker on the calling one too, and joins them.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_LIB_PLAN_PARALLEL_H
#define MESHPLAN_LIB_PLAN_PARALLEL_H

#include <pthread.h>

#include <functional>
#include <vector>

namespace meshplan::plan {

/// Runs `worker` on up to `threads` threads (at least 1, the caller's
/// included) and returns when every one has finished. Threads are started
/// with pthread_create, not std::thread: under an address-space limit a
/// thread's stack may not fit, and std::thread would throw (this library
/// neither throws nor catches; an uncaught throw with threads running ends
/// in "terminate called without an active exception"). A thread that cannot
/// start is simply not used: workers share a counter, so the others do its
/// part.
inline void runOnThreads(unsigned threads,
                         const std::function<void()> &worker) {
  std::vector<pthread_t> pool;
  pool.reserve(threads);
  auto trampoline = [](void *arg) -> void * {
    (*static_cast<const std::function<void()> *>(arg))();
    return nullptr;
  };
  for (unsigned t = 1; t < threads; ++t) {
    pthread_t id;
    if (pthread_create(&id, nullptr, trampoline,
                       const_cast<std::function<void()> *>(&worker)) != 0)
      break;
    pool.push_back(id);
  }
  worker();
  for (pthread_t id : pool)
    pthread_join(id, nullptr);
}

} // namespace meshplan::plan

#endif // MESHPLAN_LIB_PLAN_PARALLEL_H
