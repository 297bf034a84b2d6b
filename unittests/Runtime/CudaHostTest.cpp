//===- CudaHostTest.cpp - The CUDA backend's host-side logic, no GPU ------===//
//
// Everything of the CUDA/NCCL backend that runs on the host, tested on
// machines without a GPU (every CI run):
//   - the per-element functions the CUDA kernels share with the CPU kernels
//     (ScalarMath.h) against the CPU kernels' own tables and generators;
//   - the kernels' index maps (IndexMaps.h) against the CPU's boxIndexRuns
//     and copyBox;
//   - the NCCL backend's split arguments, derived from core's groups for
//     every axis subset of a 3-D mesh and checked by emulating
//     ncclCommSplit; the lazy split order; the world's unique id exchanged
//     through a real Gloo FileStore, and its failures;
//   - the plan-driven device memory (DeviceMemory.h): one allocation, no two
//     buffers that can be live together share bytes, reuse where the plan's
//     order allows it, on hand-made plans and on a planned example spec;
//   - the CUDA streams and events a plan's order becomes (StreamGraph.h):
//     every ordering the plan states is kept, and implied waits are dropped.
//
//===----------------------------------------------------------------------===//

#include "Backends/Nccl/NcclSetup.h"
#include "BoxCopy.h"
#include "DeviceMemory.h"
#include "Kernels/Cuda/IndexMaps.h"
#include "Kernels/ScalarMath.h"
#include "StreamGraph.h"
#include "meshplan/Core/Mesh.h"
#include "meshplan/Runtime/Backend.h"
#include "meshplan/Runtime/Kernels.h"
#include "meshplan/Runtime/NcclBackend.h"

#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

using namespace meshplan;
using namespace meshplan::runtime;
namespace k = meshplan::runtime::kernels;
namespace kd = meshplan::runtime::kernels::detail;
namespace cu = meshplan::runtime::cuda;

namespace {

//===----------------------------------------------------------------------===//
// Shared scalar math
//===----------------------------------------------------------------------===//

TEST(CudaScalarMath, DecodeFp8EqualsTheCpuTableForEveryCode) {
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(std::bit_cast<uint32_t>(
                  kd::decodeFp8<k::Fp8Format::E4M3FN>(uint8_t(c))),
              std::bit_cast<uint32_t>(
                  k::fp8ToFloat(uint8_t(c), k::Fp8Format::E4M3FN)))
        << "e4m3fn code " << c;
    EXPECT_EQ(
        std::bit_cast<uint32_t>(kd::decodeFp8<k::Fp8Format::E5M2>(uint8_t(c))),
        std::bit_cast<uint32_t>(k::fp8ToFloat(uint8_t(c), k::Fp8Format::E5M2)))
        << "e5m2 code " << c;
  }
}

/// The documented mapping (Kernels.h, stochasticRoundingBits) written out
/// with the public philox4x32_10, against the per-element form the GPU runs.
TEST(CudaScalarMath, PerElementStochasticBitsFollowTheDocumentedMapping) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    uint64_t seed = rng(), tensorId = rng() % 1000;
    int64_t step = int64_t(rng() % 100000) + 1;
    int64_t index = int64_t(rng() >> 2);
    if (trial < 200)
      index = trial; // the first superblocks, every position
    uint64_t key = kd::stochasticRoundingKeyBits(seed, tensorId);
    uint64_t r = uint64_t(index) % 64;
    uint64_t counter = uint64_t(index) / 64 * 8 + r % 8;
    auto words =
        k::philox4x32_10({uint32_t(counter), uint32_t(counter >> 32),
                          uint32_t(step), uint32_t(uint64_t(step) >> 32)},
                         {uint32_t(key), uint32_t(key >> 32)});
    uint32_t want = (words[r / 16] >> (16 * (r / 8 % 2))) & 0xFFFF;
    kd::PhiloxSchedule schedule(uint32_t(key), uint32_t(key >> 32));
    EXPECT_EQ(kd::stochasticBitsOf(schedule, uint64_t(step), uint64_t(index)),
              want);
    EXPECT_EQ(k::stochasticRoundingBits({seed, step, tensorId}, index), want);
  }
}

//===----------------------------------------------------------------------===//
// Index maps
//===----------------------------------------------------------------------===//

struct Box {
  std::vector<int64_t> global, offset, local;
};

std::vector<Box> randomBoxes(int count) {
  std::mt19937 rng(17);
  std::vector<Box> boxes;
  for (int i = 0; i < count; ++i) {
    int rank = 1 + int(rng() % 4);
    Box b;
    for (int d = 0; d < rank; ++d) {
      int64_t g = 1 + int64_t(rng() % 9);
      int64_t o = int64_t(rng() % uint32_t(g + 1));
      int64_t l = int64_t(rng() % uint32_t(g - o + 1));
      if (rng() % 3 == 0) { // whole dims, so that runs merge
        o = 0;
        l = g;
      }
      b.global.push_back(g);
      b.offset.push_back(o);
      b.local.push_back(l);
    }
    boxes.push_back(b);
  }
  return boxes;
}

