//===- BoxCopy.cu - Pack/unpack of padded shards on the GPU ---------------===//
//
// The device form of the executor's copyBox: one kernel per (source type,
// destination type) pair, iterating over the region's elements with the
// positions of boxCopyPositions (IndexMaps.h), converting each element with
// the CPU's per-element functions.
//
//===----------------------------------------------------------------------===//

#include "CudaSupport.cuh"

namespace meshplan::runtime::cuda {
using namespace detail;

namespace {

/// The value of an element as float (float8 divided by the scale, as the
/// CPU's dequantFp8 does).
template <ElementType T> struct Element;
template <> struct Element<ElementType::Float32> {
  using Storage = float;
  __device__ static float read(float x, float) { return x; }
  __device__ static float write(float x, float) { return x; }
};
template <> struct Element<ElementType::BFloat16> {
  using Storage = uint16_t;
  __device__ static float read(uint16_t b, float) { return widenBf16(b); }
  __device__ static uint16_t write(float x, float) { return roundBf16(x); }
};
template <Fp8Format F> struct Fp8Element {
  using Storage = uint8_t;
  __device__ static float read(uint8_t c, float scale) {
    return decodeFp8<F>(c) / scale;
  }
  __device__ static uint8_t write(float x, float scale) {
    return encodeFp8<F>(x * scale);
  }
};
template <>
struct Element<ElementType::Float8E4M3> : Fp8Element<Fp8Format::E4M3FN> {};
template <>
struct Element<ElementType::Float8E5M2> : Fp8Element<Fp8Format::E5M2> {};

template <ElementType From, ElementType To>
__global__ void copyKernel(const void *src, void *dst, BoxCopyMap map,
                           const float *scalePtr) {
  using S = typename Element<From>::Storage;
  using D = typename Element<To>::Storage;
  const S *in = static_cast<const S *>(src);
  D *out = static_cast<D *>(dst);
  float scale = scalePtr ? *scalePtr : 1.0f;
  for (int64_t e = firstIndex(); e < map.elements; e += gridStride()) {
    int64_t s, t;
    boxCopyPositions(map, e, s, t);
    if constexpr (From == To)
      out[t] = in[s]; // a copy, bits kept (NaN payloads too)
    else
      out[t] = Element<To>::write(Element<From>::read(in[s], scale), scale);
  }
}

bool isFloat8(ElementType t) {
  return t == ElementType::Float8E4M3 || t == ElementType::Float8E5M2;
}

template <ElementType From, ElementType To>
cudaError_t launch(const void *src, void *dst, const BoxCopyMap &map,
                   const float *scale, cudaStream_t stream) {
  copyKernel<From, To>
      <<<blocksFor(map.elements), kBlock, 0, stream>>>(src, dst, map, scale);
  return launched();
}

template <ElementType From>
cudaError_t launchTo(ElementType to, const void *src, void *dst,
                     const BoxCopyMap &map, const float *scale,
                     cudaStream_t stream) {
  switch (to) {
  case ElementType::Float32:
    return launch<From, ElementType::Float32>(src, dst, map, scale, stream);
  case ElementType::BFloat16:
    return launch<From, ElementType::BFloat16>(src, dst, map, scale, stream);
  case ElementType::Float8E4M3:
    return launch<From, ElementType::Float8E4M3>(src, dst, map, scale, stream);
  case ElementType::Float8E5M2:
    return launch<From, ElementType::Float8E5M2>(src, dst, map, scale, stream);
  }
  return cudaErrorInvalidValue;
}

} // namespace

cudaError_t copyBox(const DeviceBox &src, const DeviceBox &dst,
                    std::span<const int64_t> offset,
                    std::span<const int64_t> size, const float *scale,
                    cudaStream_t stream) {
  // The conversions the CPU's canConvert allows: float8 <-> float8 only as a
  // plain copy of one format.
  if (isFloat8(src.type) && isFloat8(dst.type) && src.type != dst.type)
    return cudaErrorInvalidValue;
  std::optional<BoxCopyMap> map =
      boxCopyMapOf(src.shape, src.origin, dst.shape, dst.origin, offset, size);
  if (!map)
    return cudaErrorInvalidValue;
  if (map->elements == 0)
    return cudaSuccess;
  switch (src.type) {
  case ElementType::Float32:
    return launchTo<ElementType::Float32>(dst.type, src.data, dst.data, *map,
                                          scale, stream);
  case ElementType::BFloat16:
    return launchTo<ElementType::BFloat16>(dst.type, src.data, dst.data, *map,
                                           scale, stream);
  case ElementType::Float8E4M3:
    return launchTo<ElementType::Float8E4M3>(dst.type, src.data, dst.data, *map,
                                             scale, stream);
  case ElementType::Float8E5M2:
    return launchTo<ElementType::Float8E5M2>(dst.type, src.data, dst.data, *map,
                                             scale, stream);
  }
  return cudaErrorInvalidValue;
}

} // namespace meshplan::runtime::cuda
