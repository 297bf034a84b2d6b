//===- RenameShim.c - No RENAME_EXCHANGE, by LD_PRELOAD -----------------===//
//
// Preloaded into CheckpointCheckpointTest by the ctest
// checkpoint.RenameFallback (unittests/CMakeLists.txt), so that
// publishCheckpoint, unchanged, takes its fallback for file systems without
// renameat2(RENAME_EXCHANGE) (two renames through `.<name>.previous`;
// docs/checkpoint-format.md):
//   - renameat2 with RENAME_EXCHANGE fails with EINVAL, as on such a file
//     system, and counts the refusal (meshplan_rename_shim_refusals, which
//     the test looks up to know the shim is there and was used);
//   - rename works, but with MESHPLAN_RENAME_SHIM_CRASH set in the
//     environment, a rename whose target ends in ".previous" (the old
//     checkpoint moved aside) is followed by SIGKILL: a crash between the
//     fallback's two renames.
// A shim rather than a switch inside the library: the library's code runs as
// shipped. Built without sanitizers (its CMake target), so that it loads into
// a sanitized test, whose runtime is linked into the executable.
//
//===----------------------------------------------------------------------===//

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

static int refusals;

int meshplan_rename_shim_refusals(void) { return refusals; }

int renameat2(int olddirfd, const char *oldpath, int newdirfd,
              const char *newpath, unsigned int flags) {
  if (flags & RENAME_EXCHANGE) {
    ++refusals;
    errno = EINVAL;
    return -1;
  }
  return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath,
                      flags);
}

static int endsWith(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

int rename(const char *oldpath, const char *newpath) {
  // The system call itself: rename() here would call this function again.
  int rc = (int)syscall(SYS_renameat, AT_FDCWD, oldpath, AT_FDCWD, newpath);
  if (rc == 0 && getenv("MESHPLAN_RENAME_SHIM_CRASH") &&
      endsWith(newpath, ".previous"))
    kill(getpid(), SIGKILL);
  return rc;
}
