//===- ForkedRanks.h - Run a benchmark's ranks as forked processes --------===//
//
// The multi-process benchmarks (bench-runtime-collectives, bench-checkpoint)
// run rank 0 in the calling process and ranks 1..n-1 in forked children,
// each a Session on the same store. Rank 0 reports the verdict: a rank
// function returns 0 (pass), 3 (the figures miss a target) or another code
// (an error).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_BENCH_FORKEDRANKS_H
#define MESHPLAN_BENCH_FORKEDRANKS_H

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <vector>

namespace meshplan::bench {

/// Runs rank(r) for r in [0, ranks); returns the program's exit code: rank
/// 0's, 1 when any rank failed (a child's 3 is not a failure: only rank 0
/// judges the figures), and 1 for rank 0's 3.
inline int runForkedRanks(int ranks, const std::function<int(int)> &rank) {
  auto guarded = [&](int r) {
    try {
      return rank(r);
    } catch (const std::exception &e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      return 1;
    }
  };
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int r = 1; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = guarded(r);
      std::fflush(nullptr);
      _exit(rc == 3 ? 0 : rc);
    }
    children.push_back(pid);
  }
  int rc = guarded(0);
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      rc = rc == 0 ? 1 : rc;
  }
  return rc == 3 ? 1 : rc;
}

} // namespace meshplan::bench

#endif // MESHPLAN_BENCH_FORKEDRANKS_H
