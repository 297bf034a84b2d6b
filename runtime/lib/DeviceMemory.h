//===- DeviceMemory.h - The plan's device memory, sized once ----*- C++ -*-===//
//
// The CUDA executor's buffers come from one arena of device memory allocated
// when the session opens, sized from the plan: every buffer gets a fixed
// offset for the whole session, buffers whose lives never overlap share
// bytes, and a step allocates nothing (no cudaMalloc, whose implicit device
// synchronization would serialize the streams; no fragmentation over a long
// run). A plan's `free` returns a buffer's bytes to the arena in the sense
// that later buffers were placed on them; it costs nothing at run time.
//
// Two buffers may share bytes only when the executor cannot have both live
// at once on any schedule it may run: the plan's streams run concurrently,
// so program order alone proves nothing. Lives are ordered by the plan's
// happens-before relation: program order within a stream, `deps`, and the
// order of each communicator's collectives (the executor issues those in
// program order). X's bytes may serve Y when a `free` of X happens before
// every instruction that touches Y in one of Y's live segments, for every
// pair of segments (a buffer freed and written again has several).
//
// The raw allocation is behind RawDeviceAllocator so that the sizing is
// unit-tested on machines without a GPU; the CUDA build provides
// cudaDeviceAllocator() (cudaMalloc / cudaFree). Nothing here names a CUDA
// type.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_LIB_DEVICEMEMORY_H
#define MESHPLAN_RUNTIME_LIB_DEVICEMEMORY_H

#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace meshplan::runtime {

/// The happens-before relation of a plan's instructions (see above), as a
/// reachability bitset per instruction.
class HappensBefore {
public:
  /// Fails on an unknown dep or stream, or a cycle.
  static Result<HappensBefore> of(const plan::Plan &plan);
  /// True when instruction a completes before instruction b starts on every
  /// schedule (a != b).
  bool before(size_t a, size_t b) const {
    return (reach[a][b / 64] >> (b % 64)) & 1;
  }
  /// True when a happens before every instruction of `set` (a bitset over
  /// instructions, as words()).
  bool beforeAll(size_t a, const std::vector<uint64_t> &set) const;
  size_t words() const { return wordCount; }

private:
  std::vector<std::vector<uint64_t>> reach;
  size_t wordCount = 0;
};

/// Where each buffer of a plan lives in the arena.
struct DeviceMemoryPlan {
  /// Bytes each buffer of plan.buffers needs (dtype x local shape).
  std::vector<int64_t> bytes;
  /// Its offset in the arena (a multiple of the alignment).
  std::vector<int64_t> offsets;
  /// Buffers live for the whole session (parameter shards, optimizer state,
  /// and any buffer the step does not free): never shared.
  std::vector<bool> persistent;
  /// The arena's size: the largest offset + bytes.
  int64_t arenaBytes = 0;
  /// The sum of all buffers' bytes (what one allocation per buffer would
  /// take) and the largest sum of live bytes in program order (a lower bound
  /// on any arena for this plan), for reports and tests.
  int64_t totalBytes = 0;
  int64_t programOrderPeakBytes = 0;
};

/// Places every buffer of `plan` (see above). `alignment` is a power of two
/// (256: what cudaMalloc guarantees, enough for any vector access).
Result<DeviceMemoryPlan> planDeviceMemory(const plan::Plan &plan,
                                          int64_t alignment = 256);

/// Where the arena's bytes come from.
class RawDeviceAllocator {
public:
  virtual ~RawDeviceAllocator();
  virtual Result<void *> allocate(size_t bytes) = 0;
  virtual void release(void *pointer) = 0;
};

/// cudaMalloc / cudaFree on the current device (MeshplanRuntimeNccl, CUDA
/// builds only).
std::shared_ptr<RawDeviceAllocator> cudaDeviceAllocator();

/// The session's device memory: one allocation of plan.arenaBytes, and each
/// buffer's address in it.
class DeviceArena {
public:
  static Result<std::unique_ptr<DeviceArena>>
  create(DeviceMemoryPlan plan, std::shared_ptr<RawDeviceAllocator> raw);
  ~DeviceArena();
  DeviceArena(const DeviceArena &) = delete;
  DeviceArena &operator=(const DeviceArena &) = delete;

  /// Buffer `index`'s bytes (plan.buffers order); null for an empty buffer.
  std::byte *address(size_t index) const;
  const DeviceMemoryPlan &layout() const { return memory; }

private:
  DeviceArena(DeviceMemoryPlan plan, std::shared_ptr<RawDeviceAllocator> raw,
              std::byte *base)
      : memory(std::move(plan)), raw(std::move(raw)), base(base) {}
  DeviceMemoryPlan memory;
  std::shared_ptr<RawDeviceAllocator> raw;
  std::byte *base = nullptr;
};

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_LIB_DEVICEMEMORY_H
