//===- Kernels.h - CPU kernels of the runtime: float8, bf16, AdamW --------===//
//
// The arithmetic a plan's local instructions need, as pure functions on
// spans: float8 scales, casts and dequantization (torchao's tensorwise float8
// all-gather), bf16 casts, amax, and AdamW with fp32 or stochastically
// rounded bf16 parameters. They know nothing of plans, buffers or backends;
// the executor hands them spans of a rank's local shard.
//
// Every result is a function of the inputs alone: no global state, no
// floating-point environment beyond the default (round to nearest, no
// flush-to-zero), and the same bits whether a span runs on one thread or
// many. Stochastic rounding draws its random bits from Philox-4x32-10 keyed
// by (seed, step, tensor id, global element index), so a tensor gets the
// same bits however it is sharded (docs/semantics.md).
//
// Preconditions (matching span sizes, runs that tile the shard) are checked
// on every call: a violation is a bug in the caller (the executor checks
// buffer sizes when it loads a plan), so it prints a message and aborts.
// Nothing here throws.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_KERNELS_H
#define MESHPLAN_RUNTIME_KERNELS_H

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace meshplan::runtime::kernels {

//===----------------------------------------------------------------------===//
// Threading
//===----------------------------------------------------------------------===//

/// How a span kernel may split its work over std::threads. A span is split
/// into contiguous chunks of at least `minElementsPerThread` elements, one per
/// thread, up to `maxThreads` (0: std::thread::hardware_concurrency()); short
/// spans run on the caller's thread because starting threads costs tens of
/// microseconds. Results never depend on the split.
struct Threading {
  int maxThreads = 0;
  int64_t minElementsPerThread = int64_t(1) << 20;

  static Threading singleThreaded() { return {1, int64_t(1) << 20}; }
};

//===----------------------------------------------------------------------===//
// Float8 (e4m3fn, e5m2)
//===----------------------------------------------------------------------===//

/// The OCP float8 formats torch calls float8_e4m3fn (no infinities, one NaN
/// pattern per sign, max 448) and float8_e5m2 (IEEE-like, max 57344).
enum class Fp8Format : uint8_t { E4M3FN, E5M2 };

/// 448 for e4m3fn, 57344 for e5m2.
float fp8MaxFinite(Fp8Format format);

/// torchao's tensorwise scale (amax_to_scale): float32(maxFinite /
/// max(double(amax), 1e-12)); with `powerOf2`, rounded down to a power of two
/// (torchao's exp2(floor(log2(scale))), taken exactly from the exponent bits;
/// torchao's float32 log2 may round up for a scale a few ulps below a power of
/// two). A NaN amax gives a NaN scale, an infinite one 0, so a broken tensor
/// shows up as NaNs rather than as a silently wrong cast.
float fp8ScaleFromAmax(float amax, Fp8Format format, bool powerOf2);

/// Round to nearest even with saturation to +-maxFinite, bit for bit
/// cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...): +-inf give
/// +-maxFinite, a negative value that rounds to zero gives -0 (0x80), and any
/// NaN gives 0x7F for either format (the sign is dropped, as cuda_fp8.h does;
/// torch keeps it). torchao's clamp-then-cast yields the same bits for every
/// non-NaN input.
uint8_t floatToFp8(float x, Fp8Format format);

/// The exact value of an fp8 code; NaN codes give the quiet NaN 0x7FC00000,
/// e5m2's infinities give +-inf.
float fp8ToFloat(uint8_t code, Fp8Format format);

/// out[i] = floatToFp8(in[i] * scale): the product is rounded to float first,
/// as torchao computes float32(x) * scale before the saturating cast.
void castToFp8(std::span<const float> in, float scale, std::span<uint8_t> out,
               Fp8Format format, const Threading &threading = {});
/// The same from bf16 bits (each converted exactly to float first).
void castToFp8(std::span<const uint16_t> inBf16, float scale,
               std::span<uint8_t> out, Fp8Format format,
               const Threading &threading = {});

/// out[i] = fp8ToFloat(in[i]) / scale, in float (torchao's dequantization).
void dequantFp8(std::span<const uint8_t> in, float scale, std::span<float> out,
                Fp8Format format, const Threading &threading = {});
/// The same, rounded to bf16 (floatToBf16 of the float quotient).
void dequantFp8(std::span<const uint8_t> in, float scale,
                std::span<uint16_t> outBf16, Fp8Format format,
                const Threading &threading = {});

//===----------------------------------------------------------------------===//
// amax
//===----------------------------------------------------------------------===//

/// max |x| over the span; 0 for an empty span (an empty shard must not
/// poison the MAX all-reduce). Any NaN makes the result NaN (0x7FC00000), as
/// torch's abs().max() does, so the scale turns NaN instead of hiding it.
float amax(std::span<const float> in, const Threading &threading = {});
float amax(std::span<const uint16_t> inBf16, const Threading &threading = {});

//===----------------------------------------------------------------------===//
// bfloat16
//===----------------------------------------------------------------------===//

/// Round to nearest even (torch's float -> bfloat16); any NaN gives 0x7FC0.
uint16_t floatToBf16(float x);
/// Exact.
float bf16ToFloat(uint16_t bits);
void castToBf16(std::span<const float> in, std::span<uint16_t> out,
                const Threading &threading = {});
void castBf16ToFloat(std::span<const uint16_t> in, std::span<float> out,
                     const Threading &threading = {});

//===----------------------------------------------------------------------===//
// Philox-4x32-10 and stochastic rounding
//===----------------------------------------------------------------------===//

/// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
/// 3", SC'11), word order as in Random123's philox4x32: a bijection of the
/// 128-bit counter under a 64-bit key. Counter-based, so any element's bits
/// can be computed without the others'.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                      std::array<uint32_t, 2> key);

/// What keys a tensor's stochastic rounding in one step.
struct StochasticRoundingKey {
  uint64_t seed = 0;
  /// The 1-based optimizer step (the count after increment).
  int64_t step = 0;
  /// The parameter's index in the model (the plan's tensor_id).
  uint64_t tensorId = 0;
};

/// The 16 random bits of global element `globalIndex` (row-major, >= 0):
///   k       = seed ^ mix(tensorId),  mix = SplitMix64's finalizer of
///             tensorId + 0x9E3779B97F4A7C15 (a bijection, so for one seed
///             distinct tensors get distinct keys)
///   key     = (lo32(k), hi32(k))
///   r       = globalIndex % 64
///   c       = (globalIndex / 64) * 8 + r % 8      (64-bit counter index)
///   counter = (lo32(c), hi32(c), lo32(step), hi32(step))
///   bits    = philox4x32_10(counter, key)[r / 16] >> (16 * (r / 8 % 2))
///             & 0xFFFF
/// Each Philox call serves 8 elements (every counter once); within a block of
/// 64 elements, element r takes counter r % 8 and half-word r / 8, so the 8
/// counters computed side by side in SIMD lanes yield 8 consecutive elements'
/// bits per output half-word, without shuffles. The bits depend on nothing
/// but these four values, never on the shard or the position in it.
uint16_t stochasticRoundingBits(const StochasticRoundingKey &key,
                                int64_t globalIndex);

/// torchao's _fp32_to_bf16_sr for one value: with low = bits(x) & 0xFFFF,
/// round away from zero (truncated bits + 0x10000) when random16 < low, else
/// truncate; so P(up) = low / 2^16 and the expectation is x. Exact values and
/// +-inf are kept; a finite value beyond the largest bf16 may round to +-inf
/// (as in torchao); any NaN gives 0x7FC0 (torchao's bit arithmetic could turn
/// a NaN whose payload is all in the low 16 bits into inf).
uint16_t stochasticRoundBf16(float x, uint32_t random16);

/// A contiguous run of a shard: `length` elements at local (row-major,
/// packed) index `local` hold the global row-major elements from `global`.
struct IndexRun {
  int64_t local = 0;
  int64_t global = 0;
  int64_t length = 0;

  bool operator==(const IndexRun &) const = default;
};

/// The maximal contiguous runs of the box [offset, offset + localShape) of a
/// row-major tensor of `globalShape`, in local order (a shard stored packed,
/// as the plan's local_shape describes it). Trailing dimensions the box spans
/// whole merge into its runs, so there is one run per index of the dimensions
/// before the innermost one it cuts: 4096 runs for a column shard of a 4096 x
/// 14336 matrix, one for a row shard. A scalar tensor (rank 0) is one run of
/// length 1; an empty box has no runs. nullopt when the ranks differ, a size
/// is negative, the box is not inside the tensor, or the tensor has more than
/// 2^63 - 1 elements.
std::optional<std::vector<IndexRun>>
boxIndexRuns(std::span<const int64_t> globalShape,
             std::span<const int64_t> offset,
             std::span<const int64_t> localShape);

/// out[i] = stochasticRoundBf16(in[i], stochasticRoundingBits(key, global
/// index of i)). `runs` must tile [0, in.size()) in increasing local order
/// (as boxIndexRuns gives them).
void castToBf16Stochastic(std::span<const float> in, std::span<uint16_t> out,
                          const StochasticRoundingKey &key,
                          std::span<const IndexRun> runs,
                          const Threading &threading = {});

//===----------------------------------------------------------------------===//
// AdamW
//===----------------------------------------------------------------------===//

/// torch.optim.AdamW's hyperparameters (non-fused, amsgrad=False,
/// maximize=False).
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.01;
};

