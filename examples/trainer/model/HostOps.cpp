//===- HostOps.cpp - The example model's operations on the CPU ------------===//
//
// Host memory, one cblas_sgemm per matmul (OpenBLAS's threads), and plain
// loops for the rest, on the calling thread: they are small next to the
// matmuls they feed. Sums over a row use eight partial sums so that the
// loops vectorize without -ffast-math (and give the same bits every run).
//
//===----------------------------------------------------------------------===//
#include "model/ModelOps.h"

#include "model/ElementMath.h"

#include "meshplan/Runtime/Kernels.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace meshplan::trainer {

ModelOps::~ModelOps() = default;

namespace {

namespace kernels = meshplan::runtime::kernels;

/// sum x[i] * y[i] with eight partial sums.
inline float dot(const float *x, const float *y, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j)
      acc[j] += x[i + j] * y[i + j];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
              ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i)
    sum += x[i] * y[i];
  return sum;
}

/// Rows of the causal attention per sgemm on the CPU: row block [r0, r1)
/// only needs keys [0, r1), which skips about half the work of a full
/// T x T product while keeping each sgemm large enough to run near peak.
constexpr int64_t kAttentionRowBlock = 128;

class HostOps final : public ModelOps {
public:
  std::string_view name() const override { return "cpu"; }
  bool hostMemory() const override { return true; }

