//===- KernelsTest.cpp - The runtime's CPU kernels against references -----===//
//
// Every kernel against an independent reference written from its documented
// definition: float8 casts against a brute-force nearest-even search over all
// 256 codes (and, where the CUDA toolkit's headers are installed, against
// cuda_fp8.h's __nv_cvt_float_to_fp8 itself), bf16 rounding against a
// two-candidate search, Philox against Random123's published known answers,
// AdamW against a scalar transcription of the operation order in Kernels.h.
// Stochastic rounding must give the same bits however a tensor is split into
// boxes, and every threaded path the bits of the single-threaded one.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Kernels.h"

// White-box: the SIMD paths of Philox, each against the portable one.
#include "KernelSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#if MESHPLAN_HAVE_CUDA_FP8_H
#include <cuda_fp8.h>
#endif

using namespace meshplan::runtime::kernels;

namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::E4M3FN, Fp8Format::E5M2};

const char *nameOf(Fp8Format format) {
  return format == Fp8Format::E4M3FN ? "e4m3fn" : "e5m2";
}

uint32_t bitsOf(float x) { return std::bit_cast<uint32_t>(x); }
float floatOf(uint32_t bits) { return std::bit_cast<float>(bits); }

//===----------------------------------------------------------------------===//
// References
//===----------------------------------------------------------------------===//

/// An fp8 code's value from its fields, independent of the library's table.
double fp8Value(uint8_t code, Fp8Format format) {
  int m = format == Fp8Format::E4M3FN ? 3 : 2;
  int bias = format == Fp8Format::E4M3FN ? 7 : 15;
  int exponent = (code & 0x7F) >> m;
  int mantissa = code & ((1 << m) - 1);
  double magnitude = exponent == 0 ? std::ldexp(mantissa, 1 - bias - m)
                                   : std::ldexp(1.0 + std::ldexp(mantissa, -m),
                                                exponent - bias);
  return code & 0x80 ? -magnitude : magnitude;
}

/// All finite non-negative fp8 codes in increasing order (their codes
/// increase with their values).
std::vector<uint8_t> finiteCodes(Fp8Format format) {
  uint8_t last = format == Fp8Format::E4M3FN ? 0x7E : 0x7B;
  std::vector<uint8_t> codes;
  for (int c = 0; c <= last; ++c)
    codes.push_back(static_cast<uint8_t>(c));
  return codes;
}

/// Brute force: the nearest finite fp8 value to x (values beyond the largest
/// saturate), ties to the even code; NaN -> 0x7F; the sign is kept.
uint8_t referenceFp8(float x, Fp8Format format) {
  // values[i] is the value of code i.
  static const std::array<std::vector<double>, 2> valuesOf = [] {
    std::array<std::vector<double>, 2> v;
    for (Fp8Format f : kFormats)
      for (uint8_t code : finiteCodes(f))
        v[f == Fp8Format::E5M2].push_back(fp8Value(code, f));
    return v;
  }();
  const std::vector<double> &values = valuesOf[format == Fp8Format::E5M2];
  if (std::isnan(x))
    return 0x7F;
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  double a = std::fabs(static_cast<double>(x));
  // The first code whose value is >= a.
  size_t hi =
      std::lower_bound(values.begin(), values.end(), a) - values.begin();
  if (hi == values.size())
    return sign | static_cast<uint8_t>(values.size() - 1);
  if (hi == 0 || values[hi] == a)
    return sign | static_cast<uint8_t>(hi);
  size_t lo = hi - 1;
  double dHi = values[hi] - a, dLo = a - values[lo];
  size_t nearest = dLo < dHi ? lo : dHi < dLo ? hi : lo % 2 == 0 ? lo : hi;
  return sign | static_cast<uint8_t>(nearest);
}

/// bf16 round to nearest even by comparing the two bf16 neighbours.
uint16_t referenceBf16(float x) {
  if (std::isnan(x))
    return 0x7FC0;
  uint32_t bits = bitsOf(x);
  uint16_t down = static_cast<uint16_t>(bits >> 16);
  if ((bits & 0xFFFF) == 0)
    return down;
  uint16_t up = static_cast<uint16_t>(down + 1);
  double a = std::fabs(static_cast<double>(x));
  double lo = std::fabs(static_cast<double>(floatOf(uint32_t(down) << 16)));
  // Past the largest bf16, the next value up is the overflow threshold's
  // other end, 2^128 (IEEE rounds to inf from max + half an ulp).
  double hi = (up & 0x7FFF) == 0x7F80
                  ? std::ldexp(1.0, 128)
                  : std::fabs(static_cast<double>(floatOf(uint32_t(up) << 16)));
  if (a - lo < hi - a)
    return down;
  if (hi - a < a - lo)
    return up;
  return (down & 1) == 0 ? down : up;
}

float halfToFloat(uint16_t h) {
  int exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  double v = exponent == 0 ? std::ldexp(mantissa, -24)
             : exponent == 31
                 ? (mantissa ? std::numeric_limits<double>::quiet_NaN()
                             : std::numeric_limits<double>::infinity())
                 : std::ldexp(1024 + mantissa, exponent - 25);
  return static_cast<float>(h & 0x8000 ? -v : v);
}

