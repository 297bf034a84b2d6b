//===- ModelKernels.cu - The example model's CUDA kernels -----------------===//
//
// See ModelKernels.h. Launch shapes: elementwise kernels are grid-stride
// loops over 64-bit indices; row kernels give a warp to a row (eight rows
// per block of 256 threads) and loop over rows with a grid stride; column
// sums give a thread to a column.
//
//===----------------------------------------------------------------------===//
#include "ModelKernels.h"

#include "ScalarMath.h" // runtime/lib/Kernels: bf16 rounding, as the CPU's
#include "model/ElementMath.h"

#include <cuda_runtime.h>

#include <cfloat>

namespace meshplan::trainer::cuda {

namespace {

namespace sm = meshplan::runtime::kernels::detail;

constexpr int kBlock = 256;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kBlock / kWarp;
constexpr int64_t kMaxBlocks = 8192;

unsigned blocksFor(int64_t n) {
  int64_t b = (n + kBlock - 1) / kBlock;
  return unsigned(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}
unsigned rowBlocksFor(int64_t rows) {
  int64_t b = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  return unsigned(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

__device__ __forceinline__ int64_t firstIndex() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t gridStride() {
  return int64_t(gridDim.x) * blockDim.x;
}
/// The warp's row and the row stride of the grid.
__device__ __forceinline__ int64_t firstRow() {
  return int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
}
__device__ __forceinline__ int64_t rowStride() {
  return int64_t(gridDim.x) * kRowsPerBlock;
}
__device__ __forceinline__ int lane() { return int(threadIdx.x % kWarp); }

/// Butterfly sums: every lane ends with the same value, in the same order
/// every run.
__device__ __forceinline__ float warpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ float warpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__global__ void roundBf16RowsKernel(const float *in, float *out, int64_t rows,
                                    int64_t pitch, int64_t width) {
  int64_t n = rows * width;
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int64_t at = (i / width) * pitch + i % width;
    out[at] = sm::widenBf16(sm::roundBf16(in[at]));
  }
}

__global__ void rmsNormKernel(const float *x, const float *w, float *y,
                              float *rstd, int64_t rows, int64_t D, float eps) {
  for (int64_t i = firstRow(); i < rows; i += rowStride()) {
    const float *xr = x + i * D;
    float *yr = y + i * D;
    float ss = 0;
    for (int64_t j = lane(); j < D; j += kWarp)
      ss += xr[j] * xr[j];
    float r = 1.0f / sqrtf(warpSum(ss) / float(D) + eps);
    if (lane() == 0)
      rstd[i] = r;
    for (int64_t j = lane(); j < D; j += kWarp)
      yr[j] = (xr[j] * r) * w[j];
  }
}

__global__ void rmsNormInputGradKernel(const float *dy, const float *x,
                                       const float *rstd, const float *w,
                                       float *dx, int64_t rows, int64_t D,
                                       bool add) {
  for (int64_t i = firstRow(); i < rows; i += rowStride()) {
    const float *dyr = dy + i * D, *xr = x + i * D;
    float *dxr = dx + i * D;
    float r = rstd[i];
    float part = 0;
    for (int64_t j = lane(); j < D; j += kWarp)
      part += (dyr[j] * w[j]) * xr[j];
    float c = warpSum(part) * r / float(D);
    for (int64_t j = lane(); j < D; j += kWarp) {
      float v = r * (dyr[j] * w[j] - (xr[j] * r) * c);
      dxr[j] = add ? dxr[j] + v : v;
    }
  }
}

/// dw[j] += sum over rows, in row order, of dy[i, j] x[i, j] rstd[i].
__global__ void rmsNormWeightGradKernel(const float *dy, const float *x,
                                        const float *rstd, float *dw,
                                        int64_t rows, int64_t D) {
  for (int64_t j = firstIndex(); j < D; j += gridStride()) {
    float acc = dw[j];
    for (int64_t i = 0; i < rows; ++i)
      acc += dy[i * D + j] * (x[i * D + j] * rstd[i]);
    dw[j] = acc;
  }
}

__global__ void ropeKernel(float *x, const float *cos, const float *sin,
                           int64_t rows, int64_t T, int64_t heads, int64_t hd,
                           float sign) {
  int64_t half = hd / 2, n = rows * heads * half;
  for (int64_t e = firstIndex(); e < n; e += gridStride()) {
    int64_t i = e % half, row = e / (heads * half), hh = (e / half) % heads;
    int64_t t = row % T;
    float c = cos[t * half + i], s = sign * sin[t * half + i];
    float *xv = x + row * heads * hd + hh * hd;
    math::rotate(xv[2 * i], xv[2 * i + 1], c, s);
  }
}

__global__ void addKernel(const float *x, const float *y, float *out,
                          int64_t n) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    out[i] = x[i] + y[i];
}

__global__ void swigluKernel(const float *a, const float *g, float *u,
                             int64_t n) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    u[i] = math::swiglu(a[i], g[i]);
}

__global__ void swigluBackwardKernel(const float *du, float *a, float *g,
                                     int64_t n) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    math::swigluBackward(du[i], a[i], g[i]);
}

__global__ void causalSoftmaxKernel(float *s, float *lse, int64_t R, int64_t r0,
                                    int64_t r1, int64_t pitch) {
  for (int64_t i = firstRow(); i < R; i += rowStride()) {
    int64_t t = r0 + i;
    float *row = s + i * pitch;
    float mx = -FLT_MAX;
    for (int64_t j = lane(); j <= t; j += kWarp)
      mx = fmaxf(mx, row[j]);
    mx = warpMax(mx);
    float sum = 0;
    for (int64_t j = lane(); j <= t; j += kWarp) {
      float e = expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    sum = warpSum(sum);
    float inv = 1.0f / sum;
    for (int64_t j = lane(); j < r1; j += kWarp)
      row[j] = j <= t ? row[j] * inv : 0.0f;
    if (lane() == 0)
      lse[i] = mx + logf(sum);
  }
}

__global__ void causalProbsKernel(float *s, const float *lse, int64_t R,
                                  int64_t r0, int64_t r1, int64_t pitch) {
  int64_t n = R * r1;
  for (int64_t e = firstIndex(); e < n; e += gridStride()) {
    int64_t i = e / r1, j = e % r1;
    float *at = s + i * pitch + j;
    *at = j <= r0 + i ? expf(*at - lse[i]) : 0.0f;
  }
}

__global__ void causalSoftmaxBackwardKernel(const float *p, float *dp,
                                            int64_t R, int64_t r0, int64_t r1,
                                            int64_t pitch) {
  for (int64_t i = firstRow(); i < R; i += rowStride()) {
    int64_t t = r0 + i;
    const float *pr = p + i * pitch;
    float *dr = dp + i * pitch;
    float part = 0;
    for (int64_t j = lane(); j <= t; j += kWarp)
      part += pr[j] * dr[j];
    float rowDot = warpSum(part);
    for (int64_t j = lane(); j < r1; j += kWarp)
      dr[j] = j <= t ? pr[j] * (dr[j] - rowDot) : 0.0f;
  }
}

__global__ void embeddingRowsKernel(const int32_t *rowToken, int64_t rows,
                                    const float *table, int64_t V, int64_t D,
                                    float *out) {
  int64_t n = rows * D;
  for (int64_t e = firstIndex(); e < n; e += gridStride()) {
    int64_t tok = rowToken[e / D];
    out[e] = (tok >= 0 && tok < V) ? table[tok * D + e % D] : 0.0f;
  }
}

__global__ void embeddingBackwardKernel(const int32_t *tokens,
                                        const int32_t *offsets,
                                        const int32_t *rowsOf, int64_t nTokens,
                                        const float *src, int64_t D,
                                        float *table) {
  int64_t n = nTokens * D;
  for (int64_t e = firstIndex(); e < n; e += gridStride()) {
    int64_t u = e / D, j = e % D;
    float *dst = table + int64_t(tokens[u]) * D + j;
    float acc = *dst;
    for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k)
      acc += src[int64_t(rowsOf[k]) * D + j];
    *dst = acc;
  }
}

__global__ void rowMaxAndTargetKernel(const float *logits,
                                      const int32_t *target, int64_t N,
                                      int64_t V, float *mx, float *tgt) {
  for (int64_t n = firstRow(); n < N; n += rowStride()) {
    const float *row = logits + n * V;
    float m = -FLT_MAX;
    for (int64_t j = lane(); j < V; j += kWarp)
      m = fmaxf(m, row[j]);
    m = warpMax(m);
    if (lane() == 0) {
      mx[n] = m;
      int64_t t = target[n];
      tgt[n] = (t >= 0 && t < V) ? row[t] : 0.0f;
    }
  }
}

__global__ void expAndSumKernel(float *logits, const float *mx, int64_t N,
                                int64_t V, float *sums) {
  for (int64_t n = firstRow(); n < N; n += rowStride()) {
    float *row = logits + n * V;
    float m = mx[n], sum = 0;
    for (int64_t j = lane(); j < V; j += kWarp) {
      float e = expf(row[j] - m);
      row[j] = e;
      sum += e;
    }
    sum = warpSum(sum);
    if (lane() == 0)
      sums[n] = sum;
  }
}

__global__ void normalizeRowsKernel(float *logits, const float *sums, int64_t N,
                                    int64_t V) {
  int64_t n = N * V;
  for (int64_t e = firstIndex(); e < n; e += gridStride())
    logits[e] *= 1.0f / sums[e / V];
}

__global__ void crossEntropyGradKernel(float *probs, const int32_t *target,
                                       int64_t N, int64_t V, float c) {
  int64_t n = N * V;
  for (int64_t e = firstIndex(); e < n; e += gridStride()) {
    float v = probs[e] * c;
    if (target[e / V] == e % V)
      v -= c;
    probs[e] = v;
  }
}

} // namespace

