//===- GlooBackendTest.cpp - The Gloo backend's own algorithms, bit for bit
//===//
//
// runtime.GlooBackend: forks groups of 2 to 7 processes that talk through a
// real Gloo backend (file store, TCP on loopback) and checks every
// collective's result bit for bit against a local computation on all
// members' inputs (each member's input is a function of its key and the
// case, so every process knows all of them):
//
// - all-gather: exact copies, for counts that take the log-round algorithm
//   (recursive doubling on 2 and 4 members, Bruck's with wrapping ranges on
//   the others) and Gloo's ring;
// - reduce-scatter and all-reduce of float32 and bf16 in key order
//   (docs/runtime.md, "Determinism"): the result must equal the left fold
//   member 0 + member 1 + ... + member n-1, element by element, on every
//   path the backend picks by size (Gloo's all-to-all and the fold,
//   gather-all, the pipelined all-reduce with several pieces and an uneven
//   last region), and for avg the fold divided by n;
// - small reduce-scatters on the standing bound buffers: many calls in a
//   row (the two inboxes alternate), two sizes interleaved, bf16, and an
//   output that is this member's block of the input;
// - all-to-all and broadcast: exact;
// - afterwards, every TCP connection of the member has a send buffer of at
//   least 2 MiB (or twice net.core.wmem_max): the standing buffers' first
//   bound message sizes it (kSendBufferPrimeBytes in GlooBackend.cpp); a
//   small first block used to leave it at 4.5 KiB, and every large
//   transfer then stalled 40 ms at a time on the peer's delayed ACKs.
//
// Random-looking inputs with mixed magnitudes make a sum in any other order
// differ in some element with near certainty, so the test fails if an
// algorithm adds in another order.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Backend.h"
#include "meshplan/Runtime/Kernels.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;

namespace {

/// A float of varied magnitude and sign, a function of (key, case, i).
float inputValue(int64_t key, int64_t salt, int64_t i) {
  uint64_t x = uint64_t(key) * 0x9E3779B97F4A7C15ull ^
               uint64_t(salt) * 0xC2B2AE3D27D4EB4Full ^
               uint64_t(i) * 0x165667B19E3779F9ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  float mantissa = float(x & 0xFFFFFF) / float(1 << 24) - 0.5f;
  int exponent = int((x >> 24) % 24) - 12;
  return std::ldexp(mantissa, exponent);
}

std::vector<float> inputs(int64_t key, int64_t salt, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    v[size_t(i)] = inputValue(key, salt, i);
  return v;
}

std::vector<uint16_t> toBf16(const std::vector<float> &v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = kernels::floatToBf16(v[i]);
  return out;
}

int failures = 0;

void fail(int64_t key, const std::string &what) {
  if (failures++ < 10)
    std::fprintf(stderr, "key %lld: %s\n", (long long)key, what.c_str());
}

template <typename T>
void expectEqual(int64_t key, const std::string &what, const T *got,
                 const T *want, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      fail(key, what + ": element " + std::to_string(i) + " differs");
      return;
    }
}

void check(int64_t key, const std::string &what, const Result<void> &r) {
  if (!r)
    fail(key, what + ": " + r.error().message);
}