TEST(CudaIndexMaps, ShardIndexGivesBoxIndexRunsGlobalIndices) {
  for (const Box &b : randomBoxes(3000)) {
    auto runs = k::boxIndexRuns(b.global, b.offset, b.local);
    auto index = cu::shardIndexOf(b.global, b.offset, b.local);
    ASSERT_TRUE(runs.has_value());
    ASSERT_TRUE(index.has_value());
    for (const k::IndexRun &run : *runs)
      for (int64_t j = 0; j < run.length; ++j)
        ASSERT_EQ(cu::globalIndexOf(*index, run.local + j), run.global + j);
  }
  // Scalars, contiguous shards, and what boxIndexRuns refuses.
  auto scalar = cu::shardIndexOf({}, {}, {});
  ASSERT_TRUE(scalar);
  EXPECT_EQ(cu::globalIndexOf(*scalar, 0), 0);
  cu::ShardIndex flat = cu::contiguousShardIndex(1000);
  EXPECT_EQ(cu::globalIndexOf(flat, 0), 1000);
  EXPECT_EQ(cu::globalIndexOf(flat, int64_t(1) << 40),
            1000 + (int64_t(1) << 40));
  std::vector<int64_t> g = {4, 4}, o = {0, 3}, l = {4, 2};
  EXPECT_FALSE(cu::shardIndexOf(g, o, l)); // outside the tensor
  std::vector<int64_t> nine(9, 1);
  EXPECT_FALSE(cu::shardIndexOf(nine, nine, nine)); // beyond kMaxRank
}

TEST(CudaIndexMaps, BoxCopyMapMovesWhatCopyBoxMoves) {
  std::mt19937 rng(23);
  int checked = 0;
  for (const Box &a : randomBoxes(1500)) {
    // A destination box around a region inside `a`'s box.
    size_t rank = a.global.size();
    std::vector<int64_t> off(rank), size(rank), dstOrigin(rank), dstShape(rank);
    for (size_t d = 0; d < rank; ++d) {
      off[d] = a.offset[d] + int64_t(rng() % uint32_t(a.local[d] + 1));
      size[d] =
          int64_t(rng() % uint32_t(a.offset[d] + a.local[d] - off[d] + 1));
      dstOrigin[d] = off[d] - int64_t(rng() % uint32_t(off[d] + 1));
      dstShape[d] = off[d] + size[d] - dstOrigin[d] + int64_t(rng() % 3);
    }
    int64_t srcN = 1, dstN = 1;
    for (size_t d = 0; d < rank; ++d) {
      srcN *= a.local[d];
      dstN *= dstShape[d];
    }
    std::vector<float> src(static_cast<size_t>(srcN));
    for (size_t i = 0; i < src.size(); ++i)
      src[i] = float(i) + 0.5f;
    std::vector<float> want(size_t(dstN), -1.0f), got = want;
    BoxRef s{reinterpret_cast<std::byte *>(src.data()), plan::DType::Float32,
             &a.local, &a.offset};
    BoxRef t{reinterpret_cast<std::byte *>(want.data()), plan::DType::Float32,
             &dstShape, &dstOrigin};
    copyBox(s, t, off, size);
    auto map =
        cu::boxCopyMapOf(a.local, a.offset, dstShape, dstOrigin, off, size);
    ASSERT_TRUE(map.has_value());
    for (int64_t e = 0; e < map->elements; ++e) {
      int64_t from, to;
      cu::boxCopyPositions(*map, e, from, to);
      ASSERT_GE(from, 0);
      ASSERT_LT(from, srcN);
      ASSERT_GE(to, 0);
      ASSERT_LT(to, dstN);
      got[size_t(to)] = src[size_t(from)];
    }
    ASSERT_EQ(got, want);
    ++checked;
  }
  EXPECT_EQ(checked, 1500);
  // A region outside either box is refused, as copyBox's callers check.
  std::vector<int64_t> shape = {4}, origin = {0}, off = {3}, size = {2};
  EXPECT_FALSE(cu::boxCopyMapOf(shape, origin, shape, origin, off, size));
}

//===----------------------------------------------------------------------===//
// NCCL setup
//===----------------------------------------------------------------------===//

/// What ncclCommSplit makes of every rank's (color, key): for each rank, the
/// members of its new communicator in new-rank order (key, then old rank).
std::vector<std::vector<int64_t>>
emulateSplit(const std::vector<nccl::SplitArguments> &args) {
  std::vector<std::vector<int64_t>> groups(args.size());
  for (size_t r = 0; r < args.size(); ++r) {
    std::vector<std::pair<int, int64_t>> members;
    for (size_t q = 0; q < args.size(); ++q)
      if (args[q].color == args[r].color)
        members.push_back({args[q].key, int64_t(q)});
    std::sort(members.begin(), members.end());
    for (auto &[key, rank] : members)
      groups[r].push_back(rank);
  }
  return groups;
}

