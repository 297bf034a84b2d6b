//===- ModelOps.h - Where the example model keeps its tensors and computes ===//
//
// Microbatch (Llama.h) writes the model once, as a sequence of the
// operations below; a ModelOps runs them on one kind of memory:
//   - createHostOps(): host memory, OpenBLAS sgemm, plain loops (the model
//     of the CPU runs and of the single-process reference);
//   - createCudaOps() (CudaOps.h, CUDA builds only): device memory, cuBLAS,
//     CUDA kernels, all enqueued on one CUDA stream.
// So the model's structure (which matmul, which collective, which rounding
// when) exists once, and the CPU runs in every CI job check the structure
// the GPU runs use; a GPU test compares the two implementations.
//
// Every pointer below is memory of the ops (device memory for CUDA). Calls
// are enqueued in order and may return before they complete; only the
// download* calls wait, for everything enqueued before them. Sizes are
// element counts. Matrices are row-major.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_MODEL_MODELOPS_H
#define MESHPLAN_TRAINER_MODEL_MODELOPS_H

#include "meshplan/Core/Result.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace meshplan::trainer {

class ModelOps {
public:
  virtual ~ModelOps();
  /// "cpu" or "cuda".
  virtual std::string_view name() const = 0;
  /// True when the ops' memory is host memory (pointers may be used
  /// directly by the caller).
  virtual bool hostMemory() const = 0;
  /// The CUDA stream (cudaStream_t) the ops enqueue on, for collectives
  /// that must follow their work; null for the CPU ops.
  virtual void *nativeStream() const { return nullptr; }

  //===--- Memory ---------------------------------------------------------===//

  /// `bytes` of the ops' memory, zero-filled; freed by release().
  virtual Result<void *> allocate(size_t bytes) = 0;
  virtual void release(void *p) = 0;
  virtual void upload(void *dst, const void *hostSrc, size_t bytes) = 0;
  /// Waits for everything enqueued so far, then copies to the host.
  virtual Result<void> download(void *hostDst, const void *src,
                                size_t bytes) = 0;
  virtual void copy(void *dst, const void *src, size_t bytes) = 0;
  virtual void fillZero(void *dst, size_t bytes) = 0;
  /// rows x width floats from src (row pitch srcPitch) to dst (dstPitch).
  virtual void copyRows(float *dst, int64_t dstPitch, const float *src,
                        int64_t srcPitch, int64_t width, int64_t rows) = 0;
  /// Waits for everything enqueued so far; reports a failure of any of it.
  virtual Result<void> synchronize() = 0;

  //===--- Matmuls and rounding -------------------------------------------===//

