//===- Explain.cpp - What one rank's plan does, as data -------------------===//
//
// See Explain.h. Everything here reads the rank's plan and the resolved
// spec; the only new work is the comparison compile with per-module units
// and the cost model's layouts.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Pipeline/Explain.h"

#include "meshplan/Core/PipelineSchedule.h"
#include "meshplan/Frontend/Model.h"
#include "meshplan/Frontend/Spec.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <tuple>

using namespace meshplan;
using namespace meshplan::pipeline;
using json = nlohmann::json;

/// The plan of one rank. The template is valid (it prepared), so what
/// instantiation refuses is the input's (a limit of docs/limits.md), not a
/// planner bug: the message says whose plan it was, not "internal error".
static Result<plan::Plan> instantiateRank(const PlannedSpec &planned,
                                          int64_t rank) {
  auto plan = planned.templateFor(rank).instantiate(rank);
  if (!plan)
    return makeError("the plan of rank " + std::to_string(rank) + ": " +
                     plan.error().message);
  return plan;
}

/// Callers outside the CLI (the Python binding) may pass any rank; a rank
/// outside the mesh is their input error, not a crash.
static Result<void> checkRankInMesh(const PlannedSpec &planned, int64_t rank) {
  const Mesh &mesh = *planned.spec.mesh;
  if (mesh.positionOf(rank))
    return {};
  return makeError("rank " + std::to_string(rank) +
                   " is not in the mesh (ranks 0.." +
                   std::to_string(mesh.size() - 1) + ")");
}

std::vector<int64_t> meshplan::pipeline::pipelinePeers(const PlannedSpec &p,
                                                       int64_t rank) {
  const Mesh &mesh = *p.spec.mesh;
  int axis = p.spec.pipeline->axisIndex;
  int64_t position = *mesh.positionOf(rank);
  int64_t base =
      position - mesh.coordinateAt(position, axis) * mesh.stride(axis);
  std::vector<int64_t> ranks;
  for (int64_t c = 0; c < p.spec.pipeline->config.ranks; ++c)
    ranks.push_back(mesh.rankAt(base + c * mesh.stride(axis)));
  return ranks;
}

Result<PipelineLayout>
meshplan::pipeline::layOutPipeline(const PlannedSpec &p, int64_t rank,
                                   const plan::CostModel &cost) {
  MESHPLAN_TRY(checkRankInMesh(p, rank));
  if (!p.spec.pipeline)
    return makeError("internal error: layOutPipeline on a spec without "
                     "pipeline_parallel");
  PipelineLayout out;
  out.ranks = pipelinePeers(p, rank);
  std::vector<std::vector<double>> flops;
  for (int64_t peer : out.ranks) {
    auto plan = instantiateRank(p, peer);
    if (!plan)
      return plan.error();
    out.plans.push_back(std::move(*plan));
    flops.push_back(p.templateFor(peer).flops());
  }
  std::vector<const plan::Plan *> pointers;
  for (const plan::Plan &one : out.plans)
    pointers.push_back(&one);
  auto schedules = plan::simulateTogether(pointers, flops, cost);
  if (!schedules)
    return makeError("internal error: " + schedules.error().message);
  out.schedules = std::move(*schedules);
  return out;
}

static int64_t peakOf(const plan::Plan &plan, const std::string &kind) {
  if (!plan.estimates)
    return 0;
  const auto &peak = plan.estimates->peakMemoryBytes;
  auto it = peak.find(kind);
  return it == peak.end() ? 0 : it->second;
}

/// The all-gathers of `rank` had the spec grouped its units per module
/// (norm and output apart); none when that spec does not plan.
static std::optional<int64_t> perModuleAllGathers(const PlannedSpec &p,
                                                  int64_t rank) {
  frontend::Spec perModule = p.spec.spec;
  perModule.dataParallel.units = frontend::UnitGrouping::PerModule;
  auto other = frontend::resolveSpec(perModule, p.spec.model);
  if (!other)
    return std::nullopt;
  CompileOptions options;
  options.import = p.options.import;
  auto compiled = compileTemplate(*p.context, *other, options);
  if (!compiled)
    return std::nullopt;
  auto plan = compiled->prepared.instantiate(rank);
  if (!plan)
    return std::nullopt;
  int64_t gathers = 0;
  for (const plan::Instruction &in : plan->program)
    gathers += in.op == plan::OpKind::AllGather;
  return gathers;
}