#if MESHPLAN_HAVE_CUDA_FP8_H
uint8_t cudaFp8(float x, Fp8Format format) {
  return __nv_cvt_float_to_fp8(
      x, __NV_SATFINITE, format == Fp8Format::E4M3FN ? __NV_E4M3 : __NV_E5M2);
}
float cudaFp8ToFloat(uint8_t code, Fp8Format format) {
  return halfToFloat(__nv_cvt_fp8_to_halfraw(code, format == Fp8Format::E4M3FN
                                                       ? __NV_E4M3
                                                       : __NV_E5M2)
                         .x);
}
#endif

/// The AdamW step as Kernels.h documents it, one element at a time.
struct ReferenceAdamW {
  float decay, w1, b2, w2, negStep, bc2Sqrt, eps;

  ReferenceAdamW(const AdamWParams &p, int64_t step) {
    double bc1 = 1 - std::pow(p.beta1, double(step));
    double bc2 = 1 - std::pow(p.beta2, double(step));
    decay = float(1 - p.lr * p.weightDecay);
    w1 = float(1 - p.beta1);
    b2 = float(p.beta2);
    w2 = float(1 - p.beta2);
    negStep = float(-(p.lr / bc1));
    bc2Sqrt = float(std::sqrt(bc2));
    eps = float(p.eps);
  }

  float update(float p, float g, float &m, float &v) const {
    p = p * decay;
    if (w1 < 0.5f)
      m = m + w1 * (g - m);
    else
      m = g - (g - m) * (1.0f - w1);
    v = v * b2;
    v = v + (w2 * g) * g;
    float d = std::sqrt(v) / bc2Sqrt + eps;
    return p + (negStep * m) / d;
  }
};

uint64_t splitmix64Finalizer(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Float bit patterns to test conversions on: every 4099th of 2^32, then
/// specials, float subnormals and the extremes.
std::vector<float> sampledFloats() {
  std::vector<float> xs;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4099)
    xs.push_back(floatOf(static_cast<uint32_t>(b)));
  for (uint32_t b :
       {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
        0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu, 0x7FFFFFFFu,
        0x00000001u, 0x80000001u, 0x007FFFFFu, 0x807FFFFFu, 0x00800000u,
        0x80800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x3F800000u, 0xBF800000u})
    xs.push_back(floatOf(b));
  return xs;
}

