//===- KernelSupport.h - Scalar cores shared by the CPU kernels -*- C++ -*-===//
//
// The per-element arithmetic of the kernels, written once, branch-free and
// inline so that the scalar entry points and the span loops run the very same
// operations (the loops are what the compiler vectorizes), plus the thread
// splitting and the precondition check every span kernel uses.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_KERNELS_CPU_KERNELSUPPORT_H
#define MESHPLAN_RUNTIME_KERNELS_CPU_KERNELSUPPORT_H

#include "meshplan/Runtime/Kernels.h"

#include <bit>
#include <cstdint>
#include <functional>

// Hot loops are compiled twice, for baseline x86-64 and for AVX2, and picked
// at load time (GNU ifunc): portable binaries without -march=native. Both
// clones do the same IEEE operations (no FMA: -ffp-contract=off), so they give
// the same bits. Elsewhere the baseline target is used.
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) &&            \
    !defined(MESHPLAN_KERNELS_NO_CLONES)
#define MESHPLAN_KERNEL_LOOP [[gnu::target_clones("avx2", "default")]]
#else
#define MESHPLAN_KERNEL_LOOP
#endif
#define MESHPLAN_INLINE [[gnu::always_inline]] inline

namespace meshplan::runtime::kernels::detail {

/// Reports a broken precondition of `kernel` and aborts.
[[noreturn]] void contractViolation(const char *kernel, const char *what);

inline void require(bool ok, const char *kernel, const char *what) {
  if (!ok)
    contractViolation(kernel, what);
}

/// Calls fn(begin, end) on contiguous chunks covering [0, n), on up to the
/// threads `threading` allows (the caller's thread takes the first chunk).
/// Chunk boundaries are multiples of 64 elements.
void parallelFor(int64_t n, const Threading &threading,
                 const std::function<void(int64_t, int64_t)> &fn);

/// Checks that `runs` tile [0, n) in increasing local order.
void requireTiling(std::span<const IndexRun> runs, int64_t n,
                   const char *kernel);

/// For each maximal piece of [begin, end) inside one run: fn(local, global,
/// length). `runs` tile the span (checked by the caller).
void forEachRunPiece(std::span<const IndexRun> runs, int64_t begin,
                     int64_t end,
                     const std::function<void(int64_t, int64_t, int64_t)> &fn);

//===----------------------------------------------------------------------===//
// float8
//===----------------------------------------------------------------------===//

template <Fp8Format F> struct Fp8Traits;
template <> struct Fp8Traits<Fp8Format::E4M3FN> {
  static constexpr int kMantissaBits = 3;
  static constexpr int kBias = 7;
  static constexpr float kMaxFinite = 448.0f;
  static constexpr int32_t kMinNormalBits = (127 - 6) << 23; // 2^-6
  /// 2^14: its float ulp is e4m3's smallest subnormal, 2^-9.
  static constexpr int32_t kSubnormalMagicBits = (127 + 14) << 23;
};
template <> struct Fp8Traits<Fp8Format::E5M2> {
  static constexpr int kMantissaBits = 2;
  static constexpr int kBias = 15;
  static constexpr float kMaxFinite = 57344.0f;
  static constexpr int32_t kMinNormalBits = (127 - 14) << 23; // 2^-14
  /// 2^7: its float ulp is e5m2's smallest subnormal, 2^-16.
  static constexpr int32_t kSubnormalMagicBits = (127 + 7) << 23;
};

/// cuda_fp8.h's code for every NaN input, for both formats.
constexpr uint32_t kFp8NaN = 0x7F;

/// Saturating round-to-nearest-even float -> fp8. Clamping |x| to maxFinite
/// before rounding equals rounding then saturating (every value above
/// maxFinite rounds to maxFinite or beyond). Normal results round on the
/// integer bits; subnormal ones let the FPU round, by adding a power of two
/// whose ulp is the smallest fp8 subnormal. Both are computed and one picked,
/// which the compiler turns into vector blends.
template <Fp8Format F> MESHPLAN_INLINE uint8_t encodeFp8(float x) {
  using T = Fp8Traits<F>;
  constexpr int kShift = 23 - T::kMantissaBits;
  constexpr int32_t kMaxBits = std::bit_cast<int32_t>(T::kMaxFinite);
  uint32_t bits = std::bit_cast<uint32_t>(x);
  uint32_t sign = (bits >> 24) & 0x80u;
  int32_t abs = static_cast<int32_t>(bits & 0x7FFFFFFFu);
  bool nan = abs > 0x7F800000;
  uint32_t a = static_cast<uint32_t>(abs < kMaxBits ? abs : kMaxBits);
  uint32_t normal =
      (a - (uint32_t(127 - T::kBias) << 23) + ((1u << (kShift - 1)) - 1u) +
       ((a >> kShift) & 1u)) >>
      kShift;
  constexpr float kMagic = std::bit_cast<float>(T::kSubnormalMagicBits);
  uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) + kMagic) -
      static_cast<uint32_t>(T::kSubnormalMagicBits);
  uint32_t r =
      static_cast<int32_t>(a) < T::kMinNormalBits ? subnormal : normal;
  return static_cast<uint8_t>(nan ? kFp8NaN : (r | sign));
}

