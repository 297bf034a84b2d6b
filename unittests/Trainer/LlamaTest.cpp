//===- LlamaTest.cpp - The trainer's Llama model against references -------===//
//
// The model (examples/trainer/model) is checked four ways:
//   - its loss against a naive double-precision forward written from the
//     model's definition (embedding, RMSNorm, GQA attention with torchtitan's
//     interleaved RoPE and a causal mask, SwiGLU, cross-entropy);
//   - its gradients against central finite differences, both of that double
//     reference (tight) and of the fp32 model itself;
//   - tensor-parallel runs (threads standing in for ranks, over a shared
//     in-process TpGroup) against the one-rank run, even and uneven splits;
//   - its errors, and the bf16-matmul option.
//
//===----------------------------------------------------------------------===//
#include "model/Llama.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace meshplan;
using namespace meshplan::trainer;

namespace {

// Ranks run as threads here; OpenBLAS's own threads would only oversubscribe
// the cores (and its thread pool is not meant to be entered from many
// threads at once).
const bool kOneBlasThread = [] {
  openblas_set_num_threads(1);
  return true;
}();

using Vec = std::vector<float>;

//===----------------------------------------------------------------------===//
// Whole-model parameters and their TP shards
//===----------------------------------------------------------------------===//

struct BlockParams {
  Vec attentionNorm, wq, wk, wv, wo, ffnNorm, w1, w3, w2;
};

struct Params {
  Vec embedding;
  std::vector<BlockParams> blocks;
  Vec norm, output;

  /// Every tensor with its name, in a fixed order.
  std::vector<std::pair<std::string, Vec *>> tensors() {
    std::vector<std::pair<std::string, Vec *>> all = {
        {"tok_embeddings", &embedding}};
    for (size_t l = 0; l < blocks.size(); ++l) {
      BlockParams &b = blocks[l];
      std::string p = "layers." + std::to_string(l) + ".";
      for (auto [name, t] :
           std::initializer_list<std::pair<const char *, Vec *>>{
               {"attention_norm", &b.attentionNorm},
               {"wq", &b.wq},
               {"wk", &b.wk},
               {"wv", &b.wv},
               {"wo", &b.wo},
               {"ffn_norm", &b.ffnNorm},
               {"w1", &b.w1},
               {"w3", &b.w3},
               {"w2", &b.w2}})
        all.push_back({p + name, t});
    }
    all.push_back({"norm", &norm});
    all.push_back({"output", &output});
    return all;
  }
};

/// Zeroed tensors of a rank's shapes.
Params zeros(const LlamaConfig &c, const TpShard &s) {
  int64_t hd = c.headDim(), D = c.dim;
  auto z = [](int64_t n) { return Vec(static_cast<size_t>(n), 0.0f); };
  Params p;
  p.embedding = z(s.vocabLocal * D);
  for (int64_t l = 0; l < c.nLayers; ++l)
    p.blocks.push_back({z(D), z(s.localHeads * hd * D),
                        z(s.localKvHeads * hd * D), z(s.localKvHeads * hd * D),
                        z(D * s.localHeads * hd), z(D), z(s.localFfn * D),
                        z(s.localFfn * D), z(D * s.localFfn)});
  p.norm = z(D);
  p.output = z(s.vocabLocal * D);
  return p;
}

/// Random weights: matrices uniform in +-scale, norm weights 1 +- 0.3 (so
/// their gradients are not all alike).
Params randomParams(const LlamaConfig &c, uint32_t seed, float scale) {
  Params p = zeros(c, TpShard::whole(c));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto &[name, t] : p.tensors()) {
    bool isNorm = name.find("norm") != std::string::npos;
    for (float &x : *t)
      x = isNorm ? 1.0f + 0.3f * u(rng) : scale * u(rng);
  }
  return p;
}

/// A rank's shard: TpShard plus the offset of its ffn rows, which the model
/// does not need (the trainer slices the weights) but the test does.
struct RankShard {
  TpShard tp;
  int64_t ffnOffset = 0;
};

Vec rowSlice(const Vec &m, int64_t cols, int64_t r0, int64_t n) {
  return Vec(m.begin() + r0 * cols, m.begin() + (r0 + n) * cols);
}

Vec colSlice(const Vec &m, int64_t rows, int64_t cols, int64_t c0, int64_t n) {
  Vec out(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(m.begin() + r * cols + c0, n, out.begin() + r * n);
  return out;
}

void addRows(Vec &m, int64_t cols, int64_t r0, const Vec &part) {
  for (size_t i = 0; i < part.size(); ++i)
    m[static_cast<size_t>(r0 * cols) + i] += part[i];
}

void addCols(Vec &m, int64_t rows, int64_t cols, int64_t c0, int64_t n,
             const Vec &part) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j)
      m[static_cast<size_t>(r * cols + c0 + j)] +=
          part[static_cast<size_t>(r * n + j)];
}

