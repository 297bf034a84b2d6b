//===- Float8.cpp - Float8 scales, casts and dequantization ---------------===//
//
// The cast is the hot path of the float8 all-gather (every weight shard, every
// step); it is one branch-free loop per input type and format, which the
// compiler vectorizes. Decoding is a 256-entry table: exact by construction
// and independent of the FPU's subnormal mode.
//
//===----------------------------------------------------------------------===//

#include "KernelSupport.h"

#include <algorithm>
#include <cmath>

namespace meshplan::runtime::kernels {
using namespace detail;

namespace {

/// The value of every code, as float bits, built from the format's fields.
template <Fp8Format F> constexpr std::array<float, 256> makeDecodeTable() {
  using T = Fp8Traits<F>;
  constexpr int m = T::kMantissaBits;
  std::array<float, 256> table{};
  for (uint32_t code = 0; code < 256; ++code) {
    uint32_t sign = (code & 0x80u) << 24;
    uint32_t exponent = (code & 0x7Fu) >> m;
    uint32_t mantissa = code & ((1u << m) - 1);
    uint32_t bits;
    bool nan = F == Fp8Format::E4M3FN ? (code & 0x7Fu) == 0x7Fu
                                      : exponent == 31 && mantissa != 0;
    if (nan) {
      bits = 0x7FC00000u;
    } else if (F == Fp8Format::E5M2 && exponent == 31) {
      bits = sign | 0x7F800000u;
    } else if (exponent == 0) {
      // mantissa * 2^(1 - bias - m): exact in float.
      float value = static_cast<float>(mantissa);
      for (int i = 0; i < T::kBias - 1 + m; ++i)
        value /= 2;
      bits = sign | std::bit_cast<uint32_t>(value);
    } else {
      bits =
          sign | ((exponent - T::kBias + 127) << 23) | (mantissa << (23 - m));
    }
    table[code] = std::bit_cast<float>(bits);
  }
  return table;
}

constexpr std::array<float, 256> kE4m3Table =
    makeDecodeTable<Fp8Format::E4M3FN>();
constexpr std::array<float, 256> kE5m2Table =
    makeDecodeTable<Fp8Format::E5M2>();

template <Fp8Format F>
MESHPLAN_INLINE void castLoop(const float *in, float scale, uint8_t *out,
                              int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = encodeFp8<F>(in[i] * scale);
}
template <Fp8Format F>
MESHPLAN_INLINE void castLoop(const uint16_t *in, float scale, uint8_t *out,
                              int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = encodeFp8<F>(widenBf16(in[i]) * scale);
}

MESHPLAN_KERNEL_LOOP void castE4m3(const float *in, float scale, uint8_t *out,
                                   int64_t n) {
  castLoop<Fp8Format::E4M3FN>(in, scale, out, n);
}
MESHPLAN_KERNEL_LOOP void castE5m2(const float *in, float scale, uint8_t *out,
                                   int64_t n) {
  castLoop<Fp8Format::E5M2>(in, scale, out, n);
}
MESHPLAN_KERNEL_LOOP void castE4m3(const uint16_t *in, float scale,
                                   uint8_t *out, int64_t n) {
  castLoop<Fp8Format::E4M3FN>(in, scale, out, n);
}
MESHPLAN_KERNEL_LOOP void castE5m2(const uint16_t *in, float scale,
                                   uint8_t *out, int64_t n) {
  castLoop<Fp8Format::E5M2>(in, scale, out, n);
}

MESHPLAN_KERNEL_LOOP void dequantLoop(const uint8_t *in, const float *table,
                                      float scale, float *out, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = table[in[i]] / scale;
}
MESHPLAN_KERNEL_LOOP void dequantLoop(const uint8_t *in, const float *table,
                                      float scale, uint16_t *out, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = roundBf16(table[in[i]] / scale);
}

template <typename In>
void castSpan(std::span<const In> in, float scale, std::span<uint8_t> out,
              Fp8Format format, const Threading &threading) {
  require(in.size() == out.size(), "castToFp8",
          "input and output sizes differ");
  parallelFor(
      static_cast<int64_t>(in.size()), threading,
      [&](int64_t begin, int64_t end) {
        if (format == Fp8Format::E4M3FN)
          castE4m3(in.data() + begin, scale, out.data() + begin, end - begin);
        else
          castE5m2(in.data() + begin, scale, out.data() + begin, end - begin);
      });
}

template <typename Out>
void dequantSpan(std::span<const uint8_t> in, float scale, std::span<Out> out,
                 Fp8Format format, const Threading &threading) {
  require(in.size() == out.size(), "dequantFp8",
          "input and output sizes differ");
  const float *table = fp8DecodeTable(format);
  parallelFor(static_cast<int64_t>(in.size()), threading,
              [&](int64_t begin, int64_t end) {
                dequantLoop(in.data() + begin, table, scale, out.data() + begin,
                            end - begin);
              });
}

} // namespace

const float *detail::fp8DecodeTable(Fp8Format format) {
  return format == Fp8Format::E4M3FN ? kE4m3Table.data() : kE5m2Table.data();
}

float fp8MaxFinite(Fp8Format format) {
  return format == Fp8Format::E4M3FN ? Fp8Traits<Fp8Format::E4M3FN>::kMaxFinite
                                     : Fp8Traits<Fp8Format::E5M2>::kMaxFinite;
}

float fp8ScaleFromAmax(float amax, Fp8Format format, bool powerOf2) {
  return fp8ScaleOf(amax, fp8MaxFinite(format), powerOf2);
}

uint8_t floatToFp8(float x, Fp8Format format) {
  return format == Fp8Format::E4M3FN ? encodeFp8<Fp8Format::E4M3FN>(x)
                                     : encodeFp8<Fp8Format::E5M2>(x);
}

float fp8ToFloat(uint8_t code, Fp8Format format) {
  return fp8DecodeTable(format)[code];
}

void castToFp8(std::span<const float> in, float scale, std::span<uint8_t> out,
               Fp8Format format, const Threading &threading) {
  castSpan(in, scale, out, format, threading);
}

void castToFp8(std::span<const uint16_t> inBf16, float scale,
               std::span<uint8_t> out, Fp8Format format,
               const Threading &threading) {
  castSpan(inBf16, scale, out, format, threading);
}

void dequantFp8(std::span<const uint8_t> in, float scale, std::span<float> out,
                Fp8Format format, const Threading &threading) {
  dequantSpan(in, scale, out, format, threading);
}

void dequantFp8(std::span<const uint8_t> in, float scale,
                std::span<uint16_t> outBf16, Fp8Format format,
                const Threading &threading) {
  dequantSpan(in, scale, outBf16, format, threading);
}

} // namespace meshplan::runtime::kernels
