//===- Amax.cu - max |x| on the GPU ---------------------------------------===//
//
// As on the CPU, the maximum is taken over the absolute values' bit patterns
// as integers (numeric order for non-negative floats, every NaN above +inf),
// so one integer max finds amax and propagates NaN, and the result does not
// depend on the order in which blocks finish. Each block reduces in
// registers and shared memory and makes one atomicMax; a one-thread kernel
// then turns any NaN pattern into the CPU's 0x7FC00000.
//
//===----------------------------------------------------------------------===//

#include "CudaSupport.cuh"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace meshplan::runtime::cuda {
using namespace detail;

namespace {

__device__ __forceinline__ int32_t absBits(float x) {
  return int32_t(std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu);
}
__device__ __forceinline__ int32_t absBits(uint16_t b) {
  return absBits(widenBf16(b));
}

/// The block's maximum of every thread's `m` into *result.
__device__ __forceinline__ void blockMax(int32_t m, int32_t *result) {
  for (int offset = 16; offset > 0; offset /= 2) {
    int32_t other = __shfl_down_sync(0xFFFFFFFFu, m, offset);
    m = other > m ? other : m;
  }
  __shared__ int32_t warps[kBlock / 32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0)
    warps[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kBlock / 32 ? warps[lane] : 0;
    for (int offset = 16; offset > 0; offset /= 2) {
      int32_t other = __shfl_down_sync(0xFFFFFFFFu, m, offset);
      m = other > m ? other : m;
    }
    if (lane == 0 && m > 0)
      atomicMax(result, m);
  }
}

template <typename In>
__global__ void amaxKernel(const In *__restrict__ in, int64_t n,
                           int32_t *result) {
  int32_t m = 0;
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int32_t a = absBits(in[i]);
    m = a > m ? a : m;
  }
  blockMax(m, result);
}

/// fp32 four at a time (16-byte loads), then the `tail` elements after them:
/// the scalar kernel reached 0.70 of a device copy's bandwidth at 2^24
/// elements on an H200 in the first GPU run (docs/cuda.md).
__global__ void amaxKernel4(const float4 *__restrict__ in, int64_t n4,
                            const float *__restrict__ tail, int64_t tailCount,
                            int32_t *result) {
  int32_t m = 0;
#pragma unroll 4
  for (int64_t i = firstIndex(); i < n4; i += gridStride()) {
    float4 x = in[i];
    int32_t a =
        max(max(absBits(x.x), absBits(x.y)), max(absBits(x.z), absBits(x.w)));
    m = a > m ? a : m;
  }
  if (firstIndex() < tailCount) {
    int32_t a = absBits(tail[firstIndex()]);
    m = a > m ? a : m;
  }
  blockMax(m, result);
}

__global__ void canonicalNaN(int32_t *result) {
  if (*result > 0x7F800000)
    *result = 0x7FC00000;
}

constexpr unsigned kAmaxBlocks = 1024;

template <typename In>
cudaError_t amaxAny(const In *in, int64_t n, float *result,
                    cudaStream_t stream) {
  auto *bits = reinterpret_cast<int32_t *>(result);
  if (cudaError_t e = cudaMemsetAsync(bits, 0, sizeof(int32_t), stream))
    return e;
  if constexpr (std::is_same_v<In, float>) {
    if (n >= 4 && reinterpret_cast<uintptr_t>(in) % 16 == 0) {
      int64_t n4 = n / 4;
      // At most kAmaxBlocks blocks: each block ends in one atomicMax on the
      // same word, and 8192 of them cost more than reading 2^24 floats
      // (0.65 of a device copy's bandwidth on an H200; docs/cuda.md).
      unsigned blocks = std::min(blocksFor(n4), kAmaxBlocks);
      amaxKernel4<<<blocks, kBlock, 0, stream>>>(
          reinterpret_cast<const float4 *>(in), n4, in + 4 * n4, n % 4, bits);
      canonicalNaN<<<1, 1, 0, stream>>>(bits);
      return launched();
    }
  }
  if (n > 0)
    amaxKernel<<<std::min(blocksFor(n), kAmaxBlocks), kBlock, 0, stream>>>(
        in, n, bits);
  canonicalNaN<<<1, 1, 0, stream>>>(bits);
  return launched();
}

} // namespace

cudaError_t amax(const float *in, int64_t n, float *result,
                 cudaStream_t stream) {
  return amaxAny(in, n, result, stream);
}
cudaError_t amax(const uint16_t *inBf16, int64_t n, float *result,
                 cudaStream_t stream) {
  return amaxAny(inBf16, n, result, stream);
}

} // namespace meshplan::runtime::cuda
