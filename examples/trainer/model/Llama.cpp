//===- Llama.cpp - One rank's share of a Llama 3 forward and backward -----===//
//
// Layout conventions used throughout (see Llama.h for the TP plan):
//   B batch, T seqLen, P TP size, S = T / P, D dim, hd headDim,
//   H / Hkv local query / kv heads, F localFfn, V vocabLocal,
//   N = B * T tokens of the whole microbatch, Ns = B * S tokens of the shard.
// "Full" buffers hold [B, T, width] in sequence order (what attention needs);
// collectives move data in "block" order [P, B, S, width] (rank p's block is
// its sequence shard), so gathers and scatters permute between the two.
//
// Every matmul is one cblas_sgemm (row-major) through Impl::gemm, which
// counts flops and time. With bf16Matmul, every sgemm input is rounded to
// bf16 first; buffers that feed nothing but matmuls are rounded in place
// once (rounding is idempotent), the weights into a scratch copy per use.
//
//===----------------------------------------------------------------------===//
#include "model/Llama.h"

#include "meshplan/Runtime/Kernels.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace meshplan::trainer {

TpGroup::~TpGroup() = default;

Result<void> SoloTpGroup::allGather(const float *in, float *out,
                                    int64_t count) {
  if (in != out)
    std::memmove(out, in, sizeof(float) * static_cast<size_t>(count));
  return {};
}

Result<void> SoloTpGroup::reduceScatter(const float *in, float *out,
                                        int64_t count) {
  if (in != out)
    std::memmove(out, in, sizeof(float) * static_cast<size_t>(count));
  return {};
}

TpShard TpShard::whole(const LlamaConfig &config) {
  TpShard s;
  s.localHeads = config.nHeads;
  s.localKvHeads = config.nKvHeads;
  s.localFfn = config.ffnDim;
  s.vocabLocal = config.vocab;
  return s;
}

namespace {

std::string str(int64_t v) { return std::to_string(v); }

Result<void> fail(const std::string &message) { return makeError(message); }

} // namespace

Result<void> checkModel(const LlamaConfig &c, const TpShard &s,
                        const MicrobatchShape &shape, int64_t tpSize) {
  struct Named {
    const char *name;
    int64_t value;
  };
  for (Named n : {Named{"dim", c.dim}, Named{"nLayers", c.nLayers},
                  Named{"nHeads", c.nHeads}, Named{"nKvHeads", c.nKvHeads},
                  Named{"ffnDim", c.ffnDim}, Named{"vocab", c.vocab},
                  Named{"batch", shape.batch}, Named{"seqLen", shape.seqLen},
                  Named{"TP size", tpSize}})
    if (n.value <= 0)
      return fail(std::string(n.name) + " must be positive (got " +
                  str(n.value) + ")");
  if (!(c.normEps >= 0.0f) || !std::isfinite(c.normEps))
    return fail("normEps must be finite and non-negative");
  if (!(c.ropeTheta > 0.0f) || !std::isfinite(c.ropeTheta))
    return fail("ropeTheta must be finite and positive");
  if (c.dim % c.nHeads != 0)
    return fail("dim (" + str(c.dim) + ") must be divisible by nHeads (" +
                str(c.nHeads) + ")");
  if (c.headDim() % 2 != 0)
    return fail("head dimension dim / nHeads (" + str(c.headDim()) +
                ") must be even: RoPE rotates pairs");
  if (c.nHeads % c.nKvHeads != 0)
    return fail("nHeads (" + str(c.nHeads) +
                ") must be divisible by nKvHeads (" + str(c.nKvHeads) + ")");
  if (shape.seqLen % tpSize != 0)
    return fail("seqLen (" + str(shape.seqLen) +
                ") must be divisible by the TP size (" + str(tpSize) +
                "): sequence parallelism splits every sequence evenly");
  // sgemm takes int sizes: the token count, dim, ffnDim and vocab (and the
  // head widths, at most dim) are its largest.
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (shape.batch > kIntMax / shape.seqLen)
    return fail("batch * seqLen (" + str(shape.batch) + " * " +
                str(shape.seqLen) + ") exceeds sgemm's int range");
  if (c.dim > kIntMax || c.ffnDim > kIntMax || c.vocab > kIntMax)
    return fail("dim, ffnDim and vocab must fit sgemm's int range");

  auto range = [](const char *what, int64_t offset, int64_t count,
                  int64_t total) -> Result<void> {
    if (count <= 0 || offset < 0 || offset + count > total)
      return fail(std::string("shard: ") + what + " [" + str(offset) + ", " +
                  str(offset + count) + ") must be a non-empty range within " +
                  "[0, " + str(total) + ")");
    return {};
  };
  MESHPLAN_TRY(range("query heads", s.headOffset, s.localHeads, c.nHeads));
  MESHPLAN_TRY(range("kv heads", s.kvHeadOffset, s.localKvHeads, c.nKvHeads));
  MESHPLAN_TRY(range("ffn rows", 0, s.localFfn, c.ffnDim));
  MESHPLAN_TRY(range("vocabulary rows", s.vocabOffset, s.vocabLocal, c.vocab));
  int64_t group = c.nHeads / c.nKvHeads;
  if (s.headOffset != s.kvHeadOffset * group ||
      s.localHeads != s.localKvHeads * group)
    return fail(
        "shard: query heads [" + str(s.headOffset) + ", " +
        str(s.headOffset + s.localHeads) +
        ") must be exactly those using kv heads [" + str(s.kvHeadOffset) +
        ", " + str(s.kvHeadOffset + s.localKvHeads) + "), i.e. [" +
        str(s.kvHeadOffset * group) + ", " +
        str((s.kvHeadOffset + s.localKvHeads) * group) + "): GQA groups of " +
        str(group) + " query heads cannot be split");
  if (tpSize == 1 && (s.localHeads != c.nHeads || s.localFfn != c.ffnDim ||
                      s.vocabLocal != c.vocab))
    return fail("shard: with a TP size of 1 the shard must be the whole "
                "model (TpShard::whole)");
  return {};
}

