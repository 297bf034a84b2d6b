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
