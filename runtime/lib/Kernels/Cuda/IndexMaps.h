//===- IndexMaps.h - Element index maps of the CUDA kernels -----*- C++ -*-===//
//
// Where element i of a kernel's iteration space lives: its global index in a
// sharded tensor (stochastic rounding) and its positions in the source and
// destination boxes of a box copy (pack/unpack of padded shards). The maps are
// built on the host, passed to kernels by value (no index table in device
// memory) and evaluated per element by __host__ __device__ functions, so the
// host unit tests check the very functions the kernels run against the CPU's
// boxIndexRuns and copyBox without a GPU.
//
// Both builders merge trailing dimensions that the box spans whole into one
// run, as the CPU does, so a row shard is one run and the per-element cost is
// one division per cut outer dimension.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_KERNELS_CUDA_INDEXMAPS_H
#define MESHPLAN_RUNTIME_KERNELS_CUDA_INDEXMAPS_H

#include "../ScalarMath.h"

#include <cstdint>
#include <optional>
#include <span>

namespace meshplan::runtime::cuda {

constexpr int kMaxRank = 8;

/// The global row-major indices of a shard stored packed: local element i is
/// element i % runLength of run r = i / runLength, and run r's global start
/// is base + sum over the outer dimensions of (r's index there) * stride.
struct ShardIndex {
  int64_t runLength = 1;
  int64_t base = 0;
  int outerRank = 0;
  int64_t outerExtent[kMaxRank] = {};
  int64_t outerStride[kMaxRank] = {};
};

/// The ShardIndex of the box [offset, offset + localShape) of a row-major
/// tensor of globalShape (the mapping kernels::boxIndexRuns gives as runs);
/// nullopt when boxIndexRuns would refuse it or the tensor has more than
/// kMaxRank dimensions.
std::optional<ShardIndex> shardIndexOf(std::span<const int64_t> globalShape,
                                       std::span<const int64_t> offset,
                                       std::span<const int64_t> localShape);
/// A contiguous shard: local i holds global start + i.
ShardIndex contiguousShardIndex(int64_t globalStart);

MESHPLAN_HD int64_t globalIndexOf(const ShardIndex &s, int64_t i) {
  // One run (a contiguous shard): no division, which is a slow software
  // routine for 64-bit operands on the GPU.
  if (s.outerRank == 0)
    return s.base + i;
  int64_t run = i / s.runLength;
  int64_t global = s.base + (i - run * s.runLength);
  for (int d = s.outerRank - 1; d >= 0; --d) {
    int64_t extent = s.outerExtent[d];
    int64_t q = run / extent;
    global += (run - q * extent) * s.outerStride[d];
    run = q;
  }
  return global;
}

/// A region copy between two packed boxes: element e of the region is
/// element e % rowLength of row e / rowLength; a row's start in each box is
/// its base plus the sum over the outer dimensions of index * stride.
struct BoxCopyMap {
  int64_t elements = 0;
  int64_t rowLength = 1;
  int64_t srcBase = 0, dstBase = 0;
  int outerRank = 0;
  int64_t outerExtent[kMaxRank] = {};
  int64_t srcStride[kMaxRank] = {};
  int64_t dstStride[kMaxRank] = {};
};

/// The map that copies the global region [offset, offset + size) from the box
/// (srcOrigin, srcShape) to the box (dstOrigin, dstShape); nullopt when the
/// ranks differ, exceed kMaxRank, or the region is not inside both boxes.
/// An empty region gives elements == 0.
std::optional<BoxCopyMap> boxCopyMapOf(std::span<const int64_t> srcShape,
                                       std::span<const int64_t> srcOrigin,
                                       std::span<const int64_t> dstShape,
                                       std::span<const int64_t> dstOrigin,
                                       std::span<const int64_t> offset,
                                       std::span<const int64_t> size);

/// Element e's positions (in elements) in the source and destination boxes.
MESHPLAN_HD void boxCopyPositions(const BoxCopyMap &m, int64_t e, int64_t &src,
                                  int64_t &dst) {
  int64_t row = e / m.rowLength;
  int64_t within = e - row * m.rowLength;
  src = m.srcBase + within;
  dst = m.dstBase + within;
  for (int d = m.outerRank - 1; d >= 0; --d) {
    int64_t extent = m.outerExtent[d];
    int64_t q = row / extent;
    int64_t index = row - q * extent;
    src += index * m.srcStride[d];
    dst += index * m.dstStride[d];
    row = q;
  }
}

} // namespace meshplan::runtime::cuda

#endif // MESHPLAN_RUNTIME_KERNELS_CUDA_INDEXMAPS_H
