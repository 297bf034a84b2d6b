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
#include <cmath>
#include <map>
#include <optional>
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
const TPRule kTPPlan[] = {
    {"tok_embeddings", TPStyle::Rowwise},
    {"layers.*.attention_norm", TPStyle::SequenceParallel},
    {"layers.*.attention.wq", TPStyle::Colwise},
    {"layers.*.attention.wk", TPStyle::Colwise},
    {"layers.*.attention.wv", TPStyle::Colwise},
    {"layers.*.attention.wo", TPStyle::Rowwise},
    {"layers.*.ffn_norm", TPStyle::SequenceParallel},
    {"layers.*.feed_forward.w1", TPStyle::Colwise},
    {"layers.*.feed_forward.w2", TPStyle::Rowwise},
    {"layers.*.feed_forward.w3", TPStyle::Colwise},
    {"norm", TPStyle::SequenceParallel},
    {"output", TPStyle::Colwise},
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

/// One FSDP unit of Figures: what the screen sums per pp coordinate.
struct UnitFigures {
  int firstParam = -1;  ///< index into ResolvedSpec::params
  double flops = 0;     ///< forward x 3 + recompute, per microbatch
  double saved = 0;     ///< activation bytes kept for backward
  double transient = 0; ///< the largest forward or backward working set
  bool block = false;   ///< a transformer block ("layers.N")
};

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
  /// By parameter (ResolvedSpec::params): TP-local elements, and bytes of
  /// its gathered copy.
  std::vector<double> paramElements, paramGatherBytes;
  std::vector<UnitFigures> units;
};

/// One pp coordinate's share under a pipeline layout (Tuner::perRank):
/// Figures summed over the stages the coordinate holds.
struct RankFigures {
  double params = 0;      ///< TP-local parameter elements
  double gatherBytes = 0; ///< bytes of those parameters gathered
  double flops = 0;       ///< per microbatch, all its stages
  double saved = 0;       ///< activation bytes per microbatch, all stages
  double transient = 0;
  int64_t blocks = 0;
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
  std::string s;
  if (pp > 1) {
    s = "pp=" + std::to_string(pp) + " " +
        std::string(pipelineScheduleKindName(schedule));
    if (stagesPerRank > 1)
      s += "/v" + std::to_string(stagesPerRank);
    s += "/m" + std::to_string(microbatches) + " ";
  }
  s += "dp_replicate=" + std::to_string(replicate) +
       " dp_shard=" + std::to_string(shard) + " cp=" + std::to_string(cp) +
       " tp=" + std::to_string(tp);
  s += reshardAfterForward ? " reshard=default" : " reshard=never";
  s += float8AllGather ? " fp8-gather" : "";
  if (pp == 1) {
    s += " ga=" + std::to_string(accumulationSteps);
    if (accumulationSteps > 1)
      s += "/" + name(reduce);
  }
  s += " ac=" + std::string(activationCheckpointingName(checkpointing));
  return s;
}

int64_t meshplan::pipeline::globalTokensOf(const TuneOptions &options) {
  return options.tokensPerStep ? options.tokensPerStep
                               : options.world * options.sequenceLength;
}

/// tuneSpecJson, with "batch" or without (the plainest candidate, read to
/// check the model, need not split the batch).
static std::string specJsonOf(const TuneOptions &options,
                              const TuneCandidate &c, bool withBatch) {
  ordered_json s;
  s["description"] = "meshplan tune: " + c.describe();
  s["model"] = options.model;
  s["world_size"] = options.world;
  ordered_json axes = ordered_json::array();
  auto axis = [&](const char *n, int64_t size) {
    if (size > 1)
      axes.push_back({{"name", n}, {"size", size}});
  };
  // torchtitan's mesh order: pp outermost.
  axis("pp", c.pp);
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
    for (const TPRule &rule : kTPPlan)
      plan.push_back({{"pattern", rule.pattern},
                      {"style", std::string(tpStyleName(rule.style))}});
    s["tensor_parallel"] = {{"axis", "tp"}, {"plan", plan}};
  }
  if (c.cp > 1)
    s["extra_axes"] = {"cp"};
  if (c.pp > 1) {
    ordered_json pp = {
        {"axis", "pp"},
        {"schedule", std::string(pipelineScheduleKindName(c.schedule))},
        {"microbatches", c.microbatches}};
    if (c.stagesPerRank > 1)
      pp["stages_per_rank"] = c.stagesPerRank;
    pp["split"] = "auto";
    s["pipeline_parallel"] = pp;
  }
  s["mixed_precision"] = {{"param_dtype", "bfloat16"},
                          {"reduce_dtype", "float32"}};
  // torchtitan converts every linear but the output projection.
  if (c.float8AllGather)
    s["float8"] = {{"all_gather", true},
                   {"exclude", {"output"}},
                   {"power_of_2_scales", true}};
  s["optimizer"] = {{"name", "adamw"}};
  // Under a pipeline its microbatches are the accumulation (the spec
  // refuses a second count).
  if (c.pp == 1)
    s["gradient_accumulation"] = {{"steps", c.accumulationSteps},
                                  {"reduce", name(c.reduce)}};
  s["activation_checkpointing"] =
      std::string(activationCheckpointingName(c.checkpointing));
  // The batch tuned for: `plan`/`explain` of this spec charge the same work
  // per microbatch, and so reproduce the table's figures.
  if (withBatch)
    s["batch"] = {{"global_tokens", globalTokensOf(options)},
                  {"sequence_length", options.sequenceLength}};
  return s.dump(2) + "\n";
}