TEST(CudaNcclSetup, SplitArgumentsOfEveryAxisSubsetRebuildCoresGroups) {
  auto mesh = Mesh::create({{"dp", 2}, {"fsdp", 3}, {"tp", 2}});
  ASSERT_TRUE(mesh) << mesh.error().message;
  int64_t world = 12;
  std::vector<std::vector<std::string>> subsets = {{"dp"},
                                                   {"fsdp"},
                                                   {"tp"},
                                                   {"dp", "fsdp"},
                                                   {"fsdp", "tp"},
                                                   {"dp", "tp"},
                                                   {"dp", "fsdp", "tp"},
                                                   {"tp", "dp"}};
  for (const auto &axes : subsets) {
    std::vector<nccl::SplitArguments> args;
    std::vector<GroupSpec> specs;
    for (int64_t rank = 0; rank < world; ++rank) {
      auto g = plan::deriveGroup(*mesh, axes, rank);
      ASSERT_TRUE(g) << g.error().message;
      GroupSpec spec{"comm", g->color, g->ranks, g->key, 0};
      auto a = nccl::splitArgumentsOf(spec, rank, world);
      ASSERT_TRUE(a) << a.error().message;
      EXPECT_EQ(a->size, int(g->ranks.size()));
      args.push_back(*a);
      specs.push_back(spec);
    }
    auto split = emulateSplit(args);
    for (int64_t rank = 0; rank < world; ++rank) {
      EXPECT_EQ(split[size_t(rank)], specs[size_t(rank)].ranks)
          << "axes " << axes[0] << "... rank " << rank;
      // This rank's new rank is its key.
      auto at = std::find(split[size_t(rank)].begin(),
                          split[size_t(rank)].end(), rank);
      EXPECT_EQ(at - split[size_t(rank)].begin(), specs[size_t(rank)].key);
    }
  }
}

TEST(CudaNcclSetup, SplitArgumentsRefuseWhatNcclCannotDo) {
  auto expectError = [](GroupSpec g, int64_t rank, int64_t world,
                        const std::string &words) {
    auto a = nccl::splitArgumentsOf(g, rank, world);
    ASSERT_FALSE(a);
    EXPECT_NE(a.error().message.find(words), std::string::npos)
        << a.error().message;
    EXPECT_NE(a.error().message.find("communicator \"" + g.id + "\""),
              std::string::npos);
  };
  expectError({"c", 0, {}, 0, 0}, 0, 4, "no members");
  expectError({"c", 0, {0, 5}, 0, 0}, 0, 4, "not a rank");
  expectError({"c", 0, {0, 0}, 0, 0}, 0, 4, "twice");
  expectError({"c", 0, {0, 1}, 2, 0}, 0, 4, "not a member index");
  expectError({"c", 0, {0, 1}, 1, 0}, 0, 4, "not this rank 0");
  expectError({"c", -1, {0, 1}, 0, 0}, 0, 4, "color -1");
  expectError({"c", int64_t(1) << 33, {0, 1}, 0, 0}, 0, 4, "does not fit");
  expectError({"c", 0, {0, 1, 2}, 0, 0}, 0, 2, "more members");
  auto ok = nccl::splitArgumentsOf({"c", 7, {3, 7, 1}, 2, 0}, 1, 8);
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, (nccl::SplitArguments{7, 2, 3}));
}

TEST(CudaNcclSetup, SplitsAreMadeLazilyInTheDeclaredOrder) {
  std::vector<GroupSpec> declared = {{"a", 0, {0}, 0, 0},
                                     {"b", 1, {0}, 0, 0},
                                     {"c", 0, {0}, 0, 0},
                                     {"b", 2, {0}, 0, 0}};
  std::vector<bool> split(4, false);
  auto order = nccl::splitSchedule(declared, split, {"c", 0, {0}, 0, 0});
  ASSERT_TRUE(order);
  EXPECT_EQ(*order, (std::vector<size_t>{0, 1, 2}));
  split = {true, true, true, false};
  order = nccl::splitSchedule(declared, split, {"b", 2, {0}, 0, 0});
  ASSERT_TRUE(order);
  EXPECT_EQ(*order, (std::vector<size_t>{3}));
  order = nccl::splitSchedule(declared, split, {"a", 0, {0}, 0, 0});
  ASSERT_TRUE(order);
  EXPECT_TRUE(order->empty()); // made already
  // Another color, or another epoch, is another group.
  auto missing = nccl::splitSchedule(declared, split, {"b", 3, {0}, 0, 0});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("was not declared"),
            std::string::npos);
  EXPECT_FALSE(nccl::splitSchedule(declared, split, {"a", 0, {0}, 0, 1}));
}

