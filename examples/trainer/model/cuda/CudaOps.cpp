//===- CudaOps.cpp - The example model's operations on a CUDA device ------===//
//
// Everything is enqueued on one non-blocking stream; the host waits only in
// download() and synchronize(). ModelOps' operations return nothing, so the
// first CUDA or cuBLAS error is kept and reported by the next call that can
// (download, synchronize); later work is skipped once one failed.
//
// Row-major matmuls on column-major cuBLAS: C = op(A) op(B) row-major is
// C^T = op(B)^T op(A)^T column-major, and a row-major matrix with leading
// dimension ld is its own transpose column-major with the same ld, so the
// call swaps the operands and M with N and keeps every ld.
//
//===----------------------------------------------------------------------===//
#include "model/cuda/CudaOps.h"

#include "CudaKernels.h" // runtime/lib/Kernels/Cuda: castToBf16
#include "model/cuda/ModelKernels.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

namespace meshplan::trainer {

namespace {

const char *cublasName(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS:
    return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED:
    return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED:
    return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE:
    return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH:
    return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_EXECUTION_FAILED:
    return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_NOT_SUPPORTED:
    return "CUBLAS_STATUS_NOT_SUPPORTED";
  default:
    return "a cuBLAS error";
  }
}

/// The elements a row-major operand spans: `rows` x `cols` as stored, ld.
int64_t span(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

class CudaOps final : public ModelOps {
public:
  ~CudaOps() override {
    cudaSetDevice(int(device));
    if (stream)
      cudaStreamSynchronize(stream);
    for (void *p : {static_cast<void *>(bf16A), static_cast<void *>(bf16B)})
      if (p)
        cudaFree(p);
    if (blas)
      cublasDestroy(blas);
    if (stream)
      cudaStreamDestroy(stream);
  }

  static Result<std::unique_ptr<ModelOps>> create(int64_t index) {
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess)
      return makeError(std::string("the model's CUDA ops: no CUDA device (") +
                       cudaGetErrorName(e) + ")");
    if (index < 0 || index >= count)
      return makeError("the model's CUDA ops: device " + std::to_string(index) +
                       " does not exist (" + std::to_string(count) +
                       " visible)");
    auto ops = std::unique_ptr<CudaOps>(new CudaOps(index));
    if (cudaError_t e = cudaSetDevice(int(index)); e != cudaSuccess)
      return ops->cudaFailure("cudaSetDevice", e).error();
    if (cudaError_t e =
            cudaStreamCreateWithFlags(&ops->stream, cudaStreamNonBlocking);
        e != cudaSuccess)
      return ops->cudaFailure("cudaStreamCreate", e).error();
    if (cublasStatus_t s = cublasCreate(&ops->blas); s != CUBLAS_STATUS_SUCCESS)
      return makeError(std::string("the model's CUDA ops: cublasCreate: ") +
                       cublasName(s));
    // Full fp32 sgemm: no TF32 (CUBLAS_DEFAULT_MATH), so fp32 compute is
    // what the CPU's sgemm computes, up to summation order.
    if (cublasSetStream(ops->blas, ops->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(ops->blas, CUBLAS_DEFAULT_MATH) !=
            CUBLAS_STATUS_SUCCESS)
      return makeError("the model's CUDA ops: cuBLAS refused its stream or "
                       "math mode");
    return std::unique_ptr<ModelOps>(std::move(ops));
  }

  std::string_view name() const override { return "cuda"; }
  bool hostMemory() const override { return false; }
  void *nativeStream() const override { return stream; }

  Result<void *> allocate(size_t bytes) override {
    select();
    void *p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
        e != cudaSuccess)
      return makeError("the model could not allocate " + std::to_string(bytes) +
                       " bytes on CUDA device " + std::to_string(device) +
                       " (" + cudaGetErrorName(e) + ")");
    check("cudaMemsetAsync", cudaMemsetAsync(p, 0, bytes, stream));
    return p;
  }
  void release(void *p) override {
    select();
    // cudaFree waits for the device: no enqueued work still uses p.
    cudaFree(p);
  }
  void upload(void *dst, const void *src, size_t bytes) override {
    // From pageable memory this returns once the source has been staged,
    // so the caller may reuse it at once.
    if (bytes && ok())
      check("cudaMemcpyAsync (to the device)",
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  }
  Result<void> download(void *dst, const void *src, size_t bytes) override {
    if (bytes && ok())
      check("cudaMemcpyAsync (to the host)",
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    return synchronize();
  }
  void copy(void *dst, const void *src, size_t bytes) override {
    if (bytes && ok())
      check("cudaMemcpyAsync",
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  void fillZero(void *dst, size_t bytes) override {
    if (bytes && ok())
      check("cudaMemsetAsync", cudaMemsetAsync(dst, 0, bytes, stream));
  }
  void copyRows(float *dst, int64_t dstPitch, const float *src,
                int64_t srcPitch, int64_t width, int64_t rows) override {
    if (rows && width && ok())
      check("cudaMemcpy2DAsync",
            cudaMemcpy2DAsync(dst, sizeof(float) * size_t(dstPitch), src,
                              sizeof(float) * size_t(srcPitch),
                              sizeof(float) * size_t(width), size_t(rows),
                              cudaMemcpyDeviceToDevice, stream));
  }
  Result<void> synchronize() override {
    select();
    if (ok())
      check("cudaStreamSynchronize", cudaStreamSynchronize(stream));
    if (!ok())
      return makeError(failure);
    return {};
  }

  double gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
              float alpha, const float *A, int64_t lda, const float *B,
              int64_t ldb, float beta, float *C, int64_t ldc,
              bool bf16Inputs) override {
    if (!ok() || M == 0 || N == 0)
      return 0;
    select();
    cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!bf16Inputs) {
      blasCheck("cublasSgemm",
                cublasSgemm(blas, opB, opA, int(N), int(M), int(K), &alpha, B,
                            int(ldb), A, int(lda), &beta, C, int(ldc)));
      return 0;
    }
    // The inputs hold bf16 values already (the model rounded them): their
    // bf16 copies are exact, and the tensor cores multiply those with fp32
    // accumulation, as a bf16 autocast matmul does.
    int64_t spanA = transA ? span(K, M, lda) : span(M, K, lda);
    int64_t spanB = transB ? span(N, K, ldb) : span(K, N, ldb);
    if (!reserve(bf16A, capA, spanA) || !reserve(bf16B, capB, spanB))
      return 0;
    check("castToBf16", runtime::cuda::castToBf16(A, bf16A, spanA, stream));
    check("castToBf16", runtime::cuda::castToBf16(B, bf16B, spanB, stream));
    if (!ok())
      return 0;
    blasCheck("cublasGemmEx",
              cublasGemmEx(blas, opB, opA, int(N), int(M), int(K), &alpha,
                           bf16B, CUDA_R_16BF, int(ldb), bf16A, CUDA_R_16BF,
                           int(lda), &beta, C, CUDA_R_32F, int(ldc),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
  }

  void roundBf16(const float *in, float *out, int64_t n) override {
    roundBf16Rows(in, out, 1, n, n);
  }
  void roundBf16Rows(const float *in, float *out, int64_t rows, int64_t pitch,
                     int64_t width) override {
    launch("roundBf16Rows", [&] {
      return cuda::roundBf16Rows(in, out, rows, pitch, width, stream);
    });
  }

  void rmsNorm(const float *x, const float *w, float *y, float *rstd,
               int64_t rows, int64_t D, float eps) override {
    launch("rmsNorm",
           [&] { return cuda::rmsNorm(x, w, y, rstd, rows, D, eps, stream); });
  }
  void rmsNormBackward(const float *dy, const float *x, const float *rstd,
                       const float *w, float *dw, float *dx, int64_t rows,
                       int64_t D, bool add) override {
    launch("rmsNormBackward", [&] {
      return cuda::rmsNormBackward(dy, x, rstd, w, dw, dx, rows, D, add,
                                   stream);
    });
  }
  void rope(float *x, const float *cos, const float *sin, int64_t rows,
            int64_t T, int64_t heads, int64_t hd, bool inverse) override {
    launch("rope", [&] {
      return cuda::rope(x, cos, sin, rows, T, heads, hd, inverse, stream);
    });
  }
  void add(const float *x, const float *y, float *out, int64_t n) override {
    launch("add", [&] { return cuda::add(x, y, out, n, stream); });
  }
  void swiglu(const float *a, const float *g, float *u, int64_t n) override {
    launch("swiglu", [&] { return cuda::swiglu(a, g, u, n, stream); });
  }
  void swigluBackward(const float *du, float *a, float *g, int64_t n) override {
    launch("swigluBackward",
           [&] { return cuda::swigluBackward(du, a, g, n, stream); });
  }

  /// The whole sequence per call: one score block of T x T per head.
  int64_t attentionRowBlock() const override { return int64_t(1) << 30; }
  void causalSoftmax(float *s, float *lse, int64_t R, int64_t r0, int64_t r1,
                     int64_t pitch) override {
    launch("causalSoftmax", [&] {
      return cuda::causalSoftmax(s, lse, R, r0, r1, pitch, stream);
    });
  }
  void causalProbs(float *s, const float *lse, int64_t R, int64_t r0,
                   int64_t r1, int64_t pitch) override {
    launch("causalProbs",
           [&] { return cuda::causalProbs(s, lse, R, r0, r1, pitch, stream); });
  }
  void causalSoftmaxBackward(const float *p, float *dp, int64_t R, int64_t r0,
                             int64_t r1, int64_t pitch) override {
    launch("causalSoftmaxBackward", [&] {
      return cuda::causalSoftmaxBackward(p, dp, R, r0, r1, pitch, stream);
    });
  }

  void embeddingRows(const int32_t *rowToken, int64_t rows, const float *table,
                     int64_t V, int64_t D, float *out) override {
    launch("embeddingRows", [&] {
      return cuda::embeddingRows(rowToken, rows, table, V, D, out, stream);
    });
  }
  void embeddingBackward(const int32_t *tokens, const int32_t *offsets,
                         const int32_t *rowsOf, int64_t nTokens,
                         const float *src, int64_t D, float *table) override {
    launch("embeddingBackward", [&] {
      return cuda::embeddingBackward(tokens, offsets, rowsOf, nTokens, src, D,
                                     table, stream);
    });
  }
  void rowMaxAndTarget(const float *logits, const int32_t *target, int64_t N,
                       int64_t V, float *mx, float *tgt) override {
    launch("rowMaxAndTarget", [&] {
      return cuda::rowMaxAndTarget(logits, target, N, V, mx, tgt, stream);
    });
  }
  void expAndSum(float *logits, const float *mx, int64_t N, int64_t V,
                 float *sums) override {
    launch("expAndSum",
           [&] { return cuda::expAndSum(logits, mx, N, V, sums, stream); });
  }
  void normalizeRows(float *logits, const float *sums, int64_t N,
                     int64_t V) override {
    launch("normalizeRows",
           [&] { return cuda::normalizeRows(logits, sums, N, V, stream); });
  }
  void crossEntropyGrad(float *probs, const int32_t *target, int64_t N,
                        int64_t V, float c) override {
    launch("crossEntropyGrad", [&] {
      return cuda::crossEntropyGrad(probs, target, N, V, c, stream);
    });
  }

private:
  explicit CudaOps(int64_t device) : device(device) {}

  // Callers may run on any host thread (the runtime's executor threads set
  // their own device): select ours before every call that needs it.
  void select() { cudaSetDevice(int(device)); }
  bool ok() const { return failure.empty(); }
  void check(const char *what, cudaError_t e) {
    if (e != cudaSuccess && ok())
      failure = "the model's CUDA ops on device " + std::to_string(device) +
                ": " + what + ": " + cudaGetErrorName(e) + " (" +
                cudaGetErrorString(e) + ")";
  }
  void blasCheck(const char *what, cublasStatus_t s) {
    if (s != CUBLAS_STATUS_SUCCESS && ok())
      failure = "the model's CUDA ops on device " + std::to_string(device) +
                ": " + what + ": " + cublasName(s);
  }
  template <typename Launch> void launch(const char *what, Launch &&body) {
    if (!ok())
      return;
    select();
    check(what, body());
  }
  Result<void> cudaFailure(const char *what, cudaError_t e) {
    check(what, e);
    return makeError(failure);
  }
  /// Grows a bf16 scratch to n elements (waiting for the stream first, as
  /// enqueued matmuls may still read the old one).
  bool reserve(uint16_t *&buffer, int64_t &capacity, int64_t n) {
    if (n <= capacity)
      return true;
    check("cudaStreamSynchronize", cudaStreamSynchronize(stream));
    if (buffer)
      cudaFree(buffer);
    buffer = nullptr;
    capacity = 0;
    void *p = nullptr;
    check("cudaMalloc (bf16 matmul inputs)",
          cudaMalloc(&p, sizeof(uint16_t) * size_t(n)));
    if (!ok())
      return false;
    buffer = static_cast<uint16_t *>(p);
    capacity = n;
    return true;
  }

  int64_t device;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  uint16_t *bf16A = nullptr, *bf16B = nullptr;
  int64_t capA = 0, capB = 0;
  std::string failure;
};

} // namespace

Result<std::unique_ptr<ModelOps>> createCudaOps(int64_t index) {
  return CudaOps::create(index);
}

} // namespace meshplan::trainer
