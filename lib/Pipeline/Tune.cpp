//===- Tune.cpp - Searching parallel layouts that fit the device ---------===//
//
// See Tune.h and docs/tune.md. The screen is deliberately coarse (it only
// orders candidates and drops hopeless ones); what `tune` reports comes
// from real compiles.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Pipeline/Tune.h"

#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/Template.h"
#include "meshplan/Plan/Trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <tuple>

using namespace meshplan;
using namespace meshplan::frontend;
using namespace meshplan::pipeline;
using ordered_json = nlohmann::ordered_json;

namespace {

/// The screen keeps candidates whose estimated peak is at most this much
/// above the capacity: it is an estimate, stage 2 decides.
constexpr double kScreenMargin = 1.15;

/// torchtitan's Llama 3 tensor-parallel plan (parallelize_llama), with
/// sequence-parallel norms.
const char *const kTPPlan[][2] = {
    {"tok_embeddings", "rowwise"},
    {"layers.*.attention_norm", "sequence_parallel"},
    {"layers.*.attention.wq", "colwise"},
    {"layers.*.attention.wk", "colwise"},
    {"layers.*.attention.wv", "colwise"},
    {"layers.*.attention.wo", "rowwise"},
    {"layers.*.ffn_norm", "sequence_parallel"},
    {"layers.*.feed_forward.w1", "colwise"},
    {"layers.*.feed_forward.w2", "rowwise"},
    {"layers.*.feed_forward.w3", "colwise"},
    {"norm", "sequence_parallel"},
    {"output", "colwise"},
};

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d * d <= n; ++d)
    if (n % d == 0) {
      out.push_back(d);
      if (d != n / d)
        out.push_back(n / d);
    }
  std::sort(out.begin(), out.end());
  return out;
}

/// What the screen needs of the model under one (tp, cp, float8,
/// checkpointing), per microbatch of `tokens` tokens per data-parallel rank.
struct Figures {
  double paramsPerTpRank = 0; ///< elements of the TP-local model
  double largestUnit = 0;     ///< TP-local elements of the largest unit
  double gatherBytesPerElement = 2;
  double flopsPerStep = 0; ///< forward x 3 + recompute, per microbatch
  double activationBytes = 0;
  int64_t tokens = 0; ///< the tokens the figures were computed for
  int64_t dim = 0, kvDim = 0, blocks = 0;
};

std::string name(AccumulationReduce r) {
  return std::string(accumulationReduceName(r));
}

/// Seconds of one ring collective sending `bytes` on a group of `n` over
/// links of `bandwidth` with per-step latency `alpha` (CostModel.h).
double ring(double bytes, int64_t steps, double alpha, double bandwidth) {
  return double(steps) * alpha + bytes / bandwidth;
}

} // namespace

std::string TuneCandidate::describe() const {
  std::string s = "dp_replicate=" + std::to_string(replicate) +
                  " dp_shard=" + std::to_string(shard) +
                  " cp=" + std::to_string(cp) + " tp=" + std::to_string(tp);
  s += reshardAfterForward ? " reshard=default" : " reshard=never";
  s += float8AllGather ? " fp8-gather" : "";
  s += " ga=" + std::to_string(accumulationSteps);
  if (accumulationSteps > 1)
    s += "/" + name(reduce);
  s += " ac=" + std::string(activationCheckpointingName(checkpointing));
  return s;
}

std::string meshplan::pipeline::tuneSpecJson(const TuneOptions &options,
                                             const TuneCandidate &c) {
  ordered_json s;
  s["description"] = "meshplan tune: " + c.describe();
  s["model"] = options.model;
  s["world_size"] = options.world;
  ordered_json axes = ordered_json::array();
  auto axis = [&](const char *n, int64_t size) {
    if (size > 1)
      axes.push_back({{"name", n}, {"size", size}});
  };
  axis("dp_replicate", c.replicate);
  axis("dp_shard", c.shard);
  axis("cp", c.cp);
  axis("tp", c.tp);
  if (axes.empty())
    axes.push_back({{"name", "dp_shard"}, {"size", 1}});
  s["mesh"] = {{"axes", axes}};
  ordered_json dp = ordered_json::object();
  if (c.replicate > 1)
    dp["replicate_axes"] = {"dp_replicate"};
  if (c.shard > 1) {
    dp["shard_axes"] = {"dp_shard"};
    dp["reshard_after_forward"] = c.reshardAfterForward ? "default" : "never";
  }
  if (!dp.empty())
    s["data_parallel"] = dp;
  if (c.tp > 1) {
    ordered_json plan = ordered_json::array();
    for (auto &rule : kTPPlan)
      plan.push_back({{"pattern", rule[0]}, {"style", rule[1]}});
    s["tensor_parallel"] = {{"axis", "tp"}, {"plan", plan}};
  }
  if (c.cp > 1)
    s["extra_axes"] = {"cp"};
  s["mixed_precision"] = {{"param_dtype", "bfloat16"},
                          {"reduce_dtype", "float32"}};
  // torchtitan converts every linear but the output projection.
  if (c.float8AllGather)
    s["float8"] = {{"all_gather", true},
                   {"exclude", {"output"}},
                   {"power_of_2_scales", true}};
  s["optimizer"] = {{"name", "adamw"}};
  s["gradient_accumulation"] = {{"steps", c.accumulationSteps},
                                {"reduce", name(c.reduce)}};
  s["activation_checkpointing"] =
      std::string(activationCheckpointingName(c.checkpointing));
  return s.dump(2) + "\n";
}

