//===- Philox.cpp - Philox-4x32-10 and the stochastic-rounding bits -------===//
//
// A counter-based generator makes stochastic rounding layout-transparent:
// an element's bits are a function of (seed, step, tensor id, global index),
// computed where the element lives, so no rank draws random numbers for the
// whole tensor and every sharding rounds alike. The mapping onto Philox's
// counter and key is documented at stochasticRoundingBits (Kernels.h); it
// puts 8 consecutive counters side by side in SIMD lanes, whose 4 output
// words are then the bits of 8 runs of 8 consecutive elements each.
//
// Philox's products are 32 x 32 -> 64 bits; compilers vectorize them with
// shuffles between 32- and 64-bit lanes that cost more than the arithmetic.
// The x86 paths (SSE2, AVX2, AVX-512F, picked by CPU at run time) keep each
// counter word in a 64-bit lane instead, where pmuludq reads only the low 32
// bits: the garbage that the XORs leave in the high halves is never read, and
// the products need no shuffling.
//
//===----------------------------------------------------------------------===//

#include "KernelSupport.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MESHPLAN_PHILOX_X86 1
#include <immintrin.h>
#endif

namespace meshplan::runtime::kernels {
using namespace detail;

namespace {

/// Writes the 4 words of 8 consecutive counters (word k of counter t in
/// words[k][t]) as the bits of the superblock's 64 elements.
MESHPLAN_INLINE void spread(const uint32_t (&words)[4][8], uint32_t *out) {
  for (int k = 0; k < 4; ++k)
    for (int t = 0; t < 8; ++t) {
      out[16 * k + t] = words[k][t] & 0xFFFFu;
      out[16 * k + 8 + t] = words[k][t] >> 16;
    }
}

void superblocksPortable(uint64_t first, int64_t count,
                         const PhiloxSchedule &schedule, uint64_t step,
                         uint32_t *out) {
  for (int64_t b = 0; b < count; ++b) {
    uint64_t counter = (first + static_cast<uint64_t>(b)) * 8;
    uint32_t words[4][8];
    for (int t = 0; t < 8; ++t) {
      uint64_t c = counter + static_cast<uint64_t>(t);
      uint32_t c0 = static_cast<uint32_t>(c),
               c1 = static_cast<uint32_t>(c >> 32);
      uint32_t c2 = static_cast<uint32_t>(step);
      uint32_t c3 = static_cast<uint32_t>(step >> 32);
      philoxRounds(c0, c1, c2, c3, schedule);
      words[0][t] = c0;
      words[1][t] = c1;
      words[2][t] = c2;
      words[3][t] = c3;
    }
    spread(words, out + kSuperblock * b);
  }
}

#if MESHPLAN_PHILOX_X86

/// 2 counters per register, each word in the low half of a 64-bit lane.
void superblocksSse2(uint64_t first, int64_t count,
                     const PhiloxSchedule &schedule, uint64_t step,
                     uint32_t *out) {
  const __m128i m0 = _mm_set1_epi64x(kPhiloxM0);
  const __m128i m1 = _mm_set1_epi64x(kPhiloxM1);
  const __m128i step0 = _mm_set1_epi64x(static_cast<uint32_t>(step));
  const __m128i step1 = _mm_set1_epi64x(static_cast<uint32_t>(step >> 32));
  for (int64_t b = 0; b < count; ++b) {
    uint64_t counter = (first + static_cast<uint64_t>(b)) * 8;
    uint32_t words[4][8];
    // Two halves of 4 counters keep the state in 8 of the 16 registers.
    for (int half = 0; half < 2; ++half) {
      __m128i w[4][2];
      for (int r = 0; r < 2; ++r) {
        uint64_t c0 = counter + 4 * half + 2 * r, c1 = c0 + 1;
        w[0][r] = _mm_set_epi64x(static_cast<uint32_t>(c1),
                                 static_cast<uint32_t>(c0));
        w[1][r] = _mm_set_epi64x(static_cast<uint32_t>(c1 >> 32),
                                 static_cast<uint32_t>(c0 >> 32));
        w[2][r] = step0;
        w[3][r] = step1;
      }
      for (int round = 0; round < kPhiloxRounds; ++round) {
        const __m128i k0 = _mm_set1_epi64x(schedule.k0[round]);
        const __m128i k1 = _mm_set1_epi64x(schedule.k1[round]);
        for (int r = 0; r < 2; ++r) {
          __m128i p0 = _mm_mul_epu32(w[0][r], m0);
          __m128i p1 = _mm_mul_epu32(w[2][r], m1);
          w[0][r] =
              _mm_xor_si128(_mm_xor_si128(_mm_srli_epi64(p1, 32), w[1][r]), k0);
          w[2][r] =
              _mm_xor_si128(_mm_xor_si128(_mm_srli_epi64(p0, 32), w[3][r]), k1);
          w[1][r] = p1;
          w[3][r] = p0;
        }
      }
      for (int k = 0; k < 4; ++k) {
        // The low halves of the 64-bit lanes of both registers, in order.
        __m128i lo = _mm_unpacklo_epi64(_mm_shuffle_epi32(w[k][0], 0x08),
                                        _mm_shuffle_epi32(w[k][1], 0x08));
        std::memcpy(&words[k][4 * half], &lo, sizeof lo);
      }
    }
    spread(words, out + kSuperblock * b);
  }
}

/// 4 counters per register, each word in the low half of a 64-bit lane.
[[gnu::target("avx2")]] void superblocksAvx2(uint64_t first, int64_t count,
                                             const PhiloxSchedule &schedule,
                                             uint64_t step, uint32_t *out) {
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0);
  const __m256i m1 = _mm256_set1_epi64x(kPhiloxM1);
  const __m256i step0 = _mm256_set1_epi64x(static_cast<uint32_t>(step));
  const __m256i step1 = _mm256_set1_epi64x(static_cast<uint32_t>(step >> 32));
  const __m256i mask16 = _mm256_set1_epi32(0xFFFF);
  const __m256i lanes[2] = {_mm256_setr_epi64x(0, 1, 2, 3),
                            _mm256_setr_epi64x(4, 5, 6, 7)};
  __m256i k0[kPhiloxRounds], k1[kPhiloxRounds];
  for (int round = 0; round < kPhiloxRounds; ++round) {
    k0[round] = _mm256_set1_epi64x(schedule.k0[round]);
    k1[round] = _mm256_set1_epi64x(schedule.k1[round]);
  }
  for (int64_t b = 0; b < count; ++b) {
    __m256i base = _mm256_set1_epi64x(
        static_cast<int64_t>((first + static_cast<uint64_t>(b)) * 8));
    __m256i w[4][2];
    for (int r = 0; r < 2; ++r) {
      __m256i c = _mm256_add_epi64(base, lanes[r]);
      w[0][r] = c;
      w[1][r] = _mm256_srli_epi64(c, 32);
      w[2][r] = step0;
      w[3][r] = step1;
    }
    for (int round = 0; round < kPhiloxRounds; ++round) {
      for (int r = 0; r < 2; ++r) {
        __m256i p0 = _mm256_mul_epu32(w[0][r], m0);
        __m256i p1 = _mm256_mul_epu32(w[2][r], m1);
        w[0][r] = _mm256_xor_si256(
            _mm256_xor_si256(_mm256_srli_epi64(p1, 32), w[1][r]), k0[round]);
        w[2][r] = _mm256_xor_si256(
            _mm256_xor_si256(_mm256_srli_epi64(p0, 32), w[3][r]), k1[round]);
        w[1][r] = p1;
        w[3][r] = p0;
      }
    }
    uint32_t *o = out + kSuperblock * b;
    for (int k = 0; k < 4; ++k) {
      // Low halves of counters 0-3 then 4-7: per 128-bit lane
      // [a0 a1 b0 b1 | a2 a3 b2 b3], then the middle quadwords swapped.
      __m256i lo = _mm256_permute4x64_epi64(
          _mm256_unpacklo_epi64(_mm256_shuffle_epi32(w[k][0], 0x08),
                                _mm256_shuffle_epi32(w[k][1], 0x08)),
          0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(o + 16 * k),
                          _mm256_and_si256(lo, mask16));
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(o + 16 * k + 8),
                          _mm256_srli_epi32(lo, 16));
    }
  }
}

