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

#include <algorithm>
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

struct Microbatch::Impl {
  Impl(const LlamaConfig &config, const TpShard &shard,
       const MicrobatchShape &shape, const ModelOptions &options, TpGroup &tp,
       ModelOps &ops)
      : cfg(config), shard(shard), shape(shape), opt(options), tp(tp),
        ops(ops) {}

  LlamaConfig cfg;
  TpShard shard;
  MicrobatchShape shape;
  ModelOptions opt;
  TpGroup &tp;
  ModelOps &ops;

  using Buf = OpsBuffer<float>;
  using IntBuf = OpsBuffer<int32_t>;

  // Sizes (set by allocate()).
  int64_t P = 1, B = 0, T = 0, S = 0, D = 0, hd = 0, H = 0, Hkv = 0, F = 0,
          V = 0, N = 0, Ns = 0, group = 1, qd = 0, kd = 0, L = 0;
  bool allocated = false;

  /// What backward needs from one block's forward.
  struct Layer {
    Buf xIn;   ///< [Ns, D] block input (residual)
    Buf rstd1; ///< [Ns]
    Buf n1;    ///< [N, D] gathered attention_norm output
    Buf q;     ///< [N, qd] after RoPE
    Buf k;     ///< [N, kd] after RoPE
    Buf v;     ///< [N, kd]
    Buf lse;   ///< [B, H, T] softmax log-sum-exp per row
    Buf o;     ///< [N, qd] attention output (wo's input)
    Buf hMid;  ///< [Ns, D] after the attention residual
    Buf rstd2; ///< [Ns]
    Buf n2;    ///< [N, D] gathered ffn_norm output
    Buf a, g;  ///< [N, F] w1 x and w3 x
  };
  std::vector<Layer> layers;

  /// The microbatch's data on the host (checked by setData) and, in the
  /// ops' memory, as the kernels read it.
  std::vector<int32_t> tokens, targets;
  /// [N] in collective block order [P, B, S]: the token's row of this
  /// rank's embedding shard (outside [0, V) when another rank owns it).
  IntBuf rowToken;
  /// [N]: the target's column of this rank's output shard.
  IntBuf targetLocal;
  /// The embedding backward's rows grouped by token (embeddingBackward):
  /// the distinct local tokens, offsets into embRows, block-order rows.
  IntBuf embTokens, embOffsets, embRows;
  int64_t embTokenCount = 0;
  Buf ropeCos, ropeSin; ///< [T, hd / 2]

  /// The residual stream's shard [Ns, D] in forward, its gradient in
  /// backward.
  Buf h;
  /// stream()'s host copy when the ops' memory is not the host's.
  std::vector<float> hostStream;
  Buf finalIn, rstdF; ///< final norm's input [Ns, D], [Ns]
  Buf xf;             ///< [N, D] gathered final norm output
  Buf probs;          ///< [N, V] local softmax, then dlogits
  Buf ceStats;        ///< [3 N]: max, then sumexp and target logit
  std::vector<float> ceHost;

  // Scratch reused by every segment.
  Buf staging;       ///< [N, D] collectives' block order
  Buf full;          ///< [N, D] full-sequence temporary
  Buf shardTmp;      ///< [Ns, D]
  Buf ffnTmp;        ///< [N, F]
  Buf dO, dq;        ///< [N, qd]
  Buf dk, dv;        ///< [N, kd]
  Buf sc1, sc2, sc3; ///< [rowBlock, T] attention scores
  Buf weightBf16;    ///< rounded copy of one weight

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

