//===- CudaSupport.cuh - Launch shapes of the CUDA kernels ----*- C++ -*-===//
//
// Every kernel is a grid-stride loop over 64-bit element indices, so one
// launch shape serves any size and a tensor of more than 2^31 elements needs
// nothing special. The grid is capped: beyond a few waves of blocks extra
// blocks only add scheduling work.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_KERNELS_CUDA_CUDASUPPORT_CUH
#define MESHPLAN_RUNTIME_KERNELS_CUDA_CUDASUPPORT_CUH

#include "../ScalarMath.h"
#include "CudaKernels.h"

namespace meshplan::runtime::cuda::detail {

using namespace kernels::detail;

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 8192;

inline unsigned blocksFor(int64_t n) {
  int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < 1            ? 1
                               : blocks > kMaxBlocks ? kMaxBlocks
                                                     : blocks);
}

/// The grid-stride loop: for (i = first; i < n; i += stride).
__device__ __forceinline__ int64_t firstIndex() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t gridStride() {
  return int64_t(gridDim.x) * blockDim.x;
}

/// The launch's error, or the sticky one of an earlier failure.
inline cudaError_t launched() { return cudaGetLastError(); }

} // namespace meshplan::runtime::cuda::detail

#endif // MESHPLAN_RUNTIME_KERNELS_CUDA_CUDASUPPORT_CUH