std::string meshplan::pipeline::tuneSpecJson(const TuneOptions &options,
                                             const TuneCandidate &c) {
  return specJsonOf(options, c, /*withBatch=*/true);
}

namespace {

/// The spec that tuneSpecJson writes for `c` (world size `world`), as
/// parseSpec would read it, built without the JSON round trip: the model,
/// mixed precision and optimizer, which tuneSpecJson writes the same for
/// every candidate, come from `base`, the plainest candidate's spec read
/// once from its JSON (Tuner::run); the rest from the candidate. checkSpec
/// then makes parseSpec's cross-section checks, which refuse some
/// candidates (e.g. float8 all-gather without FSDP).
Spec candidateSpec(const Spec &base, int64_t world, const TuneCandidate &c) {
  Spec s;
  s.description = "meshplan tune: " + c.describe();
  s.model = base.model;
  s.worldSize = world;
  auto axis = [&](const char *n, int64_t size) {
    if (size > 1)
      s.mesh.axes.push_back({n, size, false});
  };
  // torchtitan's mesh order: pp outermost.
  axis("pp", c.pp);
  axis("dp_replicate", c.replicate);
  axis("dp_shard", c.shard);
  axis("cp", c.cp);
  axis("tp", c.tp);
  if (s.mesh.axes.empty())
    s.mesh.axes.push_back({"dp_shard", 1, false});
  if (c.replicate > 1)
    s.dataParallel.replicateAxes = {"dp_replicate"};
  if (c.shard > 1) {
    s.dataParallel.shardAxes = {"dp_shard"};
    s.dataParallel.reshardAfterForward =
        c.reshardAfterForward ? ReshardPolicy::Default : ReshardPolicy::Never;
  }
  if (c.tp > 1)
    s.tensorParallel = TensorParallelSpec{
        "tp", std::vector<TPRule>(std::begin(kTPPlan), std::end(kTPPlan))};
  if (c.cp > 1)
    s.extraAxes = {"cp"};
  if (c.pp > 1) {
    PipelineParallelSpec pp;
    pp.axis = "pp";
    pp.schedule = c.schedule;
    pp.microbatches = c.microbatches;
    pp.stagesPerRank = defaultStagesPerRank(c.schedule);
    if (c.stagesPerRank > 1) {
      pp.stagesPerRank = c.stagesPerRank;
      pp.stagesPerRankGiven = true;
    }
    pp.split = PipelineSplit::Auto;
    s.pipelineParallel = std::move(pp);
  }
  s.mixedPrecision = base.mixedPrecision;
  if (c.float8AllGather) {
    Float8Spec f8;
    f8.allGather = true;
    f8.exclude = {"output"};
    f8.powerOf2Scales = true;
    s.float8 = std::move(f8);
  }
  s.optimizer = base.optimizer;
  if (c.pp == 1) {
    s.gradientAccumulationSteps = c.accumulationSteps;
    s.accumulationReduce = c.reduce;
  }
  s.activationCheckpointing = c.checkpointing;
  s.batch = base.batch;
  return s;
}

class Tuner {
public:
  explicit Tuner(const TuneOptions &options) : options(options) {}

