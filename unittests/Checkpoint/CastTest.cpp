//===- CastTest.cpp - Dtype casts of checkpoint loads (Cast.h) ------------===//
//
// float32 -> float16 against the compiler's IEEE conversion (_Float16), on
// every tie between neighbouring float16 values and the floats on either
// side of it, and a stride through all float32 bit patterns; float32 ->
// bfloat16 against an independent round-to-nearest-even in double on every
// bfloat16 tie. (No plan stores float16 parameters, so the CLI tests in
// python/tests/test_dtype_cast.py, which check bfloat16 against torch and
// float16 widening against numpy, cannot reach float16 narrowing.)
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Cast.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

using namespace meshplan;
using namespace meshplan::ckpt;

namespace {

uint16_t ieeeHalf(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

bool isHalfNaN(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }

void expectHalf(float f) {
  uint16_t got = floatToFloat16(f), want = ieeeHalf(f);
  if (std::isnan(f)) {
    EXPECT_TRUE(isHalfNaN(got)) << std::hex << std::bit_cast<uint32_t>(f);
    return;
  }
  EXPECT_EQ(got, want) << std::hex << "float bits "
                       << std::bit_cast<uint32_t>(f);
}

/// Round to nearest even to bfloat16, computed in double from the two
/// neighbours (an implementation independent of the bit trick).
uint16_t referenceBf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  uint32_t down = bits & 0xFFFF0000u;
  uint32_t up = down + 0x10000u; // next bf16 away from zero (may be inf)
  double x = std::fabs(double(f));
  double lo = std::fabs(double(std::bit_cast<float>(down)));
  double hi = std::fabs(double(std::bit_cast<float>(up)));
  if (std::isinf(hi)) // past the largest finite: compare with the tie
    hi = lo + (lo - std::fabs(double(std::bit_cast<float>(down - 0x10000u))));
  if (x - lo < hi - x)
    return uint16_t(down >> 16);
  if (x - lo > hi - x)
    return uint16_t(up >> 16);
  return uint16_t(((down >> 16) & 1) ? up >> 16 : down >> 16);
}

} // namespace

TEST(Cast, Float16NarrowingMatchesIeeeOnEveryTie) {
  for (uint32_t sign : {0u, 0x8000u})
    for (uint32_t h = 0; h < 0x7C00; ++h) {
      float lo = float16ToFloat(uint16_t(sign | h));
      float hi = float16ToFloat(uint16_t(sign | (h + 1)));
      // Exact in float: float16's 11-bit significands and a halving.
      float mid = float((double(lo) + double(hi)) / 2);
      for (float f : {lo, mid, std::nextafter(mid, 0.0f),
                      std::nextafter(mid, sign ? -INFINITY : INFINITY)})
        expectHalf(f);
    }
  for (float f :
       {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f, 1e30f,
        std::numeric_limits<float>::denorm_min(), std::ldexp(1.0f, -25),
        std::ldexp(1.0f, -26), std::numeric_limits<float>::quiet_NaN(),
        -std::numeric_limits<float>::quiet_NaN()})
    expectHalf(f);
}

TEST(Cast, Float16NarrowingMatchesIeeeOnAStrideOfAllFloats) {
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 4099)
    expectHalf(std::bit_cast<float>(uint32_t(bits)));
}

TEST(Cast, Float16WideningIsExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    _Float16 half;
    uint16_t bits = uint16_t(h);
    std::memcpy(&half, &bits, 2);
    float want = static_cast<float>(half), got = float16ToFloat(bits);
    if (isHalfNaN(bits))
      EXPECT_TRUE(std::isnan(got));
    else
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << std::hex << h;
  }
}

TEST(Cast, BFloat16NarrowingRoundsToNearestEvenOnEveryTie) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if ((b & 0x7F80) == 0x7F80)
      continue; // inf and NaN
    uint32_t base = b << 16;
    for (uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      float f = std::bit_cast<float>(base | low);
      EXPECT_EQ(floatToBFloat16(f), referenceBf16(f))
          << std::hex << (base | low);
    }
  }
  EXPECT_EQ(floatToBFloat16(INFINITY), 0x7F80);
  EXPECT_EQ(floatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(floatToBFloat16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
}

TEST(Cast, CastElementsChecksDtypesAndSizes) {
  // 1 + 2^-11 is the tie between 1 and 1 + 2^-10: even, down.
  std::vector<float> in = {1.0f, 1.00048828125f, 65520.0f};
  std::vector<std::byte> out(6);
  ASSERT_TRUE(castElements(plan::DType::Float32, std::as_bytes(std::span(in)),
                           plan::DType::Float16, out));
  uint16_t h[3];
  std::memcpy(h, out.data(), 6);
  EXPECT_EQ(h[0], 0x3C00);
  EXPECT_EQ(h[1], 0x3C00);
  EXPECT_EQ(h[2], 0x7C00);
  std::vector<std::byte> small(4);
  auto bad = castElements(plan::DType::Float32, std::as_bytes(std::span(in)),
                          plan::DType::Float16, small);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "cast float32 -> float16: 12 bytes in, 4 "
                                 "bytes out");
  auto fp8 = castElements(plan::DType::Float32, std::as_bytes(std::span(in)),
                          plan::DType::Float8E4M3, out);
  ASSERT_FALSE(fp8);
  EXPECT_NE(fp8.error().message.find(
                "casts convert only float32, bfloat16 and float16"),
            std::string::npos);
}
