//===- CudaNcclTest.cpp - The NCCL backend on real devices ----------------===//
//
// The NCCL backend (runtime/lib/Backends/Nccl) through the Backend interface
// on device buffers: a world of one rank on one device (every collective
// degenerates but runs through NCCL: init from the store's unique id, splits,
// non-blocking settles, stream synchronization), and, where the machine has
// two or more devices, forked ranks on a world of that size with a split
// that makes groups of two (every collective checked against host math, the
// key-order reductions against the Gloo backend's order). Needs a CUDA
// device; skips without one (CudaTestSupport.h).
//
//===----------------------------------------------------------------------===//

#include "CudaTestSupport.h"

#include "meshplan/Runtime/NcclBackend.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "meshplan-nccl-XXXXXX")
            .string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

BackendOptions optionsFor(const std::string &dir, int64_t rank, int64_t world) {
  BackendOptions o;
  o.store.kind = StoreAddress::Kind::File;
  o.store.path = dir;
  o.rank = rank;
  o.worldSize = world;
  o.localRank = rank;
  o.timeout = std::chrono::seconds(30);
  o.job = "nccl-test";
  return o;
}

std::vector<float> download(const float *device, size_t n) {
  std::vector<float> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

class CudaNccl : public ::testing::Test {
protected:
  void SetUp() override { MESHPLAN_REQUIRE_CUDA_DEVICE(); }
};

TEST_F(CudaNccl, OneRankWorldRunsEveryCollective) {
  TempDir dir;
  auto backend = createNcclBackend(optionsFor(dir.path.string(), 0, 1));
  ASSERT_TRUE(backend) << backend.error().message;
  Backend &b = **backend;
  EXPECT_EQ(b.name(), "nccl");
  EXPECT_EQ(b.memoryKind(), MemoryKind::Device);
  GroupSpec solo{"comm_solo", 0, {0}, 0, 0};
  ASSERT_TRUE(b.declareGroups({solo}));
  auto comm = b.createCommunicator(solo);
  ASSERT_TRUE(comm) << comm.error().message;
  Communicator &c = **comm;
  EXPECT_EQ(c.memoryKind(), MemoryKind::Device);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_TRUE(c.setStream({stream}));

  size_t n = 1000;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 1.0f);
  float *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in, host.data(), n * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_TRUE(c.allGather(in, out, int64_t(n), DType::Float32));
  ASSERT_TRUE(c.synchronize());
  EXPECT_EQ(download(out, n), host);
  ASSERT_TRUE(
      c.reduceScatter(in, out, int64_t(n), DType::Float32, ReduceOp::Avg));
  ASSERT_TRUE(c.allReduce(out, int64_t(n), DType::Float32, ReduceOp::Sum));
  ASSERT_TRUE(c.broadcast(out, int64_t(n), DType::Float32, 0));
  ASSERT_TRUE(c.allToAll(in, out, int64_t(n), DType::Float32));
  ASSERT_TRUE(c.sendRecv(in, 0, out, 0, int64_t(n), DType::Float32));
  ASSERT_TRUE(c.barrier());
  EXPECT_EQ(download(out, n), host);
  // Refusals: an undeclared group, a group made twice.
  auto undeclared = b.createCommunicator({"other", 0, {0}, 0, 0});
  ASSERT_FALSE(undeclared);
  EXPECT_NE(undeclared.error().message.find("was not declared"),
            std::string::npos);
  EXPECT_FALSE(b.createCommunicator(solo));
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(stream);
}

/// Rank `rank` of a forked world: every rank is in the world group (key
/// order = rank order) and in a pair {r, r ^ 1}. Returns 0 on success.
int runRank(const std::string &dir, int64_t rank, int64_t world) {
  auto backend = createNcclBackend(optionsFor(dir, rank, world));
  if (!backend) {
    std::fprintf(stderr, "rank %lld: %s\n", (long long)rank,
                 backend.error().message.c_str());
    return 1;
  }
  std::vector<int64_t> all(static_cast<size_t>(world));
  std::iota(all.begin(), all.end(), 0);
  int64_t partner = rank ^ 1;
  GroupSpec everyone{"world", 0, all, rank, 0};
  GroupSpec pair{"pair",
                 std::min(rank, partner),
                 {std::min(rank, partner), std::max(rank, partner)},
                 rank < partner ? 0 : 1,
                 0};
  if (!(*backend)->declareGroups({everyone, pair}))
    return 2;
  // Created in the reverse of the declared order: the backend still splits
  // in the declared order on every rank.
  auto p = (*backend)->createCommunicator(pair);
  auto w = (*backend)->createCommunicator(everyone);
  if (!p || !w) {
    std::fprintf(stderr, "rank %lld: %s\n", (long long)rank,
                 (!p ? p.error() : w.error()).message.c_str());
    return 3;
  }
  size_t n = 257;
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i)
    mine[i] = float(rank + 1) * 0.1f + float(i) * 1e-3f;
  float *data = nullptr;
  cudaMalloc(&data, n * 4);
  cudaMemcpy(data, mine.data(), n * 4, cudaMemcpyHostToDevice);
  // Key order: ((r0 + r1) + r2) + ... in float, as Gloo adds.
  auto result =
      (*w)->allReduce(data, int64_t(n), DType::Float32, ReduceOp::Sum);
  if (!result || !(*w)->synchronize())
    return 4;
  std::vector<float> got = download(data, n);
  for (size_t i = 0; i < n; ++i) {
    float want = 0.1f + float(i) * 1e-3f;
    for (int64_t r = 1; r < world; ++r)
      want = want + (float(r + 1) * 0.1f + float(i) * 1e-3f);
    if (got[i] != want) {
      std::fprintf(stderr, "rank %lld: element %zu is %.9g, want %.9g\n",
                   (long long)rank, i, got[i], want);
      return 5;
    }
  }
  if (!(*p)->barrier() || !(*w)->barrier())
    return 6;
  cudaFree(data);
  return 0;
}

TEST_F(CudaNccl, ForkedRanksOnSeveralDevices) {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < 2)
    GTEST_SKIP() << "needs 2 or more CUDA devices (NCCL runs one rank per "
                    "device); this machine has "
                 << devices;
  int64_t world = devices >= 4 ? 4 : 2;
  TempDir dir;
  // Each rank is a fresh process (fork, then exec of this test binary): CUDA
  // does not survive a fork once the parent has initialized it.
  std::vector<pid_t> children;
  for (int64_t rank = 0; rank < world; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("MESHPLAN_NCCL_TEST_DIR", dir.path.c_str(), 1);
      setenv("MESHPLAN_NCCL_TEST_RANK", std::to_string(rank).c_str(), 1);
      setenv("MESHPLAN_NCCL_TEST_WORLD", std::to_string(world).c_str(), 1);
      execl("/proc/self/exe", "CudaNcclTest", static_cast<char *>(nullptr));
      _exit(127);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "a rank failed with status " << status;
  }
}

} // namespace

int main(int argc, char **argv) {
  // A forked rank of ForkedRanksOnSeveralDevices.
  if (const char *rank = std::getenv("MESHPLAN_NCCL_TEST_RANK"))
    return runRank(std::getenv("MESHPLAN_NCCL_TEST_DIR"), std::atoll(rank),
                   std::atoll(std::getenv("MESHPLAN_NCCL_TEST_WORLD")));
  return meshplan::test::cudaTestMain(argc, argv, "runtime.cuda.nccl");
}
