//===- BoxCopy.cpp - Moving boxes of tensors between buffers --------------===//

#include "BoxCopy.h"

#include "meshplan/Runtime/Kernels.h"

#include <cstring>
#include <span>

namespace meshplan::runtime {

using plan::DType;
namespace k = kernels;

int64_t product(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

static bool isFloat8(DType d) {
  return d == DType::Float8E4M3 || d == DType::Float8E5M2;
}
static k::Fp8Format fp8Format(DType d) {
  return d == DType::Float8E4M3 ? k::Fp8Format::E4M3FN : k::Fp8Format::E5M2;
}

bool canConvert(DType from, DType to) {
  if (from == to)
    return true;
  bool fromOk = from == DType::Float32 || from == DType::BFloat16;
  bool toOk = to == DType::Float32 || to == DType::BFloat16;
  if (fromOk && (toOk || isFloat8(to)))
    return true;
  return isFloat8(from) && (to == DType::Float32 || to == DType::BFloat16);
}

void convertElements(const std::byte *in, DType from, std::byte *out, DType to,
                     int64_t n, float scale) {
  if (n <= 0)
    return;
  size_t count = size_t(n);
  auto f32 = [](const std::byte *p, size_t c) {
    return std::span<const float>(reinterpret_cast<const float *>(p), c);
  };
  auto bf16 = [](const std::byte *p, size_t c) {
    return std::span<const uint16_t>(reinterpret_cast<const uint16_t *>(p), c);
  };
  auto u8 = [](const std::byte *p, size_t c) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t *>(p), c);
  };
  if (from == to) {
    std::memcpy(out, in, count * size_t(plan::dtypeBytes(from)));
  } else if (from == DType::Float32 && to == DType::BFloat16) {
    k::castToBf16(f32(in, count), {reinterpret_cast<uint16_t *>(out), count});
  } else if (from == DType::BFloat16 && to == DType::Float32) {
    k::castBf16ToFloat(bf16(in, count),
                       {reinterpret_cast<float *>(out), count});
  } else if (from == DType::Float32 && isFloat8(to)) {
    k::castToFp8(f32(in, count), scale,
                 {reinterpret_cast<uint8_t *>(out), count}, fp8Format(to));
  } else if (from == DType::BFloat16 && isFloat8(to)) {
    k::castToFp8(bf16(in, count), scale,
                 {reinterpret_cast<uint8_t *>(out), count}, fp8Format(to));
  } else if (isFloat8(from) && to == DType::Float32) {
    k::dequantFp8(u8(in, count), scale, {reinterpret_cast<float *>(out), count},
                  fp8Format(from));
  } else if (isFloat8(from) && to == DType::BFloat16) {
    k::dequantFp8(u8(in, count), scale,
                  {reinterpret_cast<uint16_t *>(out), count}, fp8Format(from));
  }
}

bool boxContains(std::span<const int64_t> origin,
                 std::span<const int64_t> shape,
                 std::span<const int64_t> offset,
                 std::span<const int64_t> size) {
  if (origin.size() != offset.size() || shape.size() != size.size() ||
      origin.size() != shape.size())
    return false;
  for (size_t d = 0; d < origin.size(); ++d) {
    if (size[d] == 0)
      return true; // an empty region fits anywhere
    if (offset[d] < origin[d] || offset[d] + size[d] > origin[d] + shape[d])
      return false;
  }
  return true;
}

void copyBox(const BoxRef &src, const BoxRef &dst,
             const std::vector<int64_t> &offset,
             const std::vector<int64_t> &size, float scale) {
  copyBox(DeviceBoxRef{src.data, src.dtype, *src.shape, *src.origin},
          DeviceBoxRef{dst.data, dst.dtype, *dst.shape, *dst.origin}, offset,
          size, scale);
}

void copyBox(const DeviceBoxRef &src, const DeviceBoxRef &dst,
             std::span<const int64_t> offset, std::span<const int64_t> size,
             float scale) {
  size_t rank = size.size();
  for (int64_t extent : size)
    if (extent == 0)
      return;
  int64_t srcBytes = plan::dtypeBytes(src.dtype);
  int64_t dstBytes = plan::dtypeBytes(dst.dtype);
  if (rank == 0) {
    convertElements(static_cast<const std::byte *>(src.data), src.dtype,
                    static_cast<std::byte *>(dst.data), dst.dtype, 1, scale);
    return;
  }
  // Strides of both packed boxes, in elements.
  std::vector<int64_t> srcStride(rank, 1), dstStride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    srcStride[d - 1] = srcStride[d] * src.shape[d];
    dstStride[d - 1] = dstStride[d] * dst.shape[d];
  }
  // Merge trailing dims that are whole in both boxes into one long row.
  size_t inner = rank - 1;
  int64_t rowLength = size[inner];
  while (inner > 0 && size[inner] == src.shape[inner] &&
         size[inner] == dst.shape[inner]) {
    --inner;
    rowLength *= size[inner];
  }
  // Iterate over the outer dims [0, inner) with an odometer.
  std::vector<int64_t> idx(inner, 0);
  while (true) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d < rank; ++d) {
      int64_t i = d < inner ? idx[d] : 0;
      s += (offset[d] + i - src.origin[d]) * srcStride[d];
      t += (offset[d] + i - dst.origin[d]) * dstStride[d];
    }
    convertElements(static_cast<const std::byte *>(src.data) + s * srcBytes,
                    src.dtype,
                    static_cast<std::byte *>(dst.data) + t * dstBytes,
                    dst.dtype, rowLength, scale);
    size_t d = inner;
    while (d > 0) {
      --d;
      if (++idx[d] < size[d])
        break;
      idx[d] = 0;
      if (d == 0)
        return;
    }
    if (inner == 0)
      return;
  }
}

} // namespace meshplan::runtime