TEST(CudaNcclSetup, DeclarationFingerprintsCompareIdsAndEpochsInOrder) {
  std::vector<GroupSpec> a = {{"comm_dp", 0, {0, 4}, 0, 0},
                              {"comm_fsdp", 0, {0, 1}, 0, 0}};
  // Another rank: other colors, keys and members, same ids.
  std::vector<GroupSpec> b = {{"comm_dp", 3, {3, 7}, 1, 0},
                              {"comm_fsdp", 6, {6, 7}, 1, 0}};
  EXPECT_EQ(nccl::declarationFingerprint(a), nccl::declarationFingerprint(b));
  std::vector<GroupSpec> swapped = {a[1], a[0]};
  EXPECT_NE(nccl::declarationFingerprint(a),
            nccl::declarationFingerprint(swapped));
  std::vector<GroupSpec> epoch = a;
  epoch[1].epoch = 1;
  EXPECT_NE(nccl::declarationFingerprint(a),
            nccl::declarationFingerprint(epoch));
  std::vector<GroupSpec> fewer = {a[0]};
  EXPECT_NE(nccl::declarationFingerprint(a),
            nccl::declarationFingerprint(fewer));
  // Ids are delimited: "ab" + "c" is not "a" + "bc".
  std::vector<GroupSpec> x = {{"ab", 0, {0}, 0, 0}, {"c", 0, {0}, 0, 0}};
  std::vector<GroupSpec> y = {{"a", 0, {0}, 0, 0}, {"bc", 0, {0}, 0, 0}};
  EXPECT_NE(nccl::declarationFingerprint(x), nccl::declarationFingerprint(y));
}

/// A fresh directory for a FileStore, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "meshplan-cuda-XXXXXX")
            .string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::unique_ptr<Backend> fileStoreBackend(const TempDir &dir, int64_t rank,
                                          int64_t world,
                                          std::chrono::milliseconds timeout) {
  BackendOptions o;
  o.store.kind = StoreAddress::Kind::File;
  o.store.path = dir.path.string();
  o.rank = rank;
  o.worldSize = world;
  o.timeout = timeout;
  o.job = "cuda-host-test";
  auto b = createGlooBackend(o);
  EXPECT_TRUE(b) << b.error().message;
  return b ? std::move(*b) : nullptr;
}

TEST(CudaNcclSetup, UniqueIdTravelsThroughARealFileStore) {
  TempDir dir;
  const size_t bytes = 128; // NCCL_UNIQUE_ID_BYTES
  std::vector<char> id(bytes);
  for (size_t i = 0; i < bytes; ++i)
    id[i] = char(i * 37 + 1);
  std::string key = nccl::uniqueIdKey(0);
  std::vector<Result<std::vector<char>>> received;
  std::vector<std::thread> readers;
  received.reserve(3);
  for (int64_t rank = 1; rank <= 3; ++rank)
    received.push_back(makeError("not run"));
  for (int64_t rank = 1; rank <= 3; ++rank)
    readers.emplace_back([&, rank] {
      auto store = fileStoreBackend(dir, rank, 4, std::chrono::seconds(20));
      received[size_t(rank - 1)] = nccl::exchangeUniqueId(
          *store, rank, key, bytes, []() -> Result<std::vector<char>> {
            ADD_FAILURE() << "only rank 0 generates the id";
            return makeError("no");
          });
    });
  // Rank 0 posts after the readers started waiting.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto store0 = fileStoreBackend(dir, 0, 4, std::chrono::seconds(20));
  int generated = 0;
  auto mine = nccl::exchangeUniqueId(*store0, 0, key, bytes,
                                     [&]() -> Result<std::vector<char>> {
                                       ++generated;
                                       return id;
                                     });
  for (std::thread &t : readers)
    t.join();
  ASSERT_TRUE(mine) << mine.error().message;
  EXPECT_EQ(*mine, id);
  EXPECT_EQ(generated, 1);
  for (auto &r : received) {
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(*r, id);
  }
}

TEST(CudaNcclSetup, UniqueIdFailuresSayWhoWaitedForWhat) {
  TempDir dir;
  std::string key = nccl::uniqueIdKey(3);
  EXPECT_EQ(key, "nccl/e3/world-unique-id");
  // Rank 0 never comes: rank 2 gives up after the store's timeout.
  auto store2 = fileStoreBackend(dir, 2, 4, std::chrono::milliseconds(300));
  auto late = nccl::exchangeUniqueId(*store2, 2, key, 128, [] {
    return Result<std::vector<char>>(std::vector<char>(128));
  });
  ASSERT_FALSE(late);
  EXPECT_NE(
      late.error().message.find("rank 2: waiting for rank 0's NCCL unique id"),
      std::string::npos)
      << late.error().message;
  // Rank 0's generator fails, or makes an id of the wrong size.
  auto store0 = fileStoreBackend(dir, 0, 4, std::chrono::milliseconds(300));
  auto failed = nccl::exchangeUniqueId(*store0, 0, key, 128, [] {
    return Result<std::vector<char>>(makeError("ncclGetUniqueId: boom"));
  });
  ASSERT_FALSE(failed);
  EXPECT_NE(failed.error().message.find("boom"), std::string::npos);
  auto shortId = nccl::exchangeUniqueId(*store0, 0, key, 128, [] {
    return Result<std::vector<char>>(std::vector<char>(5));
  });
  ASSERT_FALSE(shortId);
  EXPECT_NE(shortId.error().message.find("5 bytes"), std::string::npos);
  // A value of the wrong size in the store (another job's key).
  ASSERT_TRUE(
      store0->storeSet("nccl/e9/world-unique-id", std::vector<char>(7)));
  auto stale =
      nccl::exchangeUniqueId(*store2, 2, "nccl/e9/world-unique-id", 128, [] {
        return Result<std::vector<char>>(std::vector<char>(128));
      });
  ASSERT_FALSE(stale);
  EXPECT_NE(stale.error().message.find("has 7 bytes, expected 128"),
            std::string::npos);
}

