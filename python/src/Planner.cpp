//===- Planner.cpp - Spec, plan, verify, tune from Python -----------------===//
//
// meshplan.Spec is a frontend::ResolvedSpec (checked against its model);
// meshplan.plan runs pipeline::planSpec and instantiates the rank's plans
// exactly as `meshplan plan` does; meshplan.verify is plan::verifyPlans;
// meshplan.tune is pipeline::tune. The GIL is released while C++ works.
//
//===----------------------------------------------------------------------===//
#include "Bindings.h"

#include "meshplan/Frontend/Spec.h"
#include "meshplan/Pipeline/Explain.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Pipeline/Tune.h"
#include "meshplan/Plan/CostModel.h"
#include "meshplan/Plan/PlanDirectory.h"
#include "meshplan/Plan/Verify.h"

#include <nlohmann/json.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>

namespace fs = std::filesystem;
using namespace meshplan;
using namespace meshplan::python;

namespace {

/// meshplan.Spec: a spec checked against its model.
struct SpecObject {
  std::shared_ptr<const frontend::ResolvedSpec> resolved;
  std::string text;   ///< the JSON document
  std::string origin; ///< its file, or "<dict>" / "<json>"
};

nb::list intList(const std::vector<int64_t> &values) {
  nb::list out;
  for (int64_t v : values)
    out.append(v);
  return out;
}

nb::list stringList(const std::vector<std::string> &values) {
  nb::list out;
  for (const std::string &v : values)
    out.append(v);
  return out;
}

/// `model`: a model document (docs/model.schema.json) that replaces the
/// one the spec names (meshplan.torch describes a torch module).
SpecObject specFromText(const std::string &text, const std::string &baseDir,
                        std::optional<int64_t> worldSize,
                        const std::string &origin,
                        const std::optional<std::string> &model = {},
                        std::optional<int64_t> totalSteps = {}) {
  frontend::SpecOptions options;
  options.worldSize = worldSize;
  options.totalSteps = totalSteps;
  if (model) {
    auto parsed = frontend::parseModel(*model);
    if (!parsed)
      raise("SpecError", parsed.error().within("model"));
    options.model = std::make_shared<const frontend::Model>(std::move(*parsed));
  }
  Result<frontend::ResolvedSpec> resolved = makeError("");
  {
    nb::gil_scoped_release release;
    resolved = frontend::loadSpec(text, baseDir, options);
  }
  if (!resolved)
    raise("SpecError", origin.front() == '<' ? resolved.error()
                                             : resolved.error().within(origin));
  return SpecObject{
      std::make_shared<frontend::ResolvedSpec>(std::move(*resolved)), text,
      origin};
}

SpecObject specFromFile(const std::string &path,
                        std::optional<int64_t> worldSize,
                        const std::optional<std::string> &model,
                        std::optional<int64_t> totalSteps) {
  auto text = plan::readTextFile(path);
  if (!text)
    raise("SpecError", text.error());
  std::string base = fs::path(path).parent_path().string();
  return specFromText(*text, base.empty() ? "." : base, worldSize, path, model,
                      totalSteps);
}

/// The options `meshplan plan` compiles with, from plan()'s keywords: the
/// work per microbatch by the CLI's rule (frontend::microbatchWork: the
/// keywords, else the spec's "batch", else 8192).
pipeline::CompileOptions
compileOptions(const SpecObject &spec, std::optional<int64_t> tokensPerRank,
               std::optional<int64_t> globalBatchTokens,
               std::optional<int64_t> seqLen,
               const std::optional<std::string> &contextParallel) {
  frontend::WorkRequest request;
  request.tokensPerRank = tokensPerRank;
  request.globalBatchTokens = globalBatchTokens;
  request.sequenceLength = seqLen;
  auto work = frontend::microbatchWork(spec.resolved->spec, request);
  if (!work)
    raise("SpecError", work.error());
  pipeline::CompileOptions options;
  options.import.tokensPerMicrobatch = work->tokensPerRank;
  options.import.sequenceLength = work->sequenceLength;
  if (contextParallel)
    options.import.contextParallelAxis =
        *contextParallel == "none" ? "" : *contextParallel;
  if (auto axis = pipeline::contextParallelAxis(*spec.resolved, options.import);
      !axis)
    raise("SpecError", axis.error().within("context_parallel"));
  return options;
}

void checkRank(const frontend::ResolvedSpec &spec, int64_t rank) {
  if (rank < 0 || rank >= spec.mesh->size())
    raise("SpecError", "rank: " + std::to_string(rank) +
                           " is not a rank of the mesh " + spec.mesh->str() +
                           " (" + std::to_string(spec.mesh->size()) +
                           " ranks)");
}

/// Under a pipeline, the pp coordinate whose template `rank`'s plan needs
/// (planSpec's `coordinates`); unset without one: every rank shares one.
std::optional<std::vector<int64_t>>
coordinatesOf(const frontend::ResolvedSpec &spec, int64_t rank) {
  if (!spec.pipeline)
    return std::nullopt;
  return std::vector<int64_t>{spec.mesh->coordinateAt(
      *spec.mesh->positionOf(rank), spec.pipeline->axisIndex)};
}

/// meshplan.plan: one rank's plan, or every rank's (a list, by rank).
nb::object planOf(const SpecObject &spec, std::optional<int64_t> rank,
                  std::optional<int64_t> tokensPerRank,
                  std::optional<int64_t> globalBatchTokens,
                  std::optional<int64_t> seqLen,
                  const std::optional<std::string> &contextParallel) {
  const frontend::ResolvedSpec &resolved = *spec.resolved;
  if (rank)
    checkRank(resolved, *rank);
  pipeline::CompileOptions options = compileOptions(
      spec, tokensPerRank, globalBatchTokens, seqLen, contextParallel);
  // Under a pipeline, one rank needs only its pp coordinate's template.
  std::optional<std::vector<int64_t>> coordinates;
  if (rank)
    coordinates = coordinatesOf(resolved, *rank);
  int64_t world = resolved.mesh->size();
  std::vector<int64_t> ranks;
  if (rank)
    ranks.push_back(*rank);
  else
    for (int64_t r = 0; r < world; ++r)
      ranks.push_back(r);

  std::shared_ptr<pipeline::PlannedSpec> planned;
  std::vector<std::shared_ptr<const plan::Plan>> plans(ranks.size());
  std::optional<Error> failure;
  {
    nb::gil_scoped_release release;
    auto compiled = pipeline::planSpec(resolved, options, coordinates);
    if (!compiled) {
      failure = compiled.error();
    } else {
      planned = std::make_shared<pipeline::PlannedSpec>(std::move(*compiled));
      for (size_t i = 0; i < ranks.size() && !failure; ++i) {
        auto one = planned->templateFor(ranks[i]).instantiate(ranks[i]);
        if (!one) {
          failure = one.error().within("the plan of rank " +
                                       std::to_string(ranks[i]));
          break;
        }
        plans[i] = std::make_shared<const plan::Plan>(std::move(*one));
      }
    }
  }
  if (failure)
    raise("SpecError", *failure);
  if (rank)
    return nb::cast(PlanObject{plans[0], planned});
  nb::list out;
  for (auto &p : plans)
    out.append(nb::cast(PlanObject{std::move(p), planned}));
  return out;
}

nb::dict communicatorDict(const plan::Communicator &c) {
  nb::dict d;
  d["id"] = c.id;
  d["ranks"] = intList(c.ranks);
  d["color"] = c.color;
  d["key"] = c.key;
  d["axes"] = stringList(c.axes);
  d["view"] = c.view ? nb::cast(*c.view) : nb::none();
  d["fault_tolerant"] = c.faultTolerant;
  return d;
}

nb::dict bufferDict(const plan::Buffer &b) {
  nb::dict d;
  d["id"] = b.id;
  d["kind"] = std::string(plan::bufferKindName(b.kind));
  d["dtype"] = std::string(plan::dtypeName(b.dtype));
  d["global_shape"] = intList(b.globalShape);
  d["local_shape"] = intList(b.localShape);
  d["offset"] = intList(b.offset);
  d["layout"] = b.layout;
  d["tensor"] = b.tensor;
  d["tensor_id"] = b.tensorId ? nb::cast(*b.tensorId) : nb::none();
  return d;
}

nb::dict instructionDict(const plan::Instruction &in) {
  nb::dict d;
  d["id"] = in.id;
  d["stream"] = in.stream;
  d["op"] = std::string(plan::opKindName(in.op));
  d["comm"] = in.comm;
  d["dtype"] =
      in.dtype ? nb::cast(std::string(plan::dtypeName(*in.dtype))) : nb::none();
  d["count"] = in.count;
  d["inputs"] = stringList(in.inputs);
  d["outputs"] = stringList(in.outputs);
  d["deps"] = stringList(in.deps);
  d["label"] = in.label;
  d["phase"] = in.phase;
  d["unit"] = in.unit;
  d["microbatch"] = in.microbatch;
  return d;
}

nb::object optimizerDict(const std::optional<plan::OptimizerConfig> &o) {
  if (!o)
    return nb::none();
  nb::dict d;
  d["name"] = o->name;
  d["lr"] = o->lr;
  d["beta1"] = o->beta1;
  d["beta2"] = o->beta2;
  d["eps"] = o->eps;
  d["weight_decay"] = o->weightDecay;
  d["stochastic_rounding"] = o->stochasticRounding;
  d["seed"] = o->seed;
  // The optimizer step (docs/trainer.md): None where the plan has none.
  if (o->schedule) {
    nb::dict sd;
    sd["warmup_steps"] = o->schedule->warmupSteps;
    sd["decay_ratio"] = o->schedule->decayRatio
                            ? nb::cast(*o->schedule->decayRatio)
                            : nb::none();
    sd["decay_type"] = std::string(lrDecayTypeName(o->schedule->decayType));
    sd["min_lr_factor"] = o->schedule->minLrFactor;
    sd["total_steps"] = o->schedule->totalSteps;
    d["lr_schedule"] = sd;
  } else {
    d["lr_schedule"] = nb::none();
  }
  d["max_norm"] = o->maxNorm ? nb::cast(*o->maxNorm) : nb::none();
  d["norm_type"] = std::string(gradNormTypeName(o->normType));
  d["no_decay"] = nb::cast(o->noDecay);
  return d;
}

nb::object estimatesDict(const std::optional<plan::Estimates> &e) {
  if (!e)
    return nb::none();
  nb::dict peak, sent, d;
  for (const auto &[kind, bytes] : e->peakMemoryBytes)
    peak[kind.c_str()] = bytes;
  for (const auto &[comm, bytes] : e->bytesPerStepPerComm)
    sent[comm.c_str()] = bytes;
  d["peak_memory_bytes"] = peak;
  d["bytes_per_step_per_comm"] = sent;
  return d;
}

PlanObject planFromText(const std::string &text, const std::string &origin) {
  Result<plan::Plan> parsed = makeError("");
  {
    nb::gil_scoped_release release;
    parsed = plan::parsePlan(text);
  }
  if (!parsed)
    raise("PlanError", parsed.error().within(origin));
  return PlanObject{std::make_shared<const plan::Plan>(std::move(*parsed)),
                    nullptr};
}

/// Writes `text` beside `path` and renames it into place: never a
/// half-written file.
void writeAtomically(const std::string &path, const std::string &text) {
  std::string tmp = path + ".tmp";
  std::error_code ec;
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    file << text;
    file.flush();
    if (!file.good()) {
      fs::remove(tmp, ec);
      raise("Error", path + ": cannot write");
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    raise("Error", path + ": cannot write: " + ec.message());
  }
}

nb::dict verifyResultDict(const plan::VerifyResult &r) {
  nb::dict d;
  if (r.failure) {
    const plan::VerifyFailure &f = *r.failure;
    nb::dict one;
    one["kind"] = std::string(plan::failureKindName(f.kind));
    one["rank"] = f.rank;
    one["index"] = f.index;
    one["instruction"] = f.instruction;
    one["comm"] = f.comm;
    one["other_rank"] = f.otherRank;
    one["message"] = f.message;
    d["failure"] = one;
  } else {
    d["failure"] = nb::none();
  }
  nb::dict stats;
  stats["ranks"] = r.stats.ranks;
  stats["communicators"] = r.stats.communicators;
  stats["collectives"] = r.stats.collectives;
  stats["instructions"] = r.stats.instructions;
  d["ok"] = r.ok();
  d["stats"] = stats;
  return d;
}

plan::CostModel costModelOf(const std::string &device) {
  const plan::DevicePreset *preset = plan::findDevicePreset(device);
  if (!preset)
    raise("Error", "device: unknown device \"" + device +
                       "\"; expected one of " + plan::devicePresetList());
  return preset->model;
}

/// JSON values as Python objects, walked in C++ (no text in between).
nb::object pythonOf(const nlohmann::json &j) {
  switch (j.type()) {
  case nlohmann::json::value_t::object: {
    nb::dict d;
    for (auto it = j.begin(); it != j.end(); ++it)
      d[nb::str(it.key().c_str())] = pythonOf(it.value());
    return d;
  }
  case nlohmann::json::value_t::array: {
    nb::list l;
    for (const nlohmann::json &v : j)
      l.append(pythonOf(v));
    return l;
  }
  case nlohmann::json::value_t::string:
    return nb::str(j.get_ref<const std::string &>().c_str());
  case nlohmann::json::value_t::boolean:
    return nb::bool_(j.get<bool>());
  case nlohmann::json::value_t::number_integer:
    return nb::int_(j.get<int64_t>());
  case nlohmann::json::value_t::number_unsigned:
    return nb::int_(j.get<uint64_t>());
  case nlohmann::json::value_t::number_float:
    return nb::float_(j.get<double>());
  default:
    return nb::none();
  }
}

/// Plan.explain(): what `meshplan explain --rank R` prints, as a dict
/// (pipeline::explanationJson's keys).
nb::object explainPlan(const PlanObject &p, const std::string &device,
                       std::optional<int64_t> deviceMemory) {
  if (!p.planned)
    raise("Error", "explain: this plan was read from a file; explain needs "
                   "the spec it was planned from: "
                   "meshplan.plan(spec, rank).explain()");
  plan::CostModel cost = costModelOf(device);
  if (deviceMemory) {
    if (*deviceMemory < 1)
      raise("Error", "device_memory: expected the bytes a rank may use, a "
                     "positive integer, not " +
                         std::to_string(*deviceMemory));
    // As --device-memory: what the plan may use, no reserve off it.
    cost.deviceMemoryBytes = *deviceMemory;
    cost.reservedMemoryBytes = 0;
  }
  std::shared_ptr<const pipeline::PlannedSpec> planned = p.planned;
  // A pipeline's table lays out every pp coordinate: plan those that
  // plan(spec, rank) did not.
  bool everyCoordinate = true;
  for (const auto &t : planned->templates)
    everyCoordinate = everyCoordinate && t.has_value();
  if (!everyCoordinate) {
    auto all = pipeline::planSpec(planned->spec, planned->options);
    if (!all)
      raise("SpecError", all.error());
    planned = std::make_shared<pipeline::PlannedSpec>(std::move(*all));
  }
  // The GIL stays held: explain compiles in the planned spec's MLIR
  // context, which two threads must not share.
  auto explained = pipeline::explain(*planned, p.plan->rank, cost);
  if (!explained)
    raise("Error", explained.error());
  return pythonOf(pipeline::explanationJson(*explained));
}

nb::list tuneCandidates(const std::string &model, int64_t world,
                        const std::string &device, int64_t tokensPerStep,
                        int64_t seqLen, int64_t maxContextParallel,
                        int64_t maxAccumulationSteps, int64_t pipelineParallel,
                        size_t confirm, const std::string &baseDir,
                        bool overCapacity) {
  pipeline::TuneOptions options;
  options.model = model;
  options.baseDir = baseDir;
  options.world = world;
  options.cost = costModelOf(device);
  options.tokensPerStep = tokensPerStep;
  options.sequenceLength = seqLen;
  options.maxContextParallel = maxContextParallel;
  options.maxAccumulationSteps = maxAccumulationSteps;
  options.pipelineParallel = pipelineParallel;
  options.confirm = confirm;
  Result<pipeline::TuneResult> result = makeError("");
  {
    nb::gil_scoped_release release;
    result = pipeline::tune(options);
  }
  if (!result)
    raise("TuneError", result.error());
  nb::list out;
  auto add = [&](const pipeline::TuneCandidate &c) {
    nb::dict d;
    d["description"] = c.describe();
    d["pp"] = c.pp;
    d["dp_replicate"] = c.replicate;
    d["dp_shard"] = c.shard;
    d["cp"] = c.cp;
    d["tp"] = c.tp;
    d["reshard_after_forward"] = c.reshardAfterForward;
    d["float8_all_gather"] = c.float8AllGather;
    d["accumulation_steps"] = c.accumulationSteps;
    d["microbatches"] = c.microbatches;
    d["stages_per_rank"] = c.stagesPerRank;
    d["step_seconds"] = c.stepSeconds;
    d["plan_step_seconds"] = c.planStepSeconds;
    d["trainer_comm_seconds"] = c.trainerCommSeconds;
    d["exposed_comm_seconds"] = c.exposedCommSeconds;
    d["peak_bytes"] = c.peakBytes;
    d["bubble_fraction"] = c.bubbleFraction;
    d["fits"] = c.fits;
    d["spec"] = nb::cast(specFromText(c.specJson, baseDir, std::nullopt,
                                      "<tune: " + c.describe() + ">"));
    out.append(d);
  };
  for (const pipeline::TuneCandidate &c : result->ranked)
    add(c);
  if (overCapacity)
    for (const pipeline::TuneCandidate &c : result->overCapacity)
      add(c);
  return out;
}

} // namespace