Params shardParams(const LlamaConfig &c, const Params &w, const RankShard &rs) {
  const TpShard &s = rs.tp;
  int64_t hd = c.headDim(), D = c.dim;
  Params p;
  p.embedding = rowSlice(w.embedding, D, s.vocabOffset, s.vocabLocal);
  for (const BlockParams &b : w.blocks)
    p.blocks.push_back(
        {b.attentionNorm,
         rowSlice(b.wq, D, s.headOffset * hd, s.localHeads * hd),
         rowSlice(b.wk, D, s.kvHeadOffset * hd, s.localKvHeads * hd),
         rowSlice(b.wv, D, s.kvHeadOffset * hd, s.localKvHeads * hd),
         colSlice(b.wo, D, c.nHeads * hd, s.headOffset * hd, s.localHeads * hd),
         b.ffnNorm, rowSlice(b.w1, D, rs.ffnOffset, s.localFfn),
         rowSlice(b.w3, D, rs.ffnOffset, s.localFfn),
         colSlice(b.w2, D, c.ffnDim, rs.ffnOffset, s.localFfn)});
  p.norm = w.norm;
  p.output = rowSlice(w.output, D, s.vocabOffset, s.vocabLocal);
  return p;
}

/// Adds a rank's gradients into whole-model ones: shards to their place,
/// the norms' partial sums summed.
void addShardGrads(const LlamaConfig &c, Params &whole, const Params &g,
                   const RankShard &rs) {
  const TpShard &s = rs.tp;
  int64_t hd = c.headDim(), D = c.dim;
  addRows(whole.embedding, D, s.vocabOffset, g.embedding);
  for (size_t l = 0; l < whole.blocks.size(); ++l) {
    BlockParams &w = whole.blocks[l];
    const BlockParams &b = g.blocks[l];
    addRows(w.attentionNorm, D, 0, b.attentionNorm);
    addRows(w.wq, D, s.headOffset * hd, b.wq);
    addRows(w.wk, D, s.kvHeadOffset * hd, b.wk);
    addRows(w.wv, D, s.kvHeadOffset * hd, b.wv);
    addCols(w.wo, D, c.nHeads * hd, s.headOffset * hd, s.localHeads * hd, b.wo);
    addRows(w.ffnNorm, D, 0, b.ffnNorm);
    addRows(w.w1, D, rs.ffnOffset, b.w1);
    addRows(w.w3, D, rs.ffnOffset, b.w3);
    addCols(w.w2, D, c.ffnDim, rs.ffnOffset, s.localFfn, b.w2);
  }
  addRows(whole.norm, D, 0, g.norm);
  addRows(whole.output, D, s.vocabOffset, g.output);
}

//===----------------------------------------------------------------------===//
// Running the model
//===----------------------------------------------------------------------===//

struct Data {
  std::vector<int32_t> tokens, targets;
};

Data randomData(const LlamaConfig &c, const MicrobatchShape &shape,
                uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0,
                                           static_cast<int32_t>(c.vocab) - 1);
  Data d;
  for (int64_t i = 0; i < shape.batch * shape.seqLen; ++i) {
    d.tokens.push_back(u(rng));
    d.targets.push_back(u(rng));
  }
  return d;
}

BlockWeights blockWeights(const BlockParams &b) {
  return {b.attentionNorm.data(),
          b.wq.data(),
          b.wk.data(),
          b.wv.data(),
          b.wo.data(),
          b.ffnNorm.data(),
          b.w1.data(),
          b.w3.data(),
          b.w2.data()};
}

BlockGrads blockGrads(BlockParams &b) {
  return {b.attentionNorm.data(),
          b.wq.data(),
          b.wk.data(),
          b.wv.data(),
          b.wo.data(),
          b.ffnNorm.data(),
          b.w1.data(),
          b.w3.data(),
          b.w2.data()};
}

/// Forward only; the loss.
float forward(Microbatch &mb, const Params &w) {
  auto check = [](const Result<void> &r) {
    EXPECT_TRUE(r.ok()) << r.error().message;
  };
  check(mb.forwardEmbedding(w.embedding.data()));
  for (size_t l = 0; l < w.blocks.size(); ++l)
    check(mb.forwardBlock(static_cast<int64_t>(l), blockWeights(w.blocks[l])));
  check(mb.forwardFinalNorm(w.norm.data()));
  Result<float> loss = mb.forwardOutput(w.output.data());
  EXPECT_TRUE(loss.ok()) << loss.error().message;
  return loss.ok() ? *loss : NAN;
}

/// Backward into g (added to what it holds).
void backward(Microbatch &mb, const Params &w, Params &g, float lossScale) {
  auto check = [](const Result<void> &r) {
    EXPECT_TRUE(r.ok()) << r.error().message;
  };
  check(mb.backwardOutput(w.output.data(), lossScale, g.output.data()));
  check(mb.backwardFinalNorm(w.norm.data(), g.norm.data()));
  for (size_t l = w.blocks.size(); l-- > 0;)
    check(mb.backwardBlock(static_cast<int64_t>(l), blockWeights(w.blocks[l]),
                           blockGrads(g.blocks[l])));
  check(mb.backwardEmbedding(g.embedding.data()));
}

struct RunResult {
  float loss = 0;
  Params grads;
  double flops = 0;
};