/// The FSDP units as `plan` gathers them, and the per-module comparison.
static void explainUnits(const PlannedSpec &p, const plan::Plan &plan,
                         Explanation &out) {
  std::map<std::string, std::string> tensorOf; // buffer -> parameter
  for (const plan::Buffer &buffer : plan.buffers)
    tensorOf[buffer.id] = buffer.tensor;
  std::map<std::string, size_t> unitOfParam;
  for (size_t u = 0; u < p.spec.units.size(); ++u)
    for (int param : p.spec.units[u].params)
      unitOfParam[p.spec.params[param].name] = u;

  for (const frontend::UnitAssignment &unit : p.spec.units) {
    Explanation::Unit row;
    row.name = unit.name;
    for (int param : unit.params) {
      int64_t n = 1;
      for (int64_t d : p.spec.params[param].shape)
        n *= d;
      row.elements += n;
      row.params.push_back(p.spec.params[param].name);
    }
    row.reshardAfterForward = unit.reshardAfterForward;
    row.root = unit.root;
    out.units.push_back(std::move(row));
  }
  for (const plan::Instruction &in : plan.program) {
    if (in.op != plan::OpKind::AllGather || in.outputs.empty())
      continue;
    auto it = unitOfParam.find(tensorOf[in.outputs.front()]);
    if (it == unitOfParam.end())
      continue;
    Explanation::Unit &unit = out.units[it->second];
    ++unit.allGathers;
    unit.gatheredBytes +=
        in.count * static_cast<int64_t>(plan::dtypeBytes(*in.dtype));
    ++out.unitAllGathers;
  }

  // torchtitan's [norm, output] unit against per-module units under the
  // same policy: only meaningful where that unit exists and no pipeline
  // splits the model (its stages have their own units).
  const frontend::Spec &spec = p.spec.spec;
  const frontend::UnitAssignment *normOutput = nullptr;
  for (const frontend::UnitAssignment &unit : p.spec.units)
    if (unit.name == "norm+output")
      normOutput = &unit;
  if (!normOutput || p.spec.pipeline ||
      spec.dataParallel.units != frontend::UnitGrouping::Torchtitan)
    return;
  if (auto gathers = perModuleAllGathers(p, plan.rank))
    out.perModule = Explanation::PerModuleComparison{
        *gathers, !normOutput->reshardAfterForward};
}

/// The per-stage table and the bubble of a pipelined spec, and the step of
/// the pipeline's ranks laid out together.
static Result<void> explainPipeline(const PlannedSpec &p, int64_t rank,
                                    const plan::CostModel &cost,
                                    Explanation &out) {
  const frontend::ResolvedPipeline &pp = *p.spec.pipeline;
  const PipelineScheduleConfig &config = pp.config;
  auto layout = layOutPipeline(p, rank, cost);
  if (!layout)
    return layout.error();

  Explanation::Pipeline pipeline;
  pipeline.schedule = std::string(pipelineScheduleKindName(config.kind));
  pipeline.axis = pp.axis;
  pipeline.size = config.ranks;
  pipeline.microbatches = config.microbatches;
  pipeline.stagesPerRank = config.stagesPerRank;
  pipeline.stageCount = pp.numStages();
  pipeline.coordinate = p.pipelineRankOf(rank);

  double step = 0, idle = 0;
  for (const plan::Schedule &s : layout->schedules)
    step = std::max(step, s.stepSeconds);
  for (size_t c = 0; c < layout->plans.size(); ++c) {
    const plan::Plan &plan = layout->plans[c];
    const plan::Schedule &s = layout->schedules[c];
    Explanation::PipelineStage row;
    row.coordinate = static_cast<int64_t>(c);
    row.rank = layout->ranks[c];
    for (int64_t stage : pp.stagesOfRank[c]) {
      row.stages.push_back(stage);
      row.parameters += pp.stages[size_t(stage)].numParameters;
    }
    row.peakMemoryBytes = peakOf(plan, "total");
    row.activationBytes = peakOf(plan, "activation");
    row.computeBusySeconds = s.computeStream >= 0
                                 ? s.streamBusySeconds[size_t(s.computeStream)]
                                 : 0.0;
    row.stepSeconds = s.stepSeconds;
    // Idle against the pipeline's step: every rank's step ends with the
    // slowest one's.
    row.idleFraction =
        step > 0 ? std::max(0.0, 1.0 - row.computeBusySeconds / step) : 0.0;
    idle += row.idleFraction;
    pipeline.ranks.push_back(std::move(row));
  }
  pipeline.bubbleFraction =
      layout->plans.empty() ? 0 : idle / double(layout->plans.size());
  pipeline.textbookFormula =
      config.kind == PipelineScheduleKind::Interleaved1F1B ? "(p-1)/(v m+p-1)"
      : config.kind == PipelineScheduleKind::ZeroBubbleV   ? "(p-1)/(6m+p-1)"
                                                           : "(p-1)/(m+p-1)";
  pipeline.textbookBubbleFraction = textbookBubbleFraction(config);
  out.pipeline = std::move(pipeline);

  Explanation::Step stepOut;
  stepOut.seconds = step;
  stepOut.exposedCommunicationSeconds =
      layout->schedules[size_t(p.pipelineRankOf(rank))].exposedCommSeconds;
  stepOut.tokensPerRank = out.activations
                              ? out.activations->tokensPerRank
                              : p.options.import.tokensPerMicrobatch;
  out.step = stepOut;
  return {};
}