  Result<void> allocate() {
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

    layers.resize(static_cast<size_t>(L));
    for (Layer &l : layers) {
      MESHPLAN_TRY(l.xIn.allocate(ops, Ns * D));
      MESHPLAN_TRY(l.rstd1.allocate(ops, Ns));
      MESHPLAN_TRY(l.n1.allocate(ops, N * D));
      MESHPLAN_TRY(l.q.allocate(ops, N * qd));
      MESHPLAN_TRY(l.k.allocate(ops, N * kd));
      MESHPLAN_TRY(l.v.allocate(ops, N * kd));
      MESHPLAN_TRY(l.lse.allocate(ops, B * H * T));
      MESHPLAN_TRY(l.o.allocate(ops, N * qd));
      MESHPLAN_TRY(l.hMid.allocate(ops, Ns * D));
      MESHPLAN_TRY(l.rstd2.allocate(ops, Ns));
      MESHPLAN_TRY(l.n2.allocate(ops, N * D));
      MESHPLAN_TRY(l.a.allocate(ops, N * F));
      MESHPLAN_TRY(l.g.allocate(ops, N * F));
    }
    MESHPLAN_TRY(rowToken.allocate(ops, N));
    MESHPLAN_TRY(targetLocal.allocate(ops, N));
    MESHPLAN_TRY(embTokens.allocate(ops, N));
    MESHPLAN_TRY(embOffsets.allocate(ops, N + 1));
    MESHPLAN_TRY(embRows.allocate(ops, N));
    MESHPLAN_TRY(h.allocate(ops, Ns * D));
    MESHPLAN_TRY(finalIn.allocate(ops, Ns * D));
    MESHPLAN_TRY(rstdF.allocate(ops, Ns));
    MESHPLAN_TRY(xf.allocate(ops, N * D));
    MESHPLAN_TRY(probs.allocate(ops, N * V));
    MESHPLAN_TRY(ceStats.allocate(ops, 3 * N));
    ceHost.resize(static_cast<size_t>(3 * N));
    if (P > 1 && B > 1)
      MESHPLAN_TRY(staging.allocate(ops, N * D));
    MESHPLAN_TRY(full.allocate(ops, N * D));
    MESHPLAN_TRY(shardTmp.allocate(ops, Ns * D));
    MESHPLAN_TRY(ffnTmp.allocate(ops, N * F));
    MESHPLAN_TRY(dO.allocate(ops, N * qd));
    MESHPLAN_TRY(dq.allocate(ops, N * qd));
    MESHPLAN_TRY(dk.allocate(ops, N * kd));
    MESHPLAN_TRY(dv.allocate(ops, N * kd));
    int64_t rows = std::min(ops.attentionRowBlock(), T);
    MESHPLAN_TRY(sc1.allocate(ops, rows * T));
    MESHPLAN_TRY(sc2.allocate(ops, rows * T));
    if (opt.bf16Matmul) {
      MESHPLAN_TRY(sc3.allocate(ops, rows * T));
      MESHPLAN_TRY(
          weightBf16.allocate(ops, std::max({qd * D, kd * D, F * D, V * D})));
    }

    // torchtitan's precompute_freqs_cis, in its float32 steps: freq_i =
    // 1 / theta^(2i / hd), angle = float(t) * freq_i, then cos and sin.
    int64_t half = hd / 2;
    std::vector<float> cosHost(static_cast<size_t>(T * half)),
        sinHost(static_cast<size_t>(T * half));
    for (int64_t i = 0; i < half; ++i) {
      float exponent = static_cast<float>(2 * i) / static_cast<float>(hd);
      float freq = 1.0f / std::pow(cfg.ropeTheta, exponent);
      for (int64_t t = 0; t < T; ++t) {
        float angle = static_cast<float>(t) * freq;
        cosHost[size_t(t * half + i)] = std::cos(angle);
        sinHost[size_t(t * half + i)] = std::sin(angle);
      }
    }
    MESHPLAN_TRY(ropeCos.allocate(ops, T * half));
    MESHPLAN_TRY(ropeSin.allocate(ops, T * half));
    ops.upload(ropeCos.data(), cosHost.data(), ropeCos.bytes());
    ops.upload(ropeSin.data(), sinHost.data(), ropeSin.bytes());
    allocated = true;
    return {};
  }