RunResult runRank(const LlamaConfig &c, const RankShard &rs,
                  const MicrobatchShape &shape, const ModelOptions &opt,
                  TpGroup &tp, const Params &localWeights, const Data &d) {
  Microbatch mb(c, rs.tp, shape, opt, tp);
  Result<void> r = mb.setData(d.tokens, d.targets);
  EXPECT_TRUE(r.ok()) << r.error().message;
  RunResult out;
  out.grads = zeros(c, rs.tp);
  out.loss = forward(mb, localWeights);
  backward(mb, localWeights, out.grads, 1.0f);
  out.flops = mb.matmulFlops();
  return out;
}

RunResult runSolo(const LlamaConfig &c, const MicrobatchShape &shape,
                  const ModelOptions &opt, const Params &w, const Data &d) {
  SoloTpGroup solo;
  return runRank(c, {TpShard::whole(c), 0}, shape, opt, solo, w, d);
}

/// max |a - b| / max |b| over a tensor: a relative error that is not
/// dominated by elements that happen to be near zero.
double relError(const Vec &a, const Vec &b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

//===----------------------------------------------------------------------===//
// A naive double-precision reference of the model's loss
//===----------------------------------------------------------------------===//

double referenceLoss(const LlamaConfig &c, const Params &w, const Data &d,
                     const MicrobatchShape &shape) {
  int64_t B = shape.batch, T = shape.seqLen, D = c.dim, hd = c.headDim(),
          nH = c.nHeads, nKv = c.nKvHeads, F = c.ffnDim, V = c.vocab;
  using DVec = std::vector<double>;
  auto at = [](const Vec &v, int64_t i) { return double(v[size_t(i)]); };
  // y[n, o] = sum_i x[n, i] W[o, i]
  auto linear = [&](const DVec &x, int64_t rows, int64_t in, const Vec &W,
                    int64_t out) {
    DVec y(size_t(rows * out), 0.0);
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i)
          s += x[size_t(n * in + i)] * at(W, o * in + i);
        y[size_t(n * out + o)] = s;
      }
    return y;
  };
  auto norm = [&](const DVec &x, const Vec &wt) {
    DVec y(x.size());
    for (int64_t n = 0; n < B * T; ++n) {
      double ms = 0;
      for (int64_t j = 0; j < D; ++j)
        ms += x[size_t(n * D + j)] * x[size_t(n * D + j)];
      double r = 1.0 / std::sqrt(ms / double(D) + double(c.normEps));
      for (int64_t j = 0; j < D; ++j)
        y[size_t(n * D + j)] = x[size_t(n * D + j)] * r * at(wt, j);
    }
    return y;
  };
  // torchtitan's apply_rotary_emb: (x[2i] + i x[2i+1]) * e^(i t theta^(-2i/hd))
  auto rope = [&](DVec &x, int64_t heads) {
    for (int64_t n = 0; n < B * T; ++n)
      for (int64_t hh = 0; hh < heads; ++hh)
        for (int64_t i = 0; i < hd / 2; ++i) {
          double angle = double(n % T) *
                         std::pow(double(c.ropeTheta), -2.0 * i / double(hd));
          double *p = &x[size_t((n * heads + hh) * hd + 2 * i)];
          double x0 = p[0], x1 = p[1];
          p[0] = x0 * std::cos(angle) - x1 * std::sin(angle);
          p[1] = x0 * std::sin(angle) + x1 * std::cos(angle);
        }
  };

  DVec h(size_t(B * T * D));
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t j = 0; j < D; ++j)
      h[size_t(n * D + j)] = at(w.embedding, d.tokens[size_t(n)] * D + j);
  for (const BlockParams &b : w.blocks) {
    DVec x = norm(h, b.attentionNorm);
    DVec q = linear(x, B * T, D, b.wq, nH * hd);
    DVec k = linear(x, B * T, D, b.wk, nKv * hd);
    DVec v = linear(x, B * T, D, b.wv, nKv * hd);
    rope(q, nH);
    rope(k, nKv);
    DVec o(size_t(B * T * nH * hd), 0.0);
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t hh = 0; hh < nH; ++hh) {
        int64_t kv = hh / (nH / nKv);
        for (int64_t t = 0; t < T; ++t) {
          DVec s(size_t(t + 1));
          double mx = -1e300;
          for (int64_t u = 0; u <= t; ++u) { // causal: keys 0..t
            double dotp = 0;
            for (int64_t i = 0; i < hd; ++i)
              dotp += q[size_t(((bb * T + t) * nH + hh) * hd + i)] *
                      k[size_t(((bb * T + u) * nKv + kv) * hd + i)];
            s[size_t(u)] = dotp / std::sqrt(double(hd));
            mx = std::max(mx, s[size_t(u)]);
          }
          double sum = 0;
          for (double &e : s)
            sum += (e = std::exp(e - mx));
          for (int64_t u = 0; u <= t; ++u)
            for (int64_t i = 0; i < hd; ++i)
              o[size_t(((bb * T + t) * nH + hh) * hd + i)] +=
                  s[size_t(u)] / sum *
                  v[size_t(((bb * T + u) * nKv + kv) * hd + i)];
        }
      }
    DVec attn = linear(o, B * T, nH * hd, b.wo, D);
    for (size_t i = 0; i < h.size(); ++i)
      h[i] += attn[i];
    DVec x2 = norm(h, b.ffnNorm);
    DVec a = linear(x2, B * T, D, b.w1, F);
    DVec g = linear(x2, B * T, D, b.w3, F);
    for (size_t i = 0; i < a.size(); ++i)
      a[i] = a[i] / (1.0 + std::exp(-a[i])) * g[i];
    DVec ffn = linear(a, B * T, F, b.w2, D);
    for (size_t i = 0; i < h.size(); ++i)
      h[i] += ffn[i];
  }
  DVec logits = linear(norm(h, w.norm), B * T, D, w.output, V);
  double loss = 0;
  for (int64_t n = 0; n < B * T; ++n) {
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < V; ++j)
      mx = std::max(mx, logits[size_t(n * V + j)]);
    for (int64_t j = 0; j < V; ++j)
      sum += std::exp(logits[size_t(n * V + j)] - mx);
    loss += std::log(sum) + mx - logits[size_t(n * V + d.targets[size_t(n)])];
  }
  return loss / double(B * T);
}