//===----------------------------------------------------------------------===//
// Microbatch::Impl
//===----------------------------------------------------------------------===//

namespace {

namespace kernels = meshplan::runtime::kernels;

/// Rows of the causal attention processed per sgemm: row block [r0, r1)
/// only needs keys [0, r1), which skips about half the work of a full T x T
/// product while keeping each sgemm large enough to run near peak.
constexpr int64_t kAttentionRowBlock = 128;

/// sum x[i] * y[i] with eight partial sums so the loop vectorizes without
/// -ffast-math.
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

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

} // namespace

struct Microbatch::Impl {
  Impl(const LlamaConfig &config, const TpShard &shard,
       const MicrobatchShape &shape, const ModelOptions &options, TpGroup &tp)
      : cfg(config), shard(shard), shape(shape), opt(options), tp(tp) {}

  LlamaConfig cfg;
  TpShard shard;
  MicrobatchShape shape;
  ModelOptions opt;
  TpGroup &tp;

  // Sizes (set by allocate()).
  int64_t P = 1, B = 0, T = 0, S = 0, D = 0, hd = 0, H = 0, Hkv = 0, F = 0,
          V = 0, N = 0, Ns = 0, group = 1, qd = 0, kd = 0, L = 0;
  bool allocated = false;

  /// What backward needs from one block's forward.
  struct Layer {
    std::vector<float> xIn;   ///< [Ns, D] block input (residual)
    std::vector<float> rstd1; ///< [Ns]
    std::vector<float> n1;    ///< [N, D] gathered attention_norm output
    std::vector<float> q;     ///< [N, qd] after RoPE
    std::vector<float> k;     ///< [N, kd] after RoPE
    std::vector<float> v;     ///< [N, kd]
    std::vector<float> lse;   ///< [B, H, T] softmax log-sum-exp per row
    std::vector<float> o;     ///< [N, qd] attention output (wo's input)
    std::vector<float> hMid;  ///< [Ns, D] after the attention residual
    std::vector<float> rstd2; ///< [Ns]
    std::vector<float> n2;    ///< [N, D] gathered ffn_norm output
    std::vector<float> a, g;  ///< [N, F] w1 x and w3 x
  };
  std::vector<Layer> layers;

  std::vector<int32_t> tokens, targets;
  std::vector<float> ropeCos, ropeSin; ///< [T, hd / 2]

  /// The residual stream's shard [Ns, D] in forward, its gradient in
  /// backward.
  std::vector<float> h;
  std::vector<float> finalIn, rstdF; ///< final norm's input [Ns, D], [Ns]
  std::vector<float> xf;             ///< [N, D] gathered final norm output
  std::vector<float> probs;          ///< [N, V] local softmax, then dlogits
  std::vector<float> ceStats; ///< [3 N]: max, then sumexp and target logit

  // Scratch reused by every segment.
  std::vector<float> staging;       ///< [N, D] collectives' block order
  std::vector<float> full;          ///< [N, D] full-sequence temporary
  std::vector<float> shardTmp;      ///< [Ns, D]
  std::vector<float> ffnTmp;        ///< [N, F]
  std::vector<float> dO, dq;        ///< [N, qd]
  std::vector<float> dk, dv;        ///< [N, kd]
  std::vector<float> sc1, sc2, sc3; ///< [rowBlock, T] attention scores
  std::vector<float> weightBf16;    ///< rounded copy of one weight
  std::vector<uint16_t> bf16Bits;

  // Segment order: 0 forwardEmbedding, 1 + l forwardBlock(l), L + 1
  // forwardFinalNorm, L + 2 forwardOutput, L + 3 backwardOutput, L + 4
  // backwardFinalNorm, L + 5 + (L - 1 - l) backwardBlock(l), 2 L + 5
  // backwardEmbedding, 2 L + 6 done.
  static constexpr int64_t kNoData = -1, kFailed = -2;
  int64_t step = kNoData;

  double flops = 0, seconds = 0;

  //===--------------------------------------------------------------------===//
  // Order checking
  //===--------------------------------------------------------------------===//

  std::string stepName(int64_t st) const {
    if (st == 0)
      return "forwardEmbedding";
    if (st >= 1 && st <= L)
      return "forwardBlock(" + str(st - 1) + ")";
    if (st == L + 1)
      return "forwardFinalNorm";
    if (st == L + 2)
      return "forwardOutput";
    if (st == L + 3)
      return "backwardOutput";
    if (st == L + 4)
      return "backwardFinalNorm";
    if (st >= L + 5 && st <= 2 * L + 4)
      return "backwardBlock(" + str(2 * L + 4 - st) + ")";
    if (st == 2 * L + 5)
      return "backwardEmbedding";
    return "setData or forwardEmbedding (the microbatch is done)";
  }

  Result<void> expect(int64_t st) const {
    if (step == st)
      return {};
    std::string name = stepName(st);
    if (step == kNoData)
      return fail("Microbatch: " + name + " called before setData");
    if (step == kFailed)
      return fail("Microbatch: " + name +
                  " called after an earlier call failed; setData restarts "
                  "the microbatch");
    return fail("Microbatch: " + name + " called out of order; expected " +
                stepName(step));
  }

  /// Runs a segment's body once the order allows it, then advances (or
  /// marks the microbatch failed, as its activations are now unusable).
  template <typename Body> Result<void> segment(int64_t st, Body &&body) {
    MESHPLAN_TRY(expect(st));
    Result<void> r = body();
    step = r.ok() ? st + 1 : kFailed;
    return r;
  }

  //===--------------------------------------------------------------------===//
  // Setup
  //===--------------------------------------------------------------------===//

