//===- Train.cpp - meshplan-train: a Llama 3 model trained by the runtime -===//
//
// One process per rank (started by `meshplan run`, torchrun or Slurm). Each
// plans the spec in-process (the same plan on every rank; under a pipeline
// one template per pp coordinate), opens its rank's Session and registers one
// compute callback: the runtime gathers, casts, reduces, updates and passes
// pipeline stages' activations; the callback runs the forward or backward of
// the FSDP unit it is given on this rank's slice of the global batch, with
// tensor-parallel collectives on the plan's TP communicator.
//
// With --device cuda the plan runs on this rank's GPU (NCCL by default) and
// the model on the same GPU through the CUDA ModelOps (cuBLAS). The
// callbacks still receive host copies of their views (computeOnHost): the
// parameters go up to the GPU and the gradients come back per call, and the
// trainer's own host-side collectives (the loss, extra axes) are staged
// through device memory when the communicator is NCCL's.
//
//   meshplan run -n 8 -- meshplan-train --spec examples/specs/fsdp-fp8-3d.json
//                                        --model tiny --steps 100
//
// docs/trainer.md describes the flags, the output and the checks.
//
//===----------------------------------------------------------------------===//

#include "Metrics.h"
#include "RankTrainer.h"
#include "TestHooks.h"

#include "CommandLine.h"

#include "meshplan/Core/PipelineSchedule.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Runtime/Kernels.h"
#include "meshplan/Runtime/Session.h"
#include "meshplan/Support/Timing.h"

#if MESHPLAN_HAVE_CUDA
#include "meshplan/Runtime/CudaDevice.h"
#include "model/cuda/CudaOps.h"
#endif

#include <cblas.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <thread>
#include <tuple>
#include <unistd.h>

using namespace meshplan;
using namespace meshplan::trainer;
using namespace meshplan::runtime;
namespace k = meshplan::runtime::kernels;
using Clock = SteadyClock;

namespace {

const char *kUsage =
    "usage: meshplan-train --spec FILE [--model NAME|FILE] [--steps N]\n"
    "                      [--batch B] [--seq-len T] [--seed S] [--data PATH]\n"
    "                      [--save-params DIR] [--resume-after K]\n"
    "                      [--load-checkpoint DIR] [--save-checkpoint DIR\n"
    "                      [--checkpoint-every N]]\n"
    "                      [--synthetic-grads] [--log-every N] [--cost-model]\n"
    "                      [--reference | --plain-reference]\n"
    "                      [--device cpu|cuda | --host-device]\n"
    "                      [--device-timing]\n"
    "                      [--trace DIR [--trace-steps A:B]]\n"
    "                      [--metrics FILE]\n"
    "       meshplan-train --compare DIR_A DIR_B [--rtol X]\n"
    "Run one process per rank under `meshplan run -n WORLD -- meshplan-train "
    "...`;\n--reference runs the same global batch in this one process. "
    "docs/trainer.md\nhas the details.\n";

[[noreturn]] void usageError(const std::string &message) {
  std::fprintf(stderr, "meshplan-train: error: %s\n", message.c_str());
  std::exit(2);
}

/// `text` as an integer in [min, max] (--trace-steps' two ends), or a usage
/// error naming `flag`.
int64_t parseCount(const std::string &flag, const std::string &text,
                   int64_t min, int64_t max) {
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || errno || v < min || v > max)
    usageError(flag + ": expected an integer in [" + std::to_string(min) +
               ", " + std::to_string(max) + "], got \"" + text + "\"");
  return v;
}

float readElement(const TensorView &v, int64_t i);

} // namespace

const plan::Communicator *
meshplan::trainer::commOverAxis(const plan::Plan &p, const std::string &axis) {
  const plan::Communicator *found = nullptr;
  for (const plan::Communicator &c : p.communicators)
    if (c.axes == std::vector<std::string>{axis} &&
        (!found || c.id.starts_with("trainer_")))
      found = &c;
  return found;
}

namespace {
float readElement(const TensorView &v, int64_t i) {
  switch (v.dtype()) {
  case DType::Float32:
    return v.as<float>()[size_t(i)];
  case DType::BFloat16:
    return k::bf16ToFloat(v.as<uint16_t>()[size_t(i)]);
  default:
    return 0;
  }
}
} // namespace

Result<void> RankTrainer::open(const std::string &jobSuffix) {
  SessionOptions o = options;
  o.job += jobSuffix;
  if (flags.hostDevice)
    o.device = createHostDevice();
  o.deviceTiming = flags.deviceTiming;
  if (!flags.traceDir.empty()) {
    StepTraceOptions t;
    t.dir = flags.traceDir;
    if (flags.traceSteps) {
      t.firstStep = flags.traceSteps->first;
      t.lastStep = flags.traceSteps->second;
    } else {
      t.firstStep = std::min<int64_t>(2, flags.steps);
      t.lastStep = std::min<int64_t>(6, flags.steps);
    }
    o.trace = t;
  }
  auto s = Session::openTemplate(planned.templateFor(options.rank), o);
  if (!s)
    return s.error();
  session = std::move(*s);
  hostComms.setDevice(session->device());
  if (flags.cuda) {
#if MESHPLAN_HAVE_CUDA
    int64_t index =
        session->device() ? cudaDeviceIndex(*session->device()) : -1;
    if (index < 0)
      return makeError("--device cuda: the session does not run on a GPU");
    opsWeights.clear();
    opsGrads.clear();
    auto ops = createCudaOps(index);
    if (!ops)
      return ops.error();
    gpuOps = std::move(*ops);
#else
    return makeError("--device cuda: this build has no CUDA backend");
#endif
  }
  const plan::Plan &p = session->plan();
  auto d = dataParallelIndex(planned, p.rank);
  if (!d)
    return d.error();
  dpIndex = *d;
  shareDp = dpIndex;
  shape = {flags.batch, flags.seqLen};

  // Under a pipeline this rank's plan holds its stages only; the TP split is
  // read from the plans of all stages at this rank's other coordinates.
  auto stagePlans = stagePlansOf(planned, p.rank);
  if (!stagePlans)
    return stagePlans.error();
  auto tpShard = tpShardOf(*stagePlans, planned.config);
  if (!tpShard)
    return tpShard.error();
  // The loss exists on the ranks of the last stage: the first of them (all
  // other coordinates 0) prints.
  printerRank = 0;
  if (const auto &pp = planned.spec.pipeline) {
    const Mesh &mesh = *planned.spec.mesh;
    printerRank =
        mesh.rankAt(pp->stages.back().rank * mesh.stride(pp->axisIndex));
  }
  shard = *tpShard;
  const LlamaConfig &c = planned.config;

  // Communicators for the trainer's own collectives; every rank asks for
  // them in the same order.
  tpSeconds = 0;
  if (!planned.roles.tp.empty()) {
    const plan::Communicator *pc = commOverAxis(p, planned.roles.tp);
    if (!pc)
      return makeError("the plan has no communicator over the TP axis \"" +
                       planned.roles.tp + "\"");
    auto comm = session->trainerCommunicator(pc->id);
    if (!comm)
      return comm.error();
    tp = std::make_unique<CommTpGroup>(*comm, modelOps(), tpSeconds);
  } else {
    tp = std::make_unique<SoloTpGroup>();
  }
  MESHPLAN_TRY(checkModel(c, shard, shape, tp->size()));
  extraComms.clear();
  lossComms.clear();
  for (const std::string &axis : planned.roles.extra) {
    const plan::Communicator *pc = commOverAxis(p, axis);
    if (!pc)
      return makeError("the plan has no communicator over the extra axis \"" +
                       axis + "\"");
    auto comm = session->trainerCommunicator(pc->id);
    if (!comm)
      return comm.error();
    extraComms.push_back(*comm);
  }
  const AxisRoles &r = planned.roles;
  for (const auto *axes : {&r.replicate, &r.shard, &r.extra})
    for (const std::string &axis : *axes) {
      const plan::Communicator *pc = commOverAxis(p, axis);
      // A fault_tolerant communicator's members change at run time: the
      // loss printed is then the replica group's.
      if (!pc || (pc->faultTolerant && options.faultTolerance)) {
        lossIsGlobal = false;
        continue;
      }
      auto comm = session->trainerCommunicator(pc->id);
      if (!comm)
        return comm.error();
      lossComms.push_back(*comm);
    }

  // The model computes on the host: on a device session its views are
  // copied out and its gradients back (computeOnHost).
  session->onCompute([this](ComputeCall &call) {
    return session->computeOnHost(
        call, [this](ComputeCall &onHost) { return onCompute(onHost); });
  });
  return {};
}