/// For each format: every fp8 value, the midpoints between neighbours and
/// their float neighbours, and values around the largest finite value.
std::vector<float> fp8Boundaries() {
  std::vector<float> xs;
  for (Fp8Format format : kFormats) {
    std::vector<uint8_t> codes = finiteCodes(format);
    for (size_t i = 0; i < codes.size(); ++i) {
      double v = fp8Value(codes[i], format);
      double next = i + 1 < codes.size()
                        ? fp8Value(codes[i + 1], format)
                        : 2 * v - fp8Value(codes[i - 1], format);
      float mid = static_cast<float>((v + next) / 2); // exact
      for (float x : {static_cast<float>(v), mid, std::nextafter(mid, 0.0f),
                      std::nextafter(mid, 1e30f),
                      std::nextafter(static_cast<float>(v), 0.0f),
                      std::nextafter(static_cast<float>(v), 1e30f)}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
    }
    float max = fp8MaxFinite(format);
    for (float x : {max * 2, max * 1.0625f, max * 1.03125f, 1e30f,
                    std::numeric_limits<float>::max()}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  return xs;
}

/// Scales the cast is tried with: 1, powers of two, and odd ones.
const std::vector<float> kScales = {
    1.0f, 2.0f, 0.5f,          1024.0f,   0x1p-20f,   0x1p40f,
    3.0f, 0.1f, 448.0f / 3.7f, 0.999999f, 1.0000001f, 57344.0f / 1e-3f};

std::mt19937_64 &rng() {
  static std::mt19937_64 engine(0x6d657368706c616eull);
  return engine;
}

std::vector<float> randomFloats(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> xs(n);
  for (float &x : xs)
    x = normal(rng());
  return xs;
}

std::vector<uint16_t> randomBf16(size_t n, float scale = 1.0f) {
  std::vector<uint16_t> out(n);
  std::vector<float> xs = randomFloats(n, scale);
  castToBf16(xs, out);
  return out;
}

/// Threading that splits even short spans into many uneven chunks.
const Threading kManyThreads{7, 1000};

//===----------------------------------------------------------------------===//
// Philox and the stochastic-rounding bits
//===----------------------------------------------------------------------===//

TEST(Philox, Random123KnownAnswers) {
  // Random123's kat_vectors, philox4x32 with 10 rounds.
  struct Kat {
    std::array<uint32_t, 4> counter;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> expected;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat &kat : kats)
    EXPECT_EQ(philox4x32_10(kat.counter, kat.key), kat.expected);
}

TEST(Philox, StochasticRoundingBitsFollowTheDocumentedMapping) {
  const StochasticRoundingKey keys[] = {
      {0, 1, 0},
      {42, 7, 3},
      {0xFFFFFFFFFFFFFFFFull, (int64_t(1) << 40) + 5, 1234567},
      {0x0123456789ABCDEFull, 1, 0xFEDCBA9876543210ull}};
  const int64_t indices[] = {0,
                             1,
                             7,
                             8,
                             9,
                             15,
                             16,
                             63,
                             64,
                             12345,
                             (int64_t(1) << 35) + 3,
                             (int64_t(1) << 62) + 46};
  for (const StochasticRoundingKey &key : keys) {
    uint64_t k =
        key.seed ^ splitmix64Finalizer(key.tensorId + 0x9E3779B97F4A7C15ull);
    for (int64_t index : indices) {
      uint64_t r = uint64_t(index) % 64;
      uint64_t c = uint64_t(index) / 64 * 8 + r % 8;
      uint64_t step = uint64_t(key.step);
      auto words = philox4x32_10({uint32_t(c), uint32_t(c >> 32),
                                  uint32_t(step), uint32_t(step >> 32)},
                                 {uint32_t(k), uint32_t(k >> 32)});
      uint16_t expected =
          static_cast<uint16_t>(words[r / 16] >> (16 * (r / 8 % 2)));
      EXPECT_EQ(stochasticRoundingBits(key, index), expected)
          << "seed " << key.seed << " step " << key.step << " tensor "
          << key.tensorId << " index " << index;
    }
  }
  // Each of the four inputs changes the bits.
  StochasticRoundingKey base{5, 3, 9};
  std::vector<uint16_t> a, b, c, d, e;
  for (int64_t i = 0; i < 64; ++i) {
    a.push_back(stochasticRoundingBits(base, i));
    b.push_back(stochasticRoundingBits({6, 3, 9}, i));
    c.push_back(stochasticRoundingBits({5, 4, 9}, i));
    d.push_back(stochasticRoundingBits({5, 3, 10}, i));
    e.push_back(stochasticRoundingBits(base, i + 64));
  }
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  EXPECT_NE(a, e);
}

TEST(Philox, EverySimdPathGivesTheDocumentedBits) {
  using namespace meshplan::runtime::kernels::detail;
  const uint64_t seed = 123, tensorId = 45;
  PhiloxSchedule schedule(stochasticRoundingKey(seed, tensorId));
  const int64_t count = 5;
  std::string ran;
  for (PhiloxPath path : philoxPaths())
    ran += std::to_string(static_cast<int>(path)) + " ";
  RecordProperty("philox_paths", ran);
  // The counters cross 2^32 in the third case.
  for (uint64_t first : {uint64_t(0), uint64_t(3), (uint64_t(1) << 29) - 2,
                         (uint64_t(1) << 58) - 7}) {
    for (int64_t step : {int64_t(1), (int64_t(1) << 33) + 7}) {
      std::vector<uint32_t> expected(kSuperblock * count);
      for (int64_t j = 0; j < kSuperblock * count; ++j)
        // The element index wraps like the kernel's uint64 counters (the
        // last case's index exceeds 2^63); signed arithmetic would overflow.
        expected[j] = stochasticRoundingBits(
            {seed, step, tensorId},
            static_cast<int64_t>(first * uint64_t(kSuperblock) + uint64_t(j)));
      for (PhiloxPath path : philoxPaths()) {
        std::vector<uint32_t> got(kSuperblock * count, 0xDEADBEEF);
        philoxSuperblocks(first, count, schedule, uint64_t(step), got.data(),
                          path);
        EXPECT_EQ(got, expected) << "path " << static_cast<int>(path)
                                 << " superblock " << first << " step " << step;
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// float8
//===----------------------------------------------------------------------===//

TEST(Fp8, DecodeMatchesTheFormatDefinition) {
  for (Fp8Format format : kFormats) {
    for (int c = 0; c < 256; ++c) {
      uint8_t code = static_cast<uint8_t>(c);
      float v = fp8ToFloat(code, format);
      bool nan =
          format == Fp8Format::E4M3FN ? (c & 0x7F) == 0x7F : (c & 0x7F) > 0x7C;
      bool inf = format == Fp8Format::E5M2 && (c & 0x7F) == 0x7C;
      if (nan) {
        EXPECT_EQ(bitsOf(v), 0x7FC00000u) << nameOf(format) << " " << c;
      } else if (inf) {
        EXPECT_EQ(v, c & 0x80 ? -INFINITY : INFINITY);
      } else {
        EXPECT_EQ(static_cast<double>(v), fp8Value(code, format))
            << nameOf(format) << " code " << c;
        EXPECT_EQ(std::signbit(v), (c & 0x80) != 0);
        // Every finite value encodes back to its code.
        EXPECT_EQ(floatToFp8(v, format), code) << nameOf(format) << " " << c;
      }
#if MESHPLAN_HAVE_CUDA_FP8_H
      float expected = cudaFp8ToFloat(code, format);
      if (std::isnan(expected))
        EXPECT_TRUE(std::isnan(v)) << nameOf(format) << " " << c;
      else
        EXPECT_EQ(bitsOf(v), bitsOf(expected)) << nameOf(format) << " " << c;
#endif
    }
  }
  EXPECT_EQ(fp8ToFloat(0x7E, Fp8Format::E4M3FN), 448.0f);
  EXPECT_EQ(fp8ToFloat(0x01, Fp8Format::E4M3FN), 0x1p-9f);
  EXPECT_EQ(fp8ToFloat(0x7B, Fp8Format::E5M2), 57344.0f);
  EXPECT_EQ(fp8ToFloat(0x01, Fp8Format::E5M2), 0x1p-16f);
  EXPECT_EQ(fp8MaxFinite(Fp8Format::E4M3FN), 448.0f);
  EXPECT_EQ(fp8MaxFinite(Fp8Format::E5M2), 57344.0f);
}

TEST(Fp8, SaturationNaNAndSignedZero) {
  for (Fp8Format format : kFormats) {
    uint8_t max = format == Fp8Format::E4M3FN ? 0x7E : 0x7B;
    EXPECT_EQ(floatToFp8(INFINITY, format), max);
    EXPECT_EQ(floatToFp8(-INFINITY, format), 0x80 | max);
    EXPECT_EQ(floatToFp8(1e30f, format), max);
    EXPECT_EQ(floatToFp8(NAN, format), 0x7F);
    EXPECT_EQ(floatToFp8(-NAN, format), 0x7F);
    EXPECT_EQ(floatToFp8(floatOf(0xFF800001u), format), 0x7F);
    EXPECT_EQ(floatToFp8(0.0f, format), 0x00);
    EXPECT_EQ(floatToFp8(-0.0f, format), 0x80);
    EXPECT_EQ(floatToFp8(-1e-30f, format), 0x80);
  }
  // Ties between the two largest e4m3 values and above: 464 is a tie between
  // 448 (0x7E, even) and 480 (which would be NaN); everything saturates.
  EXPECT_EQ(floatToFp8(464.0f, Fp8Format::E4M3FN), 0x7E);
  EXPECT_EQ(floatToFp8(470.0f, Fp8Format::E4M3FN), 0x7E);
  // The smallest subnormal's half is a tie with zero (even).
  EXPECT_EQ(floatToFp8(0x1p-10f, Fp8Format::E4M3FN), 0x00);
  EXPECT_EQ(floatToFp8(std::nextafter(0x1p-10f, 1.0f), Fp8Format::E4M3FN),
            0x01);
  EXPECT_EQ(floatToFp8(0x1p-17f, Fp8Format::E5M2), 0x00);
  EXPECT_EQ(floatToFp8(std::nextafter(0x1p-17f, 1.0f), Fp8Format::E5M2), 0x01);
}

/// One sweep of x * scale casts against the brute-force reference (and
/// cuda_fp8.h where present), through the span kernel and the scalar.
void checkCasts(const std::vector<float> &xs) {
  std::vector<uint8_t> out(xs.size());
  std::vector<uint16_t> bf16(xs.size());
  castToBf16(xs, bf16);
  std::vector<uint8_t> outBf16(xs.size());
  for (Fp8Format format : kFormats) {
    for (float scale : kScales) {
      castToFp8(xs, scale, out, format);
      castToFp8(bf16, scale, outBf16, format);
      int64_t failures = 0;
      for (size_t i = 0; i < xs.size() && failures < 5; ++i) {
        float y = xs[i] * scale;
        uint8_t expected = referenceFp8(y, format);
        bool ok = out[i] == expected && floatToFp8(y, format) == expected;
#if MESHPLAN_HAVE_CUDA_FP8_H
        ok = ok && cudaFp8(y, format) == expected;
#endif
        float yBf16 = bf16ToFloat(bf16[i]) * scale;
        ok = ok && outBf16[i] == referenceFp8(yBf16, format);
        if (!ok) {
          ++failures;
          ADD_FAILURE() << nameOf(format) << " x = " << xs[i] << " (0x"
                        << std::hex << bitsOf(xs[i]) << std::dec << ") scale "
                        << scale << ": got " << int(out[i]) << " scalar "
                        << int(floatToFp8(y, format)) << " expected "
                        << int(expected)
#if MESHPLAN_HAVE_CUDA_FP8_H
                        << " cuda " << int(cudaFp8(y, format))
#endif
                        << " (bf16 input: got " << int(outBf16[i])
                        << " expected " << int(referenceFp8(yBf16, format))
                        << ")";
        }
      }
    }
  }
}

TEST(Fp8, CastMatchesNearestEvenOnSampledFloats) {
  checkCasts(sampledFloats());
}

TEST(Fp8, CastMatchesNearestEvenAtEveryBoundary) {
  checkCasts(fp8Boundaries());
}

#if MESHPLAN_HAVE_CUDA_FP8_H
TEST(Fp8, CudaReferenceAgreesWithBruteForce) {
  // The two references are independent; if they disagreed, the cast tests
  // would not say which one to believe.
  for (Fp8Format format : kFormats)
    for (float x : fp8Boundaries())
      EXPECT_EQ(cudaFp8(x, format), referenceFp8(x, format))
          << nameOf(format) << " " << x;
}
#endif

TEST(Fp8, ScaleFromAmax) {
  EXPECT_EQ(fp8ScaleFromAmax(1.0f, Fp8Format::E4M3FN, false), 448.0f);
  EXPECT_EQ(fp8ScaleFromAmax(1.0f, Fp8Format::E5M2, false), 57344.0f);
  EXPECT_EQ(fp8ScaleFromAmax(1.0f, Fp8Format::E4M3FN, true), 256.0f);
  EXPECT_EQ(fp8ScaleFromAmax(1.0f, Fp8Format::E5M2, true), 32768.0f);
  EXPECT_EQ(fp8ScaleFromAmax(448.0f, Fp8Format::E4M3FN, true), 1.0f);
  // amax 0 (an all-zero or empty tensor) is clamped to 1e-12.
  EXPECT_EQ(fp8ScaleFromAmax(0.0f, Fp8Format::E4M3FN, false),
            static_cast<float>(448.0 / 1e-12));
  EXPECT_TRUE(std::isnan(fp8ScaleFromAmax(NAN, Fp8Format::E4M3FN, false)));
  EXPECT_TRUE(std::isnan(fp8ScaleFromAmax(NAN, Fp8Format::E4M3FN, true)));
  EXPECT_EQ(fp8ScaleFromAmax(INFINITY, Fp8Format::E4M3FN, true), 0.0f);
  for (Fp8Format format : kFormats) {
    for (float amax : randomFloats(2000, 100.0f)) {
      amax = std::fabs(amax) * (amax > 0 ? 1e-6f : 1e6f);
      double exact =
          double(fp8MaxFinite(format)) / std::max(double(amax), 1e-12);
      float scale = fp8ScaleFromAmax(amax, format, false);
      EXPECT_EQ(scale, static_cast<float>(exact)) << amax;
      float pow2 = fp8ScaleFromAmax(amax, format, true);
      int e;
      EXPECT_EQ(std::frexp(pow2, &e), 0.5f) << amax;
      EXPECT_LE(pow2, scale);
      EXPECT_GT(2 * pow2, scale);
    }
  }
}

TEST(Fp8, Dequant) {
  std::vector<uint8_t> codes(256);
  std::iota(codes.begin(), codes.end(), 0);
  std::vector<float> out(256);
  std::vector<uint16_t> outBf16(256);
  for (Fp8Format format : kFormats) {
    for (float scale : {1.0f, 448.0f / 3.7f, 0x1p-20f}) {
      dequantFp8(codes, scale, out, format);
      dequantFp8(codes, scale, outBf16, format);
      for (int c = 0; c < 256; ++c) {
        float expected = fp8ToFloat(uint8_t(c), format) / scale;
        EXPECT_EQ(bitsOf(out[c]), bitsOf(expected)) << c;
        EXPECT_EQ(outBf16[c], referenceBf16(expected)) << c;
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// amax and bf16
//===----------------------------------------------------------------------===//

TEST(Amax, EmptyIsZeroAndNaNPropagates) {
  EXPECT_EQ(bitsOf(amax(std::span<const float>())), 0u);
  EXPECT_EQ(bitsOf(amax(std::span<const uint16_t>())), 0u);
  std::vector<float> xs = {1.0f, -3.5f, 2.0f, -0.0f};
  EXPECT_EQ(amax(xs), 3.5f);
  xs.push_back(-INFINITY);
  EXPECT_EQ(amax(xs), INFINITY);
  xs.push_back(floatOf(0xFF800001u));
  EXPECT_TRUE(std::isnan(amax(xs)));
  std::vector<float> zeros = {-0.0f, 0.0f};
  EXPECT_EQ(bitsOf(amax(zeros)), 0u);
  std::vector<uint16_t> b = {floatToBf16(-7.0f), floatToBf16(3.0f)};
  EXPECT_EQ(amax(b), 7.0f);
  b.push_back(0xFFC1);
  EXPECT_TRUE(std::isnan(amax(b)));
  std::vector<float> r = randomFloats(100003);
  float expected = 0;
  for (float x : r)
    expected = std::max(expected, std::fabs(x));
  EXPECT_EQ(amax(r), expected);
}

TEST(BFloat16, RoundToNearestEven) {
  std::vector<float> xs = sampledFloats();
  for (float x : fp8Boundaries())
    xs.push_back(x);
  // Exact ties, and ties +- one float ulp.
  for (uint32_t b :
       {0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F807FFFu, 0x7F7F8000u,
        0x7F7F7FFFu, 0xFF7F8000u, 0x00008000u, 0x00018000u})
    xs.push_back(floatOf(b));
  std::vector<uint16_t> out(xs.size());
  castToBf16(xs, out);
  std::vector<float> back(xs.size());
  castBf16ToFloat(out, back);
  int failures = 0;
  for (size_t i = 0; i < xs.size() && failures < 5; ++i) {
    uint16_t expected = referenceBf16(xs[i]);
    if (out[i] != expected || floatToBf16(xs[i]) != expected ||
        bitsOf(back[i]) != uint32_t(out[i]) << 16 ||
        bitsOf(bf16ToFloat(out[i])) != uint32_t(out[i]) << 16) {
      ++failures;
      ADD_FAILURE() << std::hex << "x 0x" << bitsOf(xs[i]) << " got 0x"
                    << out[i] << " expected 0x" << expected;
    }
  }
  EXPECT_EQ(floatToBf16(floatOf(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(floatToBf16(INFINITY), 0x7F80);
}

//===----------------------------------------------------------------------===//
// Stochastic rounding
//===----------------------------------------------------------------------===//

TEST(StochasticRounding, RoundsUpWithProbabilityOfTheLowBits) {
  float x = floatOf(0x3F801234u);
  EXPECT_EQ(stochasticRoundBf16(x, 0x1233), 0x3F81);
  EXPECT_EQ(stochasticRoundBf16(x, 0x1234), 0x3F80);
  EXPECT_EQ(stochasticRoundBf16(x, 0xFFFF), 0x3F80);
  EXPECT_EQ(stochasticRoundBf16(x, 0), 0x3F81);
  float neg = floatOf(0xBF80FFFFu);
  EXPECT_EQ(stochasticRoundBf16(neg, 0xFFFE), 0xBF81); // away from zero
  EXPECT_EQ(stochasticRoundBf16(neg, 0xFFFF), 0xBF80);
  for (uint32_t r : {0u, 1u, 0x8000u, 0xFFFFu}) {
    EXPECT_EQ(stochasticRoundBf16(1.0f, r), 0x3F80);
    EXPECT_EQ(stochasticRoundBf16(-0.0f, r), 0x8000);
    EXPECT_EQ(stochasticRoundBf16(INFINITY, r), 0x7F80);
    EXPECT_EQ(stochasticRoundBf16(-INFINITY, r), 0xFF80);
    EXPECT_EQ(stochasticRoundBf16(NAN, r), 0x7FC0);
    EXPECT_EQ(stochasticRoundBf16(floatOf(0x7F800001u), r), 0x7FC0);
    EXPECT_EQ(stochasticRoundBf16(floatOf(0xFF80FFFFu), r), 0x7FC0);
  }
}

TEST(StochasticRounding, IsUnbiased) {
  // The mean of n roundings is x up to sampling noise: each rounding is
  // x's lower bf16 neighbour plus ulp * Bernoulli(low / 2^16).
  const int64_t n = 1 << 20;
  int64_t seedOffset = 0;
  for (float x : {1.0f + 0.3f * 0x1p-7f, -3.14159f, 1e-20f, 0.999f,
                  floatOf(0x3F800001u), floatOf(0x3F80FFFFu)}) {
    std::vector<float> in(n, x);
    std::vector<uint16_t> out(n);
    castToBf16Stochastic(in, out, {17, 1 + seedOffset++, 4}, {{{0, 0, n}}});
    double sum = 0;
    for (uint16_t b : out)
      sum += bf16ToFloat(b);
    double mean = sum / n;
    double lo = bf16ToFloat(uint16_t(bitsOf(x) >> 16));
    double ulp = std::fabs(bf16ToFloat(uint16_t((bitsOf(x) >> 16) + 1)) - lo);
    double p = (bitsOf(x) & 0xFFFF) / 65536.0;
    double sigma = ulp * std::sqrt(std::max(p * (1 - p), 1.0 / n) / n);
    EXPECT_NEAR(mean, double(x), 5 * sigma) << x;
  }
}

TEST(IndexRuns, BoxesOfARowMajorTensor) {
  using Runs = std::vector<IndexRun>;
  auto runs = [](std::vector<int64_t> g, std::vector<int64_t> o,
                 std::vector<int64_t> l) { return boxIndexRuns(g, o, l); };
  EXPECT_EQ(runs({6, 4}, {2, 0}, {3, 4}), Runs({{0, 8, 12}}));
  EXPECT_EQ(runs({6, 4}, {0, 1}, {2, 2}), Runs({{0, 1, 2}, {2, 5, 2}}));
  EXPECT_EQ(runs({2, 3, 4}, {1, 0, 0}, {1, 3, 4}), Runs({{0, 12, 12}}));
  EXPECT_EQ(runs({2, 3, 4}, {0, 1, 0}, {2, 2, 4}),
            Runs({{0, 4, 8}, {8, 16, 8}}));
  EXPECT_EQ(runs({2, 3, 4}, {1, 2, 1}, {1, 1, 3}), Runs({{0, 21, 3}}));
  EXPECT_EQ(runs({10}, {3}, {7}), Runs({{0, 3, 7}}));
  EXPECT_EQ(runs({}, {}, {}), Runs({{0, 0, 1}}));
  EXPECT_EQ(runs({6, 4}, {6, 0}, {0, 4}), Runs());
  EXPECT_EQ(runs({6, 0}, {0, 0}, {6, 0}), Runs());
  EXPECT_FALSE(runs({6, 4}, {5, 0}, {2, 4}));
  EXPECT_FALSE(runs({6, 4}, {0}, {6, 4}));
  EXPECT_FALSE(runs({6, 4}, {-1, 0}, {1, 4}));
  EXPECT_FALSE(runs({int64_t(1) << 40, int64_t(1) << 40}, {0, 0}, {1, 1}));
}

/// A box of a global tensor.
struct Box {
  std::vector<int64_t> offset, shape;
};

/// The boxes of a tensor split by `cuts` (per dimension, the sizes of the
/// pieces, summing to the dimension).
std::vector<Box> grid(const std::vector<std::vector<int64_t>> &cuts) {
  std::vector<Box> boxes = {{{}, {}}};
  for (const std::vector<int64_t> &sizes : cuts) {
    std::vector<Box> next;
    for (const Box &b : boxes) {
      int64_t at = 0;
      for (int64_t size : sizes) {
        Box c = b;
        c.offset.push_back(at);
        c.shape.push_back(size);
        next.push_back(c);
        at += size;
      }
    }
    boxes = next;
  }
  return boxes;
}

template <typename T>
std::vector<T> gather(const std::vector<T> &global,
                      const std::vector<IndexRun> &runs, int64_t n) {
  std::vector<T> local(n);
  for (const IndexRun &r : runs)
    std::copy_n(global.begin() + r.global, r.length, local.begin() + r.local);
  return local;
}

template <typename T>
void scatter(const std::vector<T> &local, const std::vector<IndexRun> &runs,
             std::vector<T> &global) {
  for (const IndexRun &r : runs)
    std::copy_n(local.begin() + r.local, r.length, global.begin() + r.global);
}

struct Split {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> cuts;
};

const std::vector<Split> kSplits = {
    {"whole", {37, 53}, {{37}, {53}}},
    {"rows", {37, 53}, {{10, 0, 27}, {53}}},
    {"columns", {37, 53}, {{37}, {20, 33}}},
    {"uneven grid", {37, 53}, {{1, 17, 19}, {3, 0, 49, 1}}},
    {"single elements", {37, 53}, {{37}, std::vector<int64_t>(53, 1)}},
    {"3-d whole", {5, 7, 9}, {{5}, {7}, {9}}},
    {"3-d grid", {5, 7, 9}, {{2, 3}, {7}, {4, 0, 5}}},
    {"3-d middle", {5, 7, 9}, {{5}, {1, 5, 1}, {9}}},
};

TEST(StochasticRounding, ResultIsTheSameForEveryShardingOfATensor) {
  AdamWParams params{1e-2, 0.9, 0.999, 1e-8, 0.1};
  for (const Split &split : kSplits) {
    int64_t n = std::accumulate(split.shape.begin(), split.shape.end(),
                                int64_t(1), std::multiplies<>());
    std::vector<float> x = randomFloats(n), g = randomFloats(n, 1e-2f),
                       m0 = randomFloats(n, 1e-3f), v0 = randomFloats(n, 1e-4f);
    for (float &v : v0)
      v = v * v;
    std::vector<uint16_t> p0 = randomBf16(n);
    // References on the whole tensor, element by element.
    StochasticRoundingKey key{99, 12, 31};
    std::vector<uint16_t> castRef(n), pRef = p0;
    std::vector<float> mRef = m0, vRef = v0, p32Ref = x, m32Ref = m0,
                       v32Ref = v0;
    ReferenceAdamW ref(params, key.step);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t r = stochasticRoundingBits(key, i);
      castRef[i] = stochasticRoundBf16(x[i], r);
      pRef[i] = stochasticRoundBf16(
          ref.update(bf16ToFloat(p0[i]), g[i], mRef[i], vRef[i]), r);
      p32Ref[i] = ref.update(x[i], g[i], m32Ref[i], v32Ref[i]);
    }
    // Each shard on its own, written back to global positions.
    std::vector<uint16_t> castOut(n, 0xDEAD), pOut(n, 0xDEAD);
    std::vector<float> mOut(n, NAN), vOut(n, NAN), p32Out(n, NAN),
        m32Out(n, NAN), v32Out(n, NAN);
    for (const Box &box : grid(split.cuts)) {
      auto runs = boxIndexRuns(split.shape, box.offset, box.shape);
      ASSERT_TRUE(runs);
      int64_t local = std::accumulate(box.shape.begin(), box.shape.end(),
                                      int64_t(1), std::multiplies<>());
      std::vector<uint16_t> c(local);
      castToBf16Stochastic(gather(x, *runs, local), c, key, *runs);
      scatter(c, *runs, castOut);
      std::vector<uint16_t> p = gather(p0, *runs, local);
      std::vector<float> gl = gather(g, *runs, local),
                         m = gather(m0, *runs, local),
                         v = gather(v0, *runs, local);
      adamwBf16StochasticRounding(p, gl, m, v, params, key.step, key.seed,
                                  key.tensorId, *runs);
      scatter(p, *runs, pOut);
      scatter(m, *runs, mOut);
      scatter(v, *runs, vOut);
      std::vector<float> p32 = gather(x, *runs, local),
                         m32 = gather(m0, *runs, local),
                         v32 = gather(v0, *runs, local);
      adamwFp32(p32, gl, m32, v32, params, key.step);
      scatter(p32, *runs, p32Out);
      scatter(m32, *runs, m32Out);
      scatter(v32, *runs, v32Out);
    }
    auto bits = [](const std::vector<float> &v) {
      std::vector<uint32_t> b;
      for (float x : v)
        b.push_back(bitsOf(x));
      return b;
    };
    EXPECT_EQ(castOut, castRef) << split.name;
    EXPECT_EQ(pOut, pRef) << split.name;
    EXPECT_EQ(bits(mOut), bits(mRef)) << split.name;
    EXPECT_EQ(bits(vOut), bits(vRef)) << split.name;
    EXPECT_EQ(bits(p32Out), bits(p32Ref)) << split.name;
    EXPECT_EQ(bits(m32Out), bits(m32Ref)) << split.name;
    EXPECT_EQ(bits(v32Out), bits(v32Ref)) << split.name;
  }
}

//===----------------------------------------------------------------------===//
// AdamW
//===----------------------------------------------------------------------===//

TEST(AdamW, Fp32MatchesTheDocumentedOperationOrderBitForBit) {
  const AdamWParams paramSets[] = {
      {1e-3, 0.9, 0.999, 1e-8, 0.01},
      {3e-4, 0.95, 0.98, 1e-6, 0.0},
      {1e-1, 0.3, 0.5, 1e-3, 0.5}, // lerp weight 0.7: ATen's other branch
      {1e-2, 0.0, 0.0, 1e-8, 0.1},
  };
  const size_t n = 4099;
  for (const AdamWParams &params : paramSets) {
    std::vector<float> p = randomFloats(n), m = randomFloats(n, 1e-3f),
                       v = randomFloats(n, 1e-3f);
    for (float &x : v)
      x = x * x;
    p[0] = 0, m[0] = 0, v[0] = 0;
    std::vector<float> pRef = p, mRef = m, vRef = v;
    for (int64_t step : {1, 2, 3, 10, 1000, 100000}) {
      std::vector<float> g = randomFloats(n, step % 2 ? 1e-2f : 1e3f);
      g[1] = 0;
      adamwFp32(p, g, m, v, params, step);
      ReferenceAdamW ref(params, step);
      for (size_t i = 0; i < n; ++i)
        pRef[i] = ref.update(pRef[i], g[i], mRef[i], vRef[i]);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(bitsOf(p[i]), bitsOf(pRef[i]))
            << "lr " << params.lr << " step " << step << " element " << i;
        ASSERT_EQ(bitsOf(m[i]), bitsOf(mRef[i]));
        ASSERT_EQ(bitsOf(v[i]), bitsOf(vRef[i]));
      }
    }
  }
}

TEST(AdamW, FirstStepMovesByLearningRate) {
  // A sanity anchor independent of the transcription: on step 1, m = (1-b1)g,
  // v = (1-b2)g^2 and the update is -lr * sign(g) (up to eps).
  std::vector<float> p = {1.0f, 1.0f}, g = {0.5f, -2.0f}, m(2), v(2);
  adamwFp32(p, g, m, v, {0.01, 0.9, 0.999, 1e-12, 0.0}, 1);
  EXPECT_NEAR(p[0], 0.99f, 1e-6f);
  EXPECT_NEAR(p[1], 1.01f, 1e-6f);
}

//===----------------------------------------------------------------------===//
// Threads
//===----------------------------------------------------------------------===//

TEST(Threads, ThreadedSpansGiveTheSingleThreadedBits) {
  const Threading one = Threading::singleThreaded();
  const int64_t n = 3'000'007;
  std::vector<float> x = randomFloats(n, 10.0f);
  std::vector<uint16_t> xb = randomBf16(n, 10.0f);
  x[n - 5] = floatOf(0x7F800123u);
  for (Fp8Format format : kFormats) {
    std::vector<uint8_t> a(n), b(n);
    castToFp8(x, 13.5f, a, format, one);
    castToFp8(x, 13.5f, b, format, kManyThreads);
    EXPECT_EQ(a, b);
    castToFp8(xb, 13.5f, a, format, one);
    castToFp8(xb, 13.5f, b, format, kManyThreads);
    EXPECT_EQ(a, b);
    std::vector<float> fa(n), fb(n);
    dequantFp8(a, 13.5f, fa, format, one);
    dequantFp8(a, 13.5f, fb, format, kManyThreads);
    EXPECT_EQ(0, std::memcmp(fa.data(), fb.data(), n * sizeof(float)));
  }
  EXPECT_TRUE(std::isnan(amax(x, kManyThreads)));
  x[n - 5] = 1.0f;
  x[n - 3] = -1e6f;
  EXPECT_EQ(amax(x, one), 1e6f);
  EXPECT_EQ(amax(x, kManyThreads), 1e6f);
  EXPECT_EQ(amax(xb, one), amax(xb, kManyThreads));

  std::vector<uint16_t> ba(n), bb(n);
  castToBf16(x, ba, one);
  castToBf16(x, bb, kManyThreads);
  EXPECT_EQ(ba, bb);

  // A column shard of a 3000 x 2000 matrix: runs of 1000 elements, pieces
  // cut by chunk boundaries anywhere.
  const int64_t rows = 3000, cols = 2000, shardCols = 1000;
  auto runs = boxIndexRuns(std::vector<int64_t>{rows, cols},
                           std::vector<int64_t>{0, 1000},
                           std::vector<int64_t>{rows, shardCols});
  ASSERT_TRUE(runs);
  const int64_t m = rows * shardCols;
  std::vector<float> in(x.begin(), x.begin() + m);
  StochasticRoundingKey key{7, 3, 11};
  castToBf16Stochastic(in, std::span(ba).first(m), key, *runs, one);
  castToBf16Stochastic(in, std::span(bb).first(m), key, *runs, kManyThreads);
  EXPECT_EQ(ba, bb);

  AdamWParams params;
  std::vector<float> g = randomFloats(m, 1e-2f), m0 = randomFloats(m, 1e-3f),
                     v0 = randomFloats(m, 1e-3f);
  for (float &v : v0)
    v = v * v;
  std::vector<float> p1 = in, p2 = in, m1 = m0, m2 = m0, v1 = v0, v2 = v0;
  adamwFp32(p1, g, m1, v1, params, 5, one);
  adamwFp32(p2, g, m2, v2, params, 5, kManyThreads);
  EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), m * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), m * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), m * sizeof(float)));
  std::vector<uint16_t> q1(xb.begin(), xb.begin() + m), q2 = q1;
  m1 = m2 = m0;
  v1 = v2 = v0;
  adamwBf16StochasticRounding(q1, g, m1, v1, params, 5, 7, 11, *runs, one);
  adamwBf16StochasticRounding(q2, g, m2, v2, params, 5, 7, 11, *runs,
                              kManyThreads);
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), m * sizeof(float)));
}

//===----------------------------------------------------------------------===//
// Preconditions
//===----------------------------------------------------------------------===//

TEST(KernelsDeathTest, BrokenPreconditionsAbortWithAMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> four(4), three(3);
  std::vector<uint8_t> out(3);
  EXPECT_DEATH(castToFp8(four, 1.0f, out, Fp8Format::E4M3FN),
               "castToFp8: input and output sizes differ");
  std::vector<uint16_t> p(4);
  EXPECT_DEATH(adamwBf16StochasticRounding(p, four, four, four, {}, 1, 0, 0,
                                           {{{0, 0, 3}}}),
               "cover the whole span");
  EXPECT_DEATH(adamwFp32(four, four, four, four, {}, 0), "1-based");
}

} // namespace