Result<Explanation> meshplan::pipeline::explain(const PlannedSpec &p,
                                                int64_t rank,
                                                const plan::CostModel &cost) {
  MESHPLAN_TRY(checkRankInMesh(p, rank));
  const plan::PreparedTemplate &prepared = p.templateFor(rank);
  auto instantiated = instantiateRank(p, rank);
  if (!instantiated)
    return instantiated.error();
  const plan::Plan &plan = *instantiated;
  const frontend::Spec &spec = p.spec.spec;
  const Mesh &mesh = prepared.mesh();

  Explanation out;
  out.rank = rank;
  out.modelName = p.spec.model->name;
  out.parameterCount = frontend::countParameters(*p.spec.model);
  out.tensorCount = static_cast<int64_t>(p.spec.params.size());
  out.unitCount = static_cast<int64_t>(p.spec.units.size());
  out.unitGrouping =
      spec.dataParallel.units == frontend::UnitGrouping::Explicit
          ? std::string("explicit")
          : std::string(frontend::kUnitGroupingNames[static_cast<int>(
                spec.dataParallel.units)]);

  out.mesh = mesh.str();
  out.meshAxes = mesh.getAxes();
  out.worldSize = mesh.size();

  out.replicateAxes = spec.dataParallel.replicateAxes;
  out.shardAxes = spec.dataParallel.shardAxes;
  out.extraAxes = spec.extraAxes;
  if (spec.tensorParallel)
    out.tensorAxis = spec.tensorParallel->axis;
  out.reshardAfterForward = std::string(
      frontend::reshardPolicyName(spec.dataParallel.reshardAfterForward));
  out.paramDtype = std::string(frontend::dtypeName(spec.optimizer.paramDtype));
  out.computeDtype =
      std::string(frontend::dtypeName(spec.mixedPrecision.paramDtype));
  out.reduceDtype =
      std::string(frontend::dtypeName(spec.mixedPrecision.reduceDtype));

  std::map<std::string, const plan::Communicator *> comms;
  for (const plan::Communicator &c : plan.communicators) {
    comms[c.id] = &c;
    out.communicators.push_back(
        {c.id, c.axes, c.ranks, c.color, c.key, c.faultTolerant});
  }

  // Collectives per (communicator, op, dtype); float8 all-gathers also at
  // what they would send in the compute dtype.
  std::map<std::tuple<std::string, std::string, std::string>,
           Explanation::CollectiveSummary>
      collectives;
  Explanation::Float8 float8;
  auto computeDtype = plan::parseDType(out.computeDtype);
  if (!computeDtype)
    return makeError("internal error: compute dtype " + out.computeDtype +
                     " is no plan dtype");
  for (const plan::Instruction &in : plan.program) {
    if (!plan::isCollective(in.op))
      continue;
    auto comm = comms.find(in.comm);
    if (comm == comms.end() || !in.dtype)
      return makeError("internal error: collective on communicator \"" +
                       in.comm + "\" of rank " + std::to_string(rank) +
                       " without a communicator or dtype");
    int64_t n = static_cast<int64_t>(comm->second->ranks.size());
    int64_t sent = plan::bytesSent(in.op, *in.dtype, in.count, n);
    std::string op(plan::opKindName(in.op)), dtype(plan::dtypeName(*in.dtype));
    Explanation::CollectiveSummary &s = collectives[{in.comm, op, dtype}];
    s.communicator = in.comm;
    s.op = op;
    s.dtype = dtype;
    s.calls += 1;
    s.elements += in.count;
    s.bytes += sent;
    if (in.op == plan::OpKind::AllGather &&
        (*in.dtype == plan::DType::Float8E4M3 ||
         *in.dtype == plan::DType::Float8E5M2)) {
      ++float8.allGathers;
      float8.bytes += sent;
      float8.bytesInComputeDtype +=
          plan::bytesSent(in.op, *computeDtype, in.count, n);
    }
  }
  for (auto &[key, summary] : collectives) {
    out.collectiveBytes += summary.bytes;
    out.collectives.push_back(std::move(summary));
  }

  explainUnits(p, plan, out);

  if (plan.estimates) {
    for (const auto &[kind, bytes] : plan.estimates->peakMemoryBytes)
      if (kind != "total")
        out.peakMemory.push_back({kind, bytes});
    const auto &peak = plan.estimates->peakMemoryBytes;
    if (auto total = peak.find("total"); total != peak.end())
      out.peakMemoryTotal = total->second;
  }
  auto activations = estimateActivations(p.spec, p.options.import);
  if (activations && !activations->units.empty())
    out.activations = Explanation::Activations{
        activations->tokensPerRank,
        p.options.import.tokensPerMicrobatch,
        activations->contextAxis,
        activations->contextSize,
        activations->blocks,
        out.computeDtype,
        std::string(frontend::activationCheckpointingName(
            spec.activationCheckpointing))};

  Explanation::Capacity &capacity = out.capacity;
  capacity.device = cost.device;
  capacity.deviceMemoryBytes = cost.deviceMemoryBytes;
  capacity.reservedBytes = cost.reservedMemoryBytes;
  capacity.capacityBytes = cost.memoryCapacityBytes();
  capacity.peakBytes = out.peakMemoryTotal.value_or(0);
  capacity.fits = capacity.peakBytes <= capacity.capacityBytes;
  capacity.headroomBytes = capacity.capacityBytes - capacity.peakBytes;

  if (spec.float8 && spec.float8->enabled) {
    float8.allGather = spec.float8->allGather;
    out.float8 = float8;
  }

  if (const auto &o = plan.optimizer) {
    Explanation::OptimizerStep step;
    step.lr = o->lr;
    step.schedule = o->schedule;
    if (o->schedule) {
      LrPhases ph = lrPhases(*o->schedule);
      int64_t total = o->schedule->totalSteps;
      // The first step, the warmup's last, the decay's first, its middle
      // and the run's last.
      int64_t decayStart = ph.warmup + ph.stable + 1;
      std::vector<int64_t> at = {1, ph.warmup, decayStart,
                                 (decayStart + total) / 2, total};
      for (int64_t s : at)
        if (s >= 1 && s <= total &&
            (step.lrSamples.empty() || step.lrSamples.back().first < s))
          step.lrSamples.push_back({s, o->lrAt(s)});
    }
    step.weightDecay = o->weightDecay;
    step.noDecay = o->noDecay;
    if (o->maxNorm) {
      step.maxNorm = o->maxNorm;
      step.normType = std::string(gradNormTypeName(o->normType));
      step.normAxes = prepared.get().gradNormAxes;
      step.normRanks = {rank};
      std::map<std::string, const plan::Buffer *> byId;
      for (const plan::Buffer &b : plan.buffers)
        byId[b.id] = &b;
      for (const plan::Instruction &in : plan.program) {
        if (in.op == plan::OpKind::GradNorm) {
          step.countedTensors = static_cast<int64_t>(in.inputs.size());
          for (const std::string &id : in.inputs) {
            int64_t n = 1;
            for (int64_t d : byId.at(id)->localShape)
              n *= d;
            step.countedElements += n;
          }
        } else if (in.op == plan::OpKind::ClipGradients) {
          step.gradients = static_cast<int64_t>(in.outputs.size());
        } else if (in.op == plan::OpKind::AllReduce &&
                   in.dtype == plan::DType::Int64) {
          if (auto c = comms.find(in.comm); c != comms.end())
            step.normRanks = c->second->ranks;
        }
      }
    }
    out.optimizer = std::move(step);
  }

  if (p.spec.pipeline) {
    if (auto ok = explainPipeline(p, rank, cost, out); !ok)
      return ok.error();
  } else if (auto schedule = plan::simulate(plan, prepared.flops(), cost)) {
    // A plan the cost model cannot lay out (a bad cost model) has no step;
    // the rest of the explanation stands.
    out.step = Explanation::Step{
        schedule->stepSeconds, schedule->exposedCommSeconds,
        out.activations ? out.activations->tokensPerRank
                        : p.options.import.tokensPerMicrobatch};
  }
  return out;
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

template <typename T> static json orNull(const std::optional<T> &value) {
  return value ? json(*value) : json(nullptr);
}

static json optimizerJson(const Explanation::OptimizerStep &o) {
  json j = {{"lr", o.lr},
            {"weight_decay", o.weightDecay},
            {"no_decay", o.noDecay},
            {"max_norm", orNull(o.maxNorm)}};
  if (o.schedule) {
    json samples = json::array();
    for (auto [step, lr] : o.lrSamples)
      samples.push_back({{"step", step}, {"lr", lr}});
    j["lr_schedule"] = {
        {"warmup_steps", o.schedule->warmupSteps},
        {"decay_ratio", orNull(o.schedule->decayRatio)},
        {"decay_type", std::string(lrDecayTypeName(o.schedule->decayType))},
        {"min_lr_factor", o.schedule->minLrFactor},
        {"total_steps", o.schedule->totalSteps},
        {"samples", samples}};
  }
  if (o.maxNorm)
    j["grad_norm"] = {{"norm_type", o.normType},
                      {"axes", o.normAxes},
                      {"ranks", o.normRanks},
                      {"gradients", o.gradients},
                      {"counted_tensors", o.countedTensors},
                      {"counted_elements", o.countedElements}};
  return j;
}

json meshplan::pipeline::explanationJson(const Explanation &e) {
  json axes = json::array();
  for (const MeshAxis &axis : e.meshAxes)
    axes.push_back(
        {{"name", axis.name}, {"size", axis.size}, {"managed", axis.managed}});

  json communicators = json::array();
  for (const Explanation::Communicator &c : e.communicators)
    communicators.push_back({{"id", c.id},
                             {"axes", c.axes},
                             {"ranks", c.ranks},
                             {"color", c.color},
                             {"key", c.key},
                             {"fault_tolerant", c.faultTolerant}});

  json collectiveRows = json::array();
  for (const Explanation::CollectiveSummary &s : e.collectives)
    collectiveRows.push_back({{"communicator", s.communicator},
                              {"op", s.op},
                              {"dtype", s.dtype},
                              {"calls", s.calls},
                              {"elements", s.elements},
                              {"bytes", s.bytes}});

  json units = json::array();
  for (const Explanation::Unit &u : e.units)
    units.push_back({{"name", u.name},
                     {"elements", u.elements},
                     {"gathered_bytes", u.gatheredBytes},
                     {"all_gathers", u.allGathers},
                     {"reshard_after_forward", u.reshardAfterForward},
                     {"root", u.root},
                     {"params", u.params}});
  json perModule = nullptr;
  if (e.perModule)
    perModule = {
        {"all_gathers", e.perModule->allGathers},
        {"norm_output_kept_gathered", e.perModule->normOutputKeptGathered}};

  json peakByKind = json::object();
  for (const Explanation::MemoryKind &kind : e.peakMemory)
    peakByKind[kind.kind] = kind.bytes;
  json activations = nullptr;
  if (const auto &a = e.activations)
    activations = {
        {"tokens_per_rank", a->tokensPerRank},
        {"tokens_per_data_parallel_rank", a->tokensPerDataParallelRank},
        {"context_axis", a->contextAxis},
        {"context_size", a->contextSize},
        {"blocks", a->blocks},
        {"dtype", a->dtype},
        {"activation_checkpointing", a->activationCheckpointing}};
  const Explanation::Capacity &c = e.capacity;
  json capacity = {{"device", c.device},
                   {"device_memory_bytes", c.deviceMemoryBytes},
                   {"reserved_bytes", c.reservedBytes},
                   {"capacity_bytes", c.capacityBytes},
                   {"peak_bytes", c.peakBytes},
                   {"fits", c.fits},
                   {"headroom_bytes", c.headroomBytes}};

  json float8 = nullptr;
  if (const auto &f = e.float8)
    float8 = {{"all_gather", f->allGather},
              {"all_gathers", f->allGathers},
              {"bytes", f->bytes},
              {"bytes_in_compute_dtype", f->bytesInComputeDtype}};

  json pipeline = nullptr;
  if (const auto &pp = e.pipeline) {
    json ranks = json::array();
    for (const Explanation::PipelineStage &s : pp->ranks)
      ranks.push_back({{"coordinate", s.coordinate},
                       {"rank", s.rank},
                       {"stages", s.stages},
                       {"parameters", s.parameters},
                       {"peak_memory_bytes", s.peakMemoryBytes},
                       {"activation_bytes", s.activationBytes},
                       {"compute_busy_seconds", s.computeBusySeconds},
                       {"step_seconds", s.stepSeconds},
                       {"idle_fraction", s.idleFraction}});
    pipeline = {{"schedule", pp->schedule},
                {"axis", pp->axis},
                {"size", pp->size},
                {"microbatches", pp->microbatches},
                {"stages_per_rank", pp->stagesPerRank},
                {"stage_count", pp->stageCount},
                {"coordinate", pp->coordinate},
                {"ranks", std::move(ranks)},
                {"bubble_fraction", pp->bubbleFraction},
                {"textbook_formula", pp->textbookFormula},
                {"textbook_bubble_fraction", pp->textbookBubbleFraction}};
  }

  json step = nullptr;
  if (const auto &s = e.step)
    step = {{"seconds", s->seconds},
            {"exposed_communication_seconds", s->exposedCommunicationSeconds},
            {"tokens_per_rank", s->tokensPerRank}};

  return {
      {"rank", e.rank},
      {"model",
       {{"name", e.modelName},
        {"parameters", e.parameterCount},
        {"tensors", e.tensorCount},
        {"units", e.unitCount},
        {"unit_grouping", e.unitGrouping}}},
      {"mesh",
       {{"text", e.mesh},
        {"axes", std::move(axes)},
        {"world_size", e.worldSize}}},
      {"roles",
       {{"replicate_axes", e.replicateAxes},
        {"shard_axes", e.shardAxes},
        {"tensor_axis", orNull(e.tensorAxis)},
        {"extra_axes", e.extraAxes},
        {"reshard_after_forward", e.reshardAfterForward},
        {"param_dtype", e.paramDtype},
        {"compute_dtype", e.computeDtype},
        {"reduce_dtype", e.reduceDtype}}},
      {"communicators", std::move(communicators)},
      {"collectives",
       {{"rows", std::move(collectiveRows)},
        {"total_bytes", e.collectiveBytes}}},
      {"fsdp_units",
       {{"units", std::move(units)},
        {"all_gathers", e.unitAllGathers},
        {"per_module", std::move(perModule)}}},
      {"memory",
       {{"peak_by_kind", std::move(peakByKind)},
        {"peak_total_bytes", orNull(e.peakMemoryTotal)},
        {"activations", std::move(activations)},
        {"capacity", std::move(capacity)}}},
      {"float8", std::move(float8)},
      {"optimizer", e.optimizer ? optimizerJson(*e.optimizer) : json(nullptr)},
      {"pipeline", std::move(pipeline)},
      {"step", std::move(step)},
  };
}
