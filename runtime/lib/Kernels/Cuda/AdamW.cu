//===- AdamW.cu - AdamW on fp32 masters and on bf16 with SR ---------------===//
//
// The element update is adamwElement (ScalarMath.h), the CPU's own; the
// step's scalars are computed on the host by the CPU's adamwScalarsOf and
// passed by value. The library is compiled with --fmad=false so that no
// multiply-add is fused (the documented order is one rounding per
// operation), and with IEEE division and square root (nvcc's defaults, never
// --use_fast_math).
//
//===----------------------------------------------------------------------===//

#include "CudaSupport.cuh"

namespace meshplan::runtime::cuda {
using namespace detail;

namespace {

template <bool SmallWeight>
__global__ void fp32Kernel(float *p, const float *g, float *m, float *v,
                           int64_t n, AdamWScalars s) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    float mi = m[i], vi = v[i];
    p[i] = adamwElement<SmallWeight>(p[i], g[i], mi, vi, s);
    m[i] = mi;
    v[i] = vi;
  }
}

template <bool SmallWeight>
__global__ void bf16Kernel(uint16_t *p, const float *g, float *m, float *v,
                           int64_t n, AdamWScalars s, PhiloxSchedule schedule,
                           uint64_t step, ShardIndex index) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    float mi = m[i], vi = v[i];
    float updated = adamwElement<SmallWeight>(widenBf16(p[i]), g[i], mi, vi, s);
    uint64_t global = uint64_t(globalIndexOf(index, i));
    p[i] =
        roundBf16Stochastic(updated, stochasticBitsOf(schedule, step, global));
    m[i] = mi;
    v[i] = vi;
  }
}

/// The same update on a contiguous shard (global index = base + local), a
/// warp per superblock of 64 elements: lane l updates elements l and l + 32
/// of it, which take word l / 16 and 2 + l / 16, half-word l / 8 % 2, of
/// Philox counter 8 b + l % 8 (stochasticBitsOf). Each lane computes its
/// counter's words itself (4 lanes share one: free on a SIMT machine, where
/// 8 lanes computing would cost the warp as much) and no 64-bit division is
/// made, while loads and stores stay as coalesced as fp32 AdamW's. The first
/// GPU run measured the per-element kernel at 0.51 of a device copy's
/// bandwidth on an H200, and one thread per counter (8 elements 8 apart) at
/// 0.62 (docs/cuda.md).
template <bool SmallWeight>
__global__ void
bf16ContiguousKernel(uint16_t *__restrict__ p, const float *__restrict__ g,
                     float *__restrict__ m, float *__restrict__ v, int64_t n,
                     AdamWScalars s, PhiloxSchedule schedule, uint64_t step,
                     uint64_t base) {
  uint64_t firstBlock = base / uint64_t(kSuperblock);
  uint64_t lastBlock = (base + uint64_t(n) - 1) / uint64_t(kSuperblock);
  int64_t superblocks = int64_t(lastBlock - firstBlock + 1);
  int lane = int(threadIdx.x % 32);
  int half = (lane / 8) % 2;
  for (int64_t b = firstIndex() / 32; b < superblocks; b += gridStride() / 32) {
    uint64_t block = firstBlock + uint64_t(b);
    uint64_t counter = block * 8 + uint64_t(lane % 8);
    uint32_t w0 = uint32_t(counter), w1 = uint32_t(counter >> 32),
             w2 = uint32_t(step), w3 = uint32_t(step >> 32);
    philoxRounds(w0, w1, w2, w3, schedule);
    int64_t first =
        int64_t(block * uint64_t(kSuperblock)) + lane - int64_t(base);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      int64_t i = first + 32 * e;
      if (i < 0 || i >= n)
        continue;
      uint32_t word = e == 0 ? (lane < 16 ? w0 : w1) : (lane < 16 ? w2 : w3);
      float mi = m[i], vi = v[i];
      float updated =
          adamwElement<SmallWeight>(widenBf16(p[i]), g[i], mi, vi, s);
      p[i] = roundBf16Stochastic(updated, (word >> (16 * half)) & 0xFFFFu);
      m[i] = mi;
      v[i] = vi;
    }
  }
}

} // namespace

cudaError_t adamwFp32(float *param, const float *grad, float *expAvg,
                      float *expAvgSq, int64_t n, const AdamWParams &params,
                      int64_t step, cudaStream_t stream) {
  if (step < 1)
    return cudaErrorInvalidValue;
  if (n <= 0)
    return cudaSuccess;
  AdamWScalars s = adamwScalarsOf(params, step);
  if (s.smallWeight)
    fp32Kernel<true><<<blocksFor(n), kBlock, 0, stream>>>(param, grad, expAvg,
                                                          expAvgSq, n, s);
  else
    fp32Kernel<false><<<blocksFor(n), kBlock, 0, stream>>>(param, grad, expAvg,
                                                           expAvgSq, n, s);
  return launched();
}

cudaError_t adamwBf16StochasticRounding(
    uint16_t *paramBf16, const float *grad, float *expAvg, float *expAvgSq,
    int64_t n, const AdamWParams &params, int64_t step, uint64_t seed,
    uint64_t tensorId, const ShardIndex &index, cudaStream_t stream) {
  if (step < 1)
    return cudaErrorInvalidValue;
  if (n <= 0)
    return cudaSuccess;
  AdamWScalars s = adamwScalarsOf(params, step);
  uint64_t k = stochasticRoundingKeyBits(seed, tensorId);
  PhiloxSchedule schedule(uint32_t(k), uint32_t(k >> 32));
  if (index.outerRank == 0) {
    // One run: global = base + local (IndexMaps.h).
    int64_t lanes =
        ((index.base + n - 1) / kSuperblock - index.base / kSuperblock + 1) *
        32;
    if (s.smallWeight)
      bf16ContiguousKernel<true><<<blocksFor(lanes), kBlock, 0, stream>>>(
          paramBf16, grad, expAvg, expAvgSq, n, s, schedule, uint64_t(step),
          uint64_t(index.base));
    else
      bf16ContiguousKernel<false><<<blocksFor(lanes), kBlock, 0, stream>>>(
          paramBf16, grad, expAvg, expAvgSq, n, s, schedule, uint64_t(step),
          uint64_t(index.base));
    return launched();
  }
  if (s.smallWeight)
    bf16Kernel<true><<<blocksFor(n), kBlock, 0, stream>>>(
        paramBf16, grad, expAvg, expAvgSq, n, s, schedule, uint64_t(step),
        index);
  else
    bf16Kernel<false><<<blocksFor(n), kBlock, 0, stream>>>(
        paramBf16, grad, expAvg, expAvgSq, n, s, schedule, uint64_t(step),
        index);
  return launched();
}

} // namespace meshplan::runtime::cuda