TEST(CudaNcclSetup, LocalRankSelectsTheDevice) {
  auto d = nccl::deviceOfLocalRank(3, 8);
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, 3);
  auto none = nccl::deviceOfLocalRank(0, 0);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("no CUDA device"), std::string::npos);
  auto beyond = nccl::deviceOfLocalRank(2, 2);
  ASSERT_FALSE(beyond);
  EXPECT_NE(beyond.error().message.find("LOCAL_RANK=2"), std::string::npos);
}

TEST(CudaNcclSetup, WithoutADeviceTheBackendSaysWhy) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
    GTEST_SKIP() << "this machine has a CUDA device (runtime.cuda.nccl "
                    "tests the backend on it)";
  TempDir dir;
  BackendOptions o;
  o.store.kind = StoreAddress::Kind::File;
  o.store.path = dir.path.string();
  auto backend = createNcclBackend(o);
  ASSERT_FALSE(backend);
  // No driver: the CUDA runtime's reason; a driver without devices: none
  // visible.
  EXPECT_NE(backend.error().message.find("CUDA device"), std::string::npos)
      << backend.error().message;
  EXPECT_TRUE(buildHasCudaBackend());
}

TEST(CudaNcclSetup, HostBackendsRefuseStreams) {
  TempDir dir;
  auto store = fileStoreBackend(dir, 0, 1, std::chrono::seconds(5));
  EXPECT_EQ(store->memoryKind(), MemoryKind::Host);
  ASSERT_TRUE(store->declareGroups({{"solo", 0, {0}, 0, 0}}));
  auto comm = store->createCommunicator({"solo", 0, {0}, 0, 0});
  ASSERT_TRUE(comm) << comm.error().message;
  EXPECT_EQ((*comm)->memoryKind(), MemoryKind::Host);
  EXPECT_TRUE((*comm)->synchronize());
  auto refused = (*comm)->setStream({});
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("host memory"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Device memory
//===----------------------------------------------------------------------===//

/// A raw allocator on host memory that counts its calls.
class CountingAllocator final : public RawDeviceAllocator {
public:
  Result<void *> allocate(size_t bytes) override {
    ++allocations;
    lastBytes = bytes;
    return std::malloc(bytes);
  }
  void release(void *p) override {
    ++releases;
    std::free(p);
  }
  int allocations = 0, releases = 0;
  size_t lastBytes = 0;
};

plan::Buffer buffer(std::string id, plan::BufferKind kind,
                    std::vector<int64_t> shape) {
  plan::Buffer b;
  b.id = std::move(id);
  b.kind = kind;
  b.dtype = plan::DType::Float32;
  b.globalShape = shape;
  b.localShape = shape;
  b.offset.assign(shape.size(), 0);
  return b;
}

plan::Instruction instruction(std::string id, std::string stream,
                              plan::OpKind op, std::vector<std::string> in,
                              std::vector<std::string> out,
                              std::vector<std::string> deps = {}) {
  plan::Instruction i;
  i.id = std::move(id);
  i.stream = std::move(stream);
  i.op = op;
  i.inputs = std::move(in);
  i.outputs = std::move(out);
  i.deps = std::move(deps);
  return i;
}

bool overlap(const DeviceMemoryPlan &m, size_t a, size_t b) {
  return m.bytes[a] > 0 && m.bytes[b] > 0 &&
         m.offsets[a] < m.offsets[b] + m.bytes[b] &&
         m.offsets[b] < m.offsets[a] + m.bytes[a];
}

using plan::BufferKind;
using plan::OpKind;

TEST(CudaDeviceMemory, BuffersShareBytesOnlyWhenAFreeHappensBefore) {
  plan::Plan p;
  p.streams = {"compute", "comm"};
  p.buffers = {buffer("w", BufferKind::ParamShard, {1000}),
               buffer("a", BufferKind::Gathered, {4000}),
               buffer("b", BufferKind::Gathered, {4000}),
               buffer("c", BufferKind::Gathered, {4000})};
  // a is written and freed on compute; b is written on comm with no order
  // against a's free (may be live together); c is written after a dep on
  // a's free (may reuse a's bytes).
  p.program = {instruction("i0", "compute", OpKind::Compute, {"w"}, {"a"}),
               instruction("i1", "compute", OpKind::Free, {"a"}, {}),
               instruction("i2", "comm", OpKind::Cast, {"w"}, {"b"}),
               instruction("i3", "comm", OpKind::Free, {"b"}, {}),
               instruction("i4", "comm", OpKind::Cast, {"w"}, {"c"}, {"i1"}),
               instruction("i5", "comm", OpKind::Free, {"c"}, {})};
  auto m = planDeviceMemory(p);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(m->persistent[0]);
  EXPECT_FALSE(m->persistent[1]);
  EXPECT_FALSE(overlap(*m, 0, 1));
  EXPECT_FALSE(overlap(*m, 1, 2)); // a and b: no order between them
  EXPECT_TRUE(overlap(*m, 1, 3) || overlap(*m, 2, 3)); // c reuses a or b
  EXPECT_EQ(m->totalBytes, 4000 + 3 * 16000);
  EXPECT_EQ(m->arenaBytes, 4096 + 2 * 16128); // 256-byte aligned
  // Without the dep, c follows b's free on its stream: it may still reuse
  // b's bytes, never a's.
  p.program[4].deps.clear();
  m = planDeviceMemory(p);
  ASSERT_TRUE(m);
  EXPECT_FALSE(overlap(*m, 1, 3));
  EXPECT_TRUE(overlap(*m, 2, 3));
  // On a stream of its own, with no order against either: three ranges.
  p.streams.push_back("third");
  p.program[4].stream = "third";
  p.program[5].stream = "third";
  m = planDeviceMemory(p);
  ASSERT_TRUE(m);
  EXPECT_FALSE(overlap(*m, 1, 3) || overlap(*m, 2, 3));
  EXPECT_EQ(m->arenaBytes, 4096 + 3 * 16128);
  // A buffer the step never frees lives on into the next step: persistent.
  p.program.pop_back();
  m = planDeviceMemory(p);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->persistent[3]);
}

TEST(CudaDeviceMemory, ABufferFreedAndWrittenAgainKeepsOneAddress) {
  // FSDP's gathered weights: gathered for forward, freed, gathered again for
  // backward. x and y alternate on one stream; each may share the other's
  // bytes, as each segment's free precedes the other's next segment.
  plan::Plan p;
  p.streams = {"s"};
  p.buffers = {buffer("w", BufferKind::ParamShard, {64}),
               buffer("x", BufferKind::Gathered, {1024}),
               buffer("y", BufferKind::Gathered, {1024})};
  p.program = {instruction("i0", "s", OpKind::Cast, {"w"}, {"x"}),
               instruction("i1", "s", OpKind::Free, {"x"}, {}),
               instruction("i2", "s", OpKind::Cast, {"w"}, {"y"}),
               instruction("i3", "s", OpKind::Free, {"y"}, {}),
               instruction("i4", "s", OpKind::Cast, {"w"}, {"x"}),
               instruction("i5", "s", OpKind::Free, {"x"}, {})};
  auto m = planDeviceMemory(p);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(overlap(*m, 1, 2));
  EXPECT_EQ(m->arenaBytes, 256 + 4096);
  // y's second life overlapping x's second life: they must not share.
  p.program = {instruction("i0", "s", OpKind::Cast, {"w"}, {"x"}),
               instruction("i1", "s", OpKind::Free, {"x"}, {}),
               instruction("i2", "s", OpKind::Cast, {"w"}, {"y"}),
               instruction("i3", "s", OpKind::Free, {"y"}, {}),
               instruction("i4", "s", OpKind::Cast, {"w"}, {"x"}),
               instruction("i5", "s", OpKind::Cast, {"x"}, {"y"}),
               instruction("i6", "s", OpKind::Free, {"x"}, {}),
               instruction("i7", "s", OpKind::Free, {"y"}, {})};
  m = planDeviceMemory(p);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_FALSE(overlap(*m, 1, 2));
}

TEST(CudaDeviceMemory, CollectivesOfACommunicatorAreOrdered) {
  // Two streams with no deps, but the collectives of one communicator run
  // in program order: the second one's output may reuse the first's input
  // once the first's input is freed before it.
  plan::Plan p;
  p.streams = {"ag", "rs"};
  p.buffers = {buffer("w", BufferKind::ParamShard, {64}),
               buffer("in", BufferKind::Scratch, {512}),
               buffer("out", BufferKind::Scratch, {512})};
  auto c1 = instruction("i0", "ag", OpKind::AllGather, {"w"}, {"in"});
  c1.comm = "fsdp";
  auto f = instruction("i1", "ag", OpKind::Free, {"in"}, {});
  auto c2 = instruction("i2", "ag", OpKind::AllReduce, {"w"}, {"w"});
  c2.comm = "fsdp";
  auto c3 = instruction("i3", "rs", OpKind::ReduceScatter, {"w"}, {"out"});
  c3.comm = "fsdp";
  auto f2 = instruction("i4", "rs", OpKind::Free, {"out"}, {});
  p.program = {c1, f, c2, c3, f2};
  auto m = planDeviceMemory(p);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_TRUE(overlap(*m, 1, 2));
  // On two communicators there is no such order.
  p.program[3].comm = "dp";
  m = planDeviceMemory(p);
  ASSERT_TRUE(m);
  EXPECT_FALSE(overlap(*m, 1, 2));
}

TEST(CudaDeviceMemory, BadPlansAreErrors) {
  plan::Plan p;
  p.streams = {"s"};
  p.buffers = {buffer("a", BufferKind::Scratch, {4})};
  p.program = {instruction("i0", "s", OpKind::Cast, {"a"}, {"zz"})};
  auto m = planDeviceMemory(p);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message.find("unknown buffer \"zz\""), std::string::npos);
  p.program = {instruction("i0", "s", OpKind::Cast, {"a"}, {"a"}, {"i9"})};
  ASSERT_FALSE(planDeviceMemory(p));
  EXPECT_FALSE(planDeviceMemory(p, 48)); // not a power of two
}