cudaError_t roundBf16Rows(const float *in, float *out, int64_t rows,
                          int64_t pitch, int64_t width, cudaStream_t stream) {
  if (rows * width == 0)
    return cudaSuccess;
  roundBf16RowsKernel<<<blocksFor(rows * width), kBlock, 0, stream>>>(
      in, out, rows, pitch, width);
  return cudaGetLastError();
}

cudaError_t rmsNorm(const float *x, const float *w, float *y, float *rstd,
                    int64_t rows, int64_t D, float eps, cudaStream_t stream) {
  if (rows == 0)
    return cudaSuccess;
  rmsNormKernel<<<rowBlocksFor(rows), kBlock, 0, stream>>>(x, w, y, rstd, rows,
                                                           D, eps);
  return cudaGetLastError();
}

cudaError_t rmsNormBackward(const float *dy, const float *x, const float *rstd,
                            const float *w, float *dw, float *dx, int64_t rows,
                            int64_t D, bool add, cudaStream_t stream) {
  if (rows == 0)
    return cudaSuccess;
  // The weight's gradient first: dx may alias nothing it reads, but the
  // two kernels are independent and the order keeps the CPU's.
  rmsNormWeightGradKernel<<<blocksFor(D), kBlock, 0, stream>>>(dy, x, rstd, dw,
                                                               rows, D);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return e;
  rmsNormInputGradKernel<<<rowBlocksFor(rows), kBlock, 0, stream>>>(
      dy, x, rstd, w, dx, rows, D, add);
  return cudaGetLastError();
}

