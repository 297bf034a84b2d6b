//===- LlamaCudaTest.cpp - The example model on a GPU against the CPU -----===//
//
// The model is written once over ModelOps (model/ModelOps.h); LlamaTest
// checks it on the CPU ops against a double-precision reference and finite
// differences. This suite runs the same Microbatch on the CUDA ops
// (cuBLAS, the model's kernels) and compares the loss and every gradient
// with the CPU's: close in fp32 (summation orders differ), close at bf16's
// precision with bf16 matmuls, and bit-identical between two GPU runs (no
// atomics anywhere). Without a CUDA device every test skips and the binary
// exits 77 (ctest: Skipped).
//
//===----------------------------------------------------------------------===//
#include "model/Llama.h"
#include "model/cuda/CudaOps.h"

#include "../Runtime/CudaTestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::trainer;

namespace {

using Vec = std::vector<float>;

LlamaConfig config() {
  LlamaConfig c;
  c.dim = 64;
  c.nLayers = 2;
  c.nHeads = 4;
  c.nKvHeads = 2;
  c.ffnDim = 96;
  c.vocab = 100;
  c.ropeTheta = 10000.0f;
  return c;
}

/// Every weight of the model, host vectors, in a fixed order.
struct Weights {
  std::vector<Vec> tensors; // embedding, 9 per layer, norm, output
};

Weights randomWeights(const LlamaConfig &c, uint32_t seed) {
  int64_t D = c.dim, hd = c.headDim();
  std::vector<std::pair<int64_t, bool>> shapes = {{c.vocab * D, false}};
  for (int64_t l = 0; l < c.nLayers; ++l)
    for (auto s :
         std::vector<std::pair<int64_t, bool>>{{D, true},
                                               {c.nHeads * hd * D, false},
                                               {c.nKvHeads * hd * D, false},
                                               {c.nKvHeads * hd * D, false},
                                               {D * c.nHeads * hd, false},
                                               {D, true},
                                               {c.ffnDim * D, false},
                                               {c.ffnDim * D, false},
                                               {D * c.ffnDim, false}})
      shapes.push_back(s);
  shapes.push_back({D, true});
  shapes.push_back({c.vocab * D, false});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Weights w;
  for (auto [n, norm] : shapes) {
    Vec t(static_cast<size_t>(n));
    for (float &x : t)
      x = norm ? 1.0f + 0.3f * u(rng) : 0.1f * u(rng);
    w.tensors.push_back(std::move(t));
  }
  return w;
}

struct Outcome {
  float loss = 0;
  std::vector<Vec> grads; ///< as Weights::tensors
  Vec stream;             ///< the embedding's input gradient, sequence shard
};

/// One forward and backward of `mb` on `ops`; the weights are uploaded to
/// (and the gradients read back from) the ops' memory.
Outcome run(ModelOps &ops, const LlamaConfig &c, const MicrobatchShape &shape,
            const ModelOptions &opt, const Weights &w, uint32_t dataSeed,
            int repeats = 1) {
  SoloTpGroup solo;
  std::vector<OpsBuffer<float>> dw(w.tensors.size()), dg(w.tensors.size());
  for (size_t i = 0; i < w.tensors.size(); ++i) {
    int64_t n = int64_t(w.tensors[i].size());
    EXPECT_TRUE(dw[i].allocate(ops, n).ok());
    EXPECT_TRUE(dg[i].allocate(ops, n).ok());
    ops.upload(dw[i].data(), w.tensors[i].data(), dw[i].bytes());
  }
  std::mt19937 rng(dataSeed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab) - 1);
  std::vector<int32_t> tokens, targets;
  for (int64_t i = 0; i < shape.batch * shape.seqLen; ++i) {
    tokens.push_back(tok(rng));
    targets.push_back(tok(rng));
  }
  auto block = [&](int64_t l, std::vector<OpsBuffer<float>> &b) {
    size_t at = 1 + size_t(l) * 9;
    return std::vector<float *>{
        b[at].data(),     b[at + 1].data(), b[at + 2].data(),
        b[at + 3].data(), b[at + 4].data(), b[at + 5].data(),
        b[at + 6].data(), b[at + 7].data(), b[at + 8].data()};
  };
  auto ok = [](const Result<void> &r) {
    EXPECT_TRUE(r.ok()) << r.error().message;
  };
  Microbatch mb(c, TpShard::whole(c), shape, opt, solo, ops);
  Outcome out;
  size_t last = w.tensors.size() - 1;
  for (int rep = 0; rep < repeats; ++rep) {
    ok(mb.setData(tokens, targets));
    ok(mb.forwardEmbedding(dw[0].data()));
    for (int64_t l = 0; l < c.nLayers; ++l) {
      auto p = block(l, dw);
      ok(mb.forwardBlock(
          l, {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]}));
    }
    ok(mb.forwardFinalNorm(dw[last - 1].data()));
    auto loss = mb.forwardOutput(dw[last].data());
    EXPECT_TRUE(loss.ok()) << loss.error().message;
    out.loss = loss.ok() ? *loss : NAN;
    ok(mb.backwardOutput(dw[last].data(), 1.0f, dg[last].data()));
    ok(mb.backwardFinalNorm(dw[last - 1].data(), dg[last - 1].data()));
    for (int64_t l = c.nLayers - 1; l >= 0; --l) {
      auto p = block(l, dw);
      auto g = block(l, dg);
      ok(mb.backwardBlock(
          l, {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]},
          {g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]}));
    }
    auto s = mb.stream();
    EXPECT_TRUE(s.ok());
    if (s.ok())
      out.stream.assign(s->begin(), s->end());
    ok(mb.backwardEmbedding(dg[0].data()));
  }
  for (size_t i = 0; i < dg.size(); ++i) {
    Vec g(w.tensors[i].size());
    ok(ops.download(g.data(), dg[i].data(), dg[i].bytes()));
    out.grads.push_back(std::move(g));
  }
  return out;
}