TEST(CudaDeviceMemory, TheArenaIsOneAllocation) {
  plan::Plan p;
  p.streams = {"s"};
  p.buffers = {buffer("w", BufferKind::ParamShard, {100}),
               buffer("g", BufferKind::Gathered, {300}),
               buffer("e", BufferKind::Scratch, {0})};
  p.program = {instruction("i0", "s", OpKind::Cast, {"w"}, {"g"}),
               instruction("i1", "s", OpKind::Free, {"g"}, {})};
  auto m = planDeviceMemory(p);
  ASSERT_TRUE(m);
  auto raw = std::make_shared<CountingAllocator>();
  {
    auto arena = DeviceArena::create(*m, raw);
    ASSERT_TRUE(arena) << arena.error().message;
    EXPECT_EQ(raw->allocations, 1);
    EXPECT_EQ(raw->lastBytes, size_t(m->arenaBytes));
    std::byte *w = (*arena)->address(0), *g = (*arena)->address(1);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(g - w, m->offsets[1] - m->offsets[0]);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(g) % 256,
              reinterpret_cast<uintptr_t>(w) % 256);
    EXPECT_EQ((*arena)->address(2), nullptr); // empty
    EXPECT_EQ((*arena)->address(99), nullptr);
  }
  EXPECT_EQ(raw->releases, 1);
}

