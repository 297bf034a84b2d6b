//===- BFloat16.cu - float <-> bfloat16, nearest-even and stochastic ------===//
//
// The stochastic cast draws, for each element, the Philox bits of its global
// index (stochasticBitsOf, ScalarMath.h): one Philox evaluation per element,
// where the CPU computes 8 counters side by side and spreads their words over
// 64 elements. Both evaluate the same counter and word for a given global
// index, so the bits agree.
//
//===----------------------------------------------------------------------===//

#include "CudaSupport.cuh"

namespace meshplan::runtime::cuda {
using namespace detail;

namespace {

__global__ void toBf16Kernel(const float *in, uint16_t *out, int64_t n) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    out[i] = roundBf16(in[i]);
}

__global__ void fromBf16Kernel(const uint16_t *in, float *out, int64_t n) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    out[i] = widenBf16(in[i]);
}

__global__ void stochasticKernel(const float *in, uint16_t *out, int64_t n,
                                 PhiloxSchedule schedule, uint64_t step,
                                 ShardIndex index) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    uint64_t global = uint64_t(globalIndexOf(index, i));
    out[i] =
        roundBf16Stochastic(in[i], stochasticBitsOf(schedule, step, global));
  }
}

} // namespace

cudaError_t castToBf16(const float *in, uint16_t *out, int64_t n,
                       cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  toBf16Kernel<<<blocksFor(n), kBlock, 0, stream>>>(in, out, n);
  return launched();
}

cudaError_t castBf16ToFloat(const uint16_t *in, float *out, int64_t n,
                            cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  fromBf16Kernel<<<blocksFor(n), kBlock, 0, stream>>>(in, out, n);
  return launched();
}

cudaError_t castToBf16Stochastic(const float *in, uint16_t *out, int64_t n,
                                 const StochasticRoundingKey &key,
                                 const ShardIndex &index, cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  uint64_t k = stochasticRoundingKeyBits(key.seed, key.tensorId);
  PhiloxSchedule schedule(uint32_t(k), uint32_t(k >> 32));
  stochasticKernel<<<blocksFor(n), kBlock, 0, stream>>>(
      in, out, n, schedule, uint64_t(key.step), index);
  return launched();
}

} // namespace meshplan::runtime::cuda