cudaError_t rope(float *x, const float *cos, const float *sin, int64_t rows,
                 int64_t T, int64_t heads, int64_t hd, bool inverse,
                 cudaStream_t stream) {
  int64_t n = rows * heads * (hd / 2);
  if (n == 0)
    return cudaSuccess;
  ropeKernel<<<blocksFor(n), kBlock, 0, stream>>>(x, cos, sin, rows, T, heads,
                                                  hd, inverse ? -1.0f : 1.0f);
  return cudaGetLastError();
}

cudaError_t add(const float *x, const float *y, float *out, int64_t n,
                cudaStream_t stream) {
  if (n == 0)
    return cudaSuccess;
  addKernel<<<blocksFor(n), kBlock, 0, stream>>>(x, y, out, n);
  return cudaGetLastError();
}

cudaError_t swiglu(const float *a, const float *g, float *u, int64_t n,
                   cudaStream_t stream) {
  if (n == 0)
    return cudaSuccess;
  swigluKernel<<<blocksFor(n), kBlock, 0, stream>>>(a, g, u, n);
  return cudaGetLastError();
}

cudaError_t swigluBackward(const float *du, float *a, float *g, int64_t n,
                           cudaStream_t stream) {
  if (n == 0)
    return cudaSuccess;
  swigluBackwardKernel<<<blocksFor(n), kBlock, 0, stream>>>(du, a, g, n);
  return cudaGetLastError();
}