/// The plan of an example spec (written by `meshplan plan` in a ctest
/// fixture, MESHPLAN_TEST_PLAN): placed without conflicts in program order,
/// at least its program-order peak, and smaller than one allocation per
/// buffer.
TEST(CudaDeviceMemory, APlannedExampleFitsWithoutConflicts) {
  const char *path = std::getenv("MESHPLAN_TEST_PLAN");
  if (!path || !*path)
    GTEST_SKIP() << "MESHPLAN_TEST_PLAN is not set (ctest sets it)";
  auto p = plan::readPlanFile(path);
  ASSERT_TRUE(p) << p.error().message;
  auto m = planDeviceMemory(*p);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_GE(m->arenaBytes, m->programOrderPeakBytes);
  EXPECT_LT(m->arenaBytes, m->totalBytes);
  // Replay the program: buffers live at the same point never overlap.
  std::map<std::string, size_t> index;
  for (size_t b = 0; b < p->buffers.size(); ++b)
    index[p->buffers[b].id] = b;
  std::vector<bool> live(p->buffers.size(), false);
  for (size_t b = 0; b < live.size(); ++b)
    live[b] = m->persistent[b];
  for (const plan::Instruction &in : p->program) {
    for (const auto *list : {&in.inputs, &in.outputs})
      for (const std::string &id : *list)
        live[index.at(id)] = in.op != OpKind::Free;
    for (size_t a = 0; a < live.size(); ++a)
      for (size_t b = a + 1; b < live.size(); ++b)
        if (live[a] && live[b]) {
          ASSERT_FALSE(overlap(*m, a, b))
              << p->buffers[a].id << " and " << p->buffers[b].id
              << " are live together at " << in.id;
        }
  }
  std::printf("plan %s: %zu buffers, %lld bytes in all, arena %lld bytes, "
              "program-order peak %lld bytes\n",
              path, p->buffers.size(), (long long)m->totalBytes,
              (long long)m->arenaBytes, (long long)m->programOrderPeakBytes);
}

//===----------------------------------------------------------------------===//
// Streams and events
//===----------------------------------------------------------------------===//

/// Independent check: with the graph's waits as the only cross-stream
/// edges, every dep and every communicator order of the plan is reachable.
void expectEveryOrderingKept(const plan::Plan &p, const StreamGraph &g) {
  size_t n = p.program.size();
  std::vector<std::vector<size_t>> preds(n);
  std::map<int, size_t> lastOnStream;
  for (size_t i = 0; i < n; ++i) {
    if (auto it = lastOnStream.find(g.steps[i].stream);
        it != lastOnStream.end())
      preds[i].push_back(it->second);
    lastOnStream[g.steps[i].stream] = i;
    for (int e : g.steps[i].waits) {
      size_t after = g.eventAfter[size_t(e)];
      ASSERT_LT(after, i) << "a wait on an event not yet recorded";
      ASSERT_EQ(g.steps[after].record, e);
      preds[i].push_back(after);
    }
  }
  // before[i]: every instruction that completes before i starts.
  std::vector<std::vector<bool>> before(n, std::vector<bool>(n, false));
  for (size_t i = 0; i < n; ++i)
    for (size_t q : preds[i]) {
      before[i][q] = true;
      for (size_t r = 0; r < n; ++r)
        if (before[q][r])
          before[i][r] = true;
    }
  std::map<std::string, size_t> position;
  std::map<std::string, size_t> lastOfComm;
  for (size_t i = 0; i < n; ++i) {
    const plan::Instruction &in = p.program[i];
    for (const std::string &d : in.deps)
      EXPECT_TRUE(before[i][position.at(d)])
          << in.id << " may start before its dep " << d;
    if (plan::isCollective(in.op)) {
      if (lastOfComm.count(in.comm)) {
        EXPECT_TRUE(before[i][lastOfComm[in.comm]])
            << in.id << " may overtake the previous collective on " << in.comm;
      }
      lastOfComm[in.comm] = i;
    }
    position[in.id] = i;
  }
}

