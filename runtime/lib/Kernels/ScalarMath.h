//===- ScalarMath.h - Per-element math of CPU and CUDA kernels -*- C++ -*-===//
//
// The one definition of every per-element operation the kernels perform:
// float8 encoding, bf16 rounding (nearest even and stochastic), Philox-4x32-10
// and the stochastic-rounding bit mapping, the float8 scale, and one AdamW
// element update. The CPU kernels (Kernels/Cpu) and the CUDA kernels
// (Kernels/Cuda) both call these functions, so "the GPU gives the CPU's bits"
// holds by construction rather than by keeping two copies in step; the GPU
// tests then check what the compilers make of it (no FMA contraction, IEEE
// division and square root, no flush to zero).
//
// Under nvcc every function is __host__ __device__; elsewhere it is a plain
// always-inline function. Nothing here may use a library call that has no
// device version (hence bit tests instead of std::isfinite).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_KERNELS_SCALARMATH_H
#define MESHPLAN_RUNTIME_KERNELS_SCALARMATH_H

#include "meshplan/Runtime/Kernels.h"

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MESHPLAN_HD __host__ __device__ __forceinline__
#else
#define MESHPLAN_HD [[gnu::always_inline]] inline
#endif

namespace meshplan::runtime::kernels::detail {

//===----------------------------------------------------------------------===//
// float8
//===----------------------------------------------------------------------===//

template <Fp8Format F> struct Fp8Traits;
template <> struct Fp8Traits<Fp8Format::E4M3FN> {
  static constexpr int kMantissaBits = 3;
  static constexpr int kBias = 7;
  static constexpr float kMaxFinite = 448.0f;
  static constexpr int32_t kMinNormalBits = (127 - 6) << 23; // 2^-6
};
template <> struct Fp8Traits<Fp8Format::E5M2> {
  static constexpr int kMantissaBits = 2;
  static constexpr int kBias = 15;
  static constexpr float kMaxFinite = 57344.0f;
  static constexpr int32_t kMinNormalBits = (127 - 14) << 23; // 2^-14
};

/// cuda_fp8.h's code for every NaN input, for both formats.
constexpr uint32_t kFp8NaN = 0x7F;

/// Saturating round-to-nearest-even float -> fp8, branch-free (the compiler
/// turns the selects into vector blends). |x| is first clamped to maxFinite,
/// which equals rounding then saturating (everything above maxFinite rounds
/// to it or beyond). Then the FPU does the rounding: with E = |x|'s exponent
/// (at least the smallest normal fp8 exponent), M = 2^(E + 23 - mantissa
/// bits) has a float ulp of exactly one fp8 ulp at E, so |x| + M rounds |x|
/// to the fp8 grid, ties to even, and its low bits count the fp8 ulps k.
/// The code is then ((E - Emin) << mantissa bits) + k: k may carry into the
/// exponent (rounding up to the next binade), and below Emin it is the
/// subnormal code itself. The float addition must not flush subnormals
/// (the CUDA kernels are built without -ftz).
template <Fp8Format F> MESHPLAN_HD uint8_t encodeFp8(float x) {
  using T = Fp8Traits<F>;
  constexpr int kShift = 23 - T::kMantissaBits;
  constexpr int32_t kMaxBits = std::bit_cast<int32_t>(T::kMaxFinite);
  uint32_t bits = std::bit_cast<uint32_t>(x);
  uint32_t sign = (bits >> 24) & 0x80u;
  int32_t abs = static_cast<int32_t>(bits & 0x7FFFFFFFu);
  bool nan = abs > 0x7F800000;
  int32_t a = abs < kMaxBits ? abs : kMaxBits;
  int32_t exponent = a & 0x7F800000;
  exponent = exponent > T::kMinNormalBits ? exponent : T::kMinNormalBits;
  int32_t magic = exponent + (kShift << 23);
  int32_t sum = std::bit_cast<int32_t>(std::bit_cast<float>(a) +
                                       std::bit_cast<float>(magic));
  uint32_t code =
      static_cast<uint32_t>(sum - magic) +
      (static_cast<uint32_t>(exponent - T::kMinNormalBits) >> kShift);
  return static_cast<uint8_t>(nan ? kFp8NaN : (code | sign));
}

/// The exact value of an fp8 code, computed from its fields (the CPU kernels
/// read a table built from the same fields; the GPU computes it, which costs
/// less than a table lookup from global memory). NaN codes give 0x7FC00000.
template <Fp8Format F> MESHPLAN_HD float decodeFp8(uint8_t code) {
  using T = Fp8Traits<F>;
  constexpr int m = T::kMantissaBits;
  uint32_t sign = (uint32_t(code) & 0x80u) << 24;
  uint32_t exponent = (uint32_t(code) & 0x7Fu) >> m;
  uint32_t mantissa = uint32_t(code) & ((1u << m) - 1);
  bool nan = F == Fp8Format::E4M3FN ? (code & 0x7Fu) == 0x7Fu
                                    : exponent == 31 && mantissa != 0;
  if (nan)
    return std::bit_cast<float>(0x7FC00000u);
  if (F == Fp8Format::E5M2 && exponent == 31)
    return std::bit_cast<float>(sign | 0x7F800000u);
  if (exponent == 0) {
    // mantissa * 2^(1 - bias - m), exact: the power of two is a normal float.
    uint32_t unit = uint32_t(127 + 1 - T::kBias - m) << 23;
    float value = static_cast<float>(mantissa) * std::bit_cast<float>(unit);
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(value));
  }
  return std::bit_cast<float>(sign | ((exponent - T::kBias + 127) << 23) |
                              (mantissa << (23 - m)));
}