/// One AdamW step, in PyTorch's single-tensor order. `step` is 1-based (the
/// count after increment). Scalars are computed in double, as Python does,
/// and rounded to float once, as a tensor-scalar op does:
///   decay    = float(1 - lr * weightDecay)
///   w1       = float(1 - beta1),  b2 = float(beta2),  w2 = float(1 - beta2)
///   bc1      = 1 - beta1^step,    bc2 = 1 - beta2^step   (std::pow, double)
///   negStep  = float(-(lr / bc1)), bc2Sqrt = float(std::sqrt(bc2))
///   epsF     = float(eps)
/// then per element, each operation a float operation in this order (no
/// fused multiply-add):
///   p = p * decay                                  (param.mul_)
///   m = w1 < 0.5 ? m + w1 * (g - m)                (exp_avg.lerp_(g, w1),
///                : g - (g - m) * (1.0f - w1)       ATen's scalar lerp)
///   v = v * b2;  v = v + (w2 * g) * g              (mul_, addcmul_)
///   d = sqrt(v) / bc2Sqrt + epsF                   (denom)
///   p = p + (negStep * m) / d                      (addcdiv_)
/// A reference with these float operations reproduces the result bit for bit.
void adamwFp32(std::span<float> param, std::span<const float> grad,
               std::span<float> expAvg, std::span<float> expAvgSq,
               const AdamWParams &params, int64_t step,
               const Threading &threading = {});

/// AdamW on bf16 parameters with fp32 gradients and states: each parameter is
/// widened exactly to float, updated as in adamwFp32, and written back with
/// stochasticRoundBf16 and stochasticRoundingBits({seed, step, tensorId},
/// global index). `runs` (from boxIndexRuns, or {{0, globalStart, n}} for a
/// contiguous shard) must tile [0, param.size()) in increasing local order.
/// The result depends only on the element values and their global indices,
/// so any sharding of a tensor updates it to the same bits.
void adamwBf16StochasticRounding(
    std::span<uint16_t> paramBf16, std::span<const float> grad,
    std::span<float> expAvg, std::span<float> expAvgSq,
    const AdamWParams &params, int64_t step, uint64_t seed, uint64_t tensorId,
    std::span<const IndexRun> runs, const Threading &threading = {});

} // namespace meshplan::runtime::kernels

#endif // MESHPLAN_RUNTIME_KERNELS_H