  void allocate() {
    P = tp.size();
    B = shape.batch;
    T = shape.seqLen;
    S = T / P;
    D = cfg.dim;
    hd = cfg.headDim();
    H = shard.localHeads;
    Hkv = shard.localKvHeads;
    F = shard.localFfn;
    V = shard.vocabLocal;
    N = B * T;
    Ns = B * S;
    group = cfg.nHeads / cfg.nKvHeads;
    qd = H * hd;
    kd = Hkv * hd;
    L = cfg.nLayers;

    auto sz = [](int64_t n) { return static_cast<size_t>(n); };
    layers.resize(sz(L));
    for (Layer &l : layers) {
      l.xIn.resize(sz(Ns * D));
      l.rstd1.resize(sz(Ns));
      l.n1.resize(sz(N * D));
      l.q.resize(sz(N * qd));
      l.k.resize(sz(N * kd));
      l.v.resize(sz(N * kd));
      l.lse.resize(sz(B * H * T));
      l.o.resize(sz(N * qd));
      l.hMid.resize(sz(Ns * D));
      l.rstd2.resize(sz(Ns));
      l.n2.resize(sz(N * D));
      l.a.resize(sz(N * F));
      l.g.resize(sz(N * F));
    }
    h.resize(sz(Ns * D));
    finalIn.resize(sz(Ns * D));
    rstdF.resize(sz(Ns));
    xf.resize(sz(N * D));
    probs.resize(sz(N * V));
    ceStats.resize(sz(3 * N));
    if (P > 1 && B > 1)
      staging.resize(sz(N * D));
    full.resize(sz(N * D));
    shardTmp.resize(sz(Ns * D));
    ffnTmp.resize(sz(N * F));
    dO.resize(sz(N * qd));
    dq.resize(sz(N * qd));
    dk.resize(sz(N * kd));
    dv.resize(sz(N * kd));
    int64_t rows = std::min(kAttentionRowBlock, T);
    sc1.resize(sz(rows * T));
    sc2.resize(sz(rows * T));
    if (opt.bf16Matmul) {
      sc3.resize(sz(rows * T));
      int64_t maxWeight = std::max({qd * D, kd * D, F * D, V * D});
      weightBf16.resize(sz(maxWeight));
      int64_t maxBuffer =
          std::max({maxWeight, N * D, N * F, N * qd, N * V, rows * T});
      bf16Bits.resize(sz(maxBuffer));
    }

    // torchtitan's precompute_freqs_cis, in its float32 steps: freq_i =
    // 1 / theta^(2i / hd), angle = float(t) * freq_i, then cos and sin.
    int64_t half = hd / 2;
    ropeCos.resize(sz(T * half));
    ropeSin.resize(sz(T * half));
    for (int64_t i = 0; i < half; ++i) {
      float exponent = static_cast<float>(2 * i) / static_cast<float>(hd);
      float freq = 1.0f / std::pow(cfg.ropeTheta, exponent);
      for (int64_t t = 0; t < T; ++t) {
        float angle = static_cast<float>(t) * freq;
        ropeCos[sz(t * half + i)] = std::cos(angle);
        ropeSin[sz(t * half + i)] = std::sin(angle);
      }
    }
    allocated = true;
  }

  //===--------------------------------------------------------------------===//
  // Matmuls and bf16 rounding
  //===--------------------------------------------------------------------===//