cudaError_t causalSoftmax(float *s, float *lse, int64_t R, int64_t r0,
                          int64_t r1, int64_t pitch, cudaStream_t stream) {
  if (R == 0)
    return cudaSuccess;
  causalSoftmaxKernel<<<rowBlocksFor(R), kBlock, 0, stream>>>(s, lse, R, r0, r1,
                                                              pitch);
  return cudaGetLastError();
}

cudaError_t causalProbs(float *s, const float *lse, int64_t R, int64_t r0,
                        int64_t r1, int64_t pitch, cudaStream_t stream) {
  if (R * r1 == 0)
    return cudaSuccess;
  causalProbsKernel<<<blocksFor(R * r1), kBlock, 0, stream>>>(s, lse, R, r0, r1,
                                                              pitch);
  return cudaGetLastError();
}

cudaError_t causalSoftmaxBackward(const float *p, float *dp, int64_t R,
                                  int64_t r0, int64_t r1, int64_t pitch,
                                  cudaStream_t stream) {
  if (R == 0)
    return cudaSuccess;
  causalSoftmaxBackwardKernel<<<rowBlocksFor(R), kBlock, 0, stream>>>(
      p, dp, R, r0, r1, pitch);
  return cudaGetLastError();
}

cudaError_t embeddingRows(const int32_t *rowToken, int64_t rows,
                          const float *table, int64_t V, int64_t D, float *out,
                          cudaStream_t stream) {
  if (rows * D == 0)
    return cudaSuccess;
  embeddingRowsKernel<<<blocksFor(rows * D), kBlock, 0, stream>>>(
      rowToken, rows, table, V, D, out);
  return cudaGetLastError();
}

cudaError_t embeddingBackward(const int32_t *tokens, const int32_t *offsets,
                              const int32_t *rowsOf, int64_t nTokens,
                              const float *src, int64_t D, float *table,
                              cudaStream_t stream) {
  if (nTokens * D == 0)
    return cudaSuccess;
  embeddingBackwardKernel<<<blocksFor(nTokens * D), kBlock, 0, stream>>>(
      tokens, offsets, rowsOf, nTokens, src, D, table);
  return cudaGetLastError();
}

cudaError_t rowMaxAndTarget(const float *logits, const int32_t *target,
                            int64_t N, int64_t V, float *mx, float *tgt,
                            cudaStream_t stream) {
  if (N == 0)
    return cudaSuccess;
  rowMaxAndTargetKernel<<<rowBlocksFor(N), kBlock, 0, stream>>>(logits, target,
                                                                N, V, mx, tgt);
  return cudaGetLastError();
}

cudaError_t expAndSum(float *logits, const float *mx, int64_t N, int64_t V,
                      float *sums, cudaStream_t stream) {
  if (N == 0)
    return cudaSuccess;
  expAndSumKernel<<<rowBlocksFor(N), kBlock, 0, stream>>>(logits, mx, N, V,
                                                          sums);
  return cudaGetLastError();
}

cudaError_t normalizeRows(float *logits, const float *sums, int64_t N,
                          int64_t V, cudaStream_t stream) {
  if (N * V == 0)
    return cudaSuccess;
  normalizeRowsKernel<<<blocksFor(N * V), kBlock, 0, stream>>>(logits, sums, N,
                                                               V);
  return cudaGetLastError();
}

cudaError_t crossEntropyGrad(float *probs, const int32_t *target, int64_t N,
                             int64_t V, float c, cudaStream_t stream) {
  if (N * V == 0)
    return cudaSuccess;
  crossEntropyGradKernel<<<blocksFor(N * V), kBlock, 0, stream>>>(probs, target,
                                                                  N, V, c);
  return cudaGetLastError();
}

} // namespace meshplan::trainer::cuda
