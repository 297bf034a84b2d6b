//===- KernelSupport.h - Scalar cores shared by the CPU kernels -*- C++ -*-===//
//
// The thread splitting, the precondition check and the Philox paths every
// span kernel uses. The per-element arithmetic is in ../ScalarMath.h, written
// once, branch-free and inline, so that the scalar entry points, the span
// loops (what the compiler vectorizes) and the CUDA kernels run the very same
// operations.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_KERNELS_CPU_KERNELSUPPORT_H
#define MESHPLAN_RUNTIME_KERNELS_CPU_KERNELSUPPORT_H

#include "../ScalarMath.h"
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

// The per-element arithmetic (float8, bf16, Philox, AdamW) is in
// ../ScalarMath.h, shared with the CUDA kernels.

/// Every code's value (NaN codes: 0x7FC00000).
const float *fp8DecodeTable(Fp8Format format);

/// The Philox key of a (seed, tensor id) pair (see stochasticRoundingBits).
std::array<uint32_t, 2> stochasticRoundingKey(uint64_t seed, uint64_t tensorId);

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