Result<void> RankTrainer::onCompute(ComputeCall &call) {
  maybeKillForTests(call, session->rank());
  // The parameters as fp32 values: bf16 widened, float8 dequantized with
  // the step's scale.
  for (const TensorView &v : call.params) {
    if (v.buffer->kind == plan::BufferKind::Activation)
      continue; // a stage's input or output gradient: forward/backward
    std::vector<float> &w = weights[v.tensor()];
    int64_t n = v.numElements();
    w.resize(size_t(n));
    switch (v.dtype()) {
    case DType::Float32:
      std::memcpy(w.data(), v.bytes.data(), size_t(n) * 4);
      break;
    case DType::BFloat16:
      for (int64_t i = 0; i < n; ++i)
        w[size_t(i)] = k::bf16ToFloat(v.as<uint16_t>()[size_t(i)]);
      break;
    case DType::Float8E4M3:
    case DType::Float8E5M2:
      if (!v.scale)
        return makeError(v.id() + ": float8 without a scale");
      k::dequantFp8(v.as<uint8_t>(), *v.scale, w,
                    v.dtype() == DType::Float8E4M3 ? k::Fp8Format::E4M3FN
                                                   : k::Fp8Format::E5M2);
      break;
    default:
      return makeError(v.id() + ": meshplan-train reads float32, bfloat16 "
                                "and float8 parameters");
    }
    if (gpuOps) {
      OpsBuffer<float> &d = opsWeights[v.tensor()];
      if (d.size() != n)
        MESHPLAN_TRY(d.allocate(*gpuOps, n));
      gpuOps->upload(d.data(), w.data(), d.bytes());
    }
  }
  auto runShare = [&]() -> Result<void> {
    if (call.phase == "forward")
      return forward(call);
    MESHPLAN_TRY(backward(call));
    poisonGradientForTests(call);
    return {};
  };
  if (call.shares.empty() || (call.shares.size() == 1 && call.shares[0] == 0))
    return runShare();
  // A replica group is missing: this rank also runs the shares of the
  // batch assigned to it (docs/fault-tolerance.md). The session hands one
  // share per call where it keeps the shares' sums apart (the exact sums of
  // the full job), or all of them, which then add into the same gradients.
  auto ft = session->faultTolerance();
  if (!ft)
    return makeError("a compute call names batch shares outside fault "
                     "tolerance");
  for (int64_t k : call.shares) {
    if (k < 0 || size_t(k) >= ft->dataRanks.size())
      return makeError("batch share " + std::to_string(k) + " of " +
                       std::to_string(ft->dataRanks.size()));
    auto d = dataParallelIndex(planned, ft->dataRanks[size_t(k)]);
    if (!d)
      return d.error();
    share = k;
    shareDp = *d;
    Result<void> ok = runShare();
    share = 0;
    shareDp = dpIndex;
    MESHPLAN_TRY(ok);
  }
  return {};
}

namespace {

/// The segments of a unit, in forward order.
struct UnitSegments {
  bool embedding = false, finalNorm = false, output = false;
  std::map<int64_t, int> blocks; ///< layer -> leaves present
};

Result<UnitSegments> segmentsOf(const ComputeCall &call) {
  UnitSegments u;
  for (const TensorView &v : call.params) {
    if (v.buffer->kind == plan::BufferKind::Activation)
      continue;
    auto site = siteOf(v.tensor());
    if (!site)
      return site.error();
    switch (site->segment) {
    case ParamSite::Embedding:
      u.embedding = true;
      break;
    case ParamSite::FinalNorm:
      u.finalNorm = true;
      break;
    case ParamSite::Output:
      u.output = true;
      break;
    case ParamSite::Block:
      ++u.blocks[site->layer];
      break;
    }
  }
  for (const auto &[layer, leaves] : u.blocks)
    if (leaves != 9)
      return makeError("unit \"" + call.unit + "\" holds " +
                       std::to_string(leaves) + " of the 9 weights of layers." +
                       std::to_string(layer) +
                       "; meshplan-train runs whole blocks (use "
                       "data_parallel.units \"torchtitan\")");
  return u;
}

/// A unit's forward segments [first, end) in the model's order (Microbatch:
/// 0 the embedding, 1 + l block l, L + 1 the final norm, L + 2 the output):
/// a pipeline stage is a contiguous run of them.
Result<std::pair<int64_t, int64_t>>
segmentRange(const UnitSegments &u, int64_t nLayers, const std::string &unit) {
  std::vector<int64_t> segs;
  if (u.embedding)
    segs.push_back(0);
  for (const auto &[layer, leaves] : u.blocks)
    segs.push_back(1 + layer);
  if (u.finalNorm)
    segs.push_back(nLayers + 1);
  if (u.output)
    segs.push_back(nLayers + 2);
  if (segs.empty())
    return makeError("unit \"" + unit + "\" holds no parameter");
  if (segs.back() - segs.front() + 1 != int64_t(segs.size()))
    return makeError("unit \"" + unit +
                     "\" holds segments that are not contiguous in the "
                     "model's order");
  return std::pair<int64_t, int64_t>{segs.front(), segs.back() + 1};
}

/// The activations among a compute's inputs (`params`) or outputs
/// (`grads`): a stage's boundary tensors (docs/pipeline.md, "Planning").
std::vector<const TensorView *>
activationsIn(const std::vector<TensorView> &views) {
  std::vector<const TensorView *> out;
  for (const TensorView &v : views)
    if (v.buffer->kind == plan::BufferKind::Activation)
      out.push_back(&v);
  return out;
}

/// The values of a boundary activation of `n` elements, checked, as fp32:
/// a float32 buffer's own, a bfloat16 buffer's widened (the spec's compute
/// dtype bf16: a bf16 stage boundary).
Result<std::vector<float>> activationValues(const TensorView &v, size_t n) {
  if (v.dtype() != DType::Float32 && v.dtype() != DType::BFloat16)
    return makeError(v.id() + ": meshplan-train passes float32 or bfloat16 "
                              "activations between stages");
  if (size_t(v.numElements()) != n)
    return makeError(v.id() + " holds " + std::to_string(v.numElements()) +
                     " elements; this rank's stage boundary is " +
                     std::to_string(n) +
                     " (batch x seq-len / TP x dim: the sequence shard)");
  std::vector<float> out(n);
  if (v.dtype() == DType::Float32) {
    std::span<const float> x = v.as<float>();
    std::copy(x.begin(), x.end(), out.begin());
  } else {
    std::span<const uint16_t> x = v.as<uint16_t>();
    for (size_t i = 0; i < n; ++i)
      out[i] = k::bf16ToFloat(x[i]);
  }
  return out;
}

/// Hands the residual stream `h` on through the activation buffer `to`: a
/// stage's output (forward) or the gradient of its input (backward),
/// rounded to nearest even when the buffer is bf16 (the reference rounds
/// the stream at the same boundaries, Microbatch::roundStreamToBf16).
Result<void> handOn(const TensorView &to, std::span<const float> h) {
  if (to.dtype() != DType::Float32 && to.dtype() != DType::BFloat16)
    return makeError(to.id() + ": meshplan-train passes float32 or bfloat16 "
                               "activations between stages");
  if (to.numElements() != int64_t(h.size()))
    return makeError(to.id() + " holds " + std::to_string(to.numElements()) +
                     " elements; this rank's stage boundary is " +
                     std::to_string(h.size()) +
                     " (batch x seq-len / TP x dim: the sequence shard)");
  if (to.dtype() == DType::Float32) {
    std::copy(h.begin(), h.end(), to.as<float>().begin());
  } else {
    std::span<uint16_t> y = to.as<uint16_t>();
    for (size_t i = 0; i < h.size(); ++i)
      y[i] = k::floatToBf16(h[i]);
  }
  return {};
}

} // namespace