  /// C = alpha op(A) op(B) + beta C, row-major; op(A) is M x K, op(B) K x N.
  void gemm(bool transA, bool transB, int64_t M, int64_t Nn, int64_t K,
            float alpha, const float *A, int64_t lda, const float *Bm,
            int64_t ldb, float beta, float *C, int64_t ldc) {
    auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
                static_cast<blasint>(Nn), static_cast<blasint>(K), alpha, A,
                static_cast<blasint>(lda), Bm, static_cast<blasint>(ldb), beta,
                C, static_cast<blasint>(ldc));
    seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    flops += 2.0 * static_cast<double>(M) * static_cast<double>(Nn) *
             static_cast<double>(K);
  }

  /// Rounds a buffer that only feeds matmuls to bf16 in place.
  void roundInPlace(float *data, int64_t n) {
    if (!opt.bf16Matmul)
      return;
    roundInto(data, data, n);
  }

  void roundInto(const float *in, float *out, int64_t n) {
    // One thread: these casts are small next to the matmuls they feed (and
    // attention's are row by row), not worth starting threads for.
    auto count = static_cast<size_t>(n);
    std::span<uint16_t> bits(bf16Bits.data(), count);
    kernels::Threading one = kernels::Threading::singleThreaded();
    kernels::castToBf16(std::span<const float>(in, count), bits, one);
    kernels::castBf16ToFloat(bits, std::span<float>(out, count), one);
  }

  /// The matmul input for weight `w` of n elements: itself, or its bf16
  /// rounding in a scratch copy (valid until the next call).
  const float *weight(const float *w, int64_t n) {
    if (!opt.bf16Matmul)
      return w;
    roundInto(w, weightBf16.data(), n);
    return weightBf16.data();
  }

  //===--------------------------------------------------------------------===//
  // Sequence-parallel collectives
  //===--------------------------------------------------------------------===//

  /// [B, S, D] shard -> [B, T, D] full sequences on every rank.
  Result<void> gatherSeq(const float *shardIn, float *fullOut) {
    if (P == 1 || B == 1) // block order is sequence order
      return tp.allGather(shardIn, fullOut, Ns * D);
    MESHPLAN_TRY(tp.allGather(shardIn, staging.data(), Ns * D));
    for (int64_t p = 0; p < P; ++p)
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(fullOut + (b * T + p * S) * D,
                    staging.data() + (p * B + b) * S * D,
                    sizeof(float) * static_cast<size_t>(S * D));
    return {};
  }

  /// [B, T, D] partial sums -> this rank's [B, S, D] shard of their sum.
  Result<void> scatterSeq(const float *fullIn, float *shardOut) {
    if (P == 1 || B == 1)
      return tp.reduceScatter(fullIn, shardOut, Ns * D);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(staging.data() + (p * B + b) * S * D,
                    fullIn + (b * T + p * S) * D,
                    sizeof(float) * static_cast<size_t>(S * D));
    return tp.reduceScatter(staging.data(), shardOut, Ns * D);
  }

  //===--------------------------------------------------------------------===//
  // Elementwise pieces
  //===--------------------------------------------------------------------===//

  /// y = x * rsqrt(mean(x^2) + eps) * w per row of [Ns, D].
  void rmsNorm(const float *x, const float *w, float *y, float *rstd) {
    for (int64_t i = 0; i < Ns; ++i) {
      const float *xr = x + i * D;
      float *yr = y + i * D;
      float ms = dot(xr, xr, D) / static_cast<float>(D);
      float r = 1.0f / std::sqrt(ms + cfg.normEps);
      rstd[i] = r;
      for (int64_t j = 0; j < D; ++j)
        yr[j] = (xr[j] * r) * w[j];
    }
  }

  /// With xhat = x r: dw += sum dy xhat; dx (+)= r (dxhat - xhat
  /// mean(dxhat xhat)) where dxhat = dy w.
  void rmsNormBackward(const float *dy, const float *x, const float *rstd,
                       const float *w, float *dw, float *dx, bool add) {
    std::vector<float> &dxhat = rowTmp;
    dxhat.resize(static_cast<size_t>(D));
    for (int64_t i = 0; i < Ns; ++i) {
      const float *dyr = dy + i * D, *xr = x + i * D;
      float *dxr = dx + i * D;
      float r = rstd[i];
      for (int64_t j = 0; j < D; ++j) {
        dw[j] += dyr[j] * (xr[j] * r);
        dxhat[j] = dyr[j] * w[j];
      }
      float c = dot(dxhat.data(), xr, D) * r / static_cast<float>(D);
      if (add)
        for (int64_t j = 0; j < D; ++j)
          dxr[j] += r * (dxhat[j] - (xr[j] * r) * c);
      else
        for (int64_t j = 0; j < D; ++j)
          dxr[j] = r * (dxhat[j] - (xr[j] * r) * c);
    }
  }
  std::vector<float> rowTmp;

  /// Rotates the pairs (x[2i], x[2i+1]) of every head of [N, heads * hd]
  /// by +angle (forward) or -angle (backward: the transpose).
  void rope(float *x, int64_t heads, bool inverse) {
    int64_t half = hd / 2, width = heads * hd;
    float sign = inverse ? -1.0f : 1.0f;
    for (int64_t n = 0; n < N; ++n) {
      int64_t t = n % T;
      const float *cs = ropeCos.data() + t * half;
      const float *sn = ropeSin.data() + t * half;
      float *row = x + n * width;
      for (int64_t hh = 0; hh < heads; ++hh) {
        float *xv = row + hh * hd;
        for (int64_t i = 0; i < half; ++i) {
          float c = cs[i], s = sign * sn[i];
          float x0 = xv[2 * i], x1 = xv[2 * i + 1];
          xv[2 * i] = x0 * c - x1 * s;
          xv[2 * i + 1] = x0 * s + x1 * c;
        }
      }
    }
  }

  //===--------------------------------------------------------------------===//
  // Attention core (per sequence and local head, causal row blocks)
  //===--------------------------------------------------------------------===//

  void attentionForward(Layer &l) {
    float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < H; ++hh) {
        int64_t kv = hh / group; // local: GQA groups are whole on a rank
        const float *qh = l.q.data() + b * T * qd + hh * hd;
        const float *kh = l.k.data() + b * T * kd + kv * hd;
        const float *vh = l.v.data() + b * T * kd + kv * hd;
        float *oh = l.o.data() + b * T * qd + hh * hd;
        float *lse = l.lse.data() + (b * H + hh) * T;
        for (int64_t r0 = 0; r0 < T; r0 += kAttentionRowBlock) {
          int64_t r1 = std::min(T, r0 + kAttentionRowBlock), R = r1 - r0;
          float *s = sc1.data();
          gemm(false, true, R, r1, hd, scale, qh + r0 * qd, qd, kh, kd, 0.0f, s,
               T);
          for (int64_t i = 0; i < R; ++i) {
            int64_t t = r0 + i;
            float *row = s + i * T;
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
            lse[t] = mx + std::log(sum);
          }
          if (opt.bf16Matmul)
            for (int64_t i = 0; i < R; ++i)
              roundInPlace(s + i * T, r1);
          gemm(false, false, R, hd, r1, 1.0f, s, T, vh, kd, 0.0f, oh + r0 * qd,
               qd);
        }
      }
  }

  /// dO (in dO) -> dq (written), dk and dv (accumulated from zero).
  void attentionBackward(Layer &l) {
    float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::fill(dk.begin(), dk.end(), 0.0f);
    std::fill(dv.begin(), dv.end(), 0.0f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < H; ++hh) {
        int64_t kv = hh / group;
        const float *qh = l.q.data() + b * T * qd + hh * hd;
        const float *kh = l.k.data() + b * T * kd + kv * hd;
        const float *vh = l.v.data() + b * T * kd + kv * hd;
        const float *doh = dO.data() + b * T * qd + hh * hd;
        float *dqh = dq.data() + b * T * qd + hh * hd;
        float *dkh = dk.data() + b * T * kd + kv * hd;
        float *dvh = dv.data() + b * T * kd + kv * hd;
        const float *lse = l.lse.data() + (b * H + hh) * T;
        for (int64_t r0 = 0; r0 < T; r0 += kAttentionRowBlock) {
          int64_t r1 = std::min(T, r0 + kAttentionRowBlock), R = r1 - r0;
          // Recompute the probabilities from the saved log-sum-exp rather
          // than keep B * H * T^2 of them per layer.
          float *p = sc1.data(), *dp = sc2.data();
          gemm(false, true, R, r1, hd, scale, qh + r0 * qd, qd, kh, kd, 0.0f, p,
               T);
          for (int64_t i = 0; i < R; ++i) {
            int64_t t = r0 + i;
            float *row = p + i * T;
            for (int64_t j = 0; j <= t; ++j)
              row[j] = std::exp(row[j] - lse[t]);
            for (int64_t j = t + 1; j < r1; ++j)
              row[j] = 0.0f;
          }
          gemm(false, true, R, r1, hd, 1.0f, doh + r0 * qd, qd, vh, kd, 0.0f,
               dp, T);
          const float *pIn = p;
          if (opt.bf16Matmul) {
            for (int64_t i = 0; i < R; ++i)
              roundInto(p + i * T, sc3.data() + i * T, r1);
            pIn = sc3.data();
          }
          gemm(true, false, r1, hd, R, 1.0f, pIn, T, doh + r0 * qd, qd, 1.0f,
               dvh, kd);
          // Softmax backward: dS = P (dP - sum_j P dP).
          for (int64_t i = 0; i < R; ++i) {
            int64_t t = r0 + i;
            float *pr = p + i * T, *dr = dp + i * T;
            float rowDot = dot(pr, dr, t + 1);
            for (int64_t j = 0; j <= t; ++j)
              dr[j] = pr[j] * (dr[j] - rowDot);
            for (int64_t j = t + 1; j < r1; ++j)
              dr[j] = 0.0f;
            roundInPlace(dr, t + 1);
          }
          gemm(false, false, R, hd, r1, scale, dp, T, kh, kd, 0.0f,
               dqh + r0 * qd, qd);
          gemm(true, false, r1, hd, R, scale, dp, T, qh + r0 * qd, qd, 1.0f,
               dkh, kd);
        }
      }
  }

  //===--------------------------------------------------------------------===//
  // Segments
  //===--------------------------------------------------------------------===//

  Result<void> forwardEmbedding(const float *emb) {
    // Each rank writes its looked-up rows (zeros for tokens of other ranks'
    // vocabulary) directly in block order; the reduce-scatter sums the ranks'
    // contributions and hands each its sequence shard.
    float *blocks = (P == 1 || B == 1) ? full.data() : staging.data();
    for (int64_t p = 0; p < P; ++p)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) {
          int64_t tok = tokens[static_cast<size_t>(b * T + p * S + s)] -
                        shard.vocabOffset;
          float *dst = blocks + ((p * B + b) * S + s) * D;
          if (tok >= 0 && tok < V)
            std::memcpy(dst, emb + tok * D, sizeof(float) * D);
          else
            std::memset(dst, 0, sizeof(float) * D);
        }
    return tp.reduceScatter(blocks, h.data(), Ns * D);
  }

  Result<void> forwardBlock(int64_t li, const BlockWeights &w) {
    Layer &l = layers[static_cast<size_t>(li)];
    l.xIn = h;
    // Attention.
    rmsNorm(l.xIn.data(), w.attentionNorm, shardTmp.data(), l.rstd1.data());
    MESHPLAN_TRY(gatherSeq(shardTmp.data(), l.n1.data()));
    roundInPlace(l.n1.data(), N * D);
    gemm(false, true, N, qd, D, 1.0f, l.n1.data(), D, weight(w.wq, qd * D), D,
         0.0f, l.q.data(), qd);
    gemm(false, true, N, kd, D, 1.0f, l.n1.data(), D, weight(w.wk, kd * D), D,
         0.0f, l.k.data(), kd);
    gemm(false, true, N, kd, D, 1.0f, l.n1.data(), D, weight(w.wv, kd * D), D,
         0.0f, l.v.data(), kd);
    rope(l.q.data(), H, false);
    rope(l.k.data(), Hkv, false);
    roundInPlace(l.q.data(), N * qd);
    roundInPlace(l.k.data(), N * kd);
    roundInPlace(l.v.data(), N * kd);
    attentionForward(l);
    roundInPlace(l.o.data(), N * qd);
    gemm(false, true, N, D, qd, 1.0f, l.o.data(), qd, weight(w.wo, D * qd), qd,
         0.0f, full.data(), D);
    MESHPLAN_TRY(scatterSeq(full.data(), shardTmp.data()));
    for (int64_t i = 0; i < Ns * D; ++i)
      l.hMid[i] = l.xIn[i] + shardTmp[i];
    // Feed-forward.
    rmsNorm(l.hMid.data(), w.ffnNorm, shardTmp.data(), l.rstd2.data());
    MESHPLAN_TRY(gatherSeq(shardTmp.data(), l.n2.data()));
    roundInPlace(l.n2.data(), N * D);
    gemm(false, true, N, F, D, 1.0f, l.n2.data(), D, weight(w.w1, F * D), D,
         0.0f, l.a.data(), F);
    gemm(false, true, N, F, D, 1.0f, l.n2.data(), D, weight(w.w3, F * D), D,
         0.0f, l.g.data(), F);
    swiglu(l);
    gemm(false, true, N, D, F, 1.0f, ffnTmp.data(), F, weight(w.w2, D * F), F,
         0.0f, full.data(), D);
    MESHPLAN_TRY(scatterSeq(full.data(), shardTmp.data()));
    for (int64_t i = 0; i < Ns * D; ++i)
      h[i] = l.hMid[i] + shardTmp[i];
    return {};
  }

  /// ffnTmp = silu(a) * g, rounded when it feeds a bf16 matmul.
  void swiglu(const Layer &l) {
    const float *a = l.a.data(), *g = l.g.data();
    float *u = ffnTmp.data();
    for (int64_t i = 0; i < N * F; ++i)
      u[i] = a[i] * sigmoid(a[i]) * g[i];
    roundInPlace(u, N * F);
  }

  Result<void> forwardFinalNorm(const float *norm) {
    finalIn = h;
    rmsNorm(finalIn.data(), norm, h.data(), rstdF.data());
    return {};
  }

  Result<float> forwardOutput(const float *output) {
    MESHPLAN_TRY(gatherSeq(h.data(), xf.data()));
    roundInPlace(xf.data(), N * D);
    float *logits = probs.data();
    gemm(false, true, N, V, D, 1.0f, xf.data(), D, weight(output, V * D), D,
         0.0f, logits, V);
    // Vocabulary-parallel cross-entropy: the global max per token, then the
    // global sum of exponentials and the target's logit (0 on ranks that do
    // not own it), summed in one all-reduce.
    float *mx = ceStats.data(), *sums = mx + N, *tgtLogit = mx + 2 * N;
    for (int64_t n = 0; n < N; ++n) {
      const float *row = logits + n * V;
      float m = row[0];
      for (int64_t j = 1; j < V; ++j)
        m = std::max(m, row[j]);
      mx[n] = m;
      int64_t tgt = targets[static_cast<size_t>(n)] - shard.vocabOffset;
      tgtLogit[n] = (tgt >= 0 && tgt < V) ? row[tgt] : 0.0f;
    }
    MESHPLAN_TRY(tp.allReduceMax(mx, N));
    for (int64_t n = 0; n < N; ++n) {
      float *row = logits + n * V;
      float m = mx[n], sum = 0;
      for (int64_t j = 0; j < V; ++j) {
        row[j] = std::exp(row[j] - m);
        sum += row[j];
      }
      sums[n] = sum;
    }
    MESHPLAN_TRY(tp.allReduceSum(sums, 2 * N));
    double loss = 0;
    for (int64_t n = 0; n < N; ++n) {
      loss += static_cast<double>(std::log(sums[n]) + mx[n] - tgtLogit[n]);
      // Keep the local softmax for backward.
      float inv = 1.0f / sums[n];
      float *row = logits + n * V;
      for (int64_t j = 0; j < V; ++j)
        row[j] *= inv;
    }
    return static_cast<float>(loss / static_cast<double>(N));
  }

  Result<void> backwardOutput(const float *output, float lossScale,
                              float *dOutput) {
    // dlogits = lossScale / N (softmax - onehot), in place of the softmax.
    float *dl = probs.data();
    float c = lossScale / static_cast<float>(N);
    for (int64_t n = 0; n < N; ++n) {
      float *row = dl + n * V;
      for (int64_t j = 0; j < V; ++j)
        row[j] *= c;
      int64_t tgt = targets[static_cast<size_t>(n)] - shard.vocabOffset;
      if (tgt >= 0 && tgt < V)
        row[tgt] -= c;
    }
    roundInPlace(dl, N * V);
    gemm(true, false, V, D, N, 1.0f, dl, V, xf.data(), D, 1.0f, dOutput, D);
    gemm(false, false, N, D, V, 1.0f, dl, V, weight(output, V * D), D, 0.0f,
         full.data(), D);
    return scatterSeq(full.data(), h.data());
  }

  Result<void> backwardFinalNorm(const float *norm, float *dNorm) {
    shardTmp = h;
    rmsNormBackward(shardTmp.data(), finalIn.data(), rstdF.data(), norm, dNorm,
                    h.data(), /*add=*/false);
    return {};
  }

  Result<void> backwardBlock(int64_t li, const BlockWeights &w,
                             const BlockGrads &gr) {
    Layer &l = layers[static_cast<size_t>(li)];
    // Feed-forward: h holds d(block output) = d(hMid) through the residual.
    float *dY = full.data();
    MESHPLAN_TRY(gatherSeq(h.data(), dY));
    roundInPlace(dY, N * D);
    swiglu(l); // u = silu(a) g again, cheaper than keeping it
    gemm(true, false, D, F, N, 1.0f, dY, D, ffnTmp.data(), F, 1.0f, gr.w2, F);
    float *du = ffnTmp.data();
    gemm(false, false, N, F, D, 1.0f, dY, D, weight(w.w2, D * F), F, 0.0f, du,
         F);
    // a and g are not needed any more: overwrite them with da and dg.
    float *a = l.a.data(), *g = l.g.data();
    for (int64_t i = 0; i < N * F; ++i) {
      float s = sigmoid(a[i]);
      float silu = a[i] * s;
      float dsilu = s * (1.0f + a[i] * (1.0f - s));
      float da = du[i] * g[i] * dsilu;
      g[i] = du[i] * silu;
      a[i] = da;
    }
    roundInPlace(a, N * F);
    roundInPlace(g, N * F);
    gemm(true, false, F, D, N, 1.0f, a, F, l.n2.data(), D, 1.0f, gr.w1, D);
    gemm(true, false, F, D, N, 1.0f, g, F, l.n2.data(), D, 1.0f, gr.w3, D);
    float *dn2 = full.data(); // dY is consumed
    gemm(false, false, N, D, F, 1.0f, a, F, weight(w.w1, F * D), D, 0.0f, dn2,
         D);
    gemm(false, false, N, D, F, 1.0f, g, F, weight(w.w3, F * D), D, 1.0f, dn2,
         D);
    MESHPLAN_TRY(scatterSeq(dn2, shardTmp.data()));
    rmsNormBackward(shardTmp.data(), l.hMid.data(), l.rstd2.data(), w.ffnNorm,
                    gr.ffnNorm, h.data(), /*add=*/true);

    // Attention: h holds d(hMid) = d(block input) through the residual.
    float *dAO = full.data();
    MESHPLAN_TRY(gatherSeq(h.data(), dAO));
    roundInPlace(dAO, N * D);
    gemm(true, false, D, qd, N, 1.0f, dAO, D, l.o.data(), qd, 1.0f, gr.wo, qd);
    gemm(false, false, N, qd, D, 1.0f, dAO, D, weight(w.wo, D * qd), qd, 0.0f,
         dO.data(), qd);
    roundInPlace(dO.data(), N * qd);
    attentionBackward(l);
    rope(dq.data(), H, /*inverse=*/true);
    rope(dk.data(), Hkv, /*inverse=*/true);
    roundInPlace(dq.data(), N * qd);
    roundInPlace(dk.data(), N * kd);
    roundInPlace(dv.data(), N * kd);
    gemm(true, false, qd, D, N, 1.0f, dq.data(), qd, l.n1.data(), D, 1.0f,
         gr.wq, D);
    gemm(true, false, kd, D, N, 1.0f, dk.data(), kd, l.n1.data(), D, 1.0f,
         gr.wk, D);
    gemm(true, false, kd, D, N, 1.0f, dv.data(), kd, l.n1.data(), D, 1.0f,
         gr.wv, D);
    float *dn1 = full.data(); // dAO is consumed
    gemm(false, false, N, D, qd, 1.0f, dq.data(), qd, weight(w.wq, qd * D), D,
         0.0f, dn1, D);
    gemm(false, false, N, D, kd, 1.0f, dk.data(), kd, weight(w.wk, kd * D), D,
         1.0f, dn1, D);
    gemm(false, false, N, D, kd, 1.0f, dv.data(), kd, weight(w.wv, kd * D), D,
         1.0f, dn1, D);
    MESHPLAN_TRY(scatterSeq(dn1, shardTmp.data()));
    rmsNormBackward(shardTmp.data(), l.xIn.data(), l.rstd1.data(),
                    w.attentionNorm, gr.attentionNorm, h.data(),
                    /*add=*/true);
    return {};
  }

  Result<void> backwardEmbedding(float *dEmb) {
    // The backward of the forward's reduce-scatter: gather the shard
    // gradients in block order, then add each token's row to its embedding
    // row where this rank owns it.
    float *blocks = (P == 1 || B == 1) ? full.data() : staging.data();
    MESHPLAN_TRY(tp.allGather(h.data(), blocks, Ns * D));
    for (int64_t p = 0; p < P; ++p)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) {
          int64_t tok = tokens[static_cast<size_t>(b * T + p * S + s)] -
                        shard.vocabOffset;
          if (tok < 0 || tok >= V)
            continue;
          const float *src = blocks + ((p * B + b) * S + s) * D;
          float *dst = dEmb + tok * D;
          for (int64_t j = 0; j < D; ++j)
            dst[j] += src[j];
        }
    return {};
  }
};