//===----------------------------------------------------------------------===//
// The tiny model of the gradient checks
//===----------------------------------------------------------------------===//

LlamaConfig tinyConfig() {
  LlamaConfig c;
  c.dim = 16;
  c.nLayers = 2;
  c.nHeads = 4;
  c.nKvHeads = 2;
  c.ffnDim = 24;
  c.vocab = 32;
  // A small theta makes every RoPE frequency turn visibly over 6 positions,
  // so a wrong rotation cannot hide in the low frequencies.
  c.ropeTheta = 10.0f;
  return c;
}

/// Elements to check in a tensor: its 4 largest gradients and 8 random ones.
std::vector<size_t> sampleIndices(const Vec &grad, std::mt19937 &rng) {
  std::vector<size_t> order(grad.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 4, order.end(),
                    [&](size_t a, size_t b) {
                      return std::fabs(grad[a]) > std::fabs(grad[b]);
                    });
  std::vector<size_t> picked(order.begin(), order.begin() + 4);
  std::uniform_int_distribution<size_t> u(0, grad.size() - 1);
  for (int i = 0; i < 8; ++i)
    picked.push_back(u(rng));
  return picked;
}

TEST(LlamaTest, ForwardMatchesDoubleReference) {
  LlamaConfig c = tinyConfig();
  MicrobatchShape shape{2, 6};
  Params w = randomParams(c, 1, 0.4f);
  Data d = randomData(c, shape, 2);
  RunResult r = runSolo(c, shape, {}, w, d);
  double ref = referenceLoss(c, w, d, shape);
  std::printf("loss %.7f, double reference %.7f\n", r.loss, ref);
  EXPECT_NEAR(r.loss, ref, 1e-5 * std::fabs(ref));

  // Also with T > the attention's row block (128), so several causal row
  // blocks and their key ranges are exercised.
  MicrobatchShape longShape{1, 300};
  Data dl = randomData(c, longShape, 3);
  RunResult rl = runSolo(c, longShape, {}, w, dl);
  double refl = referenceLoss(c, w, dl, longShape);
  std::printf("seqLen 300: loss %.7f, double reference %.7f\n", rl.loss, refl);
  EXPECT_NEAR(rl.loss, refl, 1e-5 * std::fabs(refl));
}

TEST(LlamaTest, GradientsMatchFiniteDifferences) {
  LlamaConfig c = tinyConfig();
  MicrobatchShape shape{2, 6};
  Params w = randomParams(c, 1, 0.4f);
  Data d = randomData(c, shape, 2);
  RunResult r = runSolo(c, shape, {}, w, d);

  // The fp32 model's own loss, forward only, re-run on one Microbatch.
  SoloTpGroup solo;
  Microbatch mb(c, TpShard::whole(c), shape, {}, solo);
  ASSERT_TRUE(mb.setData(d.tokens, d.targets).ok());

  std::mt19937 rng(5);
  Params grads = r.grads;
  std::vector<std::pair<std::string, Vec *>> weights = w.tensors();
  std::vector<std::pair<std::string, Vec *>> gradTensors = grads.tensors();
  double worstRef = 0, worstFp32 = 0;
  for (size_t t = 0; t < weights.size(); ++t) {
    Vec &wt = *weights[t].second;
    const Vec &gt = *gradTensors[t].second;
    double gmax = 0;
    for (float g : gt)
      gmax = std::max(gmax, std::fabs(double(g)));
    ASSERT_GT(gmax, 1e-4) << weights[t].first << " has no gradient signal";
    double errRef = 0, errFp32 = 0;
    for (size_t i : sampleIndices(gt, rng)) {
      float orig = wt[i];
      // (1) The double reference: h = 1e-3 leaves a truncation error of
      // ~h^2 |f'''| ~ 1e-6 and a rounding error far below that, so the
      // difference measures the fp32 gradient's own error (~1e-6 relative).
      auto refAt = [&](float x) {
        wt[i] = x;
        return referenceLoss(c, w, d, shape);
      };
      double step = 1e-3;
      double fdRef = (refAt(orig + float(step)) - refAt(orig - float(step))) /
                     (double(orig + float(step)) - double(orig - float(step)));
      // (2) The fp32 model: its loss (~3.5) carries ~1e-6 of rounding noise,
      // so a large step keeps the noise's share small (1e-6 / 3e-2 ~ 3e-5)
      // and the five-point stencil keeps the truncation error O(h^4) ~ 1e-6.
      auto fp32At = [&](float x) {
        wt[i] = x;
        return double(forward(mb, w));
      };
      float h = 3e-2f;
      double fdFp32 = (8 * (fp32At(orig + h) - fp32At(orig - h)) -
                       (fp32At(orig + 2 * h) - fp32At(orig - 2 * h))) /
                      (12 * double(h));
      wt[i] = orig;
      errRef = std::max(errRef, std::fabs(fdRef - gt[i]));
      errFp32 = std::max(errFp32, std::fabs(fdFp32 - gt[i]));
    }
    errRef /= gmax;
    errFp32 /= gmax;
    worstRef = std::max(worstRef, errRef);
    worstFp32 = std::max(worstFp32, errFp32);
    // A wrong formula (a RoPE sign, a missing mask or norm term, a GQA
    // head mapping) errs by a sizeable fraction of the gradient, so these
    // bounds, ~20x above the measured errors, still catch it.
    EXPECT_LT(errRef, 1e-4) << weights[t].first << " against the reference";
    EXPECT_LT(errFp32, 2e-3) << weights[t].first << " against the fp32 model";
  }
  std::printf("worst finite-difference error relative to each tensor's "
              "largest gradient: %.3g (double reference), %.3g (fp32 model)\n",
              worstRef, worstFp32);
}