/// Everything one member checks on a communicator of n members.
void runMember(Communicator &comm) {
  int64_t n = comm.size(), me = comm.key();
  // Counts: tiny, not a multiple of anything, the log-round sizes, Gloo's
  // ring sizes, and (all-reduce) more than one pipelined piece.
  for (int64_t count : {int64_t(1), int64_t(3), int64_t(1000), int64_t(20000),
                        int64_t(300000)}) {
    std::string at =
        " (n " + std::to_string(n) + ", count " + std::to_string(count) + ")";
    // All-gather.
    {
      std::vector<float> in = inputs(me, count, count);
      std::vector<float> out(size_t(count * n)), want;
      check(me, "all-gather" + at,
            comm.allGather(in.data(), out.data(), count, DType::Float32));
      for (int64_t s = 0; s < n; ++s) {
        std::vector<float> theirs = inputs(s, count, count);
        want.insert(want.end(), theirs.begin(), theirs.end());
      }
      expectEqual(me, "all-gather" + at, out.data(), want.data(), out.size());
    }
    // Reduce-scatter and avg, float32: block `me` of every member's input,
    // folded left to right.
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      std::string name =
          std::string(op == ReduceOp::Sum ? "reduce-scatter sum" : "avg") + at;
      std::vector<float> in = inputs(me, 7 * count, count * n);
      std::vector<float> out(static_cast<size_t>(count)),
          want(static_cast<size_t>(count));
      check(
          me, name,
          comm.reduceScatter(in.data(), out.data(), count, DType::Float32, op));
      std::vector<std::vector<float>> all;
      for (int64_t s = 0; s < n; ++s)
        all.push_back(inputs(s, 7 * count, count * n));
      for (int64_t i = 0; i < count; ++i) {
        float acc = all[0][size_t(me * count + i)];
        for (int64_t s = 1; s < n; ++s)
          acc = acc + all[size_t(s)][size_t(me * count + i)];
        want[size_t(i)] = op == ReduceOp::Avg ? acc / float(n) : acc;
      }
      expectEqual(me, name, out.data(), want.data(), out.size());
    }
    // All-reduce, float32 and bf16 (bf16 sums round after each addition).
    // The larger count gives every member's region (about 4 MiB of float32)
    // two pipelined pieces, the second a little shorter, and the last region
    // fewer elements than the others.
    for (int64_t total : {count, count == 300000 ? 1048576 * n + 5 : 0}) {
      if (total == 0)
        continue;
      std::string name = "all-reduce (n " + std::to_string(n) + ", count " +
                         std::to_string(total) + ")";
      std::vector<float> data = inputs(me, 13 * total, total);
      check(me, name,
            comm.allReduce(data.data(), total, DType::Float32, ReduceOp::Sum));
      std::vector<float> want = inputs(0, 13 * total, total);
      for (int64_t s = 1; s < n; ++s) {
        std::vector<float> theirs = inputs(s, 13 * total, total);
        for (int64_t i = 0; i < total; ++i)
          want[size_t(i)] = want[size_t(i)] + theirs[size_t(i)];
      }
      expectEqual(me, name, data.data(), want.data(), data.size());

      std::vector<uint16_t> half = toBf16(inputs(me, 17 * total, total));
      check(me, name + " bf16",
            comm.allReduce(half.data(), total, DType::BFloat16, ReduceOp::Sum));
      std::vector<uint16_t> wantHalf = toBf16(inputs(0, 17 * total, total));
      for (int64_t s = 1; s < n; ++s) {
        std::vector<uint16_t> theirs = toBf16(inputs(s, 17 * total, total));
        for (int64_t i = 0; i < total; ++i)
          wantHalf[size_t(i)] =
              kernels::floatToBf16(kernels::bf16ToFloat(wantHalf[size_t(i)]) +
                                   kernels::bf16ToFloat(theirs[size_t(i)]));
      }
      expectEqual(me, name + " bf16", half.data(), wantHalf.data(),
                  half.size());
    }
    // allReduceShares (fault tolerance with members missing): n + 2 nominal
    // members, 1 and n + 1 missing, their contributions brought by members
    // n - 1 and 0 beside their own; the result is the left fold over the
    // nominal members, as a full group's all-reduce would take it.
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      std::string name = std::string("all-reduce shares ") +
                         (op == ReduceOp::Sum ? "sum" : "avg") + at;
      int64_t nominal = n + 2;
      std::vector<std::vector<int64_t>> layout(static_cast<size_t>(n));
      for (int64_t g = 0, k = 0; g < nominal; ++g)
        if (g != 1 && g != nominal - 1)
          layout[size_t(k++)].push_back(g);
      // Out of member order, so that a fold in member order would differ.
      layout[size_t(n - 1)].push_back(1);
      layout[0].push_back(nominal - 1);
      std::vector<std::vector<float>> mine;
      std::vector<const void *> pointers;
      for (int64_t g : layout[size_t(me)])
        mine.push_back(inputs(g, 23 * count, count));
      for (const std::vector<float> &m : mine)
        pointers.push_back(m.data());
      std::vector<float> out(static_cast<size_t>(count)),
          want = inputs(0, 23 * count, count);
      check(me, name,
            comm.allReduceShares(pointers, out.data(), count, DType::Float32,
                                 op, layout));
      for (int64_t g = 1; g < nominal; ++g) {
        std::vector<float> theirs = inputs(g, 23 * count, count);
        for (int64_t i = 0; i < count; ++i)
          want[size_t(i)] = want[size_t(i)] + theirs[size_t(i)];
      }
      if (op == ReduceOp::Avg)
        for (float &w : want)
          w /= float(n);
      expectEqual(me, name, out.data(), want.data(), out.size());
    }
    // All-to-all: block s of member t's input lands as block t at member s.
    {
      std::vector<float> in = inputs(me, 19 * count, count * n);
      std::vector<float> out(in.size()), want;
      check(me, "all-to-all" + at,
            comm.allToAll(in.data(), out.data(), count, DType::Float32));
      for (int64_t s = 0; s < n; ++s) {
        std::vector<float> theirs = inputs(s, 19 * count, count * n);
        want.insert(want.end(), theirs.begin() + me * count,
                    theirs.begin() + (me + 1) * count);
      }
      expectEqual(me, "all-to-all" + at, out.data(), want.data(), out.size());
    }
  }
  // Small reduce-scatters back to back on their standing buffers: two sizes
  // interleaved, fresh inputs each call, so that a block landing in the
  // inbox still being folded, or read from the wrong one, changes a sum.
  for (int call = 0; call < 7; ++call)
    for (int64_t count : {int64_t(257), int64_t(4096)}) {
      std::string name = "reduce-scatter call " + std::to_string(call) +
                         " (n " + std::to_string(n) + ", count " +
                         std::to_string(count) + ")";
      int64_t salt = 1000 * call + count;
      std::vector<float> in = inputs(me, salt, count * n);
      std::vector<float> out(static_cast<size_t>(count)),
          want(static_cast<size_t>(count));
      check(me, name,
            comm.reduceScatter(in.data(), out.data(), count, DType::Float32,
                               ReduceOp::Sum));
      std::vector<std::vector<float>> all;
      for (int64_t s = 0; s < n; ++s)
        all.push_back(inputs(s, salt, count * n));
      for (int64_t i = 0; i < count; ++i) {
        float acc = all[0][size_t(me * count + i)];
        for (int64_t s = 1; s < n; ++s)
          acc = acc + all[size_t(s)][size_t(me * count + i)];
        want[size_t(i)] = acc;
      }
      expectEqual(me, name, out.data(), want.data(), out.size());
    }
  // bf16 (each addition rounds), written over this member's own block of
  // the input.
  {
    int64_t count = 999;
    std::vector<uint16_t> in = toBf16(inputs(me, 29, count * n));
    std::vector<std::vector<uint16_t>> all;
    for (int64_t s = 0; s < n; ++s)
      all.push_back(toBf16(inputs(s, 29, count * n)));
    std::vector<uint16_t> want(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      uint16_t acc = all[0][size_t(me * count + i)];
      for (int64_t s = 1; s < n; ++s)
        acc = kernels::floatToBf16(
            kernels::bf16ToFloat(acc) +
            kernels::bf16ToFloat(all[size_t(s)][size_t(me * count + i)]));
      want[size_t(i)] = acc;
    }
    uint16_t *own = in.data() + me * count;
    check(me, "reduce-scatter bf16 in place",
          comm.reduceScatter(in.data(), own, count, DType::BFloat16,
                             ReduceOp::Sum));
    expectEqual(me, "reduce-scatter bf16 in place", own, want.data(),
                size_t(count));
  }
  // An empty collective is a no-op on every path.
  float none = 0;
  check(me, "empty all-gather",
        comm.allGather(&none, &none, 0, DType::Float32));
  check(me, "empty all-reduce",
        comm.allReduce(&none, 0, DType::Float32, ReduceOp::Sum));
}

