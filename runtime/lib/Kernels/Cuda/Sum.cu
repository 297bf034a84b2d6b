//===- Sum.cu - Sums of a stacked tensor's rows ---------------------------===//
//
// One thread per output element adds the rows in row order starting from
// +0.0f, the CPU executor's order, so the float result is the same bits
// (a different order, or a tree, could round differently).
//
//===----------------------------------------------------------------------===//

#include "CudaSupport.cuh"

namespace meshplan::runtime::cuda {
using namespace detail;

namespace {

__global__ void sumRowsKernel(const float *in, int64_t rows, int64_t n,
                              float *out) {
  for (int64_t j = firstIndex(); j < n; j += gridStride()) {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      acc = acc + in[r * n + j];
    out[j] = acc;
  }
}

/// The executor's `accumulate`: acc += add, float32; bf16 widened, added in
/// float32 and rounded to nearest even once (the CPU executor's order).
__global__ void accumulateKernel(float *acc, const float *add, int64_t n) {
  for (int64_t j = firstIndex(); j < n; j += gridStride())
    acc[j] = acc[j] + add[j];
}
__global__ void accumulateBf16Kernel(uint16_t *acc, const uint16_t *add,
                                     int64_t n) {
  for (int64_t j = firstIndex(); j < n; j += gridStride())
    acc[j] = roundBf16(widenBf16(acc[j]) + widenBf16(add[j]));
}

template <BlockReduce Op>
__device__ __forceinline__ float combine(float a, float b) {
  return Op == BlockReduce::Product ? a * b : a + b;
}

__device__ __forceinline__ float loadAs(const float *p) { return *p; }
__device__ __forceinline__ float loadAs(const uint16_t *p) {
  return widenBf16(*p);
}
__device__ __forceinline__ void storeAs(float *p, float x) { *p = x; }
__device__ __forceinline__ void storeAs(uint16_t *p, float x) {
  *p = roundBf16(x);
}
/// The value after one combine: bf16 rounds every partial result, as the
/// Gloo backend's reduceBf16 does.
__device__ __forceinline__ float settle(float x, const float *) { return x; }
__device__ __forceinline__ float settle(float x, const uint16_t *) {
  return widenBf16(roundBf16(x));
}

template <BlockReduce Op, typename T>
__global__ void reduceBlocksKernel(const T *in, int64_t blocks, int64_t count,
                                   T *out) {
  for (int64_t j = firstIndex(); j < count; j += gridStride()) {
    float acc = loadAs(in + j);
    for (int64_t b = 1; b < blocks; ++b)
      acc = settle(combine<Op>(acc, loadAs(in + b * count + j)), in);
    if (Op == BlockReduce::Avg)
      acc = acc / static_cast<float>(blocks);
    storeAs(out + j, acc);
  }
}

template <typename T>
cudaError_t reduceTyped(const T *in, int64_t blocks, int64_t count, T *out,
                        BlockReduce op, cudaStream_t stream) {
  switch (op) {
  case BlockReduce::Sum:
    reduceBlocksKernel<BlockReduce::Sum>
        <<<blocksFor(count), kBlock, 0, stream>>>(in, blocks, count, out);
    break;
  case BlockReduce::Avg:
    reduceBlocksKernel<BlockReduce::Avg>
        <<<blocksFor(count), kBlock, 0, stream>>>(in, blocks, count, out);
    break;
  case BlockReduce::Product:
    reduceBlocksKernel<BlockReduce::Product>
        <<<blocksFor(count), kBlock, 0, stream>>>(in, blocks, count, out);
    break;
  }
  return launched();
}

} // namespace

cudaError_t reduceBlocksInKeyOrder(const void *in, int64_t blocks,
                                   int64_t count, void *out, bool bf16,
                                   BlockReduce op, cudaStream_t stream) {
  if (blocks < 1)
    return cudaErrorInvalidValue;
  if (count <= 0)
    return cudaSuccess;
  if (bf16)
    return reduceTyped(static_cast<const uint16_t *>(in), blocks, count,
                       static_cast<uint16_t *>(out), op, stream);
  return reduceTyped(static_cast<const float *>(in), blocks, count,
                     static_cast<float *>(out), op, stream);
}

cudaError_t sumRows(const float *in, int64_t rows, int64_t n, float *out,
                    cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  if (rows < 0)
    return cudaErrorInvalidValue;
  sumRowsKernel<<<blocksFor(n), kBlock, 0, stream>>>(in, rows, n, out);
  return launched();
}

cudaError_t accumulate(void *acc, const void *add, int64_t n, bool bf16,
                       cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  if (bf16)
    accumulateBf16Kernel<<<blocksFor(n), kBlock, 0, stream>>>(
        static_cast<uint16_t *>(acc), static_cast<const uint16_t *>(add), n);
  else
    accumulateKernel<<<blocksFor(n), kBlock, 0, stream>>>(
        static_cast<float *>(acc), static_cast<const float *>(add), n);
  return launched();
}

} // namespace meshplan::runtime::cuda