  /// The data's index arrays in the ops' memory (setData).
  void uploadData() {
    std::vector<int32_t> rows(static_cast<size_t>(N)),
        tgt(static_cast<size_t>(N));
    // Block order: row (p * B + b) * S + s is token b * T + p * S + s.
    for (int64_t p = 0; p < P; ++p)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
          rows[size_t((p * B + b) * S + s)] = static_cast<int32_t>(
              tokens[size_t(b * T + p * S + s)] - shard.vocabOffset);
    for (int64_t n = 0; n < N; ++n)
      tgt[size_t(n)] =
          static_cast<int32_t>(targets[size_t(n)] - shard.vocabOffset);
    // The embedding backward adds each block-order row into its token's
    // row, in block order: group the rows by local token, keeping that
    // order within a token.
    std::vector<std::vector<int32_t>> byToken(static_cast<size_t>(V));
    for (int64_t r = 0; r < N; ++r) {
      int32_t tok = rows[size_t(r)];
      if (tok >= 0 && tok < V)
        byToken[size_t(tok)].push_back(static_cast<int32_t>(r));
    }
    std::vector<int32_t> uniq, offsets{0}, flat;
    for (int64_t t = 0; t < V; ++t) {
      if (byToken[size_t(t)].empty())
        continue;
      uniq.push_back(static_cast<int32_t>(t));
      flat.insert(flat.end(), byToken[size_t(t)].begin(),
                  byToken[size_t(t)].end());
      offsets.push_back(static_cast<int32_t>(flat.size()));
    }
    embTokenCount = static_cast<int64_t>(uniq.size());
    ops.upload(rowToken.data(), rows.data(), rowToken.bytes());
    ops.upload(targetLocal.data(), tgt.data(), targetLocal.bytes());
    ops.upload(embTokens.data(), uniq.data(), sizeof(int32_t) * uniq.size());
    ops.upload(embOffsets.data(), offsets.data(),
               sizeof(int32_t) * offsets.size());
    ops.upload(embRows.data(), flat.data(), sizeof(int32_t) * flat.size());
  }

  //===--------------------------------------------------------------------===//
  // Matmuls and bf16 rounding
  //===--------------------------------------------------------------------===//

  /// C = alpha op(A) op(B) + beta C, row-major; op(A) is M x K, op(B) K x N.
  void gemm(bool transA, bool transB, int64_t M, int64_t Nn, int64_t K,
            float alpha, const float *A, int64_t lda, const float *Bm,
            int64_t ldb, float beta, float *C, int64_t ldc) {
    seconds += ops.gemm(transA, transB, M, Nn, K, alpha, A, lda, Bm, ldb, beta,
                        C, ldc, opt.bf16Matmul);
    flops += 2.0 * static_cast<double>(M) * static_cast<double>(Nn) *
             static_cast<double>(K);
  }

  /// Rounds a buffer that only feeds matmuls to bf16 in place.
  void roundInPlace(float *data, int64_t n) {
    if (opt.bf16Matmul)
      ops.roundBf16(data, data, n);
  }

  /// The matmul input for weight `w` of n elements: itself, or its bf16
  /// rounding in a scratch copy (valid until the next call).
  const float *weight(const float *w, int64_t n) {
    if (!opt.bf16Matmul)
      return w;
    ops.roundBf16(w, weightBf16.data(), n);
    return weightBf16.data();
  }

  //===--------------------------------------------------------------------===//
  // Sequence-parallel collectives
  //===--------------------------------------------------------------------===//

  /// The TP group's all-gather and reduce-scatter, except that a group of
  /// one copies on the ops (its buffers may be device memory, which the
  /// group cannot touch).
  Result<void> tpAllGather(const float *in, float *out, int64_t count) {
    return tp.size() != 1 ? tp.allGather(in, out, count)
                          : copyOnOps(in, out, count);
  }
  Result<void> tpReduceScatter(const float *in, float *out, int64_t count) {
    return tp.size() != 1 ? tp.reduceScatter(in, out, count)
                          : copyOnOps(in, out, count);
  }
  Result<void> copyOnOps(const float *in, float *out, int64_t count) {
    if (in != out)
      ops.copy(out, in, sizeof(float) * static_cast<size_t>(count));
    return {};
  }

