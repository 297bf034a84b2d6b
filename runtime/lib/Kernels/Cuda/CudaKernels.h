//===- CudaKernels.h - The runtime's kernels on a CUDA device ---*- C++ -*-===//
//
// The GPU counterparts of meshplan/Runtime/Kernels.h, for the CUDA executor:
// every pointer is device memory of the current device, every function
// enqueues its work on `stream` and returns at once (the host never waits for
// a kernel), and the result is bit for bit the CPU kernel's, because both
// call the per-element functions of ../ScalarMath.h.
//
// Scalars the plan computes on the device stay there: a float8 scale and an
// amax are device pointers, so a step's "amax -> all-reduce MAX -> scale ->
// cast" chain never visits the host.
//
// Internal to the runtime (it names cudaStream_t): the public headers carry
// no CUDA type. Errors are the launch's cudaError_t (an invalid argument, no
// device); a fault inside a kernel surfaces at the stream's next
// synchronization, as CUDA's are.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_KERNELS_CUDA_CUDAKERNELS_H
#define MESHPLAN_RUNTIME_KERNELS_CUDA_CUDAKERNELS_H

#include "IndexMaps.h"
#include "meshplan/Runtime/Kernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

namespace meshplan::runtime::cuda {

using kernels::AdamWParams;
using kernels::Fp8Format;
using kernels::StochasticRoundingKey;

//===----------------------------------------------------------------------===//
// float8
//===----------------------------------------------------------------------===//

/// out[i] = encodeFp8(in[i] * *scale) (kernels::castToFp8).
cudaError_t castToFp8(const float *in, const float *scale, uint8_t *out,
                      int64_t n, Fp8Format format, cudaStream_t stream);
cudaError_t castToFp8(const uint16_t *inBf16, const float *scale, uint8_t *out,
                      int64_t n, Fp8Format format, cudaStream_t stream);
/// out[i] = decode(in[i]) / *scale (kernels::dequantFp8), float or bf16.
cudaError_t dequantFp8(const uint8_t *in, const float *scale, float *out,
                       int64_t n, Fp8Format format, cudaStream_t stream);
cudaError_t dequantFp8(const uint8_t *in, const float *scale, uint16_t *outBf16,
                       int64_t n, Fp8Format format, cudaStream_t stream);
/// *scale = kernels::fp8ScaleFromAmax(*amax, format, powerOf2), on the device.
cudaError_t fp8ScaleFromAmax(const float *amax, float *scale, Fp8Format format,
                             bool powerOf2, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// amax, bf16, sum
//===----------------------------------------------------------------------===//

/// *result = kernels::amax(in[0..n)) (0 when n == 0, 0x7FC00000 with a NaN).
cudaError_t amax(const float *in, int64_t n, float *result,
                 cudaStream_t stream);
cudaError_t amax(const uint16_t *inBf16, int64_t n, float *result,
                 cudaStream_t stream);

cudaError_t castToBf16(const float *in, uint16_t *out, int64_t n,
                       cudaStream_t stream);
cudaError_t castBf16ToFloat(const uint16_t *in, float *out, int64_t n,
                            cudaStream_t stream);
/// kernels::castToBf16Stochastic with the shard's indices as a ShardIndex.
cudaError_t castToBf16Stochastic(const float *in, uint16_t *out, int64_t n,
                                 const StochasticRoundingKey &key,
                                 const ShardIndex &index, cudaStream_t stream);

/// out[j] = ((0 + in[j]) + in[n + j]) + ... + in[(rows - 1) * n + j]: the
/// executor's `sum` of a stacked gradient's rows, in the CPU's order.
cudaError_t sumRows(const float *in, int64_t rows, int64_t n, float *out,
                    cudaStream_t stream);

/// acc[i] += add[i] (the executor's `accumulate`): float32, or bfloat16
/// added in float32 and rounded to nearest even.
cudaError_t accumulate(void *acc, const void *add, int64_t n, bool bf16,
                       cudaStream_t stream);

/// The Gloo backend's key-order reduction, for the NCCL backend's
/// deterministic sums (docs/runtime.md "Determinism"): `in` holds `blocks`
/// blocks of `count` elements (member k's block k), and
///   out = ((block 0 op block 1) op block 2) ... op block (blocks - 1)
/// combining as the Gloo backend does (bf16 rounded to nearest even after
/// every step), then divided by `blocks` for Avg. Float32 and BFloat16, with
/// Sum, Avg and Product; others return cudaErrorInvalidValue.
enum class BlockReduce : uint8_t { Sum, Avg, Product };
cudaError_t reduceBlocksInKeyOrder(const void *in, int64_t blocks,
                                   int64_t count, void *out, bool bf16,
                                   BlockReduce op, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// Boxes: pack/unpack of padded shards
//===----------------------------------------------------------------------===//

/// Element types the box copy converts between (plan dtypes).
enum class ElementType : uint8_t { Float32, BFloat16, Float8E4M3, Float8E5M2 };

/// A packed box of a global tensor in device memory (the device form of the
/// executor's BoxRef).
struct DeviceBox {
  void *data = nullptr;
  ElementType type = ElementType::Float32;
  std::span<const int64_t> shape;  ///< local (packed) shape
  std::span<const int64_t> origin; ///< global offset of element [0, ..]
};

/// The GPU copyBox: copies the global region [offset, offset + size) from
/// src to dst (both must contain it; up to kMaxRank dimensions),
/// converting as the CPU's convertElements does: `scale` (a device pointer;
/// null means 1) multiplies values cast to float8 and divides values read
/// from float8. Packing a padded chunk is a zero fill (cudaMemsetAsync) and
/// one copyBox; unpacking is one copyBox per member. Returns
/// cudaErrorInvalidValue for an unsupported conversion or a region outside a
/// box.
cudaError_t copyBox(const DeviceBox &src, const DeviceBox &dst,
                    std::span<const int64_t> offset,
                    std::span<const int64_t> size, const float *scale,
                    cudaStream_t stream);

//===----------------------------------------------------------------------===//
// AdamW
//===----------------------------------------------------------------------===//

/// kernels::adamwFp32 on the device (the step's scalars are computed on the
/// host, in double, exactly as the CPU kernel computes them).
cudaError_t adamwFp32(float *param, const float *grad, float *expAvg,
                      float *expAvgSq, int64_t n, const AdamWParams &params,
                      int64_t step, cudaStream_t stream);

/// kernels::adamwBf16StochasticRounding on the device: the same Philox bits
/// for the same (seed, step, tensor id, global index).
cudaError_t adamwBf16StochasticRounding(
    uint16_t *paramBf16, const float *grad, float *expAvg, float *expAvgSq,
    int64_t n, const AdamWParams &params, int64_t step, uint64_t seed,
    uint64_t tensorId, const ShardIndex &index, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// Timing
//===----------------------------------------------------------------------===//

/// Holds `stream` until *counter (mapped pinned host memory, read through
/// its device pointer) reaches `value` (Gate.cu; Device::hold).
cudaError_t spinUntil(const uint32_t *counter, uint32_t value,
                      cudaStream_t stream);

} // namespace meshplan::runtime::cuda

#endif // MESHPLAN_RUNTIME_KERNELS_CUDA_CUDAKERNELS_H
