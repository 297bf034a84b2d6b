//===- Float8.cu - Float8 casts, dequantization and scales on the GPU -----===//
//
// The cast reads its scale from device memory: the scale is computed on the
// device from the all-reduced amax (fp8ScaleFromAmax below), and reading it
// in the kernel keeps the whole float8 chain on the device.
//
//===----------------------------------------------------------------------===//

#include "CudaSupport.cuh"

namespace meshplan::runtime::cuda {
using namespace detail;

namespace {

__device__ __forceinline__ float toFloat(float x) { return x; }
__device__ __forceinline__ float toFloat(uint16_t b) { return widenBf16(b); }

template <Fp8Format F, typename In>
__global__ void castKernel(const In *in, const float *scale, uint8_t *out,
                           int64_t n) {
  float s = scale ? *scale : 1.0f;
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    out[i] = encodeFp8<F>(toFloat(in[i]) * s);
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

template <typename In>
cudaError_t castAny(const In *in, const float *scale, uint8_t *out, int64_t n,
                    Fp8Format format, cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
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