/// torchao's tensorwise scale (see fp8ScaleFromAmax in Kernels.h):
/// float32(maxFinite / max(double(amax), 1e-12)), optionally rounded down to
/// a power of two by clearing the mantissa. std::max(a, 1e-12) keeps a NaN
/// (its first argument), which `a < 1e-12 ? 1e-12 : a` reproduces.
MESHPLAN_HD float fp8ScaleOf(float amax, float maxFinite, bool powerOf2) {
  double a = static_cast<double>(amax);
  double clamped = a < 1e-12 ? 1e-12 : a;
  float scale = static_cast<float>(static_cast<double>(maxFinite) / clamped);
  uint32_t bits = std::bit_cast<uint32_t>(scale);
  bool finite = (bits & 0x7F800000u) != 0x7F800000u;
  // Scales are normal floats here (maxFinite / FLT_MAX > FLT_MIN), so clearing
  // the mantissa is the exact floor to a power of two; 0 and NaN stay.
  if (powerOf2 && finite && scale > 0)
    scale = std::bit_cast<float>(bits & 0xFF800000u);
  return scale;
}

//===----------------------------------------------------------------------===//
// bfloat16
//===----------------------------------------------------------------------===//

constexpr uint16_t kBf16NaN = 0x7FC0;

MESHPLAN_HD float widenBf16(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

MESHPLAN_HD uint16_t roundBf16(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  uint32_t r = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? kBf16NaN : r);
}

MESHPLAN_HD uint16_t roundBf16Stochastic(float x, uint32_t random16) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  uint32_t low = bits & 0xFFFFu;
  uint32_t truncated = bits & 0xFFFF0000u;
  uint32_t r = (random16 < low ? truncated + 0x10000u : truncated) >> 16;
  return static_cast<uint16_t>(nan ? kBf16NaN : r);
}

//===----------------------------------------------------------------------===//
// Philox-4x32-10 and the stochastic-rounding bit mapping
//===----------------------------------------------------------------------===//

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

/// The key of each round (the key bumped by the Weyl constants).
struct PhiloxSchedule {
  uint32_t k0[kPhiloxRounds], k1[kPhiloxRounds];

  MESHPLAN_HD explicit PhiloxSchedule(uint32_t key0, uint32_t key1) {
    for (int r = 0; r < kPhiloxRounds; ++r) {
      k0[r] = key0 + uint32_t(r) * kPhiloxW0;
      k1[r] = key1 + uint32_t(r) * kPhiloxW1;
    }
  }
  explicit PhiloxSchedule(std::array<uint32_t, 2> key)
      : PhiloxSchedule(key[0], key[1]) {}
};

