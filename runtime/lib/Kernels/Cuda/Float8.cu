//===- Float8.cu - Float8 casts, dequantization and scales on the GPU -----===//
//
// The cast reads its scale from device memory: the scale is computed on the
// device from the all-reduced amax (fp8ScaleFromAmax below), and reading it
// in the kernel keeps the whole float8 chain on the device.
//
//===----------------------------------------------------------------------===//

#include "CudaSupport.cuh"

#include <cstdint>
#include <type_traits>

namespace meshplan::runtime::cuda {
using namespace detail;

namespace {

__device__ __forceinline__ float toFloat(float x) { return x; }
__device__ __forceinline__ float toFloat(uint16_t b) { return widenBf16(b); }

template <Fp8Format F, typename In>
__global__ void castKernel(const In *__restrict__ in,
                           const float *__restrict__ scale,
                           uint8_t *__restrict__ out, int64_t n) {
  float s = scale ? *scale : 1.0f;
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    out[i] = encodeFp8<F>(toFloat(in[i]) * s);
}

/// Four fp32 elements per step: a 16-byte load and a 4-byte store instead of
/// four 4-byte loads and four byte stores (0.55 of a device copy's
/// bandwidth on an H200 in the first GPU run; docs/cuda.md).
template <Fp8Format F>
__global__ void castKernel4(const float4 *__restrict__ in,
                            const float *__restrict__ scale,
                            uchar4 *__restrict__ out, int64_t n4) {
  float s = scale ? *scale : 1.0f;
  for (int64_t i = firstIndex(); i < n4; i += gridStride()) {
    float4 x = in[i];
    out[i] = make_uchar4(encodeFp8<F>(x.x * s), encodeFp8<F>(x.y * s),
                         encodeFp8<F>(x.z * s), encodeFp8<F>(x.w * s));
  }
}

__device__ __forceinline__ void store(float *out, float x) { *out = x; }
__device__ __forceinline__ void store(uint16_t *out, float x) {
  *out = roundBf16(x);
}

template <Fp8Format F, typename Out>
__global__ void dequantKernel(const uint8_t *in, const float *scale, Out *out,
                              int64_t n) {
  float s = scale ? *scale : 1.0f;
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    store(out + i, decodeFp8<F>(in[i]) / s);
}

__global__ void scaleKernel(const float *amax, float *scale, float maxFinite,
                            bool powerOf2) {
  *scale = fp8ScaleOf(*amax, maxFinite, powerOf2);
}

template <Fp8Format F>
cudaError_t castVector(const float *in, const float *scale, uint8_t *out,
                       int64_t n, cudaStream_t stream) {
  int64_t n4 = n / 4;
  castKernel4<F><<<blocksFor(n4), kBlock, 0, stream>>>(
      reinterpret_cast<const float4 *>(in), scale,
      reinterpret_cast<uchar4 *>(out), n4);
  if (n % 4)
    castKernel<F>
        <<<1, kBlock, 0, stream>>>(in + 4 * n4, scale, out + 4 * n4, n % 4);
  return launched();
}

template <typename In>
cudaError_t castAny(const In *in, const float *scale, uint8_t *out, int64_t n,
                    Fp8Format format, cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  if constexpr (std::is_same_v<In, float>)
    if (reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(out) % 4 == 0 && n >= 4)
      return format == Fp8Format::E4M3FN
                 ? castVector<Fp8Format::E4M3FN>(in, scale, out, n, stream)
                 : castVector<Fp8Format::E5M2>(in, scale, out, n, stream);
  if (format == Fp8Format::E4M3FN)
    castKernel<Fp8Format::E4M3FN>
        <<<blocksFor(n), kBlock, 0, stream>>>(in, scale, out, n);
  else
    castKernel<Fp8Format::E5M2>
        <<<blocksFor(n), kBlock, 0, stream>>>(in, scale, out, n);
  return launched();
}

template <typename Out>
cudaError_t dequantAny(const uint8_t *in, const float *scale, Out *out,
                       int64_t n, Fp8Format format, cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  if (format == Fp8Format::E4M3FN)
    dequantKernel<Fp8Format::E4M3FN>
        <<<blocksFor(n), kBlock, 0, stream>>>(in, scale, out, n);
  else
    dequantKernel<Fp8Format::E5M2>
        <<<blocksFor(n), kBlock, 0, stream>>>(in, scale, out, n);
  return launched();
}

} // namespace

cudaError_t castToFp8(const float *in, const float *scale, uint8_t *out,
                      int64_t n, Fp8Format format, cudaStream_t stream) {
  return castAny(in, scale, out, n, format, stream);
}
cudaError_t castToFp8(const uint16_t *inBf16, const float *scale, uint8_t *out,
                      int64_t n, Fp8Format format, cudaStream_t stream) {
  return castAny(inBf16, scale, out, n, format, stream);
}
cudaError_t dequantFp8(const uint8_t *in, const float *scale, float *out,
                       int64_t n, Fp8Format format, cudaStream_t stream) {
  return dequantAny(in, scale, out, n, format, stream);
}
cudaError_t dequantFp8(const uint8_t *in, const float *scale, uint16_t *outBf16,
                       int64_t n, Fp8Format format, cudaStream_t stream) {
  return dequantAny(in, scale, outBf16, n, format, stream);
}

cudaError_t fp8ScaleFromAmax(const float *amax, float *scale, Fp8Format format,
                             bool powerOf2, cudaStream_t stream) {
  float maxFinite = format == Fp8Format::E4M3FN
                        ? Fp8Traits<Fp8Format::E4M3FN>::kMaxFinite
                        : Fp8Traits<Fp8Format::E5M2>::kMaxFinite;
  scaleKernel<<<1, 1, 0, stream>>>(amax, scale, maxFinite, powerOf2);
  return launched();
}

} // namespace meshplan::runtime::cuda