Result<void> RankTrainer::forward(ComputeCall &call) {
  auto u = segmentsOf(call);
  if (!u)
    return u.error();
  auto range = segmentRange(*u, planned.config.nLayers, call.unit);
  if (!range)
    return range.error();
  auto [first, end] = *range;
  std::vector<const TensorView *> in = activationsIn(call.params),
                                  out = activationsIn(call.grads);
  if (in.size() > 1 || out.size() > 1)
    return makeError("forward of " + call.unit +
                     " reads or writes more than one activation");
  // A stage's first unit starts a run (from the embedding, or from the
  // previous stage's output); its other units continue the run that ended
  // just before them.
  std::vector<StageRun> &runs = microbatches[runKey(call)];
  StageRun *run = nullptr;
  if (first == 0 || !in.empty()) {
    if (first == 0 && !in.empty())
      return makeError("forward of " + call.unit +
                       " holds the embedding but reads an activation");
    runs.push_back(
        {std::make_unique<Microbatch>(planned.config, shard, shape,
                                      planned.modelOptions, *tp, modelOps()),
         first, first});
    run = &runs.back();
    data.fill(flags.seed, call.step, call.microbatch, shareDp * flags.batch,
              flags.batch, flags.seqLen, tokens, targets);
    MESHPLAN_TRY(run->mb->setData(tokens, targets));
    if (!in.empty()) {
      auto x = activationValues(*in[0], size_t(run->mb->streamSize()));
      if (!x)
        return x.error();
      MESHPLAN_TRY(run->mb->forwardFrom(first - 1, *x));
    }
  } else {
    for (StageRun &r : runs)
      if (r.end == first)
        run = &r;
    if (!run)
      return makeError("forward of " + call.unit + " (microbatch " +
                       std::to_string(call.microbatch) +
                       ") continues no forward this rank has run, and reads "
                       "no activation");
  }
  Microbatch &mb = *run->mb;
  auto w = [&](const std::string &t) -> const float * {
    return gpuOps ? opsWeights.at(t).data() : weights.at(t).data();
  };
  if (u->embedding)
    MESHPLAN_TRY(mb.forwardEmbedding(w("tok_embeddings.weight")));
  for (const auto &[layer, leaves] : u->blocks) {
    MESHPLAN_TRY(mb.forwardBlock(layer, blockWeights(layer, w)));
  }
  if (u->finalNorm)
    MESHPLAN_TRY(mb.forwardFinalNorm(w("norm.weight")));
  if (u->output) {
    auto loss = mb.forwardOutput(w("output.weight"));
    if (!loss)
      return loss.error();
    lossSum += *loss;
    ++lossCount;
  }
  run->end = end;
  // The stage's output, for the next stage's rank.
  if (!out.empty()) {
    auto h = mb.stream();
    if (!h)
      return h.error();
    MESHPLAN_TRY(handOn(*out[0], *h));
  }
  return {};
}