/// Philox's 32 x 32 -> 64-bit product, split.
MESHPLAN_HD void mulWide(uint32_t a, uint32_t b, uint32_t &hi, uint32_t &lo) {
  uint64_t p = uint64_t(a) * b;
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

MESHPLAN_HD void philoxRounds(uint32_t &c0, uint32_t &c1, uint32_t &c2,
                              uint32_t &c3, const PhiloxSchedule &s) {
  for (int r = 0; r < kPhiloxRounds; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulWide(kPhiloxM0, c0, hi0, lo0);
    mulWide(kPhiloxM1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ s.k0[r];
    uint32_t n2 = hi0 ^ c3 ^ s.k1[r];
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
}

/// The Philox key of a (seed, tensor id) pair: seed ^ SplitMix64's finalizer
/// of the tensor id (a bijection, so for one seed no two tensors share a
/// key), as (low, high) words.
MESHPLAN_HD uint64_t stochasticRoundingKeyBits(uint64_t seed,
                                               uint64_t tensorId) {
  uint64_t z = tensorId + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return seed ^ z;
}

/// Elements one superblock of 8 Philox counters serves (see
/// stochasticRoundingBits in Kernels.h).
constexpr int64_t kSuperblock = 64;

/// Word `word` (0..3) of the Philox output for counter `counter` and `step`.
/// The CUDA kernels call it once per element; the CPU computes 8 counters
/// side by side (Philox.cpp) and checks its paths against this one.
MESHPLAN_HD uint32_t philoxWord(const PhiloxSchedule &s, uint64_t counter,
                                uint64_t step, int word) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32);
  uint32_t c2 = uint32_t(step), c3 = uint32_t(step >> 32);
  philoxRounds(c0, c1, c2, c3, s);
  uint32_t w = word == 0 ? c0 : word == 1 ? c1 : word == 2 ? c2 : c3;
  return w;
}

/// The 16 random bits of global element `index` (stochasticRoundingBits):
/// element r = index % 64 of its superblock takes counter
/// (index / 64) * 8 + r % 8, word r / 16, half-word r / 8 % 2.
MESHPLAN_HD uint32_t stochasticBitsOf(const PhiloxSchedule &s, uint64_t step,
                                      uint64_t index) {
  uint64_t r = index % uint64_t(kSuperblock);
  uint64_t counter = index / uint64_t(kSuperblock) * 8 + r % 8;
  uint32_t w = philoxWord(s, counter, step, int(r / 16));
  return (w >> (16 * (r / 8 % 2))) & 0xFFFFu;
}

//===----------------------------------------------------------------------===//
// AdamW
//===----------------------------------------------------------------------===//

/// A step's scalars, each rounded to float once (see adamwFp32 in Kernels.h).
/// Computed on the host, in double, as Python does.
struct AdamWScalars {
  float decay, w1, oneMinusW1, b2, w2, negStepSize, bc2Sqrt, eps;
  bool smallWeight;
};

inline AdamWScalars adamwScalarsOf(const AdamWParams &p, int64_t step) {
  double bc1 = 1 - std::pow(p.beta1, static_cast<double>(step));
  double bc2 = 1 - std::pow(p.beta2, static_cast<double>(step));
  AdamWScalars s;
  s.decay = static_cast<float>(1 - p.lr * p.weightDecay);
  s.w1 = static_cast<float>(1 - p.beta1);
  s.oneMinusW1 = 1.0f - s.w1;
  s.b2 = static_cast<float>(p.beta2);
  s.w2 = static_cast<float>(1 - p.beta2);
  s.negStepSize = static_cast<float>(-(p.lr / bc1));
  s.bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(p.eps);
  // ATen's is_lerp_weight_small.
  s.smallWeight = std::abs(s.w1) < 0.5f;
  return s;
}

/// Correctly rounded float square root on both sides (nvcc's default
/// -prec-sqrt=true makes sqrtf IEEE).
MESHPLAN_HD float sqrtIeee(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

/// One element in PyTorch's single-tensor order; each line one float
/// operation (the build forbids contraction into FMA on both sides).
template <bool SmallWeight>
MESHPLAN_HD float adamwElement(float p, float g, float &m, float &v,
                               const AdamWScalars &s) {
  p = p * s.decay;
  float mNew = SmallWeight ? m + s.w1 * (g - m) : g - (g - m) * s.oneMinusW1;
  float vNew = v * s.b2;
  vNew = vNew + (s.w2 * g) * g;
  float denom = sqrtIeee(vNew) / s.bc2Sqrt + s.eps;
  m = mNew;
  v = vNew;
  return p + (s.negStepSize * mNew) / denom;
}

} // namespace meshplan::runtime::kernels::detail

#endif // MESHPLAN_RUNTIME_KERNELS_SCALARMATH_H
