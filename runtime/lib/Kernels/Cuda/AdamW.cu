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

/// The same update on a contiguous shard (global index = base + local),
/// one thread per Philox counter instead of per element: a counter's four
/// words serve the 8 elements of its superblock whose index is the counter
/// modulo 8 (stochasticBitsOf: element r = j + 8 k of superblock b takes
/// counter 8 b + j, word k / 2, half-word k % 2), so this kernel makes one
/// Philox call where the per-element kernel makes 8. The first GPU run
/// measured the per-element kernel at 0.51 of a device copy's bandwidth on
/// an H200 (docs/cuda.md).
template <bool SmallWeight>
__global__ void bf16ContiguousKernel(uint16_t *__restrict__ p,
                                     const float *__restrict__ g,
                                     float *__restrict__ m,
                                     float *__restrict__ v, int64_t n,
                                     AdamWScalars s, PhiloxSchedule schedule,
                                     uint64_t step, uint64_t base) {
  uint64_t firstBlock = base / uint64_t(kSuperblock);
  uint64_t lastBlock = (base + uint64_t(n) - 1) / uint64_t(kSuperblock);
  int64_t counters = int64_t(lastBlock - firstBlock + 1) * 8;
  for (int64_t c = firstIndex(); c < counters; c += gridStride()) {
    uint64_t block = firstBlock + uint64_t(c) / 8;
    int j = int(c % 8);
    uint64_t counter = block * 8 + uint64_t(j);
    uint32_t w[4] = {uint32_t(counter), uint32_t(counter >> 32),
                     uint32_t(step), uint32_t(step >> 32)};
    philoxRounds(w[0], w[1], w[2], w[3], schedule);
    int64_t first = int64_t(block * uint64_t(kSuperblock)) + j - int64_t(base);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      int64_t i = first + 8 * k;
      if (i < 0 || i >= n)
        continue;
      float mi = m[i], vi = v[i];
      float updated =
          adamwElement<SmallWeight>(widenBf16(p[i]), g[i], mi, vi, s);
      uint32_t bits = (w[k / 2] >> (16 * (k % 2))) & 0xFFFFu;
      p[i] = roundBf16Stochastic(updated, bits);
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
    int64_t counters = ((index.base + n - 1) / kSuperblock -
                        index.base / kSuperblock + 1) *
                       8;
    if (s.smallWeight)
      bf16ContiguousKernel<true><<<blocksFor(counters), kBlock, 0, stream>>>(
          paramBf16, grad, expAvg, expAvgSq, n, s, schedule, uint64_t(step),
          uint64_t(index.base));
    else
      bf16ContiguousKernel<false><<<blocksFor(counters), kBlock, 0, stream>>>(
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