// GCC 12's AVX-512 headers trip its own -Wmaybe-uninitialized (GCC PR
// 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// 8 counters per register; two superblocks at a time for instruction-level
/// parallelism (32 registers hold both).
[[gnu::target("avx512f")]] void
superblocksAvx512(uint64_t first, int64_t count, const PhiloxSchedule &schedule,
                  uint64_t step, uint32_t *out) {
  const __m512i m0 = _mm512_set1_epi64(kPhiloxM0);
  const __m512i m1 = _mm512_set1_epi64(kPhiloxM1);
  const __m512i step0 = _mm512_set1_epi64(static_cast<uint32_t>(step));
  const __m512i step1 = _mm512_set1_epi64(static_cast<uint32_t>(step >> 32));
  const __m512i lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask16 = _mm256_set1_epi32(0xFFFF);
  for (int64_t b = 0; b < count; b += 2) {
    int superblocks = count - b >= 2 ? 2 : 1;
    __m512i w[4][2];
    for (int r = 0; r < 2; ++r) {
      __m512i c =
          _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(
                               (first + static_cast<uint64_t>(b + r)) * 8)),
                           lanes);
      w[0][r] = c;
      w[1][r] = _mm512_srli_epi64(c, 32);
      w[2][r] = step0;
      w[3][r] = step1;
    }
    for (int round = 0; round < kPhiloxRounds; ++round) {
      const __m512i k0 = _mm512_set1_epi64(schedule.k0[round]);
      const __m512i k1 = _mm512_set1_epi64(schedule.k1[round]);
      for (int r = 0; r < 2; ++r) {
        __m512i p0 = _mm512_mul_epu32(w[0][r], m0);
        __m512i p1 = _mm512_mul_epu32(w[2][r], m1);
        // 0x96: the three-way XOR.
        w[0][r] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), w[1][r],
                                            k0, 0x96);
        w[2][r] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), w[3][r],
                                            k1, 0x96);
        w[1][r] = p1;
        w[3][r] = p0;
      }
    }
    for (int r = 0; r < superblocks; ++r) {
      uint32_t *o = out + kSuperblock * (b + r);
      for (int k = 0; k < 4; ++k) {
        __m256i lo = _mm512_cvtepi64_epi32(w[k][r]);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(o + 16 * k),
                            _mm256_and_si256(lo, mask16));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(o + 16 * k + 8),
                            _mm256_srli_epi32(lo, 16));
      }
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif // MESHPLAN_PHILOX_X86