  /// [B, S, D] shard -> [B, T, D] full sequences on every rank.
  Result<void> gatherSeq(const float *shardIn, float *fullOut) {
    if (P == 1 || B == 1) // block order is sequence order
      return tpAllGather(shardIn, fullOut, Ns * D);
    MESHPLAN_TRY(tpAllGather(shardIn, staging.data(), Ns * D));
    // Block (p, b) of S * D floats goes to sequence b, positions p * S...
    for (int64_t p = 0; p < P; ++p)
      ops.copyRows(fullOut + p * S * D, T * D, staging.data() + p * B * S * D,
                   S * D, S * D, B);
    return {};
  }

  /// [B, T, D] partial sums -> this rank's [B, S, D] shard of their sum.
  Result<void> scatterSeq(const float *fullIn, float *shardOut) {
    if (P == 1 || B == 1)
      return tpReduceScatter(fullIn, shardOut, Ns * D);
    for (int64_t p = 0; p < P; ++p)
      ops.copyRows(staging.data() + p * B * S * D, S * D, fullIn + p * S * D,
                   T * D, S * D, B);
    return tpReduceScatter(staging.data(), shardOut, Ns * D);
  }

  //===--------------------------------------------------------------------===//
  // Attention core (per sequence and local head, causal row blocks)
  //===--------------------------------------------------------------------===//