  /// C = alpha op(A) op(B) + beta C; op(A) is M x K, op(B) K x N. With
  /// bf16Inputs, A and B hold bf16 values (rounded by roundBf16): the CUDA
  /// ops then multiply them as bf16 with fp32 accumulation. Returns the
  /// host seconds the call took where that is the matmul's time (the CPU
  /// ops), else 0.
  virtual double gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                      float alpha, const float *A, int64_t lda, const float *B,
                      int64_t ldb, float beta, float *C, int64_t ldc,
                      bool bf16Inputs) = 0;
  /// out[i] = bf16 round-to-nearest-even of in[i], widened (in == out ok).
  virtual void roundBf16(const float *in, float *out, int64_t n) = 0;
  /// The same over `rows` rows of `width` floats, row pitch `pitch`.
  virtual void roundBf16Rows(const float *in, float *out, int64_t rows,
                             int64_t pitch, int64_t width) = 0;

  //===--- Elementwise and row-wise pieces
  //---------------------------------===//

  /// Per row of [rows, D]: rstd = 1 / sqrt(mean(x^2) + eps); y = x rstd w.
  virtual void rmsNorm(const float *x, const float *w, float *y, float *rstd,
                       int64_t rows, int64_t D, float eps) = 0;
  /// With xhat = x rstd and dxhat = dy w: dw += sum over rows of dy xhat;
  /// dx = (or +=, with add) rstd (dxhat - xhat mean(dxhat xhat)).
  virtual void rmsNormBackward(const float *dy, const float *x,
                               const float *rstd, const float *w, float *dw,
                               float *dx, int64_t rows, int64_t D,
                               bool add) = 0;
  /// Rotates the pairs (2i, 2i + 1) of every head of [rows, heads * hd] by
  /// +angle (or -angle, inverse) of the row's position (row % T), whose
  /// cos and sin are cos[t * hd / 2 + i], sin[...].
  virtual void rope(float *x, const float *cos, const float *sin, int64_t rows,
                    int64_t T, int64_t heads, int64_t hd, bool inverse) = 0;
  /// out = x + y.
  virtual void add(const float *x, const float *y, float *out, int64_t n) = 0;
  /// u = silu(a) g.
  virtual void swiglu(const float *a, const float *g, float *u, int64_t n) = 0;
  /// From du: a := da, g := dg (in place).
  virtual void swigluBackward(const float *du, float *a, float *g,
                              int64_t n) = 0;

  //===--- Causal attention over a block of query rows
  //---------------------===//
  // Rows i in [0, R) of a score block with row pitch `pitch` are the query
  // positions t = r0 + i; each sees keys [0, t] and the block holds keys
  // [0, r1) (r1 > every t). Entries for keys in (t, r1) are set to zero.

  /// The rows of keys each attention call handles at once: the CPU keeps
  /// blocks small for its caches; a GPU takes the whole sequence.
  virtual int64_t attentionRowBlock() const = 0;
  /// Softmax of each row over keys [0, t] in place; lse[i] = its
  /// log-sum-exp.
  virtual void causalSoftmax(float *s, float *lse, int64_t R, int64_t r0,
                             int64_t r1, int64_t pitch) = 0;
  /// p = exp(s - lse[i]) over keys [0, t], in place.
  virtual void causalProbs(float *s, const float *lse, int64_t R, int64_t r0,
                           int64_t r1, int64_t pitch) = 0;
  /// Softmax backward: dp = p (dp - sum_j p dp) over keys [0, t].
  virtual void causalSoftmaxBackward(const float *p, float *dp, int64_t R,
                                     int64_t r0, int64_t r1, int64_t pitch) = 0;

  //===--- Embedding and cross-entropy
  //-------------------------------------===//

  /// out row r = table row rowToken[r], or zeros where rowToken[r] is
  /// outside [0, V) (another rank's vocabulary).
  virtual void embeddingRows(const int32_t *rowToken, int64_t rows,
                             const float *table, int64_t V, int64_t D,
                             float *out) = 0;
  /// For each u < nTokens: table row tokens[u] += rows rowsOf[offsets[u]
  /// .. offsets[u + 1]) of src, in that order (deterministic: no atomics).
  virtual void embeddingBackward(const int32_t *tokens, const int32_t *offsets,
                                 const int32_t *rowsOf, int64_t nTokens,
                                 const float *src, int64_t D, float *table) = 0;
  /// Per row n of logits [N, V]: mx[n] = max, tgt[n] = logits[n, target[n]]
  /// (0 where target[n] is outside [0, V)).
  virtual void rowMaxAndTarget(const float *logits, const int32_t *target,
                               int64_t N, int64_t V, float *mx, float *tgt) = 0;
  /// logits := exp(logits - mx[n]); sums[n] = their sum.
  virtual void expAndSum(float *logits, const float *mx, int64_t N, int64_t V,
                         float *sums) = 0;
  /// logits[n, :] *= 1 / sums[n].
  virtual void normalizeRows(float *logits, const float *sums, int64_t N,
                             int64_t V) = 0;
  /// probs := c (probs - onehot(target)).
  virtual void crossEntropyGrad(float *probs, const int32_t *target, int64_t N,
                                int64_t V, float c) = 0;
};

/// Host memory, OpenBLAS sgemm (with its threads), the rest on the calling
/// thread.
std::unique_ptr<ModelOps> createHostOps();
/// One process-wide host ops, for callers that pass none.
ModelOps &hostOps();

/// A buffer of ModelOps memory, released with its owner.
template <typename T> class OpsBuffer {
public:
  OpsBuffer() = default;
  OpsBuffer(const OpsBuffer &) = delete;
  OpsBuffer &operator=(const OpsBuffer &) = delete;
  OpsBuffer(OpsBuffer &&o) noexcept { *this = std::move(o); }
  OpsBuffer &operator=(OpsBuffer &&o) noexcept {
    reset();
    ops = o.ops;
    ptr = o.ptr;
    count = o.count;
    o.ops = nullptr;
    o.ptr = nullptr;
    o.count = 0;
    return *this;
  }
  ~OpsBuffer() { reset(); }

  /// `n` zeroed elements of `on`'s memory (n may be 0).
  Result<void> allocate(ModelOps &on, int64_t n) {
    reset();
    ops = &on;
    count = n;
    if (n == 0)
      return {};
    auto p = on.allocate(sizeof(T) * static_cast<size_t>(n));
    if (!p)
      return p.error();
    ptr = static_cast<T *>(*p);
    return {};
  }
  void reset() {
    if (ops && ptr)
      ops->release(ptr);
    ptr = nullptr;
    count = 0;
  }
  T *data() const { return ptr; }
  int64_t size() const { return count; }
  size_t bytes() const { return sizeof(T) * static_cast<size_t>(count); }

private:
  ModelOps *ops = nullptr;
  T *ptr = nullptr;
  int64_t count = 0;
};

} // namespace meshplan::trainer

#endif // MESHPLAN_TRAINER_MODEL_MODELOPS_H