  Result<TuneResult> run();

private:
  const TuneOptions &options;
  /// The plainest candidate's spec and its model, read once (run): every
  /// candidate's spec is built from them (candidateSpec).
  Spec baseSpec;
  std::shared_ptr<const Model> model;
  int64_t tokensPerStep = 0;
  /// Transformer blocks of the model ("layers.N" units): a stage holds at
  /// least one.
  int64_t modelBlocks = 0;
  using FigureKey = std::tuple<int64_t, int64_t, bool, int>;
  std::map<FigureKey, Figures> figureCache;
  /// Stages -> the stage of every parameter under split "auto"; nullopt
  /// when the split refuses that many stages.
  std::map<int64_t, std::optional<std::vector<int>>> splitCache;
  /// (figures, pp, v, placement) -> per pp coordinate.
  std::map<std::tuple<FigureKey, int64_t, int64_t, int>,
           std::vector<RankFigures>>
      rankCache;
  /// (schedule, p, m, v) -> core's simulation under the textbook costs.
  std::map<std::tuple<int, int64_t, int64_t, int64_t>,
           std::optional<PipelineSimulation>>
      scheduleCache;

  static FigureKey keyOf(const TuneCandidate &c) {
    return std::make_tuple(c.tp, c.cp, c.float8AllGather,
                           static_cast<int>(c.checkpointing));
  }
  int64_t microbatchesOf(const TuneCandidate &c) const {
    return c.pp > 1 ? c.microbatches : c.accumulationSteps;
  }
  ImportOptions importFor(const TuneCandidate &c) const {
    ImportOptions import;
    import.tokensPerMicrobatch =
        tokensPerStep / (c.replicate * c.shard * microbatchesOf(c));
    import.sequenceLength = options.sequenceLength;
    return import;
  }

