//===- ModelKernels.h - The example model's CUDA kernels --------*- C++ -*-===//
//
// The kernels behind the CUDA ModelOps (CudaOps.cpp): one per ModelOps
// operation that is not a copy or a matmul, with the meaning ModelOps.h
// gives it. Every pointer is device memory of the current device; every
// function enqueues on `stream` and returns the launch's error.
//
// Row-wise operations (norms, softmax, cross-entropy) give one warp to a
// row and reduce with shuffles in a fixed order: a run gives the same bits
// every time. Sums over rows (a norm weight's gradient, an embedding row's)
// give one thread to an output element and add the rows in order, with no
// atomics, for the same reason.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_MODEL_CUDA_MODELKERNELS_H
#define MESHPLAN_TRAINER_MODEL_CUDA_MODELKERNELS_H

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshplan::trainer::cuda {

cudaError_t roundBf16Rows(const float *in, float *out, int64_t rows,
                          int64_t pitch, int64_t width, cudaStream_t stream);
cudaError_t rmsNorm(const float *x, const float *w, float *y, float *rstd,
                    int64_t rows, int64_t D, float eps, cudaStream_t stream);
cudaError_t rmsNormBackward(const float *dy, const float *x, const float *rstd,
                            const float *w, float *dw, float *dx, int64_t rows,
                            int64_t D, bool add, cudaStream_t stream);
cudaError_t rope(float *x, const float *cos, const float *sin, int64_t rows,
                 int64_t T, int64_t heads, int64_t hd, bool inverse,
                 cudaStream_t stream);
cudaError_t add(const float *x, const float *y, float *out, int64_t n,
                cudaStream_t stream);
cudaError_t swiglu(const float *a, const float *g, float *u, int64_t n,
                   cudaStream_t stream);
cudaError_t swigluBackward(const float *du, float *a, float *g, int64_t n,
                           cudaStream_t stream);
cudaError_t causalSoftmax(float *s, float *lse, int64_t R, int64_t r0,
                          int64_t r1, int64_t pitch, cudaStream_t stream);
cudaError_t causalProbs(float *s, const float *lse, int64_t R, int64_t r0,
                        int64_t r1, int64_t pitch, cudaStream_t stream);
cudaError_t causalSoftmaxBackward(const float *p, float *dp, int64_t R,
                                  int64_t r0, int64_t r1, int64_t pitch,
                                  cudaStream_t stream);
cudaError_t embeddingRows(const int32_t *rowToken, int64_t rows,
                          const float *table, int64_t V, int64_t D, float *out,
                          cudaStream_t stream);
cudaError_t embeddingBackward(const int32_t *tokens, const int32_t *offsets,
                              const int32_t *rowsOf, int64_t nTokens,
                              const float *src, int64_t D, float *table,
                              cudaStream_t stream);
cudaError_t rowMaxAndTarget(const float *logits, const int32_t *target,
                            int64_t N, int64_t V, float *mx, float *tgt,
                            cudaStream_t stream);
cudaError_t expAndSum(float *logits, const float *mx, int64_t N, int64_t V,
                      float *sums, cudaStream_t stream);
cudaError_t normalizeRows(float *logits, const float *sums, int64_t N,
                          int64_t V, cudaStream_t stream);
cudaError_t crossEntropyGrad(float *probs, const int32_t *target, int64_t N,
                             int64_t V, float c, cudaStream_t stream);

} // namespace meshplan::trainer::cuda

#endif // MESHPLAN_TRAINER_MODEL_CUDA_MODELKERNELS_H