  void attentionForward(Layer &l) {
    float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    int64_t block = ops.attentionRowBlock();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < H; ++hh) {
        int64_t kv = hh / group; // local: GQA groups are whole on a rank
        const float *qh = l.q.data() + b * T * qd + hh * hd;
        const float *kh = l.k.data() + b * T * kd + kv * hd;
        const float *vh = l.v.data() + b * T * kd + kv * hd;
        float *oh = l.o.data() + b * T * qd + hh * hd;
        float *lse = l.lse.data() + (b * H + hh) * T;
        for (int64_t r0 = 0; r0 < T; r0 += block) {
          int64_t r1 = std::min(T, r0 + block), R = r1 - r0;
          float *s = sc1.data();
          gemm(false, true, R, r1, hd, scale, qh + r0 * qd, qd, kh, kd, 0.0f, s,
               T);
          ops.causalSoftmax(s, lse + r0, R, r0, r1, T);
          if (opt.bf16Matmul)
            ops.roundBf16Rows(s, s, R, T, r1);
          gemm(false, false, R, hd, r1, 1.0f, s, T, vh, kd, 0.0f, oh + r0 * qd,
               qd);
        }
      }
  }

  /// dO (in dO) -> dq (written), dk and dv (accumulated from zero).
  void attentionBackward(Layer &l) {
    float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    int64_t block = ops.attentionRowBlock();
    ops.fillZero(dk.data(), dk.bytes());
    ops.fillZero(dv.data(), dv.bytes());
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
        for (int64_t r0 = 0; r0 < T; r0 += block) {
          int64_t r1 = std::min(T, r0 + block), R = r1 - r0;
          // Recompute the probabilities from the saved log-sum-exp rather
          // than keep B * H * T^2 of them per layer.
          float *p = sc1.data(), *dp = sc2.data();
          gemm(false, true, R, r1, hd, scale, qh + r0 * qd, qd, kh, kd, 0.0f, p,
               T);
          ops.causalProbs(p, lse + r0, R, r0, r1, T);
          gemm(false, true, R, r1, hd, 1.0f, doh + r0 * qd, qd, vh, kd, 0.0f,
               dp, T);
          const float *pIn = p;
          if (opt.bf16Matmul) {
            ops.roundBf16Rows(p, sc3.data(), R, T, r1);
            pIn = sc3.data();
          }
          gemm(true, false, r1, hd, R, 1.0f, pIn, T, doh + r0 * qd, qd, 1.0f,
               dvh, kd);
          ops.causalSoftmaxBackward(p, dp, R, r0, r1, T);
          if (opt.bf16Matmul)
            ops.roundBf16Rows(dp, dp, R, T, r1);
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
    ops.embeddingRows(rowToken.data(), N, emb, V, D, blocks);
    return tpReduceScatter(blocks, h.data(), Ns * D);
  }

  Result<void> forwardBlock(int64_t li, const BlockWeights &w) {
    Layer &l = layers[static_cast<size_t>(li)];
    ops.copy(l.xIn.data(), h.data(), h.bytes());
    // Attention.
    ops.rmsNorm(l.xIn.data(), w.attentionNorm, shardTmp.data(), l.rstd1.data(),
                Ns, D, cfg.normEps);
    MESHPLAN_TRY(gatherSeq(shardTmp.data(), l.n1.data()));
    roundInPlace(l.n1.data(), N * D);
    gemm(false, true, N, qd, D, 1.0f, l.n1.data(), D, weight(w.wq, qd * D), D,
         0.0f, l.q.data(), qd);
    gemm(false, true, N, kd, D, 1.0f, l.n1.data(), D, weight(w.wk, kd * D), D,
         0.0f, l.k.data(), kd);
    gemm(false, true, N, kd, D, 1.0f, l.n1.data(), D, weight(w.wv, kd * D), D,
         0.0f, l.v.data(), kd);
    ops.rope(l.q.data(), ropeCos.data(), ropeSin.data(), N, T, H, hd, false);
    ops.rope(l.k.data(), ropeCos.data(), ropeSin.data(), N, T, Hkv, hd, false);
    roundInPlace(l.q.data(), N * qd);
    roundInPlace(l.k.data(), N * kd);
    roundInPlace(l.v.data(), N * kd);
    attentionForward(l);
    roundInPlace(l.o.data(), N * qd);
    gemm(false, true, N, D, qd, 1.0f, l.o.data(), qd, weight(w.wo, D * qd), qd,
         0.0f, full.data(), D);
    MESHPLAN_TRY(scatterSeq(full.data(), shardTmp.data()));
    ops.add(l.xIn.data(), shardTmp.data(), l.hMid.data(), Ns * D);
    // Feed-forward.
    ops.rmsNorm(l.hMid.data(), w.ffnNorm, shardTmp.data(), l.rstd2.data(), Ns,
                D, cfg.normEps);
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
    ops.add(l.hMid.data(), shardTmp.data(), h.data(), Ns * D);
    return {};
  }

  /// ffnTmp = silu(a) * g, rounded when it feeds a bf16 matmul.
  void swiglu(const Layer &l) {
    ops.swiglu(l.a.data(), l.g.data(), ffnTmp.data(), N * F);
    roundInPlace(ffnTmp.data(), N * F);
  }

  Result<void> forwardFinalNorm(const float *norm) {
    ops.copy(finalIn.data(), h.data(), h.bytes());
    ops.rmsNorm(finalIn.data(), norm, h.data(), rstdF.data(), Ns, D,
                cfg.normEps);
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
    ops.rowMaxAndTarget(logits, targetLocal.data(), N, V, mx, tgtLogit);
    MESHPLAN_TRY(tp.allReduceMax(mx, N));
    ops.expAndSum(logits, mx, N, V, sums);
    MESHPLAN_TRY(tp.allReduceSum(sums, 2 * N));
    // Keep the local softmax for backward.
    ops.normalizeRows(logits, sums, N, V);
    MESHPLAN_TRY(ops.download(ceHost.data(), ceStats.data(), ceStats.bytes()));
    const float *hm = ceHost.data(), *hs = hm + N, *ht = hm + 2 * N;
    double loss = 0;
    for (int64_t n = 0; n < N; ++n)
      loss += static_cast<double>(std::log(hs[n]) + hm[n] - ht[n]);
    return static_cast<float>(loss / static_cast<double>(N));
  }

  Result<void> backwardOutput(const float *output, float lossScale,
                              float *dOutput) {
    // dlogits = lossScale / N (softmax - onehot), in place of the softmax.
    float *dl = probs.data();
    ops.crossEntropyGrad(dl, targetLocal.data(), N, V,
                         lossScale / static_cast<float>(N));
    roundInPlace(dl, N * V);
    gemm(true, false, V, D, N, 1.0f, dl, V, xf.data(), D, 1.0f, dOutput, D);
    gemm(false, false, N, D, V, 1.0f, dl, V, weight(output, V * D), D, 0.0f,
         full.data(), D);
    return scatterSeq(full.data(), h.data());
  }

  Result<void> backwardFinalNorm(const float *norm, float *dNorm) {
    ops.copy(shardTmp.data(), h.data(), h.bytes());
    ops.rmsNormBackward(shardTmp.data(), finalIn.data(), rstdF.data(), norm,
                        dNorm, h.data(), Ns, D, /*add=*/false);
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
    ops.swigluBackward(du, a, g, N * F);
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
    ops.rmsNormBackward(shardTmp.data(), l.hMid.data(), l.rstd2.data(),
                        w.ffnNorm, gr.ffnNorm, h.data(), Ns, D, /*add=*/true);

    // Attention: h holds d(hMid) = d(block input) through the residual.
    float *dAO = full.data();
    MESHPLAN_TRY(gatherSeq(h.data(), dAO));
    roundInPlace(dAO, N * D);
    gemm(true, false, D, qd, N, 1.0f, dAO, D, l.o.data(), qd, 1.0f, gr.wo, qd);
    gemm(false, false, N, qd, D, 1.0f, dAO, D, weight(w.wo, D * qd), qd, 0.0f,
         dO.data(), qd);
    roundInPlace(dO.data(), N * qd);
    attentionBackward(l);
    ops.rope(dq.data(), ropeCos.data(), ropeSin.data(), N, T, H, hd,
             /*inverse=*/true);
    ops.rope(dk.data(), ropeCos.data(), ropeSin.data(), N, T, Hkv, hd,
             /*inverse=*/true);
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
    ops.rmsNormBackward(shardTmp.data(), l.xIn.data(), l.rstd1.data(),
                        w.attentionNorm, gr.attentionNorm, h.data(), Ns, D,
                        /*add=*/true);
    return {};
  }

  Result<void> backwardEmbedding(float *dEmb) {
    // The backward of the forward's reduce-scatter: gather the shard
    // gradients in block order, then add each token's rows to its embedding
    // row where this rank owns it.
    float *blocks = (P == 1 || B == 1) ? full.data() : staging.data();
    MESHPLAN_TRY(tpAllGather(h.data(), blocks, Ns * D));
    ops.embeddingBackward(embTokens.data(), embOffsets.data(), embRows.data(),
                          embTokenCount, blocks, D, dEmb);
    return {};
  }
};