//===----------------------------------------------------------------------===//
// Microbatch
//===----------------------------------------------------------------------===//

Microbatch::Microbatch(const LlamaConfig &config, const TpShard &shard,
                       const MicrobatchShape &shape,
                       const ModelOptions &options, TpGroup &tp)
    : impl(std::make_unique<Impl>(config, shard, shape, options, tp)) {}

Microbatch::~Microbatch() = default;

Result<void> Microbatch::setData(std::span<const int32_t> tokens,
                                 std::span<const int32_t> targets) {
  Impl &m = *impl;
  m.step = Impl::kNoData;
  MESHPLAN_TRY(checkModel(m.cfg, m.shard, m.shape, m.tp.size()));
  if (m.tp.rank() < 0 || m.tp.rank() >= m.tp.size())
    return fail("TP rank " + str(m.tp.rank()) + " is outside [0, " +
                str(m.tp.size()) + ")");
  int64_t n = m.shape.batch * m.shape.seqLen;
  auto check = [&](const char *what,
                   std::span<const int32_t> values) -> Result<void> {
    if (static_cast<int64_t>(values.size()) != n)
      return fail(std::string("setData: ") + what + " has " +
                  str(static_cast<int64_t>(values.size())) +
                  " entries; expected batch * seqLen = " + str(n));
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i] < 0 || values[i] >= m.cfg.vocab)
        return fail(std::string("setData: ") + what + "[" +
                    str(static_cast<int64_t>(i)) + "] = " + str(values[i]) +
                    " is outside the vocabulary [0, " + str(m.cfg.vocab) + ")");
    return {};
  };
  MESHPLAN_TRY(check("tokens", tokens));
  MESHPLAN_TRY(check("targets", targets));
  if (!m.allocated)
    m.allocate();
  m.tokens.assign(tokens.begin(), tokens.end());
  m.targets.assign(targets.begin(), targets.end());
  m.step = 0;
  return {};
}

