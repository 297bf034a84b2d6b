//===- Reference.cpp - The single-process run meshplan-train compares to --===//
//
// `meshplan-train --reference` trains the same model on the same global
// batch in one process, on whole tensors, without the runtime: every
// data-parallel slice of every microbatch through the same model code, the
// parameters cast as the plan casts them (bf16; float8 with the whole
// tensor's amax scale, which is what the plan's all-reduced amax gives), the
// gradients combined in the plan's order (average over extra axes; sum over
// microbatches before the average over shard axes, or after it when every
// microbatch is reduced; then the average over replicas; docs/semantics.md),
// and the same AdamW kernels. A distributed run that agrees with it has
// trained the model a plan promises.
//
//===----------------------------------------------------------------------===//

#include "Trainer.h"

#include "meshplan/Core/GradNorm.h"
#include "meshplan/Runtime/Kernels.h"

#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <thread>

namespace k = meshplan::runtime::kernels;

namespace meshplan::trainer {

namespace {

/// The members of one TP group as threads of this process. Sums are taken
/// in key order, as the runtime's backend takes them (GlooBackend.cpp,
/// orderMatters), so each member computes what the rank of that key does.
class LocalTpGroup {
public:
  explicit LocalTpGroup(int64_t n)
      : n(n), sync(std::ptrdiff_t(n)), slots(size_t(n), nullptr) {
    for (int64_t k = 0; k < n; ++k)
      members.push_back(std::make_unique<Member>(*this, k));
  }
  TpGroup &member(int64_t k) { return *members[size_t(k)]; }

private:
  struct Member final : TpGroup {
    Member(LocalTpGroup &g, int64_t k) : g(g), k(k) {}
    int64_t size() const override { return g.n; }
    int64_t rank() const override { return k; }
    Result<void> allGather(const float *in, float *out,
                           int64_t count) override {
      g.slots[size_t(k)] = in;
      g.sync.arrive_and_wait();
      for (int64_t j = 0; j < g.n; ++j)
        std::memcpy(out + j * count, g.slots[size_t(j)], size_t(count) * 4);
      g.sync.arrive_and_wait();
      return {};
    }
    Result<void> reduceScatter(const float *in, float *out,
                               int64_t count) override {
      g.slots[size_t(k)] = in;
      g.sync.arrive_and_wait();
      std::memcpy(out, g.slots[0] + k * count, size_t(count) * 4);
      for (int64_t j = 1; j < g.n; ++j)
        for (int64_t i = 0; i < count; ++i)
          out[i] += g.slots[size_t(j)][k * count + i];
      g.sync.arrive_and_wait();
      return {};
    }
    Result<void> reduce(float *data, int64_t count, bool max) {
      g.slots[size_t(k)] = data;
      g.sync.arrive_and_wait();
      std::vector<float> r(g.slots[0], g.slots[0] + count);
      for (int64_t j = 1; j < g.n; ++j)
        for (int64_t i = 0; i < count; ++i) {
          float x = g.slots[size_t(j)][i];
          r[size_t(i)] = max ? std::max(r[size_t(i)], x) : r[size_t(i)] + x;
        }
      g.sync.arrive_and_wait();
      std::memcpy(data, r.data(), size_t(count) * 4);
      return {};
    }
    Result<void> allReduceSum(float *data, int64_t count) override {
      return reduce(data, count, false);
    }
    Result<void> allReduceMax(float *data, int64_t count) override {
      return reduce(data, count, true);
    }
    LocalTpGroup &g;
    int64_t k;
  };
  int64_t n;
  std::barrier<> sync;
  std::vector<const float *> slots;
  std::vector<std::unique_ptr<Member>> members;
};

/// Copies box (offset, local) of a whole row-major tensor out (or in).
void copyBox(const std::vector<int64_t> &global,
             const std::vector<int64_t> &offset,
             const std::vector<int64_t> &local, const float *whole, float *box,
             bool into) {
  auto runs = k::boxIndexRuns(global, offset, local);
  if (!runs)
    fatal("a compute buffer's box lies outside its tensor");
  for (const k::IndexRun &r : *runs)
    for (int64_t i = 0; i < r.length; ++i) {
      if (into)
        const_cast<float *>(whole)[r.global + i] = box[r.local + i];
      else
        box[r.local + i] = whole[r.global + i];
    }
}

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

using Gradients = std::map<std::string, std::vector<float>>;

/// A member of rank 0's TP group: its share and boxes, from its plans. The
/// reference runs each data-parallel slice on P threads that compute what
/// those ranks compute.
struct TpMember {
  TpShard shard;
  std::map<std::string, const plan::Buffer *> boxes;
  std::vector<plan::Plan> plans; ///< stagePlansOf the member's rank
};

/// One --reference run, in the steps runReference takes: the whole tensors
/// and the optimizer from rank 0's plans (loadTensors), the TP group's
/// members (setUpTpGroup), the pipeline's bf16 stage boundaries
/// (findStageBoundaries), then per step the gradient of the global batch
/// reduced in the plan's order (stepGradient, over runSlice), clipped and
/// applied (clipAndUpdate).
class ReferenceRun {
public:
  ReferenceRun(const TrainFlags &flags, const Planned &planned,
               const TextData &data)
      : flags(flags), planned(planned), data(data),
        c(planned.config), shape{flags.batch, flags.seqLen}, r(planned.roles),
        M(planned.microbatches) {}