TEST(CudaStreamGraph, DepsBecomeEventsAndImpliedWaitsAreDropped) {
  plan::Plan p;
  p.streams = {"compute", "ag", "rs"};
  p.buffers = {buffer("w", BufferKind::ParamShard, {8})};
  p.program = {
      instruction("i0", "compute", OpKind::Compute, {"w"}, {}),
      instruction("i1", "ag", OpKind::Cast, {"w"}, {}, {"i0"}),
      instruction("i2", "compute", OpKind::Compute, {"w"}, {}),
      // Depends on i1 and i0; i1 already implies i0.
      instruction("i3", "rs", OpKind::Cast, {"w"}, {}, {"i1", "i0"}),
      // i2 is not implied by anything rs waited for.
      instruction("i4", "rs", OpKind::Cast, {"w"}, {}, {"i2"}),
      // Same stream: no event.
      instruction("i5", "rs", OpKind::Cast, {"w"}, {}, {"i3"}),
      // compute waits for i5, which implies i1 and i3 (and i0, i2).
      instruction("i6", "compute", OpKind::Compute, {"w"}, {}, {"i5", "i1"})};
  auto g = buildStreamGraph(p);
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_EQ(g->steps[1].waits.size(), 1u);
  EXPECT_EQ(g->eventAfter[size_t(g->steps[1].waits[0])], 0u);
  ASSERT_EQ(g->steps[3].waits.size(), 1u);
  EXPECT_EQ(g->eventAfter[size_t(g->steps[3].waits[0])], 1u);
  ASSERT_EQ(g->steps[4].waits.size(), 1u);
  EXPECT_EQ(g->eventAfter[size_t(g->steps[4].waits[0])], 2u);
  EXPECT_TRUE(g->steps[5].waits.empty());
  ASSERT_EQ(g->steps[6].waits.size(), 1u);
  EXPECT_EQ(g->eventAfter[size_t(g->steps[6].waits[0])], 5u);
  EXPECT_EQ(g->crossStreamOrderings, 6);
  EXPECT_EQ(g->waits, 4);
  EXPECT_EQ(g->steps[3].record, -1); // nobody waits on i3
  expectEveryOrderingKept(p, *g);
}

TEST(CudaStreamGraph, ACommunicatorsCollectivesStayInOrderAcrossStreams) {
  plan::Plan p;
  p.streams = {"ag", "rs"};
  p.buffers = {buffer("w", BufferKind::ParamShard, {8})};
  auto c0 = instruction("i0", "ag", OpKind::AllGather, {"w"}, {"w"});
  auto c1 = instruction("i1", "rs", OpKind::ReduceScatter, {"w"}, {"w"});
  auto c2 = instruction("i2", "rs", OpKind::ReduceScatter, {"w"}, {"w"});
  c0.comm = c1.comm = "fsdp";
  c2.comm = "dp";
  p.program = {c0, c1, c2};
  auto g = buildStreamGraph(p);
  ASSERT_TRUE(g);
  ASSERT_EQ(g->steps[1].waits.size(), 1u);
  EXPECT_EQ(g->eventAfter[size_t(g->steps[1].waits[0])], 0u);
  EXPECT_TRUE(g->steps[2].waits.empty());
  expectEveryOrderingKept(p, *g);
  // Bad plans: an unknown stream, a dep on a later instruction.
  p.program[2].stream = "nowhere";
  EXPECT_FALSE(buildStreamGraph(p));
  p.program[2].stream = "rs";
  p.program[0].deps = {"i2"};
  auto bad = buildStreamGraph(p);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("not an earlier instruction"),
            std::string::npos);
}

TEST(CudaStreamGraph, APlannedExampleKeepsEveryOrdering) {
  const char *path = std::getenv("MESHPLAN_TEST_PLAN");
  if (!path || !*path)
    GTEST_SKIP() << "MESHPLAN_TEST_PLAN is not set (ctest sets it)";
  auto p = plan::readPlanFile(path);
  ASSERT_TRUE(p) << p.error().message;
  auto g = buildStreamGraph(*p);
  ASSERT_TRUE(g) << g.error().message;
  expectEveryOrderingKept(*p, *g);
  EXPECT_LE(g->waits, g->crossStreamOrderings);
  std::printf("plan %s: %zu instructions on %zu streams, %lld cross-stream "
              "orderings, %lld waits, %zu events\n",
              path, p->program.size(), p->streams.size(),
              (long long)g->crossStreamOrderings, (long long)g->waits,
              g->eventAfter.size());
}

} // namespace