namespace {

class Tuner {
public:
  explicit Tuner(const TuneOptions &options) : options(options) {}

  Result<TuneResult> run();

private:
  const TuneOptions &options;
  int64_t tokensPerStep = 0;
  std::map<std::tuple<int64_t, int64_t, bool, int>, Figures> figureCache;

  ImportOptions importFor(const TuneCandidate &c) const {
    ImportOptions import;
    import.tokensPerMicrobatch =
        tokensPerStep / (c.replicate * c.shard * c.accumulationSteps);
    import.sequenceLength = options.sequenceLength;
    return import;
  }

  std::vector<TuneCandidate> enumerate() const;
  Result<Figures> figures(const TuneCandidate &c);
  void screen(TuneCandidate &c, const Figures &f) const;
  double trainerCommSeconds(const TuneCandidate &c, const Figures &f) const;
  Result<void> confirm(TuneCandidate &c);
};

std::vector<TuneCandidate> Tuner::enumerate() const {
  std::vector<TuneCandidate> out;
  int64_t node = options.cost.ranksPerNode;
  for (int64_t tp : divisors(options.world)) {
    if (tp > node || node % tp != 0)
      continue;
    for (int64_t cp = 1;
         cp <= options.maxContextParallel && (options.world / tp) % cp == 0;
         cp *= 2) {
      int64_t rest = options.world / (tp * cp);
      for (int64_t replicate : divisors(rest)) {
        int64_t shard = rest / replicate;
        for (bool reshard : {true, false}) {
          // Without sharding there is nothing to gather or reshard.
          if (shard == 1 && !reshard)
            continue;
          for (bool fp8 : {false, true}) {
            if (shard == 1 && fp8)
              continue;
            for (int64_t ga = 1; ga <= options.maxAccumulationSteps; ga *= 2) {
              int64_t dp = replicate * shard;
              // Whole sequences per microbatch on every data-parallel rank.
              if (tokensPerStep % (dp * ga) != 0 ||
                  (tokensPerStep / (dp * ga)) % options.sequenceLength != 0)
                continue;
              for (AccumulationReduce reduce :
                   {AccumulationReduce::EveryMicrobatch,
                    AccumulationReduce::LastMicrobatch}) {
                if (ga == 1 && reduce == AccumulationReduce::LastMicrobatch)
                  continue;
                for (ActivationCheckpointing ac :
                     {ActivationCheckpointing::None,
                      ActivationCheckpointing::Selective,
                      ActivationCheckpointing::Full}) {
                  TuneCandidate c;
                  c.replicate = replicate;
                  c.shard = shard;
                  c.cp = cp;
                  c.tp = tp;
                  c.reshardAfterForward = reshard;
                  c.float8AllGather = fp8;
                  c.accumulationSteps = ga;
                  c.reduce = reduce;
                  c.checkpointing = ac;
                  out.push_back(c);
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

/// Resolves one representative spec per (tp, cp, float8, checkpointing)
/// and reads the figures the screen scales.
Result<Figures> Tuner::figures(const TuneCandidate &c) {
  auto key = std::make_tuple(c.tp, c.cp, c.float8AllGather,
                             static_cast<int>(c.checkpointing));
  if (auto it = figureCache.find(key); it != figureCache.end())
    return it->second;
  TuneCandidate rep = c;
  rep.replicate = 1;
  rep.shard = options.world / (c.tp * c.cp);
  rep.accumulationSteps = 1;
  rep.reshardAfterForward = true;
  auto spec = loadSpec(tuneSpecJson(options, rep), options.baseDir);
  if (!spec)
    return spec.error();
  Figures f;
  ImportOptions import;
  import.tokensPerMicrobatch = options.sequenceLength;
  import.sequenceLength = options.sequenceLength;
  f.tokens = import.tokensPerMicrobatch;
  std::vector<Unit> units = fsdpUnits(*spec, import);
  double gathered = 0, gatheredBytes = 0;
  for (const Unit &u : units) {
    double local = 0;
    for (int p : u.params) {
      const ParamAssignment &param = spec->params[p];
      double n = 1;
      for (int64_t d : param.shape)
        n *= double(d);
      if (param.tpDim >= 0)
        n /= double(c.tp);
      local += n;
      gatheredBytes += n * (param.float8 && c.float8AllGather ? 1 : 2);
      if (param.name.ends_with("attention.wq.weight"))
        f.dim = param.shape[1];
      if (param.name.ends_with("attention.wk.weight"))
        f.kvDim = param.shape[0];
    }
    f.paramsPerTpRank += local;
    f.largestUnit = std::max(f.largestUnit, local);
    gathered += local;
    f.flopsPerStep += 3 * u.forwardFlops + u.recomputeFlops;
    if (u.name.rfind("layers.", 0) == 0)
      ++f.blocks;
  }
  f.gatherBytesPerElement = gathered > 0 ? gatheredBytes / gathered : 2;
  auto act = estimateActivations(*spec, import);
  if (!act)
    return act.error();
  // Every block's saved activations plus the largest working set.
  double transient = 0;
  for (const auto &[unit, a] : act->units) {
    f.activationBytes += double(a.saved);
    transient = std::max(
        transient, double(std::max(a.forwardTransient, a.backwardTransient)));
  }
  f.activationBytes += transient;
  figureCache[key] = f;
  return f;
}

double Tuner::trainerCommSeconds(const TuneCandidate &c,
                                 const Figures &f) const {
  const plan::CostModel &m = options.cost;
  double tokens = double(importFor(c).tokensPerMicrobatch) / double(c.cp);
  double seconds = 0;
  // Sequence-parallel TP, per block and microbatch: an all-gather and a
  // reduce-scatter of the bf16 activations [tokens, dim] around attention
  // and around the feed-forward, in forward and again in backward.
  if (c.tp > 1)
    seconds +=
        8.0 * double(f.blocks) *
        ring(double(c.tp - 1) / double(c.tp) * tokens * double(f.dim) * 2,
             c.tp - 1, m.intraNodeLatencySeconds, m.intraNodeBytesPerSecond);
  // Ring attention over cp, per block and microbatch: every rank passes its
  // bf16 K and V [tokens, kvDim] around the ring in forward, and K, V and
  // their gradients in backward.
  if (c.cp > 1) {
    bool intra = c.cp * c.tp <= m.ranksPerNode;
    seconds +=
        3.0 * double(f.blocks) *
        ring(double(c.cp - 1) * 2 * tokens * double(f.kvDim) * 2, c.cp - 1,
             intra ? m.intraNodeLatencySeconds : m.interNodeLatencySeconds,
             intra ? m.intraNodeBytesPerSecond : m.interNodeBytesPerSecond);
  }
  return seconds * double(c.accumulationSteps);
}

void Tuner::screen(TuneCandidate &c, const Figures &f) const {
  const plan::CostModel &m = options.cost;
  double p = f.paramsPerTpRank, n = double(c.shard), r = double(c.replicate);
  double ga = double(c.accumulationSteps);
  bool every = c.accumulationSteps == 1 ||
               c.reduce == AccumulationReduce::EveryMicrobatch;
  double tokens = double(importFor(c).tokensPerMicrobatch);
  double scale = tokens / double(f.tokens);
  // Memory: fp32 master shard and AdamW state; gradients sharded (plus two
  // units in flight) or whole; two units gathered, or all of them when
  // nothing reshards; one microbatch's activations.
  double bytes = 12 * p / n;
  bytes += every ? 4 * p / n * 2 + 4 * f.largestUnit * 2 : 4 * p * 2;
  bytes += f.gatherBytesPerElement *
           (c.reshardAfterForward && c.shard > 1 ? 2 * f.largestUnit : p);
  bytes += f.activationBytes * scale;
  c.screenPeakBytes = static_cast<int64_t>(bytes);
  // Time: compute, and the data-parallel collectives overlapped with it.
  double compute = f.flopsPerStep * scale * ga / m.flopsPerSecond();
  bool shardIntra = c.shard * c.cp * c.tp <= m.ranksPerNode;
  bool replicaIntra = options.world <= m.ranksPerNode;
  auto bw = [&](bool intra) {
    return intra ? m.intraNodeBytesPerSecond : m.interNodeBytesPerSecond;
  };
  double comm = 0;
  if (c.shard > 1) {
    double gathers = (c.reshardAfterForward ? 2 : 1) * ga;
    comm +=
        gathers * (n - 1) / n * p * f.gatherBytesPerElement / bw(shardIntra);
    comm += (every ? ga : 1) * (n - 1) / n * 4 * p / bw(shardIntra);
  }
  if (c.replicate > 1)
    comm += 2 * (r - 1) / r * 4 * p / n / bw(replicaIntra);
  c.screenStepSeconds = std::max(compute, comm) + trainerCommSeconds(c, f);
}

Result<void> Tuner::confirm(TuneCandidate &c) {
  auto spec = loadSpec(c.specJson, options.baseDir);
  if (!spec)
    return spec.error();
  auto context = makeContext();
  CompileOptions compileOptions;
  compileOptions.import = importFor(c);
  auto compiled = compile(*context, *spec, compileOptions);
  if (!compiled)
    return compiled.error();
  auto prepared = plan::PreparedTemplate::prepare(compiled->program);
  if (!prepared)
    return prepared.error();
  auto plan = prepared->instantiate(prepared->ranks().front());
  if (!plan)
    return plan.error();
  auto schedule = plan::simulate(*plan, prepared->flops(), options.cost);
  if (!schedule)
    return schedule.error();
  auto f = figures(c);
  if (!f)
    return f.error();
  c.compiled = true;
  c.planStepSeconds = schedule->stepSeconds;
  c.exposedCommSeconds = schedule->exposedCommSeconds;
  c.trainerCommSeconds = trainerCommSeconds(c, *f);
  c.stepSeconds = c.planStepSeconds + c.trainerCommSeconds;
  c.peakBytes = plan->estimates ? plan->estimates->peakMemoryBytes["total"] : 0;
  c.fits = c.peakBytes <= options.cost.memoryCapacityBytes();
  return {};
}

static bool faster(const TuneCandidate &a, const TuneCandidate &b) {
  if (a.stepSeconds != b.stepSeconds)
    return a.stepSeconds < b.stepSeconds;
  if (a.peakBytes != b.peakBytes)
    return a.peakBytes < b.peakBytes;
  return a.describe() < b.describe();
}

Result<TuneResult> Tuner::run() {
  if (options.world < 1)
    return makeError("tune: the world size must be at least 1");
  if (options.sequenceLength < 1)
    return makeError("tune: the sequence length must be at least 1");
  MESHPLAN_TRY(plan::checkCostModel(options.cost));
  tokensPerStep = options.tokensPerStep
                      ? options.tokensPerStep
                      : options.world * options.sequenceLength;
  // A bad model is the user's error, not "nothing fits": check it on the
  // plainest layout first.
  {
    TuneCandidate plain;
    plain.shard = options.world;
    if (auto spec = loadSpec(tuneSpecJson(options, plain), options.baseDir);
        !spec)
      return makeError("tune: " + spec.error().message);
  }
  TuneResult result;
  result.capacityBytes = options.cost.memoryCapacityBytes();
  std::vector<TuneCandidate> candidates = enumerate();
  result.enumerated = candidates.size();
  std::vector<TuneCandidate> kept;
  for (TuneCandidate &c : candidates) {
    auto f = figures(c);
    if (!f) {
      // The spec refuses this layout (e.g. TP does not divide the heads).
      ++result.infeasible;
      continue;
    }
    screen(c, *f);
    if (double(c.screenPeakBytes) >
        kScreenMargin * double(result.capacityBytes)) {
      ++result.screenedOut;
      continue;
    }
    kept.push_back(std::move(c));
  }
  std::sort(kept.begin(), kept.end(), [](const auto &a, const auto &b) {
    if (a.screenStepSeconds != b.screenStepSeconds)
      return a.screenStepSeconds < b.screenStepSeconds;
    return a.describe() < b.describe();
  });
  size_t total =
      options.confirm ? std::min(options.confirm, kept.size()) : kept.size();
  for (size_t i = 0; i < total; ++i) {
    TuneCandidate &c = kept[i];
    c.specJson = tuneSpecJson(options, c);
    if (auto ok = confirm(c); !ok)
      return makeError("tune: planning " + c.describe() +
                       " failed: " + ok.error().message);
    ++result.compiled;
    (c.fits ? result.ranked : result.overCapacity).push_back(c);
    if (options.progress)
      options.progress(i + 1, total);
  }
  std::sort(result.ranked.begin(), result.ranked.end(), faster);
  std::sort(
      result.overCapacity.begin(), result.overCapacity.end(),
      [](const auto &a, const auto &b) { return a.peakBytes < b.peakBytes; });
  if (result.ranked.empty()) {
    std::string why =
        "tune: no candidate fits the device (" +
        std::to_string(result.capacityBytes) + " bytes usable on " +
        options.cost.device + "); " + std::to_string(result.enumerated) +
        " candidates, " + std::to_string(result.infeasible) +
        " refused by the spec, " + std::to_string(result.screenedOut) +
        " estimated over capacity";
    if (!result.overCapacity.empty())
      why += ", the smallest planned peak " +
             std::to_string(result.overCapacity.front().peakBytes) +
             " bytes (" + result.overCapacity.front().describe() + ")";
    return makeError(why);
  }
  return result;
}

} // namespace

Result<TuneResult> meshplan::pipeline::tune(const TuneOptions &options) {
  return Tuner(options).run();
}