TEST(LlamaTest, GradientsAccumulateAndMicrobatchIsReusable) {
  LlamaConfig c = tinyConfig();
  MicrobatchShape shape{2, 6};
  Params w = randomParams(c, 1, 0.4f);
  Data d = randomData(c, shape, 2);
  SoloTpGroup solo;
  Microbatch mb(c, TpShard::whole(c), shape, {}, solo);
  ASSERT_TRUE(mb.setData(d.tokens, d.targets).ok());
  Params g1 = zeros(c, TpShard::whole(c));
  float loss1 = forward(mb, w);
  backward(mb, w, g1, 1.0f);
  // Again on the same Microbatch, with lossScale 2 into gradients that
  // already hold g1: the result must be g1 + 2 g1.
  ASSERT_TRUE(mb.setData(d.tokens, d.targets).ok());
  Params g2 = g1;
  float loss2 = forward(mb, w);
  backward(mb, w, g2, 2.0f);
  EXPECT_EQ(loss1, loss2);
  auto t1 = g1.tensors(), t2 = g2.tensors();
  for (size_t t = 0; t < t1.size(); ++t) {
    Vec expected = *t1[t].second;
    for (float &x : expected)
      x *= 3.0f;
    EXPECT_LT(relError(*t2[t].second, expected), 1e-6) << t1[t].first;
  }
}

TEST(LlamaTest, MatmulFlopsAreCounted) {
  LlamaConfig c = tinyConfig();
  MicrobatchShape shape{2, 6};
  Params w = randomParams(c, 1, 0.4f);
  RunResult r = runSolo(c, shape, {}, w, randomData(c, shape, 2));
  double N = 12, D = 16, T = 6, hd = 4, qd = 16, kd = 8, F = 24, V = 32,
         heads = 2 * 4; // batch * nHeads
  // Per layer, forward: q/k/v, the attention's two products (one row block
  // as T <= 128), wo, w1/w3/w2. Backward: twice each projection, and five
  // attention products (scores recomputed, dP, dV, dQ, dK).
  double projections =
      2 * N * D * (qd + 2 * kd) + 2 * N * qd * D + 3 * 2 * N * D * F;
  double attention = heads * 2 * (2 * T * T * hd);
  double layer = 3 * projections + attention + heads * 5 * (2 * T * T * hd);
  double expected = 2 * layer + 3 * 2 * N * V * D;
  EXPECT_EQ(r.flops, expected);
}

//===----------------------------------------------------------------------===//
// Tensor parallelism over threads
//===----------------------------------------------------------------------===//

/// The members' shared state: each publishes its buffer, all wait, each
/// reads what it needs, all wait again before anyone may touch a buffer.
struct SharedComm {
  explicit SharedComm(int64_t size)
      : size(size), barrier(static_cast<std::ptrdiff_t>(size)),
        pointers(static_cast<size_t>(size)) {}
  int64_t size;
  std::barrier<> barrier;
  std::vector<const float *> pointers;
};

class ThreadTpGroup final : public TpGroup {
public:
  ThreadTpGroup(SharedComm &comm, int64_t rank) : comm(comm), r(rank) {}
  int64_t size() const override { return comm.size; }
  int64_t rank() const override { return r; }

