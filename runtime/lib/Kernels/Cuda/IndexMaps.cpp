//===- IndexMaps.cpp - Building the CUDA kernels' index maps --------------===//
//
// Host code (compiled by the C++ compiler, no CUDA needed), unit-tested
// against the CPU's boxIndexRuns and copyBox.
//
//===----------------------------------------------------------------------===//

#include "IndexMaps.h"

namespace meshplan::runtime::cuda {

std::optional<ShardIndex> shardIndexOf(std::span<const int64_t> globalShape,
                                       std::span<const int64_t> offset,
                                       std::span<const int64_t> localShape) {
  size_t rank = globalShape.size();
  if (rank > size_t(kMaxRank) || offset.size() != rank ||
      localShape.size() != rank)
    return std::nullopt;
  int64_t count = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (globalShape[d] < 0 || offset[d] < 0 || localShape[d] < 0 ||
        offset[d] > globalShape[d] ||
        localShape[d] > globalShape[d] - offset[d] ||
        __builtin_mul_overflow(count, globalShape[d], &count))
      return std::nullopt;
  }
  ShardIndex s;
  if (rank == 0)
    return s;
  // Trailing dimensions the box spans whole merge into one run with the
  // innermost dimension it cuts, as in boxIndexRuns.
  size_t inner = rank - 1;
  while (inner > 0 && localShape[inner] == globalShape[inner])
    --inner;
  int64_t stride[kMaxRank];
  stride[rank - 1] = 1;
  for (size_t d = rank - 1; d > 0; --d)
    stride[d - 1] = stride[d] * globalShape[d];
  s.runLength = localShape[inner] * stride[inner];
  s.base = offset[inner] * stride[inner];
  for (size_t d = 0; d < inner; ++d) {
    s.base += offset[d] * stride[d];
    s.outerExtent[d] = localShape[d];
    s.outerStride[d] = stride[d];
  }
  s.outerRank = static_cast<int>(inner);
  // An empty box has no elements to map; keep the divisions well defined.
  if (s.runLength == 0)
    s.runLength = 1;
  for (int d = 0; d < s.outerRank; ++d)
    if (s.outerExtent[d] == 0)
      s.outerExtent[d] = 1;
  return s;
}

ShardIndex contiguousShardIndex(int64_t globalStart) {
  ShardIndex s;
  // One run as long as any shard: the division i / runLength is always 0.
  s.runLength = INT64_MAX;
  s.base = globalStart;
  return s;
}

std::optional<BoxCopyMap> boxCopyMapOf(std::span<const int64_t> srcShape,
                                       std::span<const int64_t> srcOrigin,
                                       std::span<const int64_t> dstShape,
                                       std::span<const int64_t> dstOrigin,
                                       std::span<const int64_t> offset,
                                       std::span<const int64_t> size) {
  size_t rank = size.size();
  if (rank > size_t(kMaxRank) || srcShape.size() != rank ||
      srcOrigin.size() != rank || dstShape.size() != rank ||
      dstOrigin.size() != rank || offset.size() != rank)
    return std::nullopt;
  BoxCopyMap m;
  int64_t elements = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (size[d] < 0)
      return std::nullopt;
    elements *= size[d];
  }
  if (elements == 0)
    return m; // an empty region fits anywhere (boxContains)
  for (size_t d = 0; d < rank; ++d) {
    auto inside = [&](int64_t origin, int64_t extent) {
      return offset[d] >= origin && offset[d] + size[d] <= origin + extent;
    };
    if (!inside(srcOrigin[d], srcShape[d]) ||
        !inside(dstOrigin[d], dstShape[d]))
      return std::nullopt;
  }
  m.elements = elements;
  if (rank == 0)
    return m;
  int64_t srcStride[kMaxRank], dstStride[kMaxRank];
  srcStride[rank - 1] = dstStride[rank - 1] = 1;
  for (size_t d = rank - 1; d > 0; --d) {
    srcStride[d - 1] = srcStride[d] * srcShape[d];
    dstStride[d - 1] = dstStride[d] * dstShape[d];
  }
  // Trailing dimensions whole in the region and both boxes are one row, as
  // in the CPU's copyBox.
  size_t inner = rank - 1;
  m.rowLength = size[inner];
  while (inner > 0 && size[inner] == srcShape[inner] &&
         size[inner] == dstShape[inner]) {
    --inner;
    m.rowLength *= size[inner];
  }
  for (size_t d = 0; d < rank; ++d) {
    m.srcBase += (offset[d] - srcOrigin[d]) * srcStride[d];
    m.dstBase += (offset[d] - dstOrigin[d]) * dstStride[d];
  }
  m.outerRank = static_cast<int>(inner);
  for (size_t d = 0; d < inner; ++d) {
    m.outerExtent[d] = size[d];
    m.srcStride[d] = srcStride[d];
    m.dstStride[d] = dstStride[d];
  }
  return m;
}

} // namespace meshplan::runtime::cuda