namespace {

Result<void>
nonNull(const char *segment, int64_t layer,
        std::initializer_list<std::pair<const char *, const void *>> pointers) {
  for (auto [name, p] : pointers)
    if (!p)
      return fail(std::string("Microbatch: ") + segment + "(" + str(layer) +
                  "): " + name + " is null");
  return {};
}

} // namespace

Result<void> Microbatch::forwardEmbedding(const float *embedding) {
  Impl &m = *impl;
  // A new forward may start once the data is set, after a finished forward
  // (no backward, e.g. evaluation) or after a finished backward.
  if (m.step == m.L + 3 || m.step == 2 * m.L + 6)
    m.step = 0;
  if (!embedding)
    return fail("Microbatch: forwardEmbedding: embedding is null");
  return m.segment(0, [&] { return m.forwardEmbedding(embedding); });
}

Result<void> Microbatch::forwardBlock(int64_t layer, const BlockWeights &w) {
  Impl &m = *impl;
  if (layer < 0 || layer >= m.cfg.nLayers)
    return fail("Microbatch: forwardBlock(" + str(layer) +
                "): layer outside [0, " + str(m.cfg.nLayers) + ")");
  MESHPLAN_TRY(nonNull("forwardBlock", layer,
                       {{"attentionNorm", w.attentionNorm},
                        {"wq", w.wq},
                        {"wk", w.wk},
                        {"wv", w.wv},
                        {"wo", w.wo},
                        {"ffnNorm", w.ffnNorm},
                        {"w1", w.w1},
                        {"w3", w.w3},
                        {"w2", w.w2}}));
  return m.segment(1 + layer, [&] { return m.forwardBlock(layer, w); });
}