Result<void> RankTrainer::backward(ComputeCall &call) {
  // zbv splits a backward in two (docs/plan-format.md): backward_input runs
  // the unit's whole backward, hands on the input's gradient and keeps the
  // weights' for backward_weight, which adds them; the values, and the
  // order in which microbatches add, are those of a full backward.
  bool inputOnly = call.phase == "backward_input";
  if (call.phase == "backward_weight")
    return backwardWeight(call);
  if (call.phase != "backward" && !inputOnly)
    return makeError("compute phase \"" + call.phase +
                     "\" is none of forward, backward, backward_input, "
                     "backward_weight");
  auto u = segmentsOf(call);
  if (!u)
    return u.error();
  // This microbatch's gradients go to zeroed scratch first, so that what is
  // added to the accumulated gradient is the same value, in the same order,
  // as in the single-process reference.
  auto range = segmentRange(*u, planned.config.nLayers, call.unit);
  if (!range)
    return range.error();
  auto [first, end] = *range;
  std::vector<const TensorView *> in = activationsIn(call.params),
                                  out = activationsIn(call.grads);
  std::vector<StageRun> &runs = microbatches[runKey(call)];
  auto run = std::find_if(runs.begin(), runs.end(), [&](const StageRun &r) {
    return r.first <= first && end <= r.end;
  });
  if (run == runs.end())
    return makeError("backward of " + call.unit + " (microbatch " +
                     std::to_string(call.microbatch) + ") before its forward");
  // The contract (docs/pipeline.md, "Planning"): a stage's first unit reads
  // the input activation and writes its gradient in the same position; its
  // last unit, unless the model's last, reads the output's gradient after
  // everything else.
  bool fromNextStage = end == run->end && !u->output;
  if (out.size() > 1 || in.size() != out.size() + (fromNextStage ? 1 : 0))
    return makeError("backward of " + call.unit + " reads " +
                     std::to_string(in.size()) + " and writes " +
                     std::to_string(out.size()) +
                     " activations, unlike a stage's unit");
  std::map<std::string, std::vector<float>> grads;
  for (const TensorView &g : call.grads) {
    if (g.buffer->kind == plan::BufferKind::Activation)
      continue;
    if (g.dtype() != DType::Float32 && g.dtype() != DType::BFloat16)
      return makeError(g.id() + ": gradients must be float32 or bfloat16");
    grads[g.tensor()].assign(size_t(g.numElements()), 0.0f);
  }
  // backward_input writes no weight gradient: this rank's share of each has
  // the size of the parameter it reads (a stacked norm gradient's row too).
  if (inputOnly)
    for (const TensorView &v : call.params)
      if (v.buffer->kind != plan::BufferKind::Activation)
        grads[v.tensor()].assign(size_t(v.numElements()), 0.0f);
  // On a GPU the model adds into zeroed device copies, read back below.
  if (gpuOps && !flags.syntheticGrads)
    for (auto &[name, g] : grads) {
      OpsBuffer<float> &d = opsGrads[name];
      if (d.size() != int64_t(g.size()))
        MESHPLAN_TRY(d.allocate(*gpuOps, int64_t(g.size())));
      else
        gpuOps->fillZero(d.data(), d.bytes());
    }
  auto gr = [&](const std::string &t) -> float * {
    auto it = grads.find(t);
    if (it == grads.end())
      return nullptr;
    return gpuOps ? opsGrads.at(t).data() : it->second.data();
  };
  auto w = [&](const std::string &t) -> const float * {
    return gpuOps ? opsWeights.at(t).data() : weights.at(t).data();
  };

  if (flags.syntheticGrads) {
    if (!inputOnly)
      MESHPLAN_TRY(syntheticInto(call, grads));
  } else {
    Microbatch &mb = *run->mb;
    if (fromNextStage) {
      auto dy = activationValues(*in.back(), size_t(mb.streamSize()));
      if (!dy)
        return dy.error();
      MESHPLAN_TRY(mb.backwardFrom(*dy));
    }
    if (u->output)
      MESHPLAN_TRY(mb.backwardOutput(w("output.weight"),
                                     1.0f / float(planned.microbatches),
                                     gr("output.weight")));
    if (u->finalNorm)
      MESHPLAN_TRY(mb.backwardFinalNorm(w("norm.weight"), gr("norm.weight")));
    for (auto l = u->blocks.rbegin(); l != u->blocks.rend(); ++l) {
      BlockWeights bw = blockWeights(l->first, w);
      BlockGrads bg = blockGrads(l->first, gr);
      for (float *p : {bg.attentionNorm, bg.wq, bg.wk, bg.wv, bg.wo, bg.ffnNorm,
                       bg.w1, bg.w3, bg.w2})
        if (!p)
          return makeError("backward of " + call.unit +
                           " has no gradient buffer for a weight of layers." +
                           std::to_string(l->first));
      MESHPLAN_TRY(mb.backwardBlock(l->first, bw, bg));
    }
    if (u->embedding)
      MESHPLAN_TRY(mb.backwardEmbedding(gr("tok_embeddings.weight")));
    if (gpuOps)
      for (auto &[name, g] : grads)
        MESHPLAN_TRY(gpuOps->download(g.data(), opsGrads.at(name).data(),
                                      sizeof(float) * g.size()));
    // The gradient of the stage's input, for the previous stage's rank.
    if (!out.empty()) {
      auto h = mb.stream();
      if (!h)
        return h.error();
      MESHPLAN_TRY(handOn(*out[0], *h));
    }
  }
  if (first == run->first) {
    // The stage's backward of this microbatch is done.
    matmulFlops += run->mb->matmulFlops();
    matmulSeconds += run->mb->matmulSeconds();
    runs.erase(run);
    if (runs.empty())
      microbatches.erase(runKey(call));
  }
  if (inputOnly) {
    if (!stashed
             .emplace(std::pair{call.unit, call.microbatch}, std::move(grads))
             .second)
      return makeError("backward_input of " + call.unit + " (microbatch " +
                       std::to_string(call.microbatch) + ") ran twice");
    return {};
  }
  return addGradients(call, grads);
}

Result<void> RankTrainer::backwardWeight(ComputeCall &call) {
  auto it = stashed.find({call.unit, call.microbatch});
  if (it == stashed.end())
    return makeError("backward_weight of " + call.unit + " (microbatch " +
                     std::to_string(call.microbatch) +
                     ") before its backward_input");
  std::map<std::string, std::vector<float>> grads = std::move(it->second);
  stashed.erase(it);
  for (const TensorView &g : call.grads) {
    auto kept = grads.find(g.tensor());
    if (g.buffer->kind == plan::BufferKind::Activation || kept == grads.end() ||
        int64_t(kept->second.size()) != g.numElements())
      return makeError("backward_weight of " + call.unit + " writes " + g.id() +
                       ", which its backward_input did not compute");
  }
  if (flags.syntheticGrads)
    MESHPLAN_TRY(syntheticInto(call, grads));
  return addGradients(call, grads);
}

/// --synthetic-grads: only microbatch 0 and the first TP row of a stacked
/// gradient carry the value, so the reduced gradient is exactly
/// syntheticGrad in any layout.
Result<void>
RankTrainer::syntheticInto(const ComputeCall &call,
                           std::map<std::string, std::vector<float>> &grads) {
  for (const TensorView &g : call.grads) {
    if (call.microbatch != 0 || g.buffer->kind == plan::BufferKind::Activation)
      continue;
    std::vector<float> &out = grads[g.tensor()];
    bool stacked = false;
    for (const TensorView &v : call.params)
      if (v.tensor() == g.tensor())
        stacked = g.globalShape().size() == v.globalShape().size() + 1;
    int64_t rowSize = 1;
    for (size_t d = stacked ? 1 : 0; d < g.globalShape().size(); ++d)
      rowSize *= g.globalShape()[d];
    auto runs = k::boxIndexRuns(g.globalShape(), g.offset(), g.localShape());
    if (!runs)
      return makeError(g.id() + ": box outside the tensor");
    for (const k::IndexRun &r : *runs)
      for (int64_t i = 0; i < r.length; ++i) {
        int64_t gi = r.global + i;
        if (stacked && gi / rowSize != 0)
          continue;
        out[size_t(r.local + i)] =
            syntheticGrad(g.tensor(), gi % rowSize, call.step);
      }
  }
  return {};
}

/// Adds this microbatch's gradients into the plan's (which hold the earlier
/// microbatches' sum), after averaging them over the extra axes.
Result<void>
RankTrainer::addGradients(ComputeCall &call,
                          std::map<std::string, std::vector<float>> &grads) {
  // Extra axes split the batch further: average their gradients here (the
  // plan reduces over the data-parallel axes only).
  auto commStart = Clock::now();
  for (Communicator *c : extraComms)
    for (auto &[name, g] : grads)
      MESHPLAN_TRY(
          hostComms.allReduce(c, g.data(), int64_t(g.size()), ReduceOp::Avg));
  tpSeconds += secondsSince(commStart);
  for (const TensorView &g : call.grads) {
    if (g.buffer->kind == plan::BufferKind::Activation)
      continue;
    const std::vector<float> &add = grads[g.tensor()];
    if (g.dtype() == DType::Float32) {
      std::span<float> out = g.as<float>();
      for (size_t i = 0; i < add.size(); ++i)
        out[i] += add[i];
    } else {
      std::span<uint16_t> out = g.as<uint16_t>();
      for (size_t i = 0; i < add.size(); ++i)
        out[i] = k::floatToBf16(k::bf16ToFloat(out[i]) + add[i]);
    }
  }
  return {};
}

Result<float> RankTrainer::globalLoss(float local) {
  for (Communicator *c : lossComms)
    if (auto ok = hostComms.allReduce(c, &local, 1, ReduceOp::Avg); !ok) {
      // A peer that stopped because the membership store lost the job
      // closed its connections: report the store, the cause.
      MESHPLAN_TRY(session->checkMembershipStore());
      return ok.error().within("the loss's all-reduce");
    }
  return local;
}