// Long because: the binding table of the planner API, one nanobind def per
// function or type with its docstring; the work is in the helpers above.
void meshplan::python::bindPlanner(nb::module_ &m) {
  nb::class_<SpecObject>(m, "Spec",
                         "A parallelism spec checked against its model "
                         "(docs/spec-reference.md).")
      .def_static("from_file", &specFromFile, nb::arg("path"), nb::kw_only(),
                  nb::arg("world_size") = nb::none(),
                  nb::arg("model") = nb::none(),
                  nb::arg("total_steps") = nb::none(),
                  "Reads a spec file; a relative \"model\" path resolves "
                  "against the file's directory. `model` (a model JSON "
                  "document) replaces the model the spec names; "
                  "`total_steps` is the run's length for a learning-rate "
                  "schedule without its own total_steps.")
      .def_static(
          "from_json",
          [](const std::string &text, const std::string &baseDir,
             std::optional<int64_t> worldSize,
             const std::optional<std::string> &model,
             std::optional<int64_t> totalSteps) {
            return specFromText(text, baseDir, worldSize, "<json>", model,
                                totalSteps);
          },
          nb::arg("text"), nb::kw_only(), nb::arg("base_dir") = ".",
          nb::arg("world_size") = nb::none(), nb::arg("model") = nb::none(),
          nb::arg("total_steps") = nb::none(),
          "Parses a spec document; a relative \"model\" path resolves "
          "against base_dir. `model` (a model JSON document) replaces the "
          "model the spec names.")
      .def(
          "data_parallel",
          [](const SpecObject &s, int64_t rank) {
            if (rank < 0 || rank >= s.resolved->mesh->size())
              raise("SpecError", "rank " + std::to_string(rank) +
                                     " is outside the mesh of " +
                                     std::to_string(s.resolved->mesh->size()) +
                                     " ranks");
            auto d = frontend::dataParallelRankOf(*s.resolved, rank);
            if (!d)
              raise("SpecError", d.error());
            return std::make_pair(d->index, d->size);
          },
          nb::arg("rank"),
          "(index, size): the rank's place among the ranks that read "
          "different data (replicate, then shard, then extra axes, "
          "row-major).")
      .def_prop_ro(
          "text", [](const SpecObject &s) { return s.text; },
          "The spec's JSON document.")
      .def_prop_ro("origin", [](const SpecObject &s) { return s.origin; })
      .def_prop_ro("model",
                   [](const SpecObject &s) { return s.resolved->model->name; })
      .def_prop_ro("world_size",
                   [](const SpecObject &s) { return s.resolved->mesh->size(); })
      .def_prop_ro("mesh",
                   [](const SpecObject &s) { return s.resolved->mesh->str(); })
      .def_prop_ro(
          "units",
          [](const SpecObject &s) {
            nb::list out;
            for (const frontend::UnitAssignment &u : s.resolved->units) {
              std::vector<std::string> params;
              for (int p : u.params)
                params.push_back(s.resolved->params[size_t(p)].name);
              nb::dict d;
              d["name"] = u.name;
              d["params"] = stringList(params);
              d["reshard_after_forward"] = u.reshardAfterForward;
              d["root"] = u.root;
              out.append(d);
            }
            return out;
          },
          "The FSDP units in forward order: name, params, "
          "reshard_after_forward, root.")
      .def_prop_ro(
          "params",
          [](const SpecObject &s) {
            nb::list out;
            for (const frontend::ParamAssignment &p : s.resolved->params) {
              nb::dict d;
              d["name"] = p.name;
              d["shape"] = intList(p.shape);
              d["dtype"] = std::string(frontend::dtypeName(p.dtype));
              d["tp_dim"] = p.tpDim;
              d["float8"] = p.float8;
              out.append(d);
            }
            return out;
          },
          "The model's parameters in forward order, as the spec assigns "
          "them.")
      .def_prop_ro(
          "pipeline",
          [](const SpecObject &s) { return s.resolved->pipeline.has_value(); })
      .def("__repr__", [](const SpecObject &s) {
        return "<meshplan.Spec " + s.origin + ": model " +
               s.resolved->model->name + ", mesh " + s.resolved->mesh->str() +
               ">";
      });

  nb::class_<PlanObject>(m, "Plan",
                         "One rank's plan (docs/plan-format.md): its "
                         "communicators, buffers and program.")
      .def_static(
          "load",
          [](const std::string &path) {
            auto text = plan::readTextFile(path);
            if (!text)
              raise("PlanError", text.error());
            return planFromText(*text, path);
          },
          nb::arg("path"), "Reads and validates a plan file.")
      .def_static(
          "from_json",
          [](const std::string &text) { return planFromText(text, "<json>"); },
          nb::arg("text"), "Parses and validates a plan document.")
      .def("to_json",
           [](const PlanObject &p) { return plan::writePlan(*p.plan); })
      .def("explain", &explainPlan, nb::kw_only(),
           nb::arg("device") = "h100-sxm-80gb",
           nb::arg("device_memory") = nb::none(),
           "What `meshplan explain --rank R --json` prints, as a dict: the "
           "model, mesh and roles, this rank's communicators and "
           "collectives per step, the FSDP units, peak memory against the "
           "device's capacity, float8 savings, the pipeline, the step under "
           "the cost model.")
      .def(
          "save",
          [](const PlanObject &p, const std::string &path) {
            writeAtomically(path, plan::writePlan(*p.plan));
          },
          nb::arg("path"),
          "Writes the plan file (beside the target, then renamed into "
          "place).")
      .def_prop_ro("rank", [](const PlanObject &p) { return p.plan->rank; })
      .def_prop_ro("world_size",
                   [](const PlanObject &p) { return worldSizeOf(*p.plan); })
      .def_prop_ro("mesh",
                   [](const PlanObject &p) {
                     nb::list out;
                     for (const MeshAxis &a : p.plan->mesh.axes) {
                       nb::dict d;
                       d["name"] = a.name;
                       d["size"] = a.size;
                       d["managed"] = a.managed;
                       out.append(d);
                     }
                     return out;
                   })
      .def_prop_ro("communicators",
                   [](const PlanObject &p) {
                     nb::list out;
                     for (const plan::Communicator &c : p.plan->communicators)
                       out.append(communicatorDict(c));
                     return out;
                   })
      .def_prop_ro("buffers",
                   [](const PlanObject &p) {
                     nb::list out;
                     for (const plan::Buffer &b : p.plan->buffers)
                       out.append(bufferDict(b));
                     return out;
                   })
      .def_prop_ro("streams",
                   [](const PlanObject &p) { return p.plan->streams; })
      .def_prop_ro("program",
                   [](const PlanObject &p) {
                     nb::list out;
                     for (const plan::Instruction &in : p.plan->program)
                       out.append(instructionDict(in));
                     return out;
                   })
      .def_prop_ro(
          "optimizer",
          [](const PlanObject &p) { return optimizerDict(p.plan->optimizer); })
      .def_prop_ro(
          "estimates",
          [](const PlanObject &p) { return estimatesDict(p.plan->estimates); })
      .def_prop_ro(
          "units",
          [](const PlanObject &p) {
            // The (phase, unit) pairs its compute instructions call, in
            // program order, each once: what a trainer registers.
            nb::list out;
            std::set<std::pair<std::string, std::string>> seen;
            for (const plan::Instruction &in : p.plan->program)
              if (in.op == plan::OpKind::Compute &&
                  seen.insert({in.phase, in.unit}).second)
                out.append(nb::make_tuple(in.phase, in.unit));
            return out;
          },
          "The (phase, unit) pairs of the compute instructions, in program "
          "order.")
      .def("__eq__", [](const PlanObject &a,
                        const PlanObject &b) { return *a.plan == *b.plan; })
      .def("__repr__", [](const PlanObject &p) {
        return "<meshplan.Plan rank " + std::to_string(p.plan->rank) + " of " +
               std::to_string(worldSizeOf(*p.plan)) + ": " +
               std::to_string(p.plan->program.size()) + " instructions, " +
               std::to_string(p.plan->communicators.size()) + " communicators>";
      });

  m.def("plan", &planOf, nb::arg("spec"), nb::arg("rank") = nb::none(),
        nb::kw_only(), nb::arg("tokens_per_rank") = nb::none(),
        nb::arg("global_batch_tokens") = nb::none(),
        nb::arg("seq_len") = nb::none(),
        nb::arg("context_parallel") = nb::none(),
        "Plans `spec`: the plan of `rank`, or (rank=None) every rank's, by "
        "rank. tokens_per_rank/global_batch_tokens/seq_len/context_parallel "
        "are `meshplan plan`'s --tokens-per-rank/--global-batch-tokens/"
        "--seq-len/--context-parallel (the cost model's work; unset: the "
        "spec's batch, else 8192).");

  m.def(
      "_verify",
      [](const std::vector<const PlanObject *> &plans) {
        std::vector<plan::Plan> copies;
        copies.reserve(plans.size());
        for (const PlanObject *p : plans) {
          if (!p)
            raise("PlanError", "verify: expected meshplan.Plan objects");
          copies.push_back(*p->plan);
        }
        Result<plan::VerifyResult> result = makeError("");
        {
          nb::gil_scoped_release release;
          result = plan::verifyPlans(copies);
        }
        if (!result)
          raise("PlanError", result.error());
        return verifyResultDict(*result);
      },
      nb::arg("plans"),
      "Proves that every rank's plan agrees (plan::verifyPlans): a dict with "
      "ok, failure (kind, rank, instruction, comm, message) and stats.");

  m.def(
      "load_plans",
      [](const std::string &dir) {
        Result<std::vector<plan::Plan>> read = makeError("");
        {
          nb::gil_scoped_release release;
          read = plan::readPlanDirectory(dir);
        }
        if (!read)
          raise("PlanError", read.error());
        nb::list out;
        for (plan::Plan &p : *read)
          out.append(nb::cast(PlanObject{
              std::make_shared<const plan::Plan>(std::move(p)), nullptr}));
        return out;
      },
      nb::arg("dir"), "Reads every rank's plan of a plan directory.");

  m.def("_tune", &tuneCandidates, nb::arg("model"), nb::arg("world"),
        nb::arg("device"), nb::arg("tokens_per_step"), nb::arg("seq_len"),
        nb::arg("max_context_parallel"), nb::arg("max_accumulation_steps"),
        nb::arg("pipeline_parallel"), nb::arg("confirm"), nb::arg("base_dir"),
        nb::arg("over_capacity"));

  m.def(
      "_bench_plan_cpp",
      [](const SpecObject &spec, int64_t rank, int repeats) {
        // The C++ API's time for what meshplan.plan(spec, rank) does, in
        // this process: planSpec then instantiate (bench/python).
        pipeline::CompileOptions options;
        std::vector<double> seconds;
        nb::gil_scoped_release release;
        for (int i = 0; i < repeats; ++i) {
          auto start = std::chrono::steady_clock::now();
          {
            // Planned, instantiated and dropped, as a Python statement
            // `meshplan.plan(spec, rank)` does: the MLIR context's teardown
            // is inside the time on both sides.
            const frontend::ResolvedSpec &r = *spec.resolved;
            auto coordinates = coordinatesOf(r, rank);
            auto planned = pipeline::planSpec(r, options, coordinates);
            if (planned)
              (void)planned->templateFor(rank).instantiate(rank);
          }
          seconds.push_back(std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - start)
                                .count());
        }
        return seconds;
      },
      nb::arg("spec"), nb::arg("rank"), nb::arg("repeats"));
}