  Result<void> allGather(const float *in, float *out, int64_t count) override {
    publish(in);
    for (int64_t k = 0; k < comm.size; ++k)
      std::copy_n(comm.pointers[size_t(k)], count, out + k * count);
    comm.barrier.arrive_and_wait();
    return {};
  }
  Result<void> reduceScatter(const float *in, float *out,
                             int64_t count) override {
    return reduce(in, out, count, r * count, false);
  }
  Result<void> allReduceSum(float *data, int64_t count) override {
    return reduce(data, data, count, 0, false);
  }
  Result<void> allReduceMax(float *data, int64_t count) override {
    return reduce(data, data, count, 0, true);
  }

private:
  void publish(const float *p) {
    comm.pointers[size_t(r)] = p;
    comm.barrier.arrive_and_wait();
  }
  /// Members combine in rank order, so every member gets the same bits.
  Result<void> reduce(const float *in, float *out, int64_t count,
                      int64_t offset, bool max) {
    publish(in);
    tmp.assign(comm.pointers[0] + offset, comm.pointers[0] + offset + count);
    for (int64_t k = 1; k < comm.size; ++k)
      for (int64_t i = 0; i < count; ++i) {
        float x = comm.pointers[size_t(k)][offset + i];
        tmp[size_t(i)] = max ? std::max(tmp[size_t(i)], x) : tmp[size_t(i)] + x;
      }
    comm.barrier.arrive_and_wait();
    std::copy(tmp.begin(), tmp.end(), out);
    return {};
  }

  SharedComm &comm;
  int64_t r;
  Vec tmp;
};

struct TpCase {
  std::string name;
  LlamaConfig config;
  MicrobatchShape shape;
  /// Per rank: kv heads, ffn rows, vocabulary rows.
  std::vector<int64_t> kvHeads, ffn, vocab;
};

std::vector<RankShard> makeShards(const TpCase &tc) {
  std::vector<RankShard> shards;
  int64_t group = tc.config.nHeads / tc.config.nKvHeads;
  int64_t kvOff = 0, ffnOff = 0, vocabOff = 0;
  for (size_t r = 0; r < tc.kvHeads.size(); ++r) {
    RankShard s;
    s.tp.localKvHeads = tc.kvHeads[r];
    s.tp.kvHeadOffset = kvOff;
    s.tp.localHeads = tc.kvHeads[r] * group;
    s.tp.headOffset = kvOff * group;
    s.tp.localFfn = tc.ffn[r];
    s.ffnOffset = ffnOff;
    s.tp.vocabLocal = tc.vocab[r];
    s.tp.vocabOffset = vocabOff;
    kvOff += tc.kvHeads[r];
    ffnOff += tc.ffn[r];
    vocabOff += tc.vocab[r];
    shards.push_back(s);
  }
  return shards;
}

/// Runs every rank on its own thread; returns each rank's result.
std::vector<RunResult> runTp(const TpCase &tc, const ModelOptions &opt,
                             const Params &w, const Data &d) {
  std::vector<RankShard> shards = makeShards(tc);
  int64_t P = static_cast<int64_t>(shards.size());
  SharedComm comm(P);
  std::vector<RunResult> results(shards.size());
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      ThreadTpGroup tp(comm, r);
      const RankShard &s = shards[size_t(r)];
      EXPECT_TRUE(checkModel(tc.config, s.tp, tc.shape, P).ok());
      results[size_t(r)] = runRank(tc.config, s, tc.shape, opt, tp,
                                   shardParams(tc.config, w, s), d);
    });
  for (std::thread &t : threads)
    t.join();
  return results;
}

std::vector<TpCase> tpCases() {
  LlamaConfig gqa = tinyConfig(); // 4 heads, 2 kv heads
  LlamaConfig mha = tinyConfig();
  mha.nKvHeads = 4;
  LlamaConfig wide = tinyConfig(); // groups of 2 over 3 kv heads
  wide.dim = 24;
  wide.nHeads = 6;
  wide.nKvHeads = 3;
  return {
      {"P=2 even", gqa, {2, 6}, {1, 1}, {12, 12}, {16, 16}},
      {"P=2 uneven heads, ffn and vocabulary",
       wide,
       {2, 6},
       {1, 2},
       {10, 14},
       {13, 19}},
      {"P=2 uneven, batch 1", wide, {1, 6}, {2, 1}, {15, 9}, {20, 12}},
      {"P=2, seqLen 260 (several attention row blocks)",
       gqa,
       {1, 260},
       {1, 1},
       {12, 12},
       {16, 16}},
      {"P=4 uneven ffn and vocabulary",
       mha,
       {3, 8},
       {1, 1, 1, 1},
       {5, 7, 6, 6},
       {7, 9, 8, 8}},
  };
}