std::vector<PhiloxPath> detectPaths() {
  std::vector<PhiloxPath> paths = {PhiloxPath::Portable};
#if MESHPLAN_PHILOX_X86
  paths.push_back(PhiloxPath::Sse2);
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2"))
    paths.push_back(PhiloxPath::Avx2);
  if (__builtin_cpu_supports("avx512f"))
    paths.push_back(PhiloxPath::Avx512);
#endif
  return paths;
}

} // namespace

std::span<const PhiloxPath> detail::philoxPaths() {
  static const std::vector<PhiloxPath> paths = detectPaths();
  return paths;
}

void detail::philoxSuperblocks(uint64_t firstSuperblock, int64_t count,
                               const PhiloxSchedule &schedule, uint64_t step,
                               uint32_t *out, PhiloxPath path) {
  switch (path) {
#if MESHPLAN_PHILOX_X86
  case PhiloxPath::Avx512:
    return superblocksAvx512(firstSuperblock, count, schedule, step, out);
  case PhiloxPath::Avx2:
    return superblocksAvx2(firstSuperblock, count, schedule, step, out);
  case PhiloxPath::Sse2:
    return superblocksSse2(firstSuperblock, count, schedule, step, out);
#endif
  default:
    return superblocksPortable(firstSuperblock, count, schedule, step, out);
  }
}

void detail::philoxSuperblocks(uint64_t firstSuperblock, int64_t count,
                               const PhiloxSchedule &schedule, uint64_t step,
                               uint32_t *out) {
  static const PhiloxPath best = philoxPaths().back();
  philoxSuperblocks(firstSuperblock, count, schedule, step, out, best);
}

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                      std::array<uint32_t, 2> key) {
  PhiloxSchedule schedule(key);
  philoxRounds(counter[0], counter[1], counter[2], counter[3], schedule);
  return counter;
}

std::array<uint32_t, 2> detail::stochasticRoundingKey(uint64_t seed,
                                                      uint64_t tensorId) {
  uint64_t k = stochasticRoundingKeyBits(seed, tensorId);
  return {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}

void detail::forEachRandomBlock(
    std::span<const IndexRun> runs, int64_t n, const StochasticRoundingKey &key,
    const Threading &threading,
    const std::function<void(int64_t, int64_t, const uint32_t *)> &fn) {
  PhiloxSchedule schedule(stochasticRoundingKey(key.seed, key.tensorId));
  uint64_t step = static_cast<uint64_t>(key.step);
  parallelFor(n, threading, [&](int64_t begin, int64_t end) {
    // A block not starting on a superblock boundary spans one more.
    alignas(64) uint32_t random[kRandomBlock + 2 * kSuperblock];
    forEachRunPiece(
        runs, begin, end, [&](int64_t local, int64_t global, int64_t length) {
          for (int64_t done = 0; done < length; done += kRandomBlock) {
            int64_t count = std::min(kRandomBlock, length - done);
            int64_t first = global + done;
            int64_t firstSuperblock = first / kSuperblock;
            int64_t lastSuperblock = (first + count - 1) / kSuperblock;
            philoxSuperblocks(static_cast<uint64_t>(firstSuperblock),
                              lastSuperblock - firstSuperblock + 1, schedule,
                              step, random);
            fn(local + done, count, random + first % kSuperblock);
          }
        });
  });
}

uint16_t stochasticRoundingBits(const StochasticRoundingKey &key,
                                int64_t globalIndex) {
  PhiloxSchedule schedule(stochasticRoundingKey(key.seed, key.tensorId));
  return static_cast<uint16_t>(
      stochasticBitsOf(schedule, static_cast<uint64_t>(key.step),
                       static_cast<uint64_t>(globalIndex)));
}

} // namespace meshplan::runtime::kernels
