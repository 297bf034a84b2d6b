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
#include <span>

// Hot loops are compiled three times, for baseline x86-64, AVX2 and
// x86-64-v4 (AVX-512), and picked at load time (GNU ifunc): portable binaries
// without -march=native. All clones do the same IEEE operations (no FMA:
// -ffp-contract=off), so they give the same bits. Elsewhere the baseline
// target is used.
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) &&            \
    !defined(MESHPLAN_KERNELS_NO_CLONES)
#define MESHPLAN_KERNEL_LOOP                                                   \
  [[gnu::target_clones("arch=x86-64-v4", "avx2", "default")]]
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
void forEachRunPiece(std::span<const IndexRun> runs, int64_t begin, int64_t end,
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
/// subnormal code itself.
template <Fp8Format F> MESHPLAN_INLINE uint8_t encodeFp8(float x) {
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
std::array<uint32_t, 2> stochasticRoundingKey(uint64_t seed, uint64_t tensorId);

/// Elements one superblock of 8 Philox counters serves (see
/// stochasticRoundingBits).
constexpr int64_t kSuperblock = 64;

/// The ways to run Philox over superblocks: plain C++, and on x86-64 SSE2,
/// AVX2 and AVX-512F intrinsics (compilers do not vectorize Philox's 32 x 32
/// -> 64-bit products well: the intrinsic paths are 2-4x faster). All give
/// the same bits.
enum class PhiloxPath { Portable, Sse2, Avx2, Avx512 };

/// The paths this CPU can run, the fastest last.
std::span<const PhiloxPath> philoxPaths();

/// The 16 random bits of global elements [64 * firstSuperblock, 64 *
/// (firstSuperblock + count)) as out[0 .. 64 * count), one per uint32_t.
void philoxSuperblocks(uint64_t firstSuperblock, int64_t count,
                       const PhiloxSchedule &schedule, uint64_t step,
                       uint32_t *out, PhiloxPath path);
/// The same on the fastest path.
void philoxSuperblocks(uint64_t firstSuperblock, int64_t count,
                       const PhiloxSchedule &schedule, uint64_t step,
                       uint32_t *out);

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
    const std::function<void(int64_t, int64_t, const uint32_t *)> &fn);

} // namespace meshplan::runtime::kernels::detail

#endif // MESHPLAN_RUNTIME_KERNELS_CPU_KERNELSUPPORT_H
