//===- CudaOps.h - The example model on a CUDA device -----------*- C++ -*-===//
//
// The ModelOps of a GPU (CUDA builds only): device memory, cuBLAS for the
// matmuls (fp32 sgemm with full fp32 math, no TF32; with bf16 inputs
// cublasGemmEx on bf16 copies with fp32 accumulation), the kernels of
// ModelKernels.cu for the rest, everything on one CUDA stream of its own.
// This header names no CUDA type.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_MODEL_CUDA_CUDAOPS_H
#define MESHPLAN_TRAINER_MODEL_CUDA_CUDAOPS_H

#include "model/ModelOps.h"

namespace meshplan::trainer {

/// The ops on CUDA device `index`; fails, saying why, when there is no
/// such device or cuBLAS cannot start.
Result<std::unique_ptr<ModelOps>> createCudaOps(int64_t index);

} // namespace meshplan::trainer

#endif // MESHPLAN_TRAINER_MODEL_CUDA_CUDAOPS_H