  Result<void *> allocate(size_t bytes) override {
    void *p = std::calloc(std::max<size_t>(bytes, 1), 1);
    if (!p)
      return makeError("the model could not allocate " + std::to_string(bytes) +
                       " bytes of host memory");
    return p;
  }
  void release(void *p) override { std::free(p); }
  void upload(void *dst, const void *src, size_t bytes) override {
    if (bytes)
      std::memmove(dst, src, bytes);
  }
  Result<void> download(void *dst, const void *src, size_t bytes) override {
    if (bytes)
      std::memmove(dst, src, bytes);
    return {};
  }
  void copy(void *dst, const void *src, size_t bytes) override {
    if (bytes)
      std::memmove(dst, src, bytes);
  }
  void fillZero(void *dst, size_t bytes) override {
    if (bytes)
      std::memset(dst, 0, bytes);
  }
  void copyRows(float *dst, int64_t dstPitch, const float *src,
                int64_t srcPitch, int64_t width, int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dstPitch, src + r * srcPitch,
                  sizeof(float) * static_cast<size_t>(width));
  }
  Result<void> synchronize() override { return {}; }

  double gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
              float alpha, const float *A, int64_t lda, const float *B,
              int64_t ldb, float beta, float *C, int64_t ldc,
              bool /*bf16Inputs: already rounded; sgemm multiplies exactly
                     what it is given*/) override {
    auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
                static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
                static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta,
                C, static_cast<blasint>(ldc));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  }

  void roundBf16(const float *in, float *out, int64_t n) override {
    // The runtime's vectorized casts, one thread (these are small next to
    // the matmuls they feed), in chunks of a stack buffer.
    constexpr int64_t kChunk = 4096;
    uint16_t bits[kChunk];
    kernels::Threading one = kernels::Threading::singleThreaded();
    for (int64_t i = 0; i < n; i += kChunk) {
      auto m = static_cast<size_t>(std::min(kChunk, n - i));
      kernels::castToBf16(std::span<const float>(in + i, m),
                          std::span<uint16_t>(bits, m), one);
      kernels::castBf16ToFloat(std::span<const uint16_t>(bits, m),
                               std::span<float>(out + i, m), one);
    }
  }
  void roundBf16Rows(const float *in, float *out, int64_t rows, int64_t pitch,
                     int64_t width) override {
    for (int64_t r = 0; r < rows; ++r)
      roundBf16(in + r * pitch, out + r * pitch, width);
  }

  void rmsNorm(const float *x, const float *w, float *y, float *rstd,
               int64_t rows, int64_t D, float eps) override {
    for (int64_t i = 0; i < rows; ++i) {
      const float *xr = x + i * D;
      float *yr = y + i * D;
      float ms = dot(xr, xr, D) / static_cast<float>(D);
      float r = 1.0f / std::sqrt(ms + eps);
      rstd[i] = r;
      for (int64_t j = 0; j < D; ++j)
        yr[j] = (xr[j] * r) * w[j];
    }
  }

  void rmsNormBackward(const float *dy, const float *x, const float *rstd,
                       const float *w, float *dw, float *dx, int64_t rows,
                       int64_t D, bool add) override {
    std::vector<float> dxhat(static_cast<size_t>(D));
    for (int64_t i = 0; i < rows; ++i) {
      const float *dyr = dy + i * D, *xr = x + i * D;
      float *dxr = dx + i * D;
      float r = rstd[i];
      for (int64_t j = 0; j < D; ++j) {
        dw[j] += dyr[j] * (xr[j] * r);
        dxhat[size_t(j)] = dyr[j] * w[j];
      }
      float c = dot(dxhat.data(), xr, D) * r / static_cast<float>(D);
      if (add)
        for (int64_t j = 0; j < D; ++j)
          dxr[j] += r * (dxhat[size_t(j)] - (xr[j] * r) * c);
      else
        for (int64_t j = 0; j < D; ++j)
          dxr[j] = r * (dxhat[size_t(j)] - (xr[j] * r) * c);
    }
  }

  void rope(float *x, const float *cos, const float *sin, int64_t rows,
            int64_t T, int64_t heads, int64_t hd, bool inverse) override {
    int64_t half = hd / 2, width = heads * hd;
    float sign = inverse ? -1.0f : 1.0f;
    for (int64_t n = 0; n < rows; ++n) {
      int64_t t = n % T;
      const float *cs = cos + t * half;
      const float *sn = sin + t * half;
      float *row = x + n * width;
      for (int64_t hh = 0; hh < heads; ++hh) {
        float *xv = row + hh * hd;
        for (int64_t i = 0; i < half; ++i)
          math::rotate(xv[2 * i], xv[2 * i + 1], cs[i], sign * sn[i]);
      }
    }
  }

  void add(const float *x, const float *y, float *out, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      out[i] = x[i] + y[i];
  }

  void swiglu(const float *a, const float *g, float *u, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      u[i] = math::swiglu(a[i], g[i]);
  }

  void swigluBackward(const float *du, float *a, float *g, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      math::swigluBackward(du[i], a[i], g[i]);
  }

  int64_t attentionRowBlock() const override { return kAttentionRowBlock; }

  void causalSoftmax(float *s, float *lse, int64_t R, int64_t r0, int64_t r1,
                     int64_t pitch) override {
    for (int64_t i = 0; i < R; ++i) {
      int64_t t = r0 + i;
      float *row = s + i * pitch;
      float mx = row[0];
      for (int64_t j = 1; j <= t; ++j)
        mx = std::max(mx, row[j]);
      float sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        row[j] = std::exp(row[j] - mx);
        sum += row[j];
      }
      float inv = 1.0f / sum;
      for (int64_t j = 0; j <= t; ++j)
        row[j] *= inv;
      for (int64_t j = t + 1; j < r1; ++j)
        row[j] = 0.0f;
      lse[i] = mx + std::log(sum);
    }
  }

  void causalProbs(float *s, const float *lse, int64_t R, int64_t r0,
                   int64_t r1, int64_t pitch) override {
    for (int64_t i = 0; i < R; ++i) {
      int64_t t = r0 + i;
      float *row = s + i * pitch;
      for (int64_t j = 0; j <= t; ++j)
        row[j] = std::exp(row[j] - lse[i]);
      for (int64_t j = t + 1; j < r1; ++j)
        row[j] = 0.0f;
    }
  }

  void causalSoftmaxBackward(const float *p, float *dp, int64_t R, int64_t r0,
                             int64_t r1, int64_t pitch) override {
    for (int64_t i = 0; i < R; ++i) {
      int64_t t = r0 + i;
      const float *pr = p + i * pitch;
      float *dr = dp + i * pitch;
      float rowDot = dot(pr, dr, t + 1);
      for (int64_t j = 0; j <= t; ++j)
        dr[j] = pr[j] * (dr[j] - rowDot);
      for (int64_t j = t + 1; j < r1; ++j)
        dr[j] = 0.0f;
    }
  }

  void embeddingRows(const int32_t *rowToken, int64_t rows, const float *table,
                     int64_t V, int64_t D, float *out) override {
    for (int64_t r = 0; r < rows; ++r) {
      int64_t tok = rowToken[r];
      float *dst = out + r * D;
      if (tok >= 0 && tok < V)
        std::memcpy(dst, table + tok * D, sizeof(float) * size_t(D));
      else
        std::memset(dst, 0, sizeof(float) * size_t(D));
    }
  }

  void embeddingBackward(const int32_t *tokens, const int32_t *offsets,
                         const int32_t *rowsOf, int64_t nTokens,
                         const float *src, int64_t D, float *table) override {
    for (int64_t u = 0; u < nTokens; ++u) {
      float *dst = table + int64_t(tokens[u]) * D;
      for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k) {
        const float *row = src + int64_t(rowsOf[k]) * D;
        for (int64_t j = 0; j < D; ++j)
          dst[j] += row[j];
      }
    }
  }

  void rowMaxAndTarget(const float *logits, const int32_t *target, int64_t N,
                       int64_t V, float *mx, float *tgt) override {
    for (int64_t n = 0; n < N; ++n) {
      const float *row = logits + n * V;
      float m = row[0];
      for (int64_t j = 1; j < V; ++j)
        m = std::max(m, row[j]);
      mx[n] = m;
      int64_t t = target[n];
      tgt[n] = (t >= 0 && t < V) ? row[t] : 0.0f;
    }
  }

  void expAndSum(float *logits, const float *mx, int64_t N, int64_t V,
                 float *sums) override {
    for (int64_t n = 0; n < N; ++n) {
      float *row = logits + n * V;
      float m = mx[n], sum = 0;
      for (int64_t j = 0; j < V; ++j) {
        row[j] = std::exp(row[j] - m);
        sum += row[j];
      }
      sums[n] = sum;
    }
  }

  void normalizeRows(float *logits, const float *sums, int64_t N,
                     int64_t V) override {
    for (int64_t n = 0; n < N; ++n) {
      float inv = 1.0f / sums[n];
      float *row = logits + n * V;
      for (int64_t j = 0; j < V; ++j)
        row[j] *= inv;
    }
  }

  void crossEntropyGrad(float *probs, const int32_t *target, int64_t N,
                        int64_t V, float c) override {
    for (int64_t n = 0; n < N; ++n) {
      float *row = probs + n * V;
      for (int64_t j = 0; j < V; ++j)
        row[j] *= c;
      int64_t t = target[n];
      if (t >= 0 && t < V)
        row[t] -= c;
    }
  }
};

} // namespace

std::unique_ptr<ModelOps> createHostOps() {
  return std::make_unique<HostOps>();
}

ModelOps &hostOps() {
  static HostOps ops;
  return ops;
}

} // namespace meshplan::trainer