Result<void> Microbatch::forwardFinalNorm(const float *norm) {
  Impl &m = *impl;
  if (!norm)
    return fail("Microbatch: forwardFinalNorm: norm is null");
  return m.segment(m.L + 1, [&] { return m.forwardFinalNorm(norm); });
}

Result<float> Microbatch::forwardOutput(const float *output) {
  Impl &m = *impl;
  if (!output)
    return makeError("Microbatch: forwardOutput: output is null");
  float loss = 0;
  MESHPLAN_TRY(m.segment(m.L + 2, [&]() -> Result<void> {
    Result<float> r = m.forwardOutput(output);
    if (!r.ok())
      return r.error();
    loss = *r;
    return {};
  }));
  return loss;
}

Result<void> Microbatch::backwardOutput(const float *output, float lossScale,
                                        float *dOutput) {
  Impl &m = *impl;
  if (!output || !dOutput)
    return fail("Microbatch: backwardOutput: output or dOutput is null");
  return m.segment(
      m.L + 3, [&] { return m.backwardOutput(output, lossScale, dOutput); });
}

Result<void> Microbatch::backwardFinalNorm(const float *norm, float *dNorm) {
  Impl &m = *impl;
  if (!norm || !dNorm)
    return fail("Microbatch: backwardFinalNorm: norm or dNorm is null");
  return m.segment(m.L + 4, [&] { return m.backwardFinalNorm(norm, dNorm); });
}