/// max |a - b| / max |b| (0 for two zero tensors).
double relativeError(const Vec &a, const Vec &b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

class LlamaCudaTest : public ::testing::Test {
protected:
  void SetUp() override {
    MESHPLAN_REQUIRE_CUDA_DEVICE();
    auto ops = createCudaOps(0);
    ASSERT_TRUE(ops.ok()) << ops.error().message;
    gpu = std::move(*ops);
  }
  void compare(const MicrobatchShape &shape, bool bf16, double tolerance) {
    LlamaConfig c = config();
    Weights w = randomWeights(c, 7);
    ModelOptions opt;
    opt.bf16Matmul = bf16;
    Outcome cpu = run(hostOps(), c, shape, opt, w, 11);
    Outcome gpuRun = run(*gpu, c, shape, opt, w, 11);
    EXPECT_NEAR(gpuRun.loss, cpu.loss, tolerance * std::fabs(cpu.loss));
    for (size_t i = 0; i < cpu.grads.size(); ++i)
      EXPECT_LE(relativeError(gpuRun.grads[i], cpu.grads[i]), tolerance)
          << "gradient of weight " << i;
    EXPECT_LE(relativeError(gpuRun.stream, cpu.stream), tolerance);
  }
  std::unique_ptr<ModelOps> gpu;
};

TEST_F(LlamaCudaTest, Fp32MatchesTheCpu) {
  compare({3, 8}, false, 1e-4);
  // Over 128 positions the CPU splits attention into row blocks; the GPU
  // takes the whole sequence.
  compare({2, 160}, false, 1e-4);
}

TEST_F(LlamaCudaTest, Bf16MatmulsMatchTheCpuAtBf16Precision) {
  compare({3, 8}, true, 3e-2);
  compare({2, 160}, true, 3e-2);
}

TEST_F(LlamaCudaTest, RunsAreBitIdenticalAndGradientsAccumulate) {
  LlamaConfig c = config();
  Weights w = randomWeights(c, 3);
  MicrobatchShape shape{2, 16};
  Outcome a = run(*gpu, c, shape, {}, w, 5);
  Outcome b = run(*gpu, c, shape, {}, w, 5);
  EXPECT_EQ(a.loss, b.loss);
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_EQ(a.grads[i], b.grads[i]) << "weight " << i;
  // The same microbatch twice on one Microbatch: gradients add up.
  Outcome twice = run(*gpu, c, shape, {}, w, 5, 2);
  for (size_t i = 0; i < a.grads.size(); ++i) {
    Vec doubled = a.grads[i];
    for (float &x : doubled)
      x *= 2;
    EXPECT_LE(relativeError(twice.grads[i], doubled), 1e-5) << "weight " << i;
  }
}

TEST_F(LlamaCudaTest, MissingDeviceIsAnError) {
  auto ops = createCudaOps(1 << 20);
  EXPECT_FALSE(ops.ok());
}

} // namespace

int main(int argc, char **argv) {
  return meshplan::test::cudaTestMain(argc, argv, "trainer.cuda.model");
}