TEST(LlamaTest, TensorParallelEqualsOneRank) {
  for (const TpCase &tc : tpCases()) {
    SCOPED_TRACE(tc.name);
    Params w = randomParams(tc.config, 7, 0.4f);
    Data d = randomData(tc.config, tc.shape, 8);
    RunResult solo = runSolo(tc.config, tc.shape, {}, w, d);
    std::vector<RunResult> ranks = runTp(tc, {}, w, d);
    std::vector<RankShard> shards = makeShards(tc);

    Params assembled = zeros(tc.config, TpShard::whole(tc.config));
    for (size_t r = 0; r < ranks.size(); ++r) {
      EXPECT_EQ(ranks[r].loss, ranks[0].loss) << "rank " << r;
      addShardGrads(tc.config, assembled, ranks[r].grads, shards[r]);
    }
    double lossErr = std::fabs(double(ranks[0].loss) - double(solo.loss)) /
                     std::fabs(double(solo.loss));
    double worst = 0;
    std::string worstName;
    auto ta = assembled.tensors(), ts = solo.grads.tensors();
    for (size_t t = 0; t < ta.size(); ++t) {
      double e = relError(*ta[t].second, *ts[t].second);
      EXPECT_LT(e, 1e-5) << ta[t].first;
      if (e > worst) {
        worst = e;
        worstName = ta[t].first;
      }
    }
    EXPECT_LT(lossErr, 1e-5);
    std::printf("%s: loss relative error %.3g, worst gradient relative error "
                "%.3g (%s)\n",
                tc.name.c_str(), lossErr, worst, worstName.c_str());
  }
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

template <typename T>
bool mentions(const Result<T> &r, const std::string &text) {
  return !r.ok() && r.error().message.find(text) != std::string::npos;
}

TEST(LlamaTest, CheckModelRejectsBadConfigurations) {
  LlamaConfig c = tinyConfig();
  TpShard whole = TpShard::whole(c);
  EXPECT_TRUE(checkModel(c, whole, {2, 6}, 1).ok());

  // seqLen not divisible by the TP size.
  TpShard half;
  half.localHeads = 2;
  half.localKvHeads = 1;
  half.localFfn = 12;
  half.vocabLocal = 16;
  EXPECT_TRUE(checkModel(c, half, {2, 6}, 2).ok());
  Result<void> r = checkModel(c, half, {2, 7}, 2);
  EXPECT_TRUE(mentions(r, "seqLen (7)")) << (r.ok() ? "" : r.error().message);

  // A GQA group (2 query heads per kv head) split across ranks.
  TpShard split = half;
  split.headOffset = 1;
  r = checkModel(c, split, {2, 6}, 2);
  EXPECT_TRUE(mentions(r, "GQA")) << (r.ok() ? "" : r.error().message);
  split = half;
  split.localHeads = 1;
  EXPECT_TRUE(mentions(checkModel(c, split, {2, 6}, 2), "GQA"));

  // Bad dimensions.
  LlamaConfig bad = c;
  bad.dim = 18; // not divisible by 4 heads
  EXPECT_TRUE(
      mentions(checkModel(bad, TpShard::whole(bad), {2, 6}, 1), "dim (18)"));
  bad = c;
  bad.nKvHeads = 3;
  EXPECT_TRUE(mentions(checkModel(bad, TpShard::whole(bad), {2, 6}, 1),
                       "nKvHeads (3)"));
  bad = c;
  bad.dim = 8; // head dimension 2 is fine, 12 / 4 = 3 is odd
  EXPECT_TRUE(checkModel(bad, TpShard::whole(bad), {2, 6}, 1).ok());
  bad.dim = 12;
  EXPECT_TRUE(
      mentions(checkModel(bad, TpShard::whole(bad), {2, 6}, 1), "even"));
  bad = c;
  bad.vocab = 0;
  EXPECT_TRUE(mentions(checkModel(bad, whole, {2, 6}, 1), "vocab"));
  EXPECT_TRUE(mentions(checkModel(c, whole, {0, 6}, 1), "batch"));

  // Shard ranges and a partial shard on one rank.
  TpShard over = half;
  over.vocabOffset = 20;
  EXPECT_TRUE(mentions(checkModel(c, over, {2, 6}, 2), "vocabulary rows"));
  EXPECT_TRUE(mentions(checkModel(c, half, {2, 6}, 1), "whole model"));
}

TEST(LlamaTest, SetDataRejectsBadTokens) {
  LlamaConfig c = tinyConfig();
  MicrobatchShape shape{2, 6};
  SoloTpGroup solo;
  Microbatch mb(c, TpShard::whole(c), shape, {}, solo);
  Data d = randomData(c, shape, 2);
  EXPECT_TRUE(mb.setData(d.tokens, d.targets).ok());
  Data bad = d;
  bad.tokens[5] = 32;
  Result<void> r = mb.setData(bad.tokens, bad.targets);
  EXPECT_TRUE(mentions(r, "tokens[5] = 32"))
      << (r.ok() ? "" : r.error().message);
  bad = d;
  bad.targets[0] = -1;
  EXPECT_TRUE(mentions(mb.setData(bad.tokens, bad.targets), "targets[0]"));
  bad = d;
  bad.targets.pop_back();
  EXPECT_TRUE(mentions(mb.setData(bad.tokens, bad.targets), "11 entries"));

  // A Microbatch whose configuration is bad says so on setData.
  Microbatch odd(c, TpShard::whole(c), {2, 7}, {}, solo);
  EXPECT_TRUE(
      odd.setData(std::vector<int32_t>(14, 0), std::vector<int32_t>(14, 0))
          .ok()); // seqLen 7 is fine with one rank
  TpShard partial = TpShard::whole(c);
  partial.localFfn = 10;
  Microbatch part(c, partial, shape, {}, solo);
  EXPECT_TRUE(mentions(part.setData(d.tokens, d.targets), "whole model"));
}

TEST(LlamaTest, SegmentsMustRunInOrder) {
  LlamaConfig c = tinyConfig();
  MicrobatchShape shape{2, 6};
  Params w = randomParams(c, 1, 0.4f);
  Params g = zeros(c, TpShard::whole(c));
  Data d = randomData(c, shape, 2);
  SoloTpGroup solo;
  Microbatch mb(c, TpShard::whole(c), shape, {}, solo);

  EXPECT_TRUE(
      mentions(mb.forwardEmbedding(w.embedding.data()), "before setData"));
  ASSERT_TRUE(mb.setData(d.tokens, d.targets).ok());
  BlockWeights b0 = blockWeights(w.blocks[0]), b1 = blockWeights(w.blocks[1]);
  Result<void> r = mb.forwardBlock(0, b0);
  EXPECT_TRUE(mentions(r, "expected forwardEmbedding"))
      << (r.ok() ? "" : r.error().message);
  EXPECT_TRUE(
      mentions(mb.backwardOutput(w.output.data(), 1.0f, g.output.data()),
               "expected forwardEmbedding"));
  ASSERT_TRUE(mb.forwardEmbedding(w.embedding.data()).ok());
  EXPECT_TRUE(mentions(mb.forwardBlock(1, b1), "expected forwardBlock(0)"));
  EXPECT_TRUE(mentions(mb.forwardBlock(2, b1), "outside [0, 2)"));
  ASSERT_TRUE(mb.forwardBlock(0, b0).ok());
  ASSERT_TRUE(mb.forwardBlock(1, b1).ok());
  EXPECT_TRUE(
      mentions(mb.forwardOutput(w.output.data()), "expected forwardFinalNorm"));
  ASSERT_TRUE(mb.forwardFinalNorm(w.norm.data()).ok());
  ASSERT_TRUE(mb.forwardOutput(w.output.data()).ok());
  EXPECT_TRUE(mentions(mb.backwardFinalNorm(w.norm.data(), g.norm.data()),
                       "expected backwardOutput"));
  ASSERT_TRUE(mb.backwardOutput(w.output.data(), 1.0f, g.output.data()).ok());
  ASSERT_TRUE(mb.backwardFinalNorm(w.norm.data(), g.norm.data()).ok());
  EXPECT_TRUE(mentions(mb.backwardBlock(0, b0, blockGrads(g.blocks[0])),
                       "expected backwardBlock(1)"));
  EXPECT_TRUE(mentions(mb.forwardEmbedding(w.embedding.data()),
                       "expected backwardBlock(1)"));
  BlockWeights missing = b1;
  missing.w3 = nullptr;
  EXPECT_TRUE(mentions(mb.backwardBlock(1, missing, blockGrads(g.blocks[1])),
                       "w3 is null"));
  ASSERT_TRUE(mb.backwardBlock(1, b1, blockGrads(g.blocks[1])).ok());
  ASSERT_TRUE(mb.backwardBlock(0, b0, blockGrads(g.blocks[0])).ok());
  ASSERT_TRUE(mb.backwardEmbedding(g.embedding.data()).ok());
  EXPECT_TRUE(
      mentions(mb.backwardEmbedding(g.embedding.data()), "microbatch is done"));
  // A finished microbatch may run forward again on the same data.
  EXPECT_TRUE(mb.forwardEmbedding(w.embedding.data()).ok());
}

//===----------------------------------------------------------------------===//
// bf16 matmuls
//===----------------------------------------------------------------------===//

TEST(LlamaTest, Bf16MatmulsStayCloseToFp32) {
  LlamaConfig c = tinyConfig();
  MicrobatchShape shape{2, 6};
  Params w = randomParams(c, 1, 0.4f);
  Data d = randomData(c, shape, 2);
  RunResult fp32 = runSolo(c, shape, {}, w, d);
  ModelOptions bf16;
  bf16.bf16Matmul = true;
  RunResult low = runSolo(c, shape, bf16, w, d);
  std::printf("loss fp32 %.6f, bf16 matmuls %.6f\n", fp32.loss, low.loss);
  EXPECT_NEAR(low.loss, fp32.loss, 1e-2);
  EXPECT_NE(low.loss, fp32.loss) << "bf16 rounding had no effect";
  double worst = 0;
  auto tl = low.grads.tensors(), tf = fp32.grads.tensors();
  for (size_t t = 0; t < tl.size(); ++t) {
    double e = relError(*tl[t].second, *tf[t].second);
    worst = std::max(worst, e);
    // bf16 keeps 8 significant bits (relative rounding ~4e-3 per input).
    EXPECT_LT(e, 5e-2) << tl[t].first;
  }
  std::printf("bf16 matmuls: worst gradient relative error %.3g\n", worst);

  // With TP, the same rounding (up to the sums' order).
  TpCase tc = tpCases()[1];
  Params ww = randomParams(tc.config, 7, 0.4f);
  Data dd = randomData(tc.config, tc.shape, 8);
  RunResult soloBf16 = runSolo(tc.config, tc.shape, bf16, ww, dd);
  std::vector<RunResult> ranks = runTp(tc, bf16, ww, dd);
  EXPECT_NEAR(ranks[0].loss, soloBf16.loss, 1e-3);
}

} // namespace