Result<void> RankTrainer::saveParams() {
  std::vector<DumpBox> boxes;
  for (TensorView v : session->parameters()) {
    // A device session's shard, read into the host first.
    std::vector<std::byte> host(v.bytes.size());
    MESHPLAN_TRY(session->copyOut(v, host));
    v.bytes = host;
    DumpBox b;
    b.tensor = v.tensor();
    b.bf16 = v.dtype() == DType::BFloat16;
    b.globalShape = v.globalShape();
    b.offset = v.offset();
    b.localShape = v.localShape();
    int64_t n = v.numElements();
    b.values.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i)
      b.values[size_t(i)] = readElement(v, i);
    boxes.push_back(std::move(b));
  }
  return writeDump(flags.saveParams, session->rank(), boxes);
}

/// Saves --save-checkpoint at the step done (collective; over an existing
/// checkpoint atomically, docs/checkpoint-format.md).
Result<void> RankTrainer::saveCheckpoint() {
  ckpt::CheckpointInfo info;
  info.model = {planned.spec.model->name, ""};
  auto specText = plan::readTextFile(flags.spec);
  info.spec = {flags.spec,
               specText ? ckpt::fingerprintOf(*specText) : std::string()};
  if (const auto &o = session->plan().optimizer) {
    info.training.seed = int64_t(o->seed);
    info.training.stochasticRounding = o->stochasticRounding;
  }
  info.generator = "meshplan-train";
  MESHPLAN_TRY(session->saveCheckpoint(flags.saveCheckpoint, info));
  lastSaved = session->stepsDone();
  if (session->plan().rank == printerRank) {
    std::printf("saved checkpoint %s at step %lld\n",
                flags.saveCheckpoint.c_str(), (long long)lastSaved);
    std::fflush(stdout);
  }
  return {};
}

Result<void> RankTrainer::initParameters() {
  auto init = [&](TensorView &v) -> Result<void> {
    auto runs = k::boxIndexRuns(v.globalShape(), v.offset(), v.localShape());
    if (!runs)
      return makeError(v.id() + ": box outside the tensor");
    for (const k::IndexRun &r : *runs)
      for (int64_t i = 0; i < r.length; ++i) {
        float x =
            initialValue(flags.seed, v.tensor(), r.global + i, v.globalShape());
        if (v.dtype() == DType::BFloat16)
          v.as<uint16_t>()[size_t(r.local + i)] = k::floatToBf16(x);
        else
          v.as<float>()[size_t(r.local + i)] = x;
      }
    return {};
  };
  return session->initParameters(init);
}

void RankTrainer::printBanner() const {
  const LlamaConfig &c = planned.config;
  std::printf(
      "meshplan-train: model %s (dim %lld, %lld layers, %lld heads, "
      "%lld kv heads, ffn %lld, vocab %lld) on %lld ranks; %lld "
      "data-parallel x %lld microbatches x %lld sequences of %lld "
      "tokens = %lld tokens per step; %s matmuls\n",
      planned.spec.model->name.c_str(), (long long)c.dim, (long long)c.nLayers,
      (long long)c.nHeads, (long long)c.nKvHeads, (long long)c.ffnDim,
      (long long)c.vocab, (long long)options.worldSize,
      (long long)planned.roles.dataParallel(), (long long)planned.microbatches,
      (long long)flags.batch, (long long)flags.seqLen, (long long)tokensPerStep,
      planned.modelOptions.bf16Matmul ? "bf16-input" : "fp32");
  std::fflush(stdout);
}

Result<int64_t> RankTrainer::loadCheckpointIfAsked() {
  if (flags.loadCheckpoint.empty())
    return int64_t(1);
  ckpt::LoadOptions load;
  load.dtypeCast = flags.dtypeCast;
  load.resetOptimizerState = flags.optimizerState == "reset";
  auto state = session->loadCheckpoint(flags.loadCheckpoint, load);
  if (!state)
    return state.error().within("--load-checkpoint");
  if (state->step >= flags.steps)
    return makeError("--load-checkpoint: the checkpoint is at step " +
                     std::to_string(state->step) + ", not below --steps " +
                     std::to_string(flags.steps));
  MESHPLAN_TRY(session->resumeAfter(state->step));
  int64_t first = state->step + 1;
  if (session->plan().rank == printerRank)
    std::printf("loaded %s: continuing at step %lld\n",
                flags.loadCheckpoint.c_str(), (long long)first);
  return first;
}

// Gradient clipping's instructions are grad_norm, the all_reduce of its
// buffer and clip_grad: their time per step, for the summary's ratio.
std::optional<double>
RankTrainer::clippingSeconds(const StepProfile &prof) const {
  const plan::Plan &p = session->plan();
  std::string normBuffer;
  double seconds = 0;
  bool any = false;
  for (size_t i = 0; i < p.program.size() && i < prof.instructionEnd.size();
       ++i) {
    const plan::Instruction &in = p.program[i];
    bool clipping =
        in.op == plan::OpKind::GradNorm || in.op == plan::OpKind::ClipGradients;
    if (in.op == plan::OpKind::GradNorm)
      normBuffer = in.outputs.at(0);
    if (in.op == plan::OpKind::AllReduce && !normBuffer.empty() &&
        in.inputs == std::vector<std::string>{normBuffer})
      clipping = true;
    if (!clipping)
      continue;
    any = true;
    seconds += prof.instructionEnd[i] - prof.instructionStart[i];
  }
  return any ? std::optional<double>(seconds) : std::nullopt;
}

// Keeps every persistent shard in memory, ends this session, and goes on in
// a fresh one from those bytes.
Result<void> RankTrainer::resumeInFreshSession() {
  std::map<std::string, std::vector<std::byte>> kept;
  std::vector<TensorView> all = session->parameters();
  for (const TensorView &v : session->optimizerState())
    all.push_back(v);
  for (const TensorView &v : all) {
    kept[v.id()].resize(v.bytes.size());
    MESHPLAN_TRY(session->copyOut(v, kept[v.id()]));
  }
  MESHPLAN_TRY(session->close());
  session.reset();
  MESHPLAN_TRY(open("-resumed"));
  for (auto &[id, bytes] : kept) {
    auto v = session->tensor(id);
    if (!v)
      return v.error();
    if (v->bytes.size() != bytes.size())
      return makeError("resume: " + id + " changed size");
    MESHPLAN_TRY(session->copyInto(*v, bytes));
  }
  MESHPLAN_TRY(session->resumeAfter(flags.resumeAfter));
  if (session->plan().rank == printerRank)
    std::printf("resumed after step %lld in a fresh session from the "
                "shards kept in memory (%zu tensors)\n",
                (long long)flags.resumeAfter, kept.size());
  return {};
}

/// Prints the fault-tolerance state when it changed since the last step.
void RankTrainer::reportFaultTolerance() {
  auto ft = session->faultTolerance();
  if (!ft || (ft->epoch == ftEpoch && ft->stepsDiscarded == ftDiscarded &&
              ft->heals == ftHeals))
    return;
  std::string live;
  for (int g : ft->liveGroups)
    live += (live.empty() ? "" : ", ") + std::to_string(g);
  std::printf("fault tolerance: step %lld committed in epoch %lld "
              "(replica groups %s of %lld live); %lld steps "
              "discarded, %lld heals so far\n",
              (long long)session->stepsDone(), (long long)ft->epoch,
              live.c_str(), (long long)ft->numGroups,
              (long long)ft->stepsDiscarded, (long long)ft->heals);
  std::fflush(stdout);
  ftEpoch = ft->epoch;
  ftDiscarded = ft->stepsDiscarded;
  ftHeals = ft->heals;
}