/// Every code's value (NaN codes: 0x7FC00000).
const float *fp8DecodeTable(Fp8Format format);

//===----------------------------------------------------------------------===//
// bfloat16
//===----------------------------------------------------------------------===//

constexpr uint16_t kBf16NaN = 0x7FC0;

MESHPLAN_INLINE float widenBf16(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

MESHPLAN_INLINE uint16_t roundBf16(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  uint32_t r = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? kBf16NaN : r);
}

MESHPLAN_INLINE uint16_t roundBf16Stochastic(float x, uint32_t random16) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  uint32_t low = bits & 0xFFFFu;
  uint32_t truncated = bits & 0xFFFF0000u;
  uint32_t r = (random16 < low ? truncated + 0x10000u : truncated) >> 16;
  return static_cast<uint16_t>(nan ? kBf16NaN : r);
}

//===----------------------------------------------------------------------===//
// Philox
//===----------------------------------------------------------------------===//

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

/// The key of each round (the key bumped by the Weyl constants).
struct PhiloxSchedule {
  uint32_t k0[kPhiloxRounds], k1[kPhiloxRounds];

  explicit PhiloxSchedule(std::array<uint32_t, 2> key) {
    for (int r = 0; r < kPhiloxRounds; ++r) {
      k0[r] = key[0] + uint32_t(r) * kPhiloxW0;
      k1[r] = key[1] + uint32_t(r) * kPhiloxW1;
    }
  }
};

MESHPLAN_INLINE void philoxRounds(uint32_t &c0, uint32_t &c1, uint32_t &c2,
                                  uint32_t &c3, const PhiloxSchedule &s) {
  for (int r = 0; r < kPhiloxRounds; ++r) {
    uint64_t p0 = uint64_t(kPhiloxM0) * c0;
    uint64_t p1 = uint64_t(kPhiloxM1) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ s.k0[r];
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ s.k1[r];
    c0 = n0;
    c1 = uint32_t(p1);
    c2 = n2;
    c3 = uint32_t(p0);
  }
}

/// The Philox key of a (seed, tensor id) pair (see stochasticRoundingBits).
std::array<uint32_t, 2> stochasticRoundingKey(uint64_t seed,
                                              uint64_t tensorId);

/// Elements per Philox call.
constexpr int64_t kRandomPerCall = 8;

/// The random 16-bit values of global elements [8 * firstGroup, 8 *
/// (firstGroup + groups)) into out[0 .. 8 * groups).
void philoxRandom16(uint64_t firstGroup, int64_t groups,
                    const PhiloxSchedule &schedule, uint64_t step,
                    uint16_t *out);

/// Elements per block of random bits: small enough to stay in L1 between
/// drawing and use.
constexpr int64_t kRandomBlock = 2048;

/// Splits [0, n) over threads and runs, and calls fn(local, length, random)
/// on blocks of at most kRandomBlock local elements, where random[j] is
/// stochasticRoundingBits(key, global index of element local + j). `runs`
/// tile [0, n) (checked by the caller).
void forEachRandomBlock(
    std::span<const IndexRun> runs, int64_t n, const StochasticRoundingKey &key,
    const Threading &threading,
    const std::function<void(int64_t, int64_t, const uint16_t *)> &fn);

} // namespace meshplan::runtime::kernels::detail

#endif // MESHPLAN_RUNTIME_KERNELS_CPU_KERNELSUPPORT_H
