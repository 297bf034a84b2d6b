//===- Reference.cpp - The single-process run meshplan-train compares to --===//
//
// `meshplan-train --reference` trains the same model on the same global
// batch in one process, on whole tensors, without the runtime: every
// data-parallel slice of every microbatch through the same model code, the
// parameters cast as the plan casts them (bf16; float8 with the whole
// tensor's amax scale, which is what the plan's all-reduced amax gives), the
// gradients combined in the plan's order (sum over microbatches, average over
// extra axes, then over shard axes, then over replicas; docs/semantics.md),
// and the same AdamW kernels. A distributed run that agrees with it has
// trained the model a plan promises.
//
//===----------------------------------------------------------------------===//

#include "Trainer.h"

#include "meshplan/Runtime/Kernels.h"

#include <chrono>
#include <cstdio>
#include <map>

namespace k = meshplan::runtime::kernels;

namespace meshplan::trainer {

namespace {
struct RefTensor {
  std::string name;
  int64_t id = 0;
  plan::DType master = plan::DType::Float32;
  plan::DType seen = plan::DType::Float32;
  std::optional<plan::Fp8Scale> scale;
  std::vector<int64_t> shape;
  std::vector<float> w, m, v, seenW, grad;
};

void addInto(std::vector<float> &acc, const std::vector<float> &x) {
  for (size_t i = 0; i < acc.size(); ++i)
    acc[i] += x[i];
}
void scale(std::vector<float> &x, int64_t n) {
  if (n == 1)
    return;
  for (float &v : x)
    v /= static_cast<float>(n);
}
} // namespace

int runReference(const TrainFlags &flags, const Planned &planned,
                 const TextData &data) {
  auto plan0 = planned.prepared->instantiate(0, false);
  if (!plan0)
    fatal(plan0.error().message);
  std::map<std::string, RefTensor> tensors;
  for (const plan::Buffer &b : plan0->buffers) {
    if (b.kind != plan::BufferKind::ParamShard)
      continue;
    RefTensor &t = tensors[b.tensor];
    t.name = b.tensor;
    t.id = b.tensorId.value_or(0);
    t.master = b.dtype;
    t.seen = b.dtype;
    t.shape = b.globalShape;
    int64_t n = 1;
    for (int64_t d : t.shape)
      n *= d;
    t.w.resize(size_t(n));
    for (int64_t g = 0; g < n; ++g) {
      float x = initialValue(flags.seed, t.name, g, t.shape);
      t.w[size_t(g)] = t.master == plan::DType::BFloat16
                           ? k::bf16ToFloat(k::floatToBf16(x))
                           : x;
    }
    t.m.assign(size_t(n), 0.0f);
    t.v.assign(size_t(n), 0.0f);
  }
  // What the compute callbacks read: the dtype (and float8 scale) of the
  // buffers compute instructions take.
  for (const plan::Instruction &in : plan0->program)
    if (in.op == plan::OpKind::Compute)
      for (const std::string &id : in.inputs)
        for (const plan::Buffer &b : plan0->buffers)
          if (b.id == id && tensors.count(b.tensor)) {
            tensors[b.tensor].seen = b.dtype;
            tensors[b.tensor].scale = b.scale;
          }
  if (!plan0->optimizer)
    fatal("the plan has no optimizer");
  const plan::OptimizerConfig &o = *plan0->optimizer;
  k::AdamWParams hp{o.lr, o.beta1, o.beta2, o.eps, o.weightDecay};

  const LlamaConfig &c = planned.config;
  TpShard shard = TpShard::whole(c);
  MicrobatchShape shape{flags.batch, flags.seqLen};
  SoloTpGroup solo;
  if (auto ok = checkModel(c, shard, shape, 1); !ok)
    fatal(ok.error().message);
  const AxisRoles &r = planned.roles;
  int64_t M = planned.microbatches;
  int64_t tokensPerStep =
      r.dataParallel() * M * flags.batch * flags.seqLen;
  std::printf("meshplan-train --reference: model %s in one process; %lld "
              "data-parallel slices x %lld microbatches x %lld sequences of "
              "%lld tokens = %lld tokens per step; %s matmuls\n",
              planned.spec.model->name.c_str(), (long long)r.dataParallel(),
              (long long)M, (long long)flags.batch, (long long)flags.seqLen,
              (long long)tokensPerStep,
              planned.modelOptions.bf16Matmul ? "bf16-input" : "fp32");

  std::vector<int32_t> tokens, targets;
  auto zeros = [&](const std::string &name) {
    return std::vector<float>(tensors.at(name).w.size(), 0.0f);
  };
  for (int64_t step = 1; step <= flags.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    for (auto &[name, t] : tensors) {
      t.seenW = t.w;
      emulateCast(t.seenW, t.seen, t.scale);
    }
    auto w = [&](const std::string &n) { return tensors.at(n).seenW.data(); };
    double lossSum = 0;
    std::map<std::string, std::vector<float>> replicaSum;
    for (auto &[name, t] : tensors)
      replicaSum[name] = zeros(name);
    for (int64_t rep = 0; rep < r.replicas; ++rep) {
      std::map<std::string, std::vector<float>> shardSum;
      for (auto &[name, t] : tensors)
        shardSum[name] = zeros(name);
      for (int64_t sh = 0; sh < r.shards; ++sh) {
        std::map<std::string, std::vector<float>> acc;
        for (auto &[name, t] : tensors)
          acc[name] = zeros(name);
        for (int64_t mb = 0; mb < M; ++mb) {
          std::map<std::string, std::vector<float>> extraSum;
          for (auto &[name, t] : tensors)
            extraSum[name] = zeros(name);
          for (int64_t e = 0; e < r.extras; ++e) {
            int64_t d = (rep * r.shards + sh) * r.extras + e;
            std::map<std::string, std::vector<float>> g;
            for (auto &[name, t] : tensors)
              g[name] = zeros(name);
            auto gr = [&](const std::string &n) { return g.at(n).data(); };
            Microbatch run(c, shard, shape, planned.modelOptions, solo);
            data.fill(flags.seed, step, mb, d * flags.batch, flags.batch,
                      flags.seqLen, tokens, targets);
            auto check = [](Result<void> ok) {
              if (!ok)
                fatal(ok.error().message);
            };
            check(run.setData(tokens, targets));
            check(run.forwardEmbedding(w("tok_embeddings.weight")));
            auto block = [&](int64_t l) {
              std::string p = "layers." + std::to_string(l) + ".";
              return BlockWeights{w(p + "attention_norm.weight"),
                                  w(p + "attention.wq.weight"),
                                  w(p + "attention.wk.weight"),
                                  w(p + "attention.wv.weight"),
                                  w(p + "attention.wo.weight"),
                                  w(p + "ffn_norm.weight"),
                                  w(p + "feed_forward.w1.weight"),
                                  w(p + "feed_forward.w3.weight"),
                                  w(p + "feed_forward.w2.weight")};
            };
            for (int64_t l = 0; l < c.nLayers; ++l)
              check(run.forwardBlock(l, block(l)));
            check(run.forwardFinalNorm(w("norm.weight")));
            auto loss = run.forwardOutput(w("output.weight"));
            if (!loss)
              fatal(loss.error().message);
            lossSum += *loss;
            if (flags.syntheticGrads) {
              // As the ranks do: the whole value on microbatch 0 only.
              if (mb == 0)
                for (auto &[name, v] : g)
                  for (size_t i = 0; i < v.size(); ++i)
                    v[i] = syntheticGrad(name, int64_t(i), step);
            } else {
              check(run.backwardOutput(w("output.weight"), 1.0f / float(M),
                                       gr("output.weight")));
              check(run.backwardFinalNorm(w("norm.weight"), gr("norm.weight")));
              for (int64_t l = c.nLayers - 1; l >= 0; --l) {
                std::string p = "layers." + std::to_string(l) + ".";
                BlockGrads bg{gr(p + "attention_norm.weight"),
                              gr(p + "attention.wq.weight"),
                              gr(p + "attention.wk.weight"),
                              gr(p + "attention.wv.weight"),
                              gr(p + "attention.wo.weight"),
                              gr(p + "ffn_norm.weight"),
                              gr(p + "feed_forward.w1.weight"),
                              gr(p + "feed_forward.w3.weight"),
                              gr(p + "feed_forward.w2.weight")};
                check(run.backwardBlock(l, block(l), bg));
              }
              check(run.backwardEmbedding(gr("tok_embeddings.weight")));
            }
            for (auto &[name, v] : g)
              addInto(extraSum[name], v);
          }
          for (auto &[name, v] : extraSum) {
            scale(v, r.extras);
            addInto(acc[name], v);
          }
        }
        for (auto &[name, v] : acc)
          addInto(shardSum[name], v);
      }
      for (auto &[name, v] : shardSum) {
        scale(v, r.shards);
        addInto(replicaSum[name], v);
      }
    }
    for (auto &[name, t] : tensors) {
      std::vector<float> &grad = replicaSum[name];
      scale(grad, r.replicas);
      if (t.master == plan::DType::BFloat16) {
        std::vector<uint16_t> bits(t.w.size());
        for (size_t i = 0; i < bits.size(); ++i)
          bits[i] = k::floatToBf16(t.w[i]);
        std::vector<k::IndexRun> runs{{0, 0, int64_t(t.w.size())}};
        k::adamwBf16StochasticRounding(bits, grad, t.m, t.v, hp, step,
                                       uint64_t(o.seed), uint64_t(t.id),
                                       runs);
        for (size_t i = 0; i < bits.size(); ++i)
          t.w[i] = k::bf16ToFloat(bits[i]);
      } else {
        k::adamwFp32(t.w, grad, t.m, t.v, hp, step);
      }
    }
    double wall = std::chrono::duration<double>(
                      std::chrono::steady_clock::now() - start)
                      .count();
    double loss = lossSum / double(r.dataParallel() * M);
    if (step % flags.logEvery == 0 || step == flags.steps) {
      std::printf("step %lld/%lld loss %.4f tok/s %.0f | step %.1f ms\n",
                  (long long)step, (long long)flags.steps, loss,
                  double(tokensPerStep) / wall, wall * 1e3);
      std::fflush(stdout);
    }
  }
  if (!flags.saveParams.empty()) {
    std::vector<DumpBox> boxes;
    for (auto &[name, t] : tensors) {
      DumpBox b;
      b.tensor = name;
      b.bf16 = t.master == plan::DType::BFloat16;
      b.globalShape = t.shape;
      b.offset.assign(t.shape.size(), 0);
      b.localShape = t.shape;
      b.values = t.w;
      boxes.push_back(std::move(b));
    }
    if (auto ok = writeDump(flags.saveParams, 0, boxes); !ok)
      fatal(ok.error().message);
  }
  return 0;
}

} // namespace meshplan::trainer