Result<RankTrainer::StepFigures> RankTrainer::runStep(int64_t &step) {
  lossSum = 0;
  lossCount = 0;
  tpSeconds = 0;
  delayStepForTests();
  holdStepForTests(session->stepsDone());
  StepFigures f;
  // The plan's rate for this step (its lr_schedule): printed with it.
  f.lr = session->lr().value_or(0.0);
  auto t = Clock::now();
  MESHPLAN_TRY(session->step());
  f.wall = secondsSince(t);
  if (session->faultTolerance()) {
    // A healed group continues at its source's step.
    step = session->stepsDone();
    reportFaultTolerance();
  }
  f.step = step;
  if (!microbatches.empty() || !stashed.empty())
    return makeError("step " + std::to_string(step) +
                     " ended with a microbatch whose backward never ran");
  auto loss = globalLoss(lossCount ? float(lossSum / double(lossCount)) : 0);
  if (!loss)
    return loss.error();
  f.loss = *loss;
  const StepProfile &prof = session->lastStepProfile();
  f.compute = prof.callbacks - tpSeconds + prof.kernels;
  f.comm = prof.collectives + tpSeconds;
  f.exposed = prof.exposedCollectives + tpSeconds;
  return f;
}

void RankTrainer::record(RunSeries &series, const StepFigures &f,
                         const StepProfile &prof, int64_t firstStep) {
  series.losses.push_back(f.loss);
  series.walls.push_back(f.wall);
  if (auto c = clippingSeconds(prof))
    series.clips.push_back(*c);
  if (prof.traceRecording > 0)
    series.traceRecordings.push_back(prof.traceRecording);
  series.computes.push_back(f.compute);
  series.comms.push_back(f.comm);
  series.exposeds.push_back(f.exposed);
  series.overheads.push_back(prof.overhead);
  series.callbackComputes.push_back(prof.callbacks - tpSeconds);
  series.planExposed.push_back(prof.exposedCollectives);
  if (flags.deviceTiming && f.step > firstStep)
    series.deviceTimes.add(session->plan(), prof);
  if (machine && planned.spec.pipeline &&
      (f.step > firstStep || f.step == flags.steps))
    recordBubble(prof);
}

Result<void> RankTrainer::writeMetrics(MetricsFile &metrics,
                                       const StepFigures &f,
                                       const StepProfile &prof) {
  StepMetrics m;
  m.step = f.step;
  m.rank = options.rank;
  m.loss = f.loss;
  m.lossIsGlobal = lossIsGlobal;
  m.lr = f.lr;
  m.gradNorm = prof.gradNorm;
  m.clipCoefficient = prof.clipCoefficient;
  m.updateSkipped = prof.updateSkipped;
  m.tokens = tokensPerStep;
  m.stepSeconds = f.wall;
  m.computeSeconds = f.compute;
  m.communicationSeconds = f.comm;
  m.exposedSeconds = f.exposed;
  m.runtimeSeconds = prof.overhead;
  m.peakRssBytes = MetricsFile::peakRssBytes();
  if (auto ft = session->faultTolerance())
    m.faultToleranceEpoch = ft->epoch;
  return metrics.write(m);
}

void RankTrainer::printStep(const StepFigures &f,
                            const StepProfile &prof) const {
  std::string norm;
  if (prof.gradNorm) {
    char text[96];
    std::snprintf(text, sizeof(text), " grad norm %.4g (clip %.4g)",
                  *prof.gradNorm, double(prof.clipCoefficient));
    norm = text;
  }
  std::printf("step %lld/%lld loss %.4f%s%s lr %.4g tok/s %.0f | step "
              "%.1f ms: compute %.1f comm %.1f exposed %.1f runtime %.2f "
              "ms\n",
              (long long)f.step, (long long)flags.steps, f.loss,
              lossIsGlobal ? "" : " (this rank)", norm.c_str(), f.lr,
              double(tokensPerStep) / f.wall, f.wall * 1e3, f.compute * 1e3,
              f.comm * 1e3, f.exposed * 1e3, prof.overhead * 1e3);
  std::fflush(stdout);
}