Result<void> Microbatch::backwardBlock(int64_t layer, const BlockWeights &w,
                                       const BlockGrads &g) {
  Impl &m = *impl;
  if (layer < 0 || layer >= m.cfg.nLayers)
    return fail("Microbatch: backwardBlock(" + str(layer) +
                "): layer outside [0, " + str(m.cfg.nLayers) + ")");
  MESHPLAN_TRY(nonNull("backwardBlock", layer,
                       {{"attentionNorm", w.attentionNorm},
                        {"wq", w.wq},
                        {"wk", w.wk},
                        {"wv", w.wv},
                        {"wo", w.wo},
                        {"ffnNorm", w.ffnNorm},
                        {"w1", w.w1},
                        {"w3", w.w3},
                        {"w2", w.w2},
                        {"gradient attentionNorm", g.attentionNorm},
                        {"gradient wq", g.wq},
                        {"gradient wk", g.wk},
                        {"gradient wv", g.wv},
                        {"gradient wo", g.wo},
                        {"gradient ffnNorm", g.ffnNorm},
                        {"gradient w1", g.w1},
                        {"gradient w3", g.w3},
                        {"gradient w2", g.w2}}));
  return m.segment(m.L + 5 + (m.L - 1 - layer),
                   [&] { return m.backwardBlock(layer, w, g); });
}

Result<void> Microbatch::backwardEmbedding(float *dEmbedding) {
  Impl &m = *impl;
  if (!dEmbedding)
    return fail("Microbatch: backwardEmbedding: dEmbedding is null");
  return m.segment(2 * m.L + 5,
                   [&] { return m.backwardEmbedding(dEmbedding); });
}

Result<void> Microbatch::forwardFrom(int64_t layer,
                                     std::span<const float> input) {
  Impl &m = *impl;
  if (layer < 0 || layer > m.cfg.nLayers + 1)
    return fail("Microbatch: forwardFrom(" + str(layer) +
                "): expected a layer in [0, " + str(m.cfg.nLayers) +
                "] or nLayers + 1 (the output)");
  // As forwardEmbedding: a finished forward or backward may start again.
  if (m.step == m.L + 3 || m.step == 2 * m.L + 6)
    m.step = 0;
  if (m.step != 0)
    return fail("Microbatch: forwardFrom(" + str(layer) + ") called " +
                (m.step == Impl::kNoData ? std::string("before setData")
                 : m.step == Impl::kFailed
                     ? std::string("after a failed call")
                     : "out of order; expected " + m.stepName(m.step)));
  if (static_cast<int64_t>(input.size()) != m.Ns * m.D)
    return fail("Microbatch: forwardFrom(" + str(layer) + "): the input has " +
                str(static_cast<int64_t>(input.size())) +
                " values; this rank's stream shard is batch * seqLen / P * "
                "dim = " +
                str(m.Ns * m.D));
  std::copy(input.begin(), input.end(), m.h.begin());
  m.step = 1 + layer;
  return {};
}

Result<void> Microbatch::backwardFrom(std::span<const float> outputGrad) {
  Impl &m = *impl;
  // After forward segment f the step is f + 1; f's backward is 2 L + 5 - f.
  if (m.step < 1 || m.step > m.L + 2)
    return fail("Microbatch: backwardFrom called " +
                std::string(m.step == m.L + 3
                                ? "after forwardOutput (the last stage's "
                                  "backward starts at backwardOutput)"
                                : "before a forward segment ran"));
  if (static_cast<int64_t>(outputGrad.size()) != m.Ns * m.D)
    return fail("Microbatch: backwardFrom: the gradient has " +
                str(static_cast<int64_t>(outputGrad.size())) +
                " values; this rank's stream shard is " + str(m.Ns * m.D));
  std::copy(outputGrad.begin(), outputGrad.end(), m.h.begin());
  m.step = 2 * m.L + 6 - m.step;
  return {};
}

std::span<const float> Microbatch::stream() const {
  const Impl &m = *impl;
  if (!m.allocated)
    return {};
  return {m.h.data(), static_cast<size_t>(m.Ns * m.D)};
}

void Microbatch::roundStreamToBf16() {
  Impl &m = *impl;
  if (!m.allocated)
    return;
  for (int64_t i = 0; i < m.Ns * m.D; ++i)
    m.h[size_t(i)] = kernels::bf16ToFloat(kernels::floatToBf16(m.h[size_t(i)]));
}

double Microbatch::matmulFlops() const { return impl->flops; }
double Microbatch::matmulSeconds() const { return impl->seconds; }

} // namespace meshplan::trainer