/// Every connected TCP socket of this process (here: the communicator's
/// pairs) has a send buffer of at least twice 1 MiB, within the kernel's
/// cap net.core.wmem_max (setsockopt doubles the value it is given).
void checkSendBuffers(int64_t key) {
  long long cap = 0;
  std::ifstream("/proc/sys/net/core/wmem_max") >> cap;
  long long want = 2 * std::min<long long>(1 << 20, cap > 0 ? cap : 1 << 20);
  int sockets = 0;
  for (const auto &entry :
       std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = std::atoi(entry.path().filename().c_str());
    int type = 0;
    socklen_t len = sizeof type;
    sockaddr_storage peer{};
    socklen_t peerLen = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
        type != SOCK_STREAM ||
        getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &peerLen) != 0 ||
        (peer.ss_family != AF_INET && peer.ss_family != AF_INET6))
      continue;
    int sndbuf = 0;
    len = sizeof sndbuf;
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len);
    ++sockets;
    if (sndbuf < want)
      fail(key, "TCP socket " + std::to_string(fd) + " has a send buffer of " +
                    std::to_string(sndbuf) + " bytes, want at least " +
                    std::to_string(want));
  }
  if (sockets == 0)
    fail(key, "no connected TCP socket found in /proc/self/fd");
}

/// Forks n members; returns how many of them failed.
int runGroup(int64_t n) {
  char tmpl[] = "/tmp/meshplan-gloo-backend-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return int(n);
  }
  std::string dir = tmpl;
  std::vector<pid_t> pids;
  for (int64_t rank = 0; rank < n; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      BackendOptions options;
      options.store.kind = StoreAddress::Kind::File;
      options.store.path = dir;
      options.rank = rank;
      options.worldSize = n;
      options.timeout = std::chrono::milliseconds(60000);
      auto backend = createGlooBackend(options);
      if (!backend) {
        fail(rank, backend.error().message);
        _exit(1);
      }
      GroupSpec group;
      group.id = "world";
      for (int64_t r = 0; r < n; ++r)
        group.ranks.push_back(r);
      group.key = rank;
      auto comm = (*backend)->createCommunicator(group);
      if (!comm) {
        fail(rank, comm.error().message);
        _exit(1);
      }
      runMember(**comm);
      checkSendBuffers(rank);
      // As Session::close() does: a member that exits while a peer has not
      // yet taken its last message from the socket ends that peer's wait
      // with "connection closed" (Gloo fails every bound buffer of a closed
      // pair, received or not).
      check(rank, "closing barrier", (*comm)->barrier());
      std::fflush(stderr);
      _exit(failures ? 1 : 0);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
      std::fprintf(stderr, "a member of %lld was killed by signal %d\n",
                   (long long)n, WTERMSIG(status));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      ++failed;
  }
  std::filesystem::remove_all(dir);
  return failed;
}

} // namespace

int main() {
  int failedGroups = 0;
  for (int64_t n : {2, 3, 4, 5, 7}) {
    int failed = runGroup(n);
    std::printf("%lld members: %s\n", (long long)n,
                failed ? "FAILED" : "bit-exact");
    failedGroups += failed != 0;
  }
  return failedGroups ? 1 : 0;
}