  void run();

private:
  void loadTensors();
  void setUpTpGroup();
  void findStageBoundaries();
  void printHeader() const;
  std::vector<float> zeros(const std::string &name) const {
    return std::vector<float>(tensors.at(name).w.size() * size_t(rows.at(name)),
                              0.0f);
  }
  Gradients zeroGradients() const {
    Gradients g;
    for (auto &[name, t] : tensors)
      g[name] = zeros(name);
    return g;
  }
  float runSlice(int64_t step, int64_t mb, int64_t d, Gradients &g);
  void runMember(int64_t t, LocalTpGroup &group,
                 const std::vector<int32_t> &tokens,
                 const std::vector<int32_t> &targets, Gradients &W,
                 Gradients &G, float &loss) const;
  Gradients sliceGradient(int64_t step, int64_t rep, int64_t sh, int64_t mb,
                          double &lossSum);
  Gradients stepGradient(int64_t step, double &lossSum);
  std::string clipAndUpdate(int64_t step, Gradients &grads);
  void saveParams() const;

  const TrainFlags &flags;
  const Planned &planned;
  const TextData &data;
  const LlamaConfig &c;
  MicrobatchShape shape;
  const AxisRoles &r;
  int64_t M;

  std::map<std::string, RefTensor> tensors;
  const plan::OptimizerConfig *o = nullptr;
  k::AdamWParams hp;
  /// Every stage's no-decay parameters (each stage's plan lists its own).
  std::set<std::string> noDecay;
  std::vector<plan::Plan> plans0;
  std::vector<TpMember> members;
  int64_t P = 1;
  /// Sequence-parallel norms: one partial gradient per TP rank (the plan's
  /// stacked gradient), summed in key order after the data-parallel
  /// average.
  std::map<std::string, int64_t> rows;
  bool reduceEveryMicrobatch = false;
  int64_t tokensPerStep = 0;
  /// boundaryAfter[f]: a pipeline stage ends after forward segment f (0 the
  /// embedding, 1 + l block l, L + 1 the final norm, L + 2 the output).
  std::vector<bool> boundaryAfter;
};

void check(Result<void> ok) {
  if (!ok)
    fatal(ok.error().message);
}

/// Rank 0's plan and, under a pipeline, those of the ranks that hold the
/// other stages: together every parameter, as it is cast and split.
void ReferenceRun::loadTensors() {
  auto stagePlans = stagePlansOf(planned, 0);
  if (!stagePlans)
    fatal(stagePlans.error().message);
  plans0 = std::move(*stagePlans);
  const plan::Plan *plan0 = &plans0.front();
  for (const plan::Plan &stagePlan : plans0)
    for (const plan::Buffer &b : stagePlan.buffers) {
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
  for (const auto &[name, b] : computeInputs(plans0))
    if (tensors.count(name)) {
      tensors[name].seen = b->dtype;
      tensors[name].scale = b->scale;
    }
  if (!plan0->optimizer)
    fatal("the plan has no optimizer");
  o = &*plan0->optimizer;
  hp = k::AdamWParams{o->lr, o->beta1, o->beta2, o->eps, o->weightDecay};
  for (const plan::Plan &stagePlan : plans0)
    if (stagePlan.optimizer)
      noDecay.insert(stagePlan.optimizer->noDecay.begin(),
                     stagePlan.optimizer->noDecay.end());
}

/// The TP group of rank 0 (one member without TP or with
/// --plain-reference), and the rows of each tensor's gradient.
void ReferenceRun::setUpTpGroup() {
  const plan::Plan *plan0 = &plans0.front();
  if (!planned.roles.tp.empty()) {
    const plan::Communicator *tpComm = nullptr;
    for (const plan::Communicator &cm : plan0->communicators)
      if (cm.axes == std::vector<std::string>{planned.roles.tp})
        tpComm = &cm;
    if (!tpComm)
      fatal("the plan has no communicator over the TP axis");
    P = int64_t(tpComm->ranks.size());
    members.resize(size_t(P));
    for (int64_t t = 0; t < P; ++t) {
      auto pt = stagePlansOf(planned, tpComm->ranks[size_t(t)]);
      if (!pt)
        fatal(pt.error().message);
      members[size_t(t)].plans = std::move(*pt);
    }
    for (TpMember &m : members) {
      auto sh = tpShardOf(m.plans, c);
      if (!sh)
        fatal(sh.error().message);
      m.shard = *sh;
      m.boxes = computeInputs(m.plans);
    }
  }
  if (flags.plainReference)
    P = 1;
  if (P == 1) {
    members.assign(1, TpMember{});
    members[0].shard = TpShard::whole(c);
  }
  for (const TpMember &m : members)
    if (auto ok = checkModel(c, m.shard, shape, P); !ok)
      fatal(ok.error().message);
  for (auto &[name, t] : tensors) {
    auto site = siteOf(name);
    bool norm = site && (site->segment == ParamSite::FinalNorm ||
                         site->leaf.ends_with("norm"));
    rows[name] = norm ? P : 1;
  }
}

/// A pipeline with bf16 activations (the compute dtype) rounds the residual
/// stream where a stage ends: forward, the stage's output as its rank
/// writes act.s<s>.mb<m>; backward, the gradient of the next stage's input
/// as that rank writes actgrad.s<s+1>.mb<m> (Train.cpp, handOn).
void ReferenceRun::findStageBoundaries() {
  boundaryAfter.assign(size_t(c.nLayers + 3), false);
  if (!planned.spec.pipeline ||
      planned.spec.spec.mixedPrecision.paramDtype != frontend::DType::BFloat16)
    return;
  const auto &stages = planned.spec.pipeline->stages;
  for (size_t st = 0; st + 1 < stages.size(); ++st) {
    int64_t lastSegment = -1;
    for (const std::string &name : stages[st].paramNames) {
      auto site = siteOf(name);
      if (!site)
        fatal(site.error().message);
      int64_t seg = site->segment == ParamSite::Embedding   ? 0
                    : site->segment == ParamSite::Block     ? 1 + site->layer
                    : site->segment == ParamSite::FinalNorm ? c.nLayers + 1
                                                            : c.nLayers + 2;
      lastSegment = std::max(lastSegment, seg);
    }
    if (lastSegment < 0 || lastSegment >= c.nLayers + 2)
      fatal("pipeline stage " + std::to_string(st) +
            " ends at no segment boundary the model has");
    boundaryAfter[size_t(lastSegment)] = true;
  }
}

void ReferenceRun::printHeader() const {
  std::printf("meshplan-train --reference: model %s in one process; %lld "
              "data-parallel slices x %lld microbatches x %lld sequences of "
              "%lld tokens = %lld tokens per step; %s matmuls; %s\n",
              planned.spec.model->name.c_str(), (long long)r.dataParallel(),
              (long long)M, (long long)flags.batch, (long long)flags.seqLen,
              (long long)tokensPerStep,
              planned.modelOptions.bf16Matmul ? "bf16-input" : "fp32",
              P > 1 ? ("tensor parallel over " + std::to_string(P) +
                       " threads (the TP ranks' order of sums)")
                          .c_str()
                    : "no tensor parallelism");
}

/// TP member t's forward and backward of one slice, on its weights W (its
/// boxes of the cast parameters) into its gradients G.
void ReferenceRun::runMember(int64_t t, LocalTpGroup &group,
                             const std::vector<int32_t> &tokens,
                             const std::vector<int32_t> &targets, Gradients &W,
                             Gradients &G, float &loss) const {
  auto w = [&](const std::string &n) { return W.at(n).data(); };
  auto gr = [&](const std::string &n) { return G.at(n).data(); };
  Microbatch run(c, members[size_t(t)].shard, shape, planned.modelOptions,
                 group.member(t));
  // After forward segment f, and after the backward of segment f + 1,
  // when a stage ends after f (bf16 boundaries only).
  auto boundary = [&](int64_t f) {
    if (boundaryAfter[size_t(f)])
      run.roundStreamToBf16();
  };
  check(run.setData(tokens, targets));
  check(run.forwardEmbedding(w("tok_embeddings.weight")));
  boundary(0);
  auto block = [&](int64_t l) { return blockWeights(l, w); };
  for (int64_t l = 0; l < c.nLayers; ++l) {
    check(run.forwardBlock(l, block(l)));
    boundary(1 + l);
  }
  check(run.forwardFinalNorm(w("norm.weight")));
  boundary(c.nLayers + 1);
  auto result = run.forwardOutput(w("output.weight"));
  if (!result)
    fatal(result.error().message);
  loss = *result;
  if (flags.syntheticGrads)
    return;
  check(run.backwardOutput(w("output.weight"), 1.0f / float(M),
                           gr("output.weight")));
  boundary(c.nLayers + 1);
  check(run.backwardFinalNorm(w("norm.weight"), gr("norm.weight")));
  boundary(c.nLayers);
  for (int64_t l = c.nLayers - 1; l >= 0; --l) {
    check(run.backwardBlock(l, block(l), blockGrads(l, gr)));
    boundary(l);
  }
  check(run.backwardEmbedding(gr("tok_embeddings.weight")));
}

/// One data-parallel slice of one microbatch on the TP members: adds its
/// gradients into g (zeroed by the caller), returns the loss.
float ReferenceRun::runSlice(int64_t step, int64_t mb, int64_t d,
                             Gradients &g) {
  std::vector<int32_t> tokens, targets;
  data.fill(flags.seed, step, mb, d * flags.batch, flags.batch, flags.seqLen,
            tokens, targets);
  LocalTpGroup group(P);
  std::vector<float> losses(size_t(P), 0.0f);
  std::vector<Gradients> localW(static_cast<size_t>(P)),
      localG(static_cast<size_t>(P));
  for (int64_t t = 0; t < P; ++t)
    for (auto &[name, tensor] : tensors) {
      std::vector<float> &w = localW[size_t(t)][name];
      if (P == 1) {
        w = tensor.seenW;
      } else {
        const plan::Buffer *b = members[size_t(t)].boxes.at(name);
        int64_t n = 1;
        for (int64_t x : b->localShape)
          n *= x;
        w.resize(size_t(n));
        copyBox(tensor.shape, b->offset, b->localShape, tensor.seenW.data(),
                w.data(), false);
      }
      localG[size_t(t)][name].assign(w.size(), 0.0f);
    }
  auto work = [&](int64_t t) {
    runMember(t, group, tokens, targets, localW[size_t(t)], localG[size_t(t)],
              losses[size_t(t)]);
  };
  if (P == 1) {
    work(0);
  } else {
    std::vector<std::thread> threads;
    for (int64_t t = 0; t < P; ++t)
      threads.emplace_back(work, t);
    for (std::thread &th : threads)
      th.join();
  }
  if (flags.syntheticGrads) {
    // As the ranks do: the whole value on microbatch 0 (row 0) only.
    if (mb == 0)
      for (auto &[name, v] : g)
        for (size_t i = 0; i < tensors.at(name).w.size(); ++i)
          v[i] = syntheticGrad(name, int64_t(i), step);
    return losses[0];
  }
  for (auto &[name, v] : g) {
    const RefTensor &tensor = tensors.at(name);
    for (int64_t t = 0; t < P; ++t) {
      const std::vector<float> &lg = localG[size_t(t)][name];
      if (P == 1)
        v = lg;
      else if (rows[name] > 1)
        std::copy(lg.begin(), lg.end(), v.begin() + t * int64_t(lg.size()));
      else {
        const plan::Buffer *b = members[size_t(t)].boxes.at(name);
        copyBox(tensor.shape, b->offset, b->localShape, v.data(),
                const_cast<float *>(lg.data()), true);
      }
    }
  }
  return losses[0];
}

/// One data-parallel slice's gradient of one microbatch, averaged over the
/// extra axes (as the backward callbacks do).
Gradients ReferenceRun::sliceGradient(int64_t step, int64_t rep, int64_t sh,
                                      int64_t mb, double &lossSum) {
  Gradients extraSum = zeroGradients();
  for (int64_t e = 0; e < r.extras; ++e) {
    int64_t d = (rep * r.shards + sh) * r.extras + e;
    Gradients g = zeroGradients();
    lossSum += runSlice(step, mb, d, g);
    for (auto &[name, v] : g)
      addInto(extraSum[name], v);
  }
  for (auto &[name, v] : extraSum)
    scale(v, r.extras);
  return extraSum;
}

/// The step's gradient of the global batch, reduced in the plan's order
/// (docs/semantics.md, "Gradient accumulation"); adds the slices' losses
/// into lossSum.
Gradients ReferenceRun::stepGradient(int64_t step, double &lossSum) {
  Gradients replicaSum = zeroGradients();
  for (int64_t rep = 0; rep < r.replicas; ++rep) {
    Gradients replicaGrad = zeroGradients();
    if (reduceEveryMicrobatch) {
      // Each microbatch averaged over the shards (its reduce-scatter),
      // then added into the accumulated shard.
      for (int64_t mb = 0; mb < M; ++mb) {
        Gradients shardSum = zeroGradients();
        for (int64_t sh = 0; sh < r.shards; ++sh)
          for (auto &[name, v] : sliceGradient(step, rep, sh, mb, lossSum))
            addInto(shardSum[name], v);
        for (auto &[name, v] : shardSum) {
          scale(v, r.shards);
          addInto(replicaGrad[name], v);
        }
      }
    } else {
      // Each slice's microbatches summed locally (the unsharded
      // gradient), then averaged over the shards once.
      for (int64_t sh = 0; sh < r.shards; ++sh) {
        Gradients acc = zeroGradients();
        for (int64_t mb = 0; mb < M; ++mb)
          for (auto &[name, v] : sliceGradient(step, rep, sh, mb, lossSum))
            addInto(acc[name], v);
        for (auto &[name, v] : acc)
          addInto(replicaGrad[name], v);
      }
      for (auto &[name, v] : replicaGrad)
        scale(v, r.shards);
    }
    for (auto &[name, v] : replicaGrad)
      addInto(replicaSum[name], v);
  }
  for (auto &[name, v] : replicaSum) {
    scale(v, r.replicas);
    // The TP ranks' partial norm gradients, summed in key order.
    size_t n = tensors.at(name).w.size();
    for (int64_t row = 1; row < rows[name]; ++row)
      for (size_t i = 0; i < n; ++i)
        v[i] += v[size_t(row) * n + i];
    v.resize(n);
  }
  return replicaSum;
}

/// Clips the step's gradients and applies AdamW; returns the log line's
/// norm text ("" without clipping).
std::string ReferenceRun::clipAndUpdate(int64_t step, Gradients &replicaSum) {
  // Clipping on whole tensors: core's exact norm gives the bits every
  // layout's ranks reduce to, and the same coefficient scales each
  // element in fp32, as clip_grad does.
  if (step == nanGradStepForTests())
    replicaSum.at("tok_embeddings.weight")[0] =
        std::numeric_limits<float>::quiet_NaN();
  bool skip = false;
  std::string normText;
  if (o->maxNorm) {
    std::vector<int64_t> acc(size_t(gradNormBufferLength(o->normType)), 0);
    for (auto &[name, grad] : replicaSum)
      accumulateGradNorm(o->normType, grad, acc);
    double norm = gradNormOf(o->normType, acc);
    skip = !std::isfinite(norm);
    float coefficient = skip ? 1.0f : clipCoefficient(*o->maxNorm, norm);
    char text[96];
    std::snprintf(text, sizeof(text), " grad norm %.4g (clip %.4g)", norm,
                  double(coefficient));
    normText = text;
    if (skip)
      std::printf("step %lld: gradient norm %g is not finite; the update "
                  "was skipped\n",
                  (long long)step, norm);
    else if (coefficient != 1.0f)
      for (auto &[name, grad] : replicaSum)
        for (float &x : grad)
          x *= coefficient;
  }
  hp.lr = o->lrAt(step);
  for (auto &[name, t] : tensors) {
    if (skip)
      break;
    std::vector<float> &grad = replicaSum[name];
    hp.weightDecay = noDecay.count(name) ? 0.0 : o->weightDecay;
    if (t.master == plan::DType::BFloat16) {
      std::vector<uint16_t> bits(t.w.size());
      for (size_t i = 0; i < bits.size(); ++i)
        bits[i] = k::floatToBf16(t.w[i]);
      std::vector<k::IndexRun> runs{{0, 0, int64_t(t.w.size())}};
      k::adamwBf16StochasticRounding(bits, grad, t.m, t.v, hp, step,
                                     uint64_t(o->seed), uint64_t(t.id), runs);
      for (size_t i = 0; i < bits.size(); ++i)
        t.w[i] = k::bf16ToFloat(bits[i]);
    } else {
      k::adamwFp32(t.w, grad, t.m, t.v, hp, step);
    }
  }
  return normText;
}

void ReferenceRun::saveParams() const {
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

void ReferenceRun::run() {
  loadTensors();
  setUpTpGroup();
  // docs/semantics.md, "Gradient accumulation": the order of the sums
  // depends on when the plan reduces. A pipeline's microbatches are reduced
  // once, after each stage's last backward (dist-lower-pipeline;
  // docs/pipeline.md, "Planning"), whatever the accumulation mode says.
  reduceEveryMicrobatch = M > 1 && !planned.spec.pipeline &&
                          planned.spec.spec.accumulationReduce ==
                              frontend::AccumulationReduce::EveryMicrobatch;
  tokensPerStep = r.dataParallel() * M * flags.batch * flags.seqLen;
  printHeader();
  findStageBoundaries();

  for (int64_t step = 1; step <= flags.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    for (auto &[name, t] : tensors) {
      t.seenW = t.w;
      emulateCast(t.seenW, t.seen, t.scale);
    }
    double lossSum = 0;
    Gradients grads = stepGradient(step, lossSum);
    std::string normText = clipAndUpdate(step, grads);
    double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    double loss = lossSum / double(r.dataParallel() * M);
    if (step % flags.logEvery == 0 || step == flags.steps) {
      std::printf("step %lld/%lld loss %.4f%s lr %.4g tok/s %.0f | step "
                  "%.1f ms\n",
                  (long long)step, (long long)flags.steps, loss,
                  normText.c_str(), hp.lr, double(tokensPerStep) / wall,
                  wall * 1e3);
      std::fflush(stdout);
    }
  }
  if (!flags.saveParams.empty())
    saveParams();
}

} // namespace

int runReference(const TrainFlags &flags, const Planned &planned,
                 const TextData &data) {
  ReferenceRun(flags, planned, data).run();
  return 0;
}

} // namespace meshplan::trainer
