//===- Parallel.cpp - Splitting span kernels over threads -----------------===//
//
// Threads are started per call rather than kept in a pool: the kernels are
// called on spans of millions of elements (milliseconds of work), where a
// thread start is noise, and a pool would be global state shared by every
// caller of a pure-function library.
//
//===----------------------------------------------------------------------===//

#include "KernelSupport.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace meshplan::runtime::kernels::detail {

void contractViolation(const char *kernel, const char *what) {
  std::fprintf(stderr, "meshplan kernels: %s: %s\n", kernel, what);
  std::abort();
}

void parallelFor(int64_t n, const Threading &threading,
                 const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0)
    return;
  int64_t perThread = std::max<int64_t>(threading.minElementsPerThread, 1);
  if (n / perThread < 2) {
    fn(0, n);
    return;
  }
  // hardware_concurrency() reads /sys on every call (glibc): once is enough.
  static const int64_t cores =
      std::max(1u, std::thread::hardware_concurrency());
  int64_t maxThreads = threading.maxThreads > 0 ? threading.maxThreads : cores;
  int64_t threads = std::clamp<int64_t>(n / perThread, 1, maxThreads);
  if (threads == 1) {
    fn(0, n);
    return;
  }
  // 64-element multiples keep chunks on separate cache lines for every
  // element size.
  int64_t chunk = ((n + threads - 1) / threads + 63) / 64 * 64;
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  int64_t begin = chunk;
  for (; begin < n; begin += chunk) {
    int64_t end = std::min(n, begin + chunk);
#if defined(__cpp_exceptions)
    try {
      workers.emplace_back(fn, begin, end);
    } catch (...) {
      // No thread to be had: this chunk runs here, after the first.
      break;
    }
#else
    workers.emplace_back(fn, begin, end);
#endif
  }
  fn(0, std::min(n, chunk));
  for (; begin < n; begin += chunk)
    fn(begin, std::min(n, begin + chunk));
  for (std::thread &worker : workers)
    worker.join();
}

void requireTiling(std::span<const IndexRun> runs, int64_t n,
                   const char *kernel) {
  int64_t next = 0;
  for (const IndexRun &run : runs) {
    require(run.local == next && run.length >= 0 && run.global >= 0, kernel,
            "the index runs must tile the span in increasing local order "
            "with non-negative global indices");
    next += run.length;
  }
  require(next == n, kernel, "the index runs must cover the whole span");
}

void forEachRunPiece(std::span<const IndexRun> runs, int64_t begin, int64_t end,
                     const std::function<void(int64_t, int64_t, int64_t)> &fn) {
  // The last run starting at or before `begin` holds it.
  auto it = std::upper_bound(
      runs.begin(), runs.end(), begin,
      [](int64_t local, const IndexRun &run) { return local < run.local; });
  if (it != runs.begin())
    --it;
  for (; it != runs.end() && it->local < end; ++it) {
    int64_t from = std::max(begin, it->local);
    int64_t to = std::min(end, it->local + it->length);
    if (from < to)
      fn(from, it->global + (from - it->local), to - from);
  }
}

} // namespace meshplan::runtime::kernels::detail