//===----------------------------------------------------------------------===//
// Microbatch
//===----------------------------------------------------------------------===//

Microbatch::Microbatch(const LlamaConfig &config, const TpShard &shard,
                       const MicrobatchShape &shape,
                       const ModelOptions &options, TpGroup &tp, ModelOps &ops)
    : impl(std::make_unique<Impl>(config, shard, shape, options, tp, ops)) {}

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
    MESHPLAN_TRY(m.allocate());
  m.tokens.assign(tokens.begin(), tokens.end());
  m.targets.assign(targets.begin(), targets.end());
  m.uploadData();
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
  m.ops.upload(m.h.data(), input.data(), m.h.bytes());
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
  m.ops.upload(m.h.data(), outputGrad.data(), m.h.bytes());
  m.step = 2 * m.L + 6 - m.step;
  return {};
}

int64_t Microbatch::streamSize() const {
  const Impl &m = *impl;
  return m.allocated ? m.Ns * m.D : 0;
}

Result<std::span<const float>> Microbatch::stream() {
  Impl &m = *impl;
  if (!m.allocated)
    return std::span<const float>();
  size_t n = static_cast<size_t>(m.Ns * m.D);
  if (m.ops.hostMemory())
    return std::span<const float>(m.h.data(), n);
  m.hostStream.resize(n);
  MESHPLAN_TRY(m.ops.download(m.hostStream.data(), m.h.data(), m.h.bytes()));
  return std::span<const float>(m.hostStream);
}

void Microbatch::roundStreamToBf16() {
  Impl &m = *impl;
  if (m.allocated)
    m.ops.roundBf16(m.h.data(), m.h.data(), m.Ns * m.D);
}

double Microbatch::matmulFlops() const { return impl->flops; }
double Microbatch::matmulSeconds() const { return impl->seconds; }

} // namespace meshplan::trainer