void RankTrainer::printSummary(const RunSeries &series, bool bubble) {
  const std::vector<double> &losses = series.losses;
  size_t n = std::min<size_t>(10, losses.size());
  double first = 0, last = 0;
  for (size_t i = 0; i < n; ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  double w = median(series.walls);
  std::printf(
      "summary: %lld steps; loss %.4f -> %.4f (mean of the first and last "
      "%zu steps); median step %.1f ms, %.0f tok/s; compute %.1f ms, comm "
      "%.1f ms (exposed %.1f ms), runtime overhead %.2f ms (%.2f%% of the "
      "step); matmuls %.2f GFLOP/s\n",
      (long long)losses.size(), first / double(n), last / double(n), n, w * 1e3,
      double(tokensPerStep) / w, median(series.computes) * 1e3,
      median(series.comms) * 1e3, median(series.exposeds) * 1e3,
      median(series.overheads) * 1e3, 100.0 * median(series.overheads) / w,
      matmulSeconds > 0 ? matmulFlops / matmulSeconds * 1e-9 : 0.0);
  if (!series.clips.empty())
    std::printf("gradient clipping: median %.3f ms per step (exact norm, "
                "its all-reduce, the scale) = %.2f%% of the median step\n",
                median(series.clips) * 1e3, 100.0 * median(series.clips) / w);
  if (!series.traceRecordings.empty()) {
    // Every traced step copies its times; the last also writes the file.
    double total = 0;
    for (double t : series.traceRecordings)
      total += t;
    size_t traced = series.traceRecordings.size();
    std::printf("trace recording: %zu steps in %.3f ms (the file's write "
                "included), %.3f ms per traced step = %.2f%% of the median "
                "step (rank 0; %s/rank<R>.json)\n",
                traced, total * 1e3, total / double(traced) * 1e3,
                100.0 * total / double(traced) / w, flags.traceDir.c_str());
  }
  if (flags.deviceTiming)
    series.deviceTimes.print(w);
  if (machine)
    printCostModel(median(series.callbackComputes), w,
                   median(series.planExposed));
  if (bubble)
    printBubble();
}

Result<void> RankTrainer::run() {
  MESHPLAN_TRY(open(""));
  bool printer = session->plan().rank == printerRank;
  tokensPerStep = planned.roles.dataParallel() * planned.microbatches *
                  flags.batch * flags.seqLen;
  MESHPLAN_TRY(initParameters());
  if (flags.costModel)
    MESHPLAN_TRY(calibrate());
  if (printer)
    printBanner();
  Result<int64_t> first = loadCheckpointIfAsked();
  if (!first)
    return first.error();
  std::unique_ptr<MetricsFile> metrics;
  if (!flags.metrics.empty()) {
    auto opened = MetricsFile::open(flags.metrics, options.rank);
    if (!opened)
      return opened.error();
    metrics = std::move(*opened);
  }
  RunSeries series;
  for (int64_t step = *first; step <= flags.steps; ++step) {
    if (flags.resumeAfter >= 0 && step == flags.resumeAfter + 1)
      MESHPLAN_TRY(resumeInFreshSession());
    Result<StepFigures> f = runStep(step);
    if (!f)
      return f.error();
    const StepProfile &prof = session->lastStepProfile();
    record(series, *f, prof, *first);
    // A skipped update is said on every step it happens, whatever
    // --log-every says: it is never silent.
    if (printer && prof.updateSkipped) {
      std::printf("step %lld: gradient norm %g is not finite; the update was "
                  "skipped on every rank (weights and optimizer state "
                  "unchanged)\n",
                  (long long)step, prof.gradNorm.value_or(0.0));
      std::fflush(stdout);
    }
    if (metrics)
      MESHPLAN_TRY(writeMetrics(*metrics, *f, prof));
    if (printer && (step % flags.logEvery == 0 || step == flags.steps))
      printStep(*f, prof);
    if (flags.checkpointEvery > 0 && step % flags.checkpointEvery == 0)
      MESHPLAN_TRY(saveCheckpoint());
  }
  if (!flags.saveParams.empty())
    MESHPLAN_TRY(saveParams());
  if (!flags.saveCheckpoint.empty() && session->stepsDone() != lastSaved)
    MESHPLAN_TRY(saveCheckpoint());
  // Before close: the exchange runs on the trainer's pair communicators.
  bool bubble = machine && planned.spec.pipeline &&
                planned.spec.pipeline->config.ranks > 1 && !idleOfStep.empty();
  if (bubble)
    MESHPLAN_TRY(exchangeBubble());
  MESHPLAN_TRY(session->close());
  if (printer && !series.losses.empty())
    printSummary(series, bubble);
  return {};
}

/// meshplan-train's flags (docs/trainer.md, "Flags"), parsed by CLI11 in
/// `meshplan`'s error style (tools/common/CommandLine.h).
static void addTrainFlags(CLI::App &app, TrainFlags &flags,
                          std::vector<std::string> &compare, double &rtol,
                          std::string &device, std::string &traceSteps) {
  app.add_option("--spec", flags.spec,
                 "The parallelism (JSON; docs/spec.md); planned in-process by "
                 "every rank (required, except with --compare)")
      ->type_name("FILE");
  app.add_option("--model", flags.model,
                 "A preset name or a model file (relative to the working "
                 "directory); default: the spec's")
      ->type_name("NAME|FILE");
  app.add_option("--steps", flags.steps, "Optimizer steps (default 100)")
      ->type_name("N")
      ->check(cli::integerIn(1, 100000000));
  app.add_option("--batch", flags.batch,
                 "Sequences per data-parallel rank and microbatch (default 4)")
      ->type_name("B")
      ->check(cli::integerIn(1, 1 << 20));
  app.add_option("--seq-len", flags.seqLen,
                 "Tokens per sequence; a multiple of the TP degree (default "
                 "64)")
      ->type_name("T")
      ->check(cli::integerIn(1, 1 << 20));
  app.add_option("--seed", flags.seed,
                 "Initial weights and data order (default 0)")
      ->type_name("S")
      ->check(cli::integerIn(0, INT64_MAX));
  app.add_option("--data", flags.data,
                 "A text file, or a directory whose .md/.txt files are "
                 "concatenated (default: docs)")
      ->type_name("PATH");
  app.add_option("--save-params", flags.saveParams,
                 "After the last step, each rank writes its parameter shards "
                 "to DIR/rank<R>.bin")
      ->type_name("DIR");
  app.add_option("--resume-after", flags.resumeAfter,
                 "After step K keep every shard in memory, open a fresh "
                 "session from those bytes and continue")
      ->type_name("K")
      ->check(cli::integerIn(0, INT64_MAX));
  app.add_option("--load-checkpoint", flags.loadCheckpoint,
                 "Start from a checkpoint written under any layout of the "
                 "same model; the run continues at its step + 1")
      ->type_name("DIR");
  app.add_flag("--dtype-cast", flags.dtypeCast,
               "With --load-checkpoint: convert tensors stored in another "
               "floating-point dtype than the plan's (float32, bfloat16, "
               "float16; round to nearest even) instead of refusing them");
  app.add_option("--optimizer-state", flags.optimizerState,
                 "With --load-checkpoint: keep the checkpoint's optimizer "
                 "state (default) or reset it to zero and start at step 1, "
                 "as a fresh AdamW")
      ->type_name("keep|reset")
      ->check(CLI::IsMember({"keep", "reset"}));
  app.add_option("--save-checkpoint", flags.saveCheckpoint,
                 "After the last step, save a checkpoint "
                 "(docs/checkpoint-format.md)")
      ->type_name("DIR");
  app.add_option("--checkpoint-every", flags.checkpointEvery,
                 "With --save-checkpoint: also save after every step "
                 "divisible by N (default 0: only at the end)")
      ->type_name("N")
      ->check(cli::integerIn(1, INT64_MAX));
  app.add_flag("--synthetic-grads", flags.syntheticGrads,
               "Gradients are a function of (tensor, global index, step): "
               "every layout reduces to the same gradient exactly");
  app.add_option("--log-every", flags.logEvery,
                 "Print every N-th step's line (default 1)")
      ->type_name("N")
      ->check(cli::integerIn(1, INT64_MAX));
  app.add_flag("--cost-model", flags.costModel,
               "Measure this machine's collective latency and bandwidth and "
               "print the plan's cost model beside the measured step");
  app.add_flag("--reference", flags.reference,
               "The single-process run of the same global batch");
  app.add_flag("--plain-reference", flags.plainReference,
               "The single-process run without emulating TP's order of sums");
  app.add_option("--device", device,
                 "Where the plan and the model run: cpu (default) or cuda "
                 "(docs/cuda.md); not with --host-device or --reference")
      ->type_name("cpu|cuda")
      ->check(CLI::Validator(
          [](std::string &d) -> std::string {
            if (d != "cpu" && d != "cuda")
              return "expected cpu or cuda, got \"" + d +
                     "\" (where the step runs; `meshplan`'s --device "
                     "names the cost model's hardware, e.g. h100)";
            return {};
          },
          ""));
  app.add_flag("--host-device", flags.hostDevice,
               "Run the plan through the device executor on the host device "
               "(docs/cuda.md, \"Executor on devices\")");
  app.add_flag("--device-timing", flags.deviceTiming,
               "With --device cuda or --host-device: time every instruction "
               "on the device too");
  app.add_option("--metrics", flags.metrics,
                 "Write one JSON line per step (loss, lr, grad norm, tokens/s, "
                 "step time and breakdown, peak memory) to FILE; rank 0, or "
                 "every rank when FILE holds {rank} (docs/observability.md)")
      ->type_name("FILE");
  app.add_option("--trace", flags.traceDir,
                 "Record the executed steps' per-instruction times into "
                 "DIR/rank<R>.json, or rank<R>.inc<I>.json per process of "
                 "a fault-tolerant run (meshplan trace --merge DIR)")
      ->type_name("DIR");
  app.add_option("--trace-steps", traceSteps,
                 "With --trace: the steps traced, A to B from 1 (default "
                 "2:6, within --steps)")
      ->type_name("A:B");
  app.add_option("--compare", compare,
                 "Compare two parameter dumps (--save-params directories)")
      ->type_name("DIR_A DIR_B")
      ->expected(2);
  app.add_option("--rtol", rtol,
                 "With --compare: the relative tolerance (default 1e-5)")
      ->type_name("X")
      ->check(CLI::Validator(
          [](std::string &t) -> std::string {
            char *end = nullptr;
            double v = std::strtod(t.c_str(), &end);
            if (t.empty() || *end || !(v >= 0))
              return "expected a number >= 0, got \"" + t + "\"";
            return {};
          },
          ""));
}

int main(int argc, char **argv) {
  TrainFlags flags;
  std::vector<std::string> compare;
  double rtol = 1e-5;
  std::string device = "cpu";
  std::string traceSteps;
  CLI::App app{"meshplan-train: a Llama 3 model trained by the meshplan "
               "runtime, one process per rank (docs/trainer.md)",
               "meshplan-train"};
  app.footer(kUsage);
  // A flag given twice takes its last value, as the hand-written parser
  // did (scripts and tests append overrides to a common command line).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  addTrainFlags(app, flags, compare, rtol, device, traceSteps);
  if (auto exit = cli::parseCommandLine(
          app, std::vector<char *>(argv, argv + argc), "meshplan-train"))
    return *exit;
#if !MESHPLAN_HAVE_CUDA
  if (device == "cuda")
    usageError("--device cuda: this build has no CUDA backend (build with the "
               "CUDA toolkit installed; docs/cuda.md)");
#endif
  flags.cuda = device == "cuda";
  flags.reference = flags.reference || flags.plainReference;
  std::string compareA = compare.size() == 2 ? compare[0] : "";
  std::string compareB = compare.size() == 2 ? compare[1] : "";
  if ((flags.dtypeCast || app.count("--optimizer-state")) &&
      flags.loadCheckpoint.empty())
    usageError(
        std::string(flags.dtypeCast ? "--dtype-cast" : "--optimizer-state") +
        " applies to --load-checkpoint DIR");
  if (app.count("--metrics") && flags.metrics.empty())
    usageError("--metrics: expected a file");
  if (app.count("--trace") && flags.traceDir.empty())
    usageError("--trace: expected a directory");
  // "-" is stdout only where one file is written and stdout is free; here
  // the directories cannot be, and stdout carries the step log.
  for (const auto &[flag, value, what] :
       {std::tuple<const char *, const std::string &, const char *>{
            "--trace", flags.traceDir, "a directory (rank<R>.json per rank)"},
        {"--save-params", flags.saveParams,
         "a directory (rank<R>.bin per rank)"},
        {"--save-checkpoint", flags.saveCheckpoint, "a checkpoint directory"},
        {"--metrics", flags.metrics,
         "a file beside the step log, which stdout carries"}})
    if (value == "-")
      usageError(std::string(flag) + ": writes " + what +
                 "; \"-\" (standard output) cannot be one");
  if (!traceSteps.empty()) {
    size_t colon = traceSteps.find(':');
    if (colon == std::string::npos)
      usageError("--trace-steps: expected A:B (steps A to B, from 1), got "
                 "\"" +
                 traceSteps + "\"");
    int64_t first =
        parseCount("--trace-steps", traceSteps.substr(0, colon), 1, INT64_MAX);
    int64_t last = parseCount("--trace-steps", traceSteps.substr(colon + 1),
                              first, INT64_MAX);
    flags.traceSteps = {first, last};
  }
  if (!compareA.empty())
    return compareDumps(compareA, compareB, rtol);
  if (flags.spec.empty())
    usageError("--spec is required; see 'meshplan-train --help'");
  if (flags.cuda && flags.hostDevice)
    usageError("--device cuda and --host-device exclude each other (the "
               "host device runs the device executor on the CPU)");
  if (flags.deviceTiming && !flags.cuda && !flags.hostDevice)
    usageError("--device-timing needs a device: --device cuda or "
               "--host-device");
  if (flags.cuda && flags.reference)
    usageError("--device cuda: the single-process --reference runs on the "
               "CPU; compare a GPU run's --save-params with it");
  if (flags.reference && (!flags.metrics.empty() || !flags.traceDir.empty()))
    usageError(std::string(flags.metrics.empty() ? "--trace" : "--metrics") +
               ": written by the ranks of a run, not by --reference");
  if (flags.traceSteps && flags.traceDir.empty())
    usageError("--trace-steps needs --trace DIR (where to write)");
  if (flags.traceSteps && flags.traceSteps->second > flags.steps)
    usageError("--trace-steps " + std::to_string(flags.traceSteps->first) +
               ":" + std::to_string(flags.traceSteps->second) +
               " ends after --steps " + std::to_string(flags.steps));
  if (flags.checkpointEvery > 0 && flags.saveCheckpoint.empty())
    usageError("--checkpoint-every needs --save-checkpoint DIR (where to "
               "save)");
  if (flags.resumeAfter >= flags.steps)
    usageError("--resume-after " + std::to_string(flags.resumeAfter) +
               " must be below --steps " + std::to_string(flags.steps));
  if (flags.batch * flags.seqLen > (int64_t(1) << 28))
    usageError("--batch x --seq-len is too large");
  // One BLAS thread per process: ranks share the cores, and the reference
  // must compute each slice exactly as a rank does.
  openblas_set_num_threads(1);

  if (flags.data.empty()) {
    std::error_code ec;
    flags.data = std::filesystem::is_directory("docs", ec)
                     ? "docs"
                     : std::string(MESHPLAN_SOURCE_DIR) + "/docs";
  }
  auto data = TextData::load(flags.data);
  if (!data)
    usageError("--data: " + data.error().message);
  if (data->size() <= flags.seqLen + 1)
    usageError("--data: " + flags.data + " holds " +
               std::to_string(data->size()) + " bytes, fewer than --seq-len");

  auto planned = planSpec(flags, flags.batch * flags.seqLen);
  if (!planned)
    usageError(planned.error().message);
  if (!planned->roles.tp.empty()) {
    const Mesh &mesh = *planned->spec.mesh;
    int64_t tpSize = mesh.axis(*mesh.findAxis(planned->roles.tp)).size;
    if (flags.seqLen % tpSize != 0)
      usageError("--seq-len " + std::to_string(flags.seqLen) +
                 " must be a multiple of the tensor-parallel degree " +
                 std::to_string(tpSize) +
                 " (sequence parallelism splits each sequence evenly)");
  }
  if (flags.reference)
    return runReference(flags, *planned, *data);

  auto options = sessionOptionsFromEnv();
  // The other messages say what the launcher should have set; with no
  // launcher at all, say how to start one.
  if (!options)
    usageError(options.error().message +
               (options.error().message.starts_with("RANK is not set")
                    ? " (start meshplan-train with `meshplan run -n N -- "
                      "meshplan-train ...`, or use --reference for one "
                      "process)"
                    : ""));
  // The launcher's world against the spec's, before any rank waits for a
  // peer that will never come: the variable as the launcher set it.
  if (int64_t meshSize = planned->spec.mesh->size();
      options->worldSize != meshSize)
    usageError(options->worldSizeVariable + "=" +
               std::to_string(options->worldSize) + " but the spec's mesh (" +
               flags.spec + ") has " + std::to_string(meshSize) +
               " ranks: start " + std::to_string(meshSize) + " processes");
#if MESHPLAN_HAVE_CUDA
  if (flags.cuda) {
    // One GPU per rank over NCCL, unless MESHPLAN_BACKEND=gloo asks for
    // ranks sharing GPUs with staged collectives (docs/cuda.md).
    const char *backend = std::getenv("MESHPLAN_BACKEND");
    if (!backend || !*backend)
      options->backend = "nccl";
    auto onGpu = cudaSessionOptions(*options);
    if (!onGpu)
      fatal("rank " + std::to_string(options->rank) +
            ": --device cuda: " + onGpu.error().message);
    options = std::move(onGpu);
  }
#endif
  RankTrainer trainer(flags, *planned, *data, *options);
  if (auto ok = trainer.run(); !ok)
    fatal(ok.error().message.starts_with("rank ")
              ? ok.error().message
              : "rank " + std::to_string(options->rank) + ": " +
                    ok.error().message);
  return 0;
}