  /// The candidate's spec (world size `world`) checked and resolved
  /// against the model, as loadSpec(tuneSpecJson(...)) would give it.
  /// Representatives (figures, stageOfParam) are not candidates: they need
  /// not split the batch (`withBatch` false leaves it out).
  Result<ResolvedSpec> resolveCandidate(const TuneCandidate &c, int64_t world,
                                        bool withBatch = true) const {
    Spec spec = candidateSpec(baseSpec, world, c);
    if (!withBatch)
      spec.batch.reset();
    MESHPLAN_TRY(checkSpec(spec));
    return resolveSpec(std::move(spec), model);
  }
  std::vector<int64_t> pipelineDegrees() const;
  std::vector<TuneCandidate> enumerate() const;
  Result<Figures> figures(const TuneCandidate &c);
  const std::optional<std::vector<int>> &stageOfParam(int64_t stages);
  const std::vector<RankFigures> *perRank(const TuneCandidate &c,
                                          const Figures &f);
  const PipelineSimulation *simulation(const TuneCandidate &c);
  bool screen(TuneCandidate &c, const Figures &f);
  std::vector<double> rankPeakBytes(const TuneCandidate &c, const Figures &f,
                                    const std::vector<RankFigures> &ranks,
                                    const PipelineSimulation &sim) const;
  double commPerBlockAndMicrobatch(const TuneCandidate &c,
                                   const Figures &f) const;
  double trainerCommSeconds(const TuneCandidate &c, const Figures &f);
  Result<void> confirm(TuneCandidate &c);
  Result<void> confirmPipeline(TuneCandidate &c, const ResolvedSpec &spec,
                               const Figures &f);
};

/// 1 (no pipeline) and the pp degrees options allow: dividing the world,
/// at most maxPipelineParallel, and at most the blocks (a stage holds at
/// least one).
std::vector<int64_t> Tuner::pipelineDegrees() const {
  if (options.pipelineParallel >= 1)
    return {options.pipelineParallel};
  std::vector<int64_t> out;
  for (int64_t pp : divisors(options.world))
    if (pp == 1 || (pp <= options.maxPipelineParallel && pp <= modelBlocks))
      out.push_back(pp);
  return out;
}

/// The schedules tried under a pipeline, with their stages per rank:
/// torchtitan's defaults (one for the single-stage schedules, two for the
/// multi-stage ones).
constexpr std::pair<PipelineScheduleKind, int64_t> kSchedules[] = {
    {PipelineScheduleKind::GPipe, 1},
    {PipelineScheduleKind::OneFOneB, 1},
    {PipelineScheduleKind::Interleaved1F1B, 2},
    {PipelineScheduleKind::ZeroBubbleV, 2},
};

std::vector<TuneCandidate> Tuner::enumerate() const {
  std::vector<TuneCandidate> out;
  int64_t node = options.cost.ranksPerNode;
  const ActivationCheckpointing policies[] = {
      ActivationCheckpointing::None, ActivationCheckpointing::Selective,
      ActivationCheckpointing::Full};
  for (int64_t pp : pipelineDegrees()) {
    int64_t perPipeline = options.world / pp;
    for (int64_t tp : divisors(perPipeline)) {
      if (tp > node || node % tp != 0)
        continue;
      for (int64_t cp = 1;
           cp <= options.maxContextParallel && (perPipeline / tp) % cp == 0;
           cp *= 2) {
        int64_t rest = perPipeline / (tp * cp);
        for (int64_t replicate : divisors(rest)) {
          int64_t shard = rest / replicate;
          int64_t dp = replicate * shard;
          TuneCandidate base;
          base.pp = pp;
          base.replicate = replicate;
          base.shard = shard;
          base.cp = cp;
          base.tp = tp;
          for (bool fp8 : {false, true}) {
            // Without sharding there is nothing to gather.
            if (shard == 1 && fp8)
              continue;
            base.float8AllGather = fp8;
            if (pp > 1) {
              // Whole sequences per data-parallel rank, cut into m
              // microbatches of whole sequences.
              if (tokensPerStep % (dp * options.sequenceLength) != 0)
                continue;
              int64_t sequences = tokensPerStep / (dp * options.sequenceLength);
              // The plans gather a stage's parameters once per step under
              // a pipeline; "never" says so (torchtitan's default).
              base.reshardAfterForward = shard == 1;
              for (auto [kind, v] : kSchedules) {
                if (pp * v > modelBlocks)
                  continue;
                // p, 2p, 4p, 8p, and one sequence per microbatch (the
                // fewest activations in flight).
                std::vector<int64_t> counts = {pp, 2 * pp, 4 * pp, 8 * pp,
                                               sequences};
                std::sort(counts.begin(), counts.end());
                counts.erase(std::unique(counts.begin(), counts.end()),
                             counts.end());
                for (int64_t m : counts) {
                  if (m > sequences || sequences % m != 0 ||
                      m > options.maxPipelineMicrobatches ||
                      !checkPipelineScheduleConfig({kind, pp, m, v}))
                    continue;
                  for (ActivationCheckpointing ac : policies) {
                    TuneCandidate c = base;
                    c.schedule = kind;
                    c.stagesPerRank = v;
                    c.microbatches = m;
                    c.checkpointing = ac;
                    out.push_back(c);
                  }
                }
              }
              continue;
            }
            for (bool reshard : {true, false}) {
              // Without sharding there is nothing to reshard.
              if (shard == 1 && !reshard)
                continue;
              for (int64_t ga = 1; ga <= options.maxAccumulationSteps;
                   ga *= 2) {
                // Whole sequences per microbatch on every data-parallel
                // rank.
                if (tokensPerStep % (dp * ga) != 0 ||
                    (tokensPerStep / (dp * ga)) % options.sequenceLength != 0)
                  continue;
                for (AccumulationReduce reduce :
                     {AccumulationReduce::EveryMicrobatch,
                      AccumulationReduce::LastMicrobatch}) {
                  if (ga == 1 && reduce == AccumulationReduce::LastMicrobatch)
                    continue;
                  for (ActivationCheckpointing ac : policies) {
                    TuneCandidate c = base;
                    c.reshardAfterForward = reshard;
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
  }
  return out;
}

/// Resolves one representative spec per (tp, cp, float8, checkpointing)
/// and reads the figures the screen scales.
Result<Figures> Tuner::figures(const TuneCandidate &c) {
  FigureKey key = keyOf(c);
  if (auto it = figureCache.find(key); it != figureCache.end())
    return it->second;
  TuneCandidate rep;
  rep.tp = c.tp;
  rep.cp = c.cp;
  rep.shard = options.world / (c.tp * c.cp);
  rep.float8AllGather = c.float8AllGather;
  rep.checkpointing = c.checkpointing;
  auto spec = resolveCandidate(rep, options.world, /*withBatch=*/false);
  if (!spec)
    return spec.error();
  Figures f;
  ImportOptions import;
  import.tokensPerMicrobatch = options.sequenceLength;
  import.sequenceLength = options.sequenceLength;
  f.tokens = import.tokensPerMicrobatch;
  f.paramElements.assign(spec->params.size(), 0);
  f.paramGatherBytes.assign(spec->params.size(), 0);
  std::vector<Unit> units = fsdpUnits(*spec, import);
  std::map<std::string, size_t> unitIndex;
  double gathered = 0, gatheredBytes = 0;
  for (const Unit &u : units) {
    UnitFigures uf;
    double local = 0;
    for (int p : u.params) {
      const ParamAssignment &param = spec->params[p];
      double n = 1;
      for (int64_t d : param.shape)
        n *= double(d);
      if (param.tpDim >= 0)
        n /= double(c.tp);
      local += n;
      double bytes = n * (param.float8 && c.float8AllGather ? 1 : 2);
      gatheredBytes += bytes;
      f.paramElements[size_t(p)] = n;
      f.paramGatherBytes[size_t(p)] = bytes;
      if (uf.firstParam < 0 || p < uf.firstParam)
        uf.firstParam = p;
      if (param.name.ends_with("attention.wq.weight"))
        f.dim = param.shape[1];
      if (param.name.ends_with("attention.wk.weight"))
        f.kvDim = param.shape[0];
    }
    f.paramsPerTpRank += local;
    f.largestUnit = std::max(f.largestUnit, local);
    gathered += local;
    uf.flops = 3 * u.forwardFlops + u.recomputeFlops;
    f.flopsPerStep += uf.flops;
    uf.block = u.name.rfind("layers.", 0) == 0;
    if (uf.block)
      ++f.blocks;
    unitIndex[u.name] = f.units.size();
    f.units.push_back(uf);
  }
  f.gatherBytesPerElement = gathered > 0 ? gatheredBytes / gathered : 2;
  auto act = estimateActivations(*spec, import);
  if (!act)
    return act.error();
  // Every block's saved activations plus the largest working set.
  double transient = 0;
  for (const auto &[unit, a] : act->units) {
    double saved = double(a.saved);
    double working = double(std::max(a.forwardTransient, a.backwardTransient));
    f.activationBytes += saved;
    transient = std::max(transient, working);
    if (auto it = unitIndex.find(unit); it != unitIndex.end()) {
      f.units[it->second].saved += saved;
      f.units[it->second].transient =
          std::max(f.units[it->second].transient, working);
    }
  }
  f.activationBytes += transient;
  figureCache[key] = f;
  return f;
}

/// The stage of every parameter when the model is cut into `stages` by the
/// spec's split "auto" (what tuneSpecJson writes), from a spec of `stages`
/// pp ranks and nothing else: the split depends on the model only.
const std::optional<std::vector<int>> &Tuner::stageOfParam(int64_t stages) {
  auto [it, inserted] = splitCache.try_emplace(stages);
  if (!inserted)
    return it->second;
  TuneCandidate rep;
  rep.pp = stages;
  rep.schedule = PipelineScheduleKind::GPipe;
  rep.microbatches = 1;
  if (auto spec = resolveCandidate(rep, stages, /*withBatch=*/false);
      spec && spec->pipeline)
    it->second = spec->pipeline->stageOfParam;
  return it->second;
}

/// Figures summed per pp coordinate: a parameter goes to the coordinate of
/// its stage, a unit's FLOPs and activations to that of its first
/// parameter's stage. nullptr when the split refuses the stages.
const std::vector<RankFigures> *Tuner::perRank(const TuneCandidate &c,
                                               const Figures &f) {
  PipelineScheduleKind kind = c.schedule;
  StagePlacement placement = placementOf(kind);
  auto key = std::make_tuple(keyOf(c), c.pp, c.stagesPerRank,
                             static_cast<int>(placement));
  if (auto it = rankCache.find(key); it != rankCache.end())
    return &it->second;
  const std::optional<std::vector<int>> &split =
      stageOfParam(c.pp * c.stagesPerRank);
  if (!split || split->size() != f.paramElements.size())
    return nullptr;
  std::vector<RankFigures> ranks(size_t(c.pp));
  auto rankOf = [&](int param) {
    return size_t(rankOfStage(placement, c.pp, (*split)[size_t(param)]));
  };
  for (size_t p = 0; p < split->size(); ++p) {
    RankFigures &r = ranks[rankOf(int(p))];
    r.params += f.paramElements[p];
    r.gatherBytes += f.paramGatherBytes[p];
  }
  for (const UnitFigures &u : f.units) {
    if (u.firstParam < 0)
      continue;
    RankFigures &r = ranks[rankOf(u.firstParam)];
    r.flops += u.flops;
    r.saved += u.saved;
    r.transient = std::max(r.transient, u.transient);
    r.blocks += u.block ? 1 : 0;
  }
  return &(rankCache[key] = std::move(ranks));
}

/// Core's schedule for the candidate, simulated under the textbook costs:
/// the bubble and each pp rank's activations in flight.
const PipelineSimulation *Tuner::simulation(const TuneCandidate &c) {
  auto key = std::make_tuple(static_cast<int>(c.schedule), c.pp, c.microbatches,
                             c.stagesPerRank);
  auto [it, inserted] = scheduleCache.try_emplace(key);
  if (inserted) {
    auto schedule = buildPipelineSchedule(
        {c.schedule, c.pp, c.microbatches, c.stagesPerRank});
    if (schedule)
      if (auto sim = simulatePipelineSchedule(*schedule); sim)
        it->second = std::move(*sim);
  }
  return it->second ? &*it->second : nullptr;
}

/// The trainer's TP and CP collectives of one transformer block on one
/// microbatch (forward and backward).
double Tuner::commPerBlockAndMicrobatch(const TuneCandidate &c,
                                        const Figures &f) const {
  const plan::CostModel &m = options.cost;
  double tokens = double(importFor(c).tokensPerMicrobatch) / double(c.cp);
  double seconds = 0;
  // Sequence-parallel TP, per block and microbatch: an all-gather and a
  // reduce-scatter of the bf16 activations [tokens, dim] around attention
  // and around the feed-forward, in forward and again in backward.
  if (c.tp > 1)
    seconds +=
        8.0 * ring(double(c.tp - 1) / double(c.tp) * tokens * double(f.dim) * 2,
                   c.tp - 1, m.intraNodeLatencySeconds,
                   m.intraNodeBytesPerSecond);
  // Ring attention over cp, per block and microbatch: every rank passes its
  // bf16 K and V [tokens, kvDim] around the ring in forward, and K, V and
  // their gradients in backward.
  if (c.cp > 1) {
    bool intra = c.cp * c.tp <= m.ranksPerNode;
    seconds +=
        3.0 *
        ring(double(c.cp - 1) * 2 * tokens * double(f.kvDim) * 2, c.cp - 1,
             intra ? m.intraNodeLatencySeconds : m.interNodeLatencySeconds,
             intra ? m.intraNodeBytesPerSecond : m.interNodeBytesPerSecond);
  }
  return seconds;
}

/// The trainer's TP/CP collectives over a step. Under a pipeline: those of
/// the pp coordinate with the most blocks, over its m microbatches,
/// stretched as its compute is by the schedule's bubble (they run inside
/// its compute callbacks).
double Tuner::trainerCommSeconds(const TuneCandidate &c, const Figures &f) {
  double perBlock = commPerBlockAndMicrobatch(c, f);
  if (c.pp == 1)
    return perBlock * double(f.blocks) * double(c.accumulationSteps);
  const std::vector<RankFigures> *ranks = perRank(c, f);
  const PipelineSimulation *sim = simulation(c);
  if (!ranks || !sim)
    return 0;
  int64_t blocks = 0;
  for (const RankFigures &r : *ranks)
    blocks = std::max(blocks, r.blocks);
  return perBlock * double(blocks) * double(c.microbatches) /
         (1.0 - sim->bubbleFraction);
}

/// The screen's peak memory of every pp coordinate: the fp32 master shard
/// and AdamW state; the gradients accumulated whole over the microbatches
/// and reduced (into a shard) after the stage's last backward; the stage's
/// parameters gathered for the whole step; the activations of the (stage,
/// microbatch) pairs in flight at the rank's peak (core's simulation), each
/// a stage's share of the rank's, plus the largest working set.
std::vector<double> Tuner::rankPeakBytes(const TuneCandidate &c,
                                         const Figures &f,
                                         const std::vector<RankFigures> &ranks,
                                         const PipelineSimulation &sim) const {
  double n = double(c.shard), v = double(c.stagesPerRank);
  double scale = double(importFor(c).tokensPerMicrobatch) / double(f.tokens);
  std::vector<double> out;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const RankFigures &rf = ranks[k];
    double p = rf.params;
    double bytes = 12 * p / n + 4 * p + (c.shard > 1 ? 4 * p / n : 0);
    bytes += rf.gatherBytes;
    bytes +=
        (double(sim.peakActivations[k]) * rf.saved / v + rf.transient) * scale;
    out.push_back(bytes);
  }
  return out;
}

/// Fills the candidate's screen estimates; false when a pipeline layout
/// cannot be made (the split or the schedule refuses it).
bool Tuner::screen(TuneCandidate &c, const Figures &f) {
  const plan::CostModel &m = options.cost;
  double n = double(c.shard), r = double(c.replicate);
  double tokens = double(importFor(c).tokensPerMicrobatch);
  double scale = tokens / double(f.tokens);
  bool shardIntra = c.shard * c.cp * c.tp <= m.ranksPerNode;
  bool replicaIntra = options.world / c.pp <= m.ranksPerNode;
  auto bw = [&](bool intra) {
    return intra ? m.intraNodeBytesPerSecond : m.interNodeBytesPerSecond;
  };
  if (c.pp > 1) {
    const std::vector<RankFigures> *ranks = perRank(c, f);
    const PipelineSimulation *sim = simulation(c);
    if (!ranks || !sim)
      return false;
    c.bubbleFraction = sim->bubbleFraction;
    double mb = double(c.microbatches);
    double perBlock = commPerBlockAndMicrobatch(c, f);
    std::vector<double> peaks = rankPeakBytes(c, f, *ranks, *sim);
    double peak = *std::max_element(peaks.begin(), peaks.end());
    double busy = 0, dpComm = 0;
    for (size_t k = 0; k < ranks->size(); ++k) {
      const RankFigures &rf = (*ranks)[k];
      double p = rf.params;
      double compute = rf.flops * scale * mb / m.flopsPerSecond() +
                       perBlock * double(rf.blocks) * mb;
      busy = std::max(busy, compute);
      double comm = 0;
      if (c.shard > 1)
        comm += (n - 1) / n * (rf.gatherBytes + 4 * p) / bw(shardIntra);
      if (c.replicate > 1)
        comm += 2 * (r - 1) / r * 4 * p / n / bw(replicaIntra);
      dpComm = std::max(dpComm, comm);
    }
    c.screenPeakBytes = static_cast<int64_t>(peak);
    // The slowest coordinate's work stretched by the schedule's bubble;
    // each boundary crossed in the fill and again in the drain by one
    // microbatch's activation (bf16 [tokens / cp / tp, dim] under sequence
    // parallelism).
    double pipelineStep = busy / (1.0 - c.bubbleFraction);
    bool p2pIntra = options.world <= m.ranksPerNode;
    double boundary =
        std::ceil(tokens / double(c.cp) / double(c.tp)) * double(f.dim) * 2;
    double crossings = placementOf(c.schedule) == StagePlacement::V
                           ? 2.0 * double(c.pp - 1)
                           : double(c.pp * c.stagesPerRank - 1);
    double p2p =
        2 * crossings *
        ((p2pIntra ? m.intraNodeLatencySeconds : m.interNodeLatencySeconds) +
         boundary / bw(p2pIntra));
    c.screenStepSeconds = std::max(pipelineStep, dpComm) + p2p;
    return true;
  }
  double p = f.paramsPerTpRank;
  double ga = double(c.accumulationSteps);
  bool every = c.accumulationSteps == 1 ||
               c.reduce == AccumulationReduce::EveryMicrobatch;
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
  return true;
}

Result<void> Tuner::confirm(TuneCandidate &c) {
  auto spec = resolveCandidate(c, options.world);
  if (!spec)
    return spec.error();
  auto f = figures(c);
  if (!f)
    return f.error();
  if (c.pp > 1) {
    MESHPLAN_TRY(confirmPipeline(c, *spec, *f));
    c.compiled = true;
    c.fits = c.peakBytes <= options.cost.memoryCapacityBytes();
    if (c.fits) {
      c.trainerCommSeconds = trainerCommSeconds(c, *f);
      c.stepSeconds = c.planStepSeconds + c.trainerCommSeconds;
    }
    return {};
  }
  auto context = makeContext();
  CompileOptions compileOptions;
  compileOptions.import = importFor(c);
  // What tune reads of a plan needs no IR verification after every pass;
  // `meshplan plan` of the winning spec verifies.
  compileOptions.verifyEachStage = false;
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
  c.compiled = true;
  c.planStepSeconds = schedule->stepSeconds;
  c.exposedCommSeconds = schedule->exposedCommSeconds;
  c.trainerCommSeconds = trainerCommSeconds(c, *f);
  c.stepSeconds = c.planStepSeconds + c.trainerCommSeconds;
  c.peakBytes = plan->estimates ? plan->estimates->peakMemoryBytes["total"] : 0;
  c.fits = c.peakBytes <= options.cost.memoryCapacityBytes();
  return {};
}

/// As `meshplan plan` plans a pipelined spec and `explain` lays it out: one
/// template per pp coordinate (CompileOptions::pipelineRank), the plans of
/// the ranks that run rank 0's pipeline (its coordinates with each pp
/// coordinate in turn), laid out together by plan::simulateTogether. The
/// coordinates are compiled largest screened peak first; one over the
/// capacity ends the candidate there (it does not fit, and its step is not
/// needed), with that plan's peak.
Result<void> Tuner::confirmPipeline(TuneCandidate &c, const ResolvedSpec &spec,
                                    const Figures &f) {
  if (!spec.pipeline)
    return makeError("internal error: the spec has no pipeline_parallel");
  const Mesh &mesh = *spec.mesh;
  int axis = spec.pipeline->axisIndex;
  auto position = mesh.positionOf(0);
  if (!position)
    return position.error();
  int64_t base =
      *position - mesh.coordinateAt(*position, axis) * mesh.stride(axis);
  const int64_t pp = spec.pipeline->config.ranks;
  std::vector<int64_t> order(static_cast<size_t>(pp));
  for (int64_t k = 0; k < pp; ++k)
    order[size_t(k)] = k;
  const std::vector<RankFigures> *ranks = perRank(c, f);
  const PipelineSimulation *sim = simulation(c);
  if (ranks && sim && int64_t(ranks->size()) == pp) {
    std::vector<double> peaks = rankPeakBytes(c, f, *ranks, *sim);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return peaks[size_t(a)] > peaks[size_t(b)];
    });
  }
  auto context = makeContext();
  std::vector<plan::Plan> plans(static_cast<size_t>(pp));
  std::vector<std::vector<double>> flops(static_cast<size_t>(pp));
  c.planStepSeconds = 0;
  c.exposedCommSeconds = 0;
  c.peakBytes = 0;
  for (int64_t k : order) {
    CompileOptions compileOptions;
    compileOptions.import = importFor(c);
    compileOptions.pipelineRank = k;
    compileOptions.verifyEachStage = false;
    auto compiled = compile(*context, spec, compileOptions);
    if (!compiled)
      return compiled.error();
    auto prepared = plan::PreparedTemplate::prepare(compiled->program);
    if (!prepared)
      return prepared.error();
    auto plan =
        prepared->instantiate(mesh.rankAt(base + k * mesh.stride(axis)));
    if (!plan)
      return plan.error();
    if (plan->estimates)
      if (auto it = plan->estimates->peakMemoryBytes.find("total");
          it != plan->estimates->peakMemoryBytes.end())
        c.peakBytes = std::max(c.peakBytes, it->second);
    if (c.peakBytes > options.cost.memoryCapacityBytes())
      return {};
    plans[size_t(k)] = std::move(*plan);
    flops[size_t(k)] = prepared->flops();
  }
  std::vector<const plan::Plan *> pointers;
  for (const plan::Plan &one : plans)
    pointers.push_back(&one);
  auto schedules = plan::simulateTogether(pointers, flops, options.cost);
  if (!schedules)
    return schedules.error();
  for (size_t k = 0; k < plans.size(); ++k) {
    c.planStepSeconds =
        std::max(c.planStepSeconds, (*schedules)[k].stepSeconds);
    c.exposedCommSeconds =
        std::max(c.exposedCommSeconds, (*schedules)[k].exposedCommSeconds);
  }
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
  if (options.pipelineParallel < 0)
    return makeError("tune: the pipeline-parallel degree must be 0 (search) "
                     "or at least 1, not " +
                     std::to_string(options.pipelineParallel));
  if (options.maxPipelineParallel < 1)
    return makeError("tune: the largest pipeline-parallel degree must be at "
                     "least 1");
  if (options.pipelineParallel > 1 &&
      options.world % options.pipelineParallel != 0)
    return makeError("tune: pp " + std::to_string(options.pipelineParallel) +
                     " does not divide the world size " +
                     std::to_string(options.world));
  MESHPLAN_TRY(plan::checkCostModel(options.cost));
  tokensPerStep = globalTokensOf(options);
  // A bad model is the user's error, not "nothing fits": check it on the
  // plainest layout first.
  {
    TuneCandidate plain;
    plain.shard = options.world;
    auto spec = loadSpec(specJsonOf(options, plain, /*withBatch=*/false),
                         options.baseDir);
    if (!spec)
      return makeError("tune: " + spec.error().message);
    baseSpec = spec->spec;
    baseSpec.batch = BatchSpec{tokensPerStep, options.sequenceLength};
    model = spec->model;
    for (const Unit &u : fsdpUnits(*spec))
      modelBlocks += u.name.rfind("layers.", 0) == 0 ? 1 : 0;
  }
  if (options.pipelineParallel > modelBlocks)
    return makeError("tune: pp " + std::to_string(options.pipelineParallel) +
                     " leaves a stage without a block: the model has " +
                     std::to_string(modelBlocks) + " blocks");
  TuneResult result;
  result.capacityBytes = options.cost.memoryCapacityBytes();
  std::vector<TuneCandidate> candidates = enumerate();
  result.enumerated = candidates.size();
  std::vector<TuneCandidate> kept;
  for (TuneCandidate &c : candidates) {
    if (c.pp > 1)
      ++result.pipelined;
    auto f = figures(c);
    // The spec refuses this layout (e.g. TP does not divide the heads), or
    // the split refuses the stages.
    if (!f || !screen(c, *f)) {
      ++result.infeasible;
      continue;
    }
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
