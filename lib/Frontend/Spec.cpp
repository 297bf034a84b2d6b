//===- Spec.cpp - The parallelism spec: reading and checking documents ---===//
//
// parseSpec: each section read with its own checks, then the checks across
// sections (axis roles, the pipeline's schedule rules; checkSpec); and
// loading a spec with its model. Checking a spec against its model
// (resolveSpec) is in SpecResolve.cpp.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Frontend/Spec.h"
#include "meshplan/Frontend/Presets.h"

#include "meshplan/Frontend/Schema.h"
#include "meshplan/Support/Json.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace meshplan::frontend {

using namespace meshplan::json;

std::string_view tpStyleName(TPStyle style) {
  return kTPStyleNames[static_cast<int>(style)];
}

std::string_view reshardPolicyName(ReshardPolicy policy) {
  return kReshardPolicyNames[static_cast<int>(policy)];
}

std::string_view accumulationReduceName(AccumulationReduce mode) {
  return kAccumulationReduceNames[static_cast<int>(mode)];
}

std::string_view activationCheckpointingName(ActivationCheckpointing mode) {
  return kActivationCheckpointingNames[static_cast<int>(mode)];
}

int64_t defaultStagesPerRank(PipelineScheduleKind schedule) {
  // torchtitan's pipeline_llm: one stage per rank for its single-stage
  // schedules, two for the multi-stage ones (a V holds exactly two).
  return schedule == PipelineScheduleKind::Interleaved1F1B ||
                 schedule == PipelineScheduleKind::ZeroBubbleV
             ? 2
             : 1;
}

std::string_view pipelineSplitName(PipelineSplit split) {
  return split == PipelineSplit::Explicit
             ? std::string_view("explicit")
             : kPipelineSplitNames[static_cast<int>(split)];
}

/// The index of `name` in a closed set the schema already checked.
template <size_t N>
static int indexOf(const std::array<std::string_view, N> &names,
                   std::string_view name) {
  return static_cast<int>(std::find(names.begin(), names.end(), name) -
                          names.begin());
}

static const SectionRule &section(std::string_view name) {
  return findSection(specSections(), name);
}

/// The checked object at `key` of `parent`, or null when absent.
static const Json *sectionOf(const Json &parent, std::string_view key) {
  return member(parent, key);
}

static const std::string &str(const Json &value) {
  return value.get_ref<const std::string &>();
}

static DType dtypeOf(const Json &value) { return *parseDType(str(value)); }

//===----------------------------------------------------------------------===//
// Sections
//===----------------------------------------------------------------------===//

static Result<MeshSpec> parseMesh(const Json &value) {
  const std::string ptr = "/mesh";
  MESHPLAN_TRY(checkObject(value, ptr, section("mesh")));
  MeshSpec mesh;
  const Json &axes = *member(value, "axes");
  const std::string axesPtr = "/mesh/axes";
  if (axes.empty())
    return errorAt(axesPtr, "expected at least one axis");
  std::map<std::string, size_t> seen;
  int64_t product = 1;
  for (size_t i = 0; i < axes.size(); ++i) {
    std::string axisPtr = childPointer(axesPtr, i);
    MESHPLAN_TRY(checkObject(axes[i], axisPtr, section("mesh_axis")));
    std::string namePtr = childPointer(axisPtr, "name");
    const std::string &name = str(*member(axes[i], "name"));
    if (!isIdentifier(name))
      return errorAt(namePtr, "invalid axis name " + quote(name) +
                                  "; expected letters, digits and '_', not "
                                  "starting with a digit");
    auto [it, inserted] = seen.emplace(name, i);
    if (!inserted)
      return errorAt(
          namePtr, "duplicate axis " + quote(name) + " (also at " +
                       childPointer(childPointer(axesPtr, it->second), "name") +
                       ")");
    std::string sizePtr = childPointer(axisPtr, "size");
    auto size = readInt(*member(axes[i], "size"), sizePtr, 1, kMaxMeshDevices);
    MESHPLAN_TRY(size);
    if (product > kMaxMeshDevices / *size)
      return errorAt(sizePtr, "the mesh would have more than " +
                                  std::string(kMaxMeshDevicesText) +
                                  " ranks (docs/limits.md)");
    product *= *size;
    mesh.axes.push_back({name, *size, false});
  }

  if (const Json *order = member(value, "device_order")) {
    const std::string orderPtr = "/mesh/device_order";
    if (static_cast<int64_t>(order->size()) != product)
      return errorAt(orderPtr, "expected " + std::to_string(product) +
                                   " rank ids (one per mesh position), got " +
                                   std::to_string(order->size()));
    auto ids = readIntArray(*order, orderPtr, 0, INT64_MAX);
    MESHPLAN_TRY(ids);
    std::map<int64_t, size_t> where;
    for (size_t i = 0; i < ids->size(); ++i) {
      auto [it, inserted] = where.emplace((*ids)[i], i);
      if (!inserted)
        return errorAt(childPointer(orderPtr, i),
                       "rank " + std::to_string((*ids)[i]) +
                           " appears twice (also at " +
                           childPointer(orderPtr, it->second) + ")");
    }
    mesh.deviceOrder = std::move(*ids);
  }

  if (const Json *managed = member(value, "managed_axes")) {
    const std::string managedPtr = "/mesh/managed_axes";
    std::vector<std::string_view> known;
    for (const MeshAxis &axis : mesh.axes)
      known.push_back(axis.name);
    std::map<std::string, size_t> listed;
    for (size_t i = 0; i < managed->size(); ++i) {
      std::string itemPtr = childPointer(managedPtr, i);
      const std::string &name = str((*managed)[i]);
      auto it = seen.find(name);
      if (it == seen.end())
        return errorAt(itemPtr, "unknown axis " + quote(name) +
                                    "; the mesh has " + joinNames(known) +
                                    didYouMean(name, known));
      auto [at, inserted] = listed.emplace(name, i);
      if (!inserted)
        return errorAt(itemPtr, "axis " + quote(name) +
                                    " is listed twice (also at " +
                                    childPointer(managedPtr, at->second) + ")");
      mesh.axes[it->second].managed = true;
    }
  }
  return mesh;
}

static Result<std::vector<std::string>> readPatterns(const Json &value,
                                                     const std::string &ptr) {
  auto patterns = readStringArray(value, ptr);
  MESHPLAN_TRY(patterns);
  for (size_t i = 0; i < patterns->size(); ++i)
    if (auto ok = checkPattern((*patterns)[i]); !ok)
      return ok.error().within(childPointer(ptr, i));
  return patterns;
}

/// Checks `value` against a section whose keys may take a second type
/// (specKeyAlternatives): a value of the alternative type is checked against
/// the alternative's closed set and then passes as that type.
static Result<void> checkObjectWithAlternatives(const Json &value,
                                                const std::string &ptr,
                                                std::string_view name) {
  SectionRule rules = section(name);
  if (!value.is_object())
    return checkObject(value, ptr, rules);
  for (const KeyAlternative &alt : specKeyAlternatives()) {
    if (alt.section != name)
      continue;
    const Json *v = member(value, alt.key);
    auto rule =
        std::find_if(rules.keys.begin(), rules.keys.end(),
                     [&](const KeyRule &r) { return r.name == alt.key; });
    if (!v || rule == rules.keys.end())
      continue;
    std::string keyPtr = childPointer(ptr, alt.key);
    bool isAlt = alt.type == JsonType::Boolean  ? v->is_boolean()
                 : alt.type == JsonType::String ? v->is_string()
                                                : false;
    bool isMain = rule->type == JsonType::Boolean  ? v->is_boolean()
                  : rule->type == JsonType::String ? v->is_string()
                  : rule->type == JsonType::Array  ? v->is_array()
                  : rule->type == JsonType::Number ? v->is_number()
                                                   : false;
    if (!isAlt && !isMain)
      return typeError(
          keyPtr, *v,
          std::string(rule->type == JsonType::Array ? "an " : "a ") +
              std::string(jsonTypeName(rule->type)) + " or a " +
              std::string(jsonTypeName(alt.type)));
    if (!isAlt)
      continue;
    if (!alt.values.empty() && std::find(alt.values.begin(), alt.values.end(),
                                         str(*v)) == alt.values.end())
      return errorAt(keyPtr,
                     "unknown " + std::string(alt.key) + " " + quote(str(*v)) +
                         "; expected one of " + joinNames(alt.values) + " or " +
                         (rule->type != JsonType::Array
                              ? "a " + std::string(jsonTypeName(rule->type))
                          : alt.key == "split" ? "an array of stages"
                                               : "an array of units") +
                         didYouMean(str(*v), alt.values));
    *rule = KeyRule{.name = rule->name, .type = alt.type};
  }
  return checkObject(value, ptr, rules);
}

static Result<DataParallelSpec> parseDataParallel(const Json &value) {
  const std::string ptr = "/data_parallel";
  MESHPLAN_TRY(checkObjectWithAlternatives(value, ptr, "data_parallel"));
  DataParallelSpec dp;
  if (const Json *v = member(value, "replicate_axes"))
    dp.replicateAxes = *readStringArray(*v, "/data_parallel/replicate_axes");
  if (const Json *v = member(value, "shard_axes"))
    dp.shardAxes = *readStringArray(*v, "/data_parallel/shard_axes");
  if (const Json *v = member(value, "reshard_after_forward")) {
    if (v->is_boolean())
      dp.reshardAfterForward =
          v->get<bool>() ? ReshardPolicy::Always : ReshardPolicy::Never;
    else
      dp.reshardAfterForward = static_cast<ReshardPolicy>(
          std::find(kReshardPolicyNames.begin(), kReshardPolicyNames.end(),
                    str(*v)) -
          kReshardPolicyNames.begin());
  }
  if (const Json *v = member(value, "units")) {
    const std::string unitsPtr = childPointer(ptr, "units");
    if (v->is_string()) {
      dp.units = static_cast<UnitGrouping>(std::find(kUnitGroupingNames.begin(),
                                                     kUnitGroupingNames.end(),
                                                     str(*v)) -
                                           kUnitGroupingNames.begin());
      return dp;
    }
    if (v->empty())
      return errorAt(unitsPtr, "expected at least one unit (an array of "
                               "patterns), or \"torchtitan\" or "
                               "\"per_module\"");
    dp.units = UnitGrouping::Explicit;
    for (size_t u = 0; u < v->size(); ++u) {
      std::string unitPtr = childPointer(unitsPtr, u);
      if ((*v)[u].empty())
        return errorAt(unitPtr, "expected at least one pattern");
      auto patterns = readPatterns((*v)[u], unitPtr);
      MESHPLAN_TRY(patterns);
      dp.unitPatterns.push_back(std::move(*patterns));
    }
  }
  return dp;
}

static Result<TensorParallelSpec> parseTensorParallel(const Json &value) {
  const std::string ptr = "/tensor_parallel";
  MESHPLAN_TRY(checkObject(value, ptr, section("tensor_parallel")));
  TensorParallelSpec tp;
  tp.axis = str(*member(value, "axis"));
  const Json &plan = *member(value, "plan");
  const std::string planPtr = "/tensor_parallel/plan";
  if (plan.empty())
    return errorAt(planPtr, "expected at least one rule {pattern, style}");
  for (size_t i = 0; i < plan.size(); ++i) {
    std::string rulePtr = childPointer(planPtr, i);
    MESHPLAN_TRY(checkObject(plan[i], rulePtr, section("tp_rule")));
    TPRule rule;
    rule.pattern = str(*member(plan[i], "pattern"));
    if (auto ok = checkPattern(rule.pattern); !ok)
      return ok.error().within(childPointer(rulePtr, "pattern"));
    auto style =
        readEnum(*member(plan[i], "style"), childPointer(rulePtr, "style"),
                 "style", section("tp_rule").find("style")->values);
    MESHPLAN_TRY(style);
    rule.style = static_cast<TPStyle>(*style);
    tp.plan.push_back(std::move(rule));
  }
  return tp;
}

static Result<PipelineParallelSpec> parsePipelineParallel(const Json &value) {
  const std::string ptr = "/pipeline_parallel";
  MESHPLAN_TRY(checkObjectWithAlternatives(value, ptr, "pipeline_parallel"));
  PipelineParallelSpec pp;
  pp.axis = str(*member(value, "axis"));
  auto kind = parsePipelineScheduleKind(str(*member(value, "schedule")));
  if (!kind) // checkObject has checked the name against the same list
    return kind.error().within(childPointer(ptr, "schedule"));
  pp.schedule = *kind;
  // Any integer: core's checkPipelineScheduleConfig states the bounds (at
  // least 1, the size limit) with the schedule's own rules.
  auto m = readInt(*member(value, "microbatches"),
                   childPointer(ptr, "microbatches"));
  MESHPLAN_TRY(m);
  pp.microbatches = *m;
  pp.stagesPerRank = defaultStagesPerRank(pp.schedule);
  if (const Json *v = member(value, "stages_per_rank")) {
    auto stages = readInt(*v, childPointer(ptr, "stages_per_rank"));
    MESHPLAN_TRY(stages);
    pp.stagesPerRank = *stages;
    pp.stagesPerRankGiven = true;
  }
  if (const Json *v = member(value, "split")) {
    const std::string splitPtr = childPointer(ptr, "split");
    if (v->is_string()) {
      pp.split =
          static_cast<PipelineSplit>(indexOf(kPipelineSplitNames, str(*v)));
      return pp;
    }
    if (v->empty())
      return errorAt(splitPtr, "expected at least one stage (an array of "
                               "module names), or \"auto\" or "
                               "\"torchtitan\"");
    pp.split = PipelineSplit::Explicit;
    for (size_t i = 0; i < v->size(); ++i) {
      std::string stagePtr = childPointer(splitPtr, i);
      auto names = readStringArray((*v)[i], stagePtr);
      MESHPLAN_TRY(names);
      if (names->empty())
        return errorAt(stagePtr, "expected at least one module; every "
                                 "stage runs some of the model");
      pp.stageModules.push_back(std::move(*names));
    }
  }
  return pp;
}

static Result<MixedPrecisionSpec> parseMixedPrecision(const Json &value) {
  MESHPLAN_TRY(
      checkObject(value, "/mixed_precision", section("mixed_precision")));
  MixedPrecisionSpec mp;
  if (const Json *v = member(value, "param_dtype"))
    mp.paramDtype = dtypeOf(*v);
  if (const Json *v = member(value, "reduce_dtype"))
    mp.reduceDtype = dtypeOf(*v);
  return mp;
}

static Result<Float8Spec> parseFloat8(const Json &value) {
  MESHPLAN_TRY(checkObject(value, "/float8", section("float8")));
  Float8Spec f8;
  if (const Json *v = member(value, "enabled"))
    f8.enabled = v->get<bool>();
  if (const Json *v = member(value, "all_gather"))
    f8.allGather = v->get<bool>();
  if (const Json *v = member(value, "modules")) {
    auto patterns = readPatterns(*v, "/float8/modules");
    MESHPLAN_TRY(patterns);
    if (patterns->empty())
      return errorAt("/float8/modules",
                     "expected at least one pattern (leave the key out to "
                     "convert every linear module)");
    f8.modules = std::move(*patterns);
  }
  if (const Json *v = member(value, "exclude")) {
    auto patterns = readPatterns(*v, "/float8/exclude");
    MESHPLAN_TRY(patterns);
    f8.exclude = std::move(*patterns);
  }
  // "scaling" has one value so far; checkObject has checked it.
  if (const Json *v = member(value, "power_of_2_scales"))
    f8.powerOf2Scales = v->get<bool>();
  return f8;
}

/// "optimizer.lr_schedule": what the document says; the run's length and
/// the checks that need it come in checkLrScheduleOf.
static Result<void> parseLrSchedule(const Json &value, OptimizerSpec &opt) {
  const std::string ptr = "/optimizer/lr_schedule";
  MESHPLAN_TRY(checkObject(value, ptr, section("lr_schedule")));
  LrSchedule s;
  if (const Json *v = member(value, "warmup_steps")) {
    auto n =
        readInt(*v, childPointer(ptr, "warmup_steps"), 0, int64_t(1) << 40);
    MESHPLAN_TRY(n);
    s.warmupSteps = *n;
  }
  if (const Json *v = member(value, "total_steps")) {
    auto n = readInt(*v, childPointer(ptr, "total_steps"), 1, int64_t(1) << 40);
    MESHPLAN_TRY(n);
    s.totalSteps = *n;
    opt.totalStepsGiven = true;
  }
  auto fraction = [&](const char *key, double &out) -> Result<void> {
    const Json *v = member(value, key);
    if (!v)
      return {};
    std::string keyPtr = childPointer(ptr, key);
    auto d = readNumber(*v, keyPtr);
    MESHPLAN_TRY(d);
    if (!(*d >= 0 && *d <= 1))
      return errorAt(keyPtr,
                     "expected a number in [0, 1], got " + describe(*v));
    out = *d;
    return {};
  };
  if (member(value, "decay_ratio")) {
    double ratio = 0;
    MESHPLAN_TRY(fraction("decay_ratio", ratio));
    s.decayRatio = ratio;
  }
  MESHPLAN_TRY(fraction("min_lr_factor", s.minLrFactor));
  if (const Json *v = member(value, "decay_type"))
    s.decayType = *parseLrDecayType(str(*v));
  opt.schedule = s;
  return {};
}

static Result<OptimizerSpec> parseOptimizer(const Json &value) {
  const std::string ptr = "/optimizer";
  MESHPLAN_TRY(checkObjectWithAlternatives(value, ptr, "optimizer"));
  OptimizerSpec opt;
  auto positive = [&](const char *key, double &out, bool allowZero,
                      std::string_view what) -> Result<void> {
    const Json *v = member(value, key);
    if (!v)
      return {};
    std::string keyPtr = childPointer(ptr, key);
    auto d = readNumber(*v, keyPtr);
    MESHPLAN_TRY(d);
    if (allowZero ? *d < 0 : *d <= 0)
      return errorAt(keyPtr, "expected " + std::string(what) +
                                 (allowZero ? " >= 0" : " > 0") + ", got " +
                                 describe(*v));
    out = *d;
    return {};
  };
  MESHPLAN_TRY(positive("lr", opt.lr, false, "a learning rate"));
  MESHPLAN_TRY(positive("eps", opt.eps, false, "an epsilon"));
  MESHPLAN_TRY(
      positive("weight_decay", opt.weightDecay, true, "a weight decay"));
  if (const Json *betas = member(value, "betas")) {
    double *out[2] = {&opt.beta1, &opt.beta2};
    for (size_t i = 0; i < 2; ++i) {
      std::string betaPtr = childPointer(childPointer(ptr, "betas"), i);
      auto b = readNumber((*betas)[i], betaPtr);
      MESHPLAN_TRY(b);
      if (*b < 0 || *b >= 1)
        return errorAt(betaPtr, "expected a beta in [0, 1), got " +
                                    describe((*betas)[i]));
      *out[i] = *b;
    }
  }
  if (const Json *v = member(value, "param_dtype"))
    opt.paramDtype = dtypeOf(*v);
  if (const Json *v = member(value, "stochastic_rounding"))
    opt.stochasticRounding = v->get<bool>();
  if (const Json *v = member(value, "seed")) {
    auto seed = readUInt64(*v, childPointer(ptr, "seed"));
    MESHPLAN_TRY(seed);
    opt.seed = *seed;
  }
  if (const Json *v = member(value, "lr_schedule"))
    MESHPLAN_TRY(parseLrSchedule(*v, opt));
  if (const Json *v = member(value, "max_norm")) {
    const std::string keyPtr = childPointer(ptr, "max_norm");
    auto d = readNumber(*v, keyPtr);
    MESHPLAN_TRY(d);
    // NaN and inf are refused as well: a clip at inf clips nothing, and a
    // NaN bound would scale every gradient to NaN.
    if (!(*d > 0) || !std::isfinite(*d))
      return errorAt(keyPtr,
                     "expected a finite max_norm > 0, got " + describe(*v));
    opt.maxNorm = *d;
  }
  if (const Json *v = member(value, "norm_type")) {
    const std::string keyPtr = childPointer(ptr, "norm_type");
    if (v->is_string()) {
      opt.normType = GradNormType::Inf; // the alternative's only value
    } else {
      auto d = readNumber(*v, keyPtr);
      MESHPLAN_TRY(d);
      if (*d != 2)
        return errorAt(keyPtr, "norm_type " + describe(*v) +
                                   " is not supported; expected 2 or \"inf\"");
      opt.normType = GradNormType::L2;
    }
    if (!member(value, "max_norm"))
      return errorAt(keyPtr, "norm_type without max_norm clips nothing; give "
                             "max_norm too");
  }
  if (const Json *v = member(value, "no_decay")) {
    auto patterns = readPatterns(*v, childPointer(ptr, "no_decay"));
    MESHPLAN_TRY(patterns);
    opt.noDecay = std::move(*patterns);
  }
  if (opt.stochasticRounding && opt.paramDtype != DType::BFloat16)
    return errorAt("/optimizer/stochastic_rounding",
                   "stochastic rounding rounds updates to bfloat16 "
                   "parameters; set param_dtype to \"bfloat16\" (it is \"" +
                       std::string(dtypeName(opt.paramDtype)) + "\")");
  // The other way round too: the plan's optimizer_update takes bfloat16
  // parameters with stochastic rounding and float32 ones without
  // (docs/plan-format.md); planned anyway, such a spec gave plans that
  // `meshplan verify` and the runtime refuse (found by fuzz-spec).
  if (!opt.stochasticRounding && opt.paramDtype == DType::BFloat16)
    return errorAt("/optimizer/param_dtype",
                   "bfloat16 parameters are updated with stochastic rounding "
                   "only; set stochastic_rounding to true, or param_dtype to "
                   "\"float32\"");
  return opt;
}

//===----------------------------------------------------------------------===//
// Axis roles
//===----------------------------------------------------------------------===//

namespace {
/// One place where the spec names a mesh axis for some role.
struct AxisUse {
  std::string name;
  std::string pointer;
  std::string role;
  /// Shard and TP axes cut tensor dims and the PP axis cuts the model: all
  /// need the axis's size when planning, which a managed axis does not have.
  bool splitsTensors;
};
} // namespace

static std::vector<AxisUse> axisUses(const Spec &spec) {
  std::vector<AxisUse> uses;
  auto add = [&](const std::vector<std::string> &names, const std::string &ptr,
                 const std::string &role, bool splits) {
    for (size_t i = 0; i < names.size(); ++i)
      uses.push_back({names[i], childPointer(ptr, i), role, splits});
  };
  add(spec.dataParallel.replicateAxes, "/data_parallel/replicate_axes",
      "a replicate axis", false);
  add(spec.dataParallel.shardAxes, "/data_parallel/shard_axes", "a shard axis",
      true);
  if (spec.tensorParallel)
    uses.push_back({spec.tensorParallel->axis, "/tensor_parallel/axis",
                    "the tensor-parallel axis", true});
  add(spec.extraAxes, "/extra_axes", "an extra axis", false);
  // Last, so that a pp axis that is also a data, tensor or extra (e.g.
  // context-parallel) axis is reported at /pipeline_parallel/axis.
  if (spec.pipelineParallel)
    uses.push_back({spec.pipelineParallel->axis, "/pipeline_parallel/axis",
                    "the pipeline-parallel axis", true});
  return uses;
}

/// Every use names a mesh axis; no axis has two roles; every axis has one;
/// managed axes (whose live size is known only at run time) do not split
/// tensors.
static Result<void> checkAxisRoles(const Spec &spec) {
  std::vector<std::string_view> known;
  for (const MeshAxis &axis : spec.mesh.axes)
    known.push_back(axis.name);
  std::map<std::string, const AxisUse *> used;
  std::vector<AxisUse> uses = axisUses(spec);
  for (const AxisUse &use : uses) {
    auto axis =
        std::find_if(spec.mesh.axes.begin(), spec.mesh.axes.end(),
                     [&](const MeshAxis &a) { return a.name == use.name; });
    if (axis == spec.mesh.axes.end())
      return errorAt(use.pointer, "unknown axis " + quote(use.name) +
                                      "; the mesh has " + joinNames(known) +
                                      didYouMean(use.name, known));
    auto [it, inserted] = used.emplace(use.name, &use);
    if (!inserted)
      return errorAt(use.pointer,
                     "axis " + quote(use.name) + " is already used as " +
                         it->second->role + " (" + it->second->pointer +
                         "); each mesh axis has exactly one role");
    if (axis->managed && use.splitsTensors)
      return errorAt(use.pointer,
                     "axis " + quote(use.name) +
                         " is managed (its live size is known only at run "
                         "time), so it cannot be " +
                         use.role + "; managed axes replicate");
  }
  for (size_t i = 0; i < spec.mesh.axes.size(); ++i) {
    const std::string &name = spec.mesh.axes[i].name;
    if (!used.count(name))
      return errorAt(
          "/mesh/axes/" + std::to_string(i) + "/name",
          "axis " + quote(name) +
              " has no role; name it in data_parallel "
              "(replicate_axes or shard_axes), tensor_parallel.axis, "
              "pipeline_parallel.axis or extra_axes");
  }
  return {};
}

static std::string meshProduct(const MeshSpec &mesh) {
  std::string out;
  for (const MeshAxis &axis : mesh.axes)
    out += (out.empty() ? "" : " x ") + axis.name + "=" +
           std::to_string(axis.size);
  return out;
}

Result<Mesh> buildMesh(const MeshSpec &mesh) {
  return Mesh::create(mesh.axes, mesh.deviceOrder);
}

/// The size of mesh axis `name`, which checkAxisRoles has found.
static int64_t meshAxisSize(const MeshSpec &mesh, const std::string &name) {
  for (const MeshAxis &axis : mesh.axes)
    if (axis.name == name)
      return axis.size;
  return 1;
}

/// The schedule's rules on (pp size, microbatches, stages per rank), asked
/// of core, and how pipeline_parallel combines with the other sections.
/// Needs the axis roles checked.
static Result<void>
checkPipelineParallel(const Spec &spec,
                      const std::string &accumulationStepsPointer) {
  const PipelineParallelSpec &pp = *spec.pipelineParallel;
  const std::string ptr = "/pipeline_parallel";
  PipelineScheduleConfig config{pp.schedule, meshAxisSize(spec.mesh, pp.axis),
                                pp.microbatches, pp.stagesPerRank};
  if (auto ok = checkPipelineScheduleConfig(config); !ok) {
    // Core words its messages for any caller ("pipeline_parallel: ...");
    // here the pointer says where, so the section's name would be said
    // twice. The pointer is that of the value the rule is about: the stages
    // per rank when the message names them, the microbatches when it is
    // about them, else the section (the size limit on their product).
    std::string message = ok.error().message;
    const std::string prefix = "pipeline_parallel: ";
    if (message.rfind(prefix, 0) == 0)
      message = message.substr(prefix.size());
    std::string where = ptr;
    if (message.find("stages_per_rank") != std::string::npos)
      where = childPointer(ptr, "stages_per_rank");
    else if (message.find("docs/limits.md") == std::string::npos &&
             message.find("microbatches") != std::string::npos)
      where = childPointer(ptr, "microbatches");
    return errorAt(where, message);
  }
  const int64_t numStages = config.ranks * config.stagesPerRank;
  if (pp.split == PipelineSplit::Explicit &&
      static_cast<int64_t>(pp.stageModules.size()) != numStages)
    return errorAt(
        childPointer(ptr, "split"),
        "expected " + std::to_string(numStages) + " stage" +
            (numStages == 1 ? "" : "s") + " (pp axis " + quote(pp.axis) +
            " of size " + std::to_string(config.ranks) + " x " +
            std::to_string(config.stagesPerRank) + " stages per rank), got " +
            std::to_string(pp.stageModules.size()));
  // The pipeline's microbatches are the accumulation: each stage sums its
  // gradients over them before the optimizer step. Accumulating further
  // around whole pipeline steps would be a second loop that the plans do
  // not express, so a second count is refused rather than ignored.
  if (spec.gradientAccumulationSteps != 1) {
    return errorAt(accumulationStepsPointer,
                   "gradient accumulation (" +
                       std::to_string(spec.gradientAccumulationSteps) +
                       " steps) cannot be combined with pipeline_parallel: "
                       "the pipeline already splits each step's batch into " +
                       std::to_string(pp.microbatches) +
                       " microbatches (/pipeline_parallel/microbatches) and "
                       "accumulates their gradients; raise microbatches "
                       "instead and leave this at 1");
  }
  return {};
}

//===----------------------------------------------------------------------===//
// parseSpec
//===----------------------------------------------------------------------===//

/// What parseSpec checks across sections once each has been read (see
/// checkSpec); `accumulationStepsPointer` locates the gradient accumulation
/// count in the document.
static Result<void> checkSections(Spec &spec, const SpecOptions &options,
                                  const std::string &accumulationStepsPointer) {
  int64_t devices = 1;
  for (const MeshAxis &axis : spec.mesh.axes)
    devices *= axis.size;
  if (spec.worldSize && *spec.worldSize != devices)
    return errorAt("/world_size", "world size " +
                                      std::to_string(*spec.worldSize) +
                                      " does not match the mesh, which has " +
                                      std::to_string(devices) + " devices (" +
                                      meshProduct(spec.mesh) + ")");
  if (spec.optimizer.schedule) {
    // The schedule's length: the spec's total_steps, else the run's.
    LrSchedule &schedule = *spec.optimizer.schedule;
    if (!spec.optimizer.totalStepsGiven) {
      if (!options.totalSteps)
        return errorAt("/optimizer/lr_schedule/total_steps",
                       "the schedule needs the run's length: give "
                       "total_steps (a trainer gives its step count)");
      schedule.totalSteps = *options.totalSteps;
    }
    if (auto ok = checkLrSchedule(schedule); !ok) {
      // Located at the value the message is about.
      const std::string &m = ok.error().message;
      std::string key = m.rfind("warmup_steps", 0) == 0    ? "warmup_steps"
                        : m.rfind("decay_ratio", 0) == 0   ? "decay_ratio"
                        : m.rfind("min_lr_factor", 0) == 0 ? "min_lr_factor"
                                                           : "total_steps";
      return errorAt("/optimizer/lr_schedule/" + key, m);
    }
  }
  if (options.worldSize && *options.worldSize != devices)
    return errorAt("/mesh/axes", "the mesh has " + std::to_string(devices) +
                                     " devices (" + meshProduct(spec.mesh) +
                                     "), but the world size is " +
                                     std::to_string(*options.worldSize));
  if (auto core = buildMesh(spec.mesh); !core)
    return core.error().within("/mesh");
  MESHPLAN_TRY(checkAxisRoles(spec));
  if (spec.pipelineParallel)
    MESHPLAN_TRY(checkPipelineParallel(spec, accumulationStepsPointer));
  if (spec.float8 && spec.float8->enabled && spec.float8->allGather &&
      spec.dataParallel.shardAxes.empty())
    return errorAt("/float8/all_gather", "float8 all-gather needs FSDP, but "
                                         "data_parallel.shard_axes is empty");
  if (spec.batch) {
    auto shape = batchPerMicrobatch(spec, spec.batch->globalTokens,
                                    spec.batch->sequenceLength);
    if (!shape)
      return errorAt("/batch/global_tokens", shape.error().message);
  }
  // bfloat16 and float16 have the same width and different ranges: casting
  // one to the other is neither a truncation nor an extension (the planner
  // has no such cast; found by fuzz-spec, exit 3 before), and bfloat16
  // values beyond 65504 would overflow float16.
  if (spec.optimizer.paramDtype == DType::BFloat16 &&
      spec.mixedPrecision.paramDtype == DType::Float16)
    return errorAt("/mixed_precision/param_dtype",
                   "float16 compute from bfloat16 parameters "
                   "(/optimizer/param_dtype) is not supported: bfloat16 "
                   "values beyond float16's range would overflow; compute in "
                   "bfloat16, or keep float32 parameters");
  return {};
}

Result<MicrobatchShape> batchPerMicrobatch(const Spec &spec,
                                           int64_t globalTokens,
                                           int64_t sequenceLength) {
  MicrobatchShape out;
  for (const auto *axes :
       {&spec.dataParallel.replicateAxes, &spec.dataParallel.shardAxes})
    for (const std::string &name : *axes)
      out.dataParallelRanks *= meshAxisSize(spec.mesh, name);
  out.microbatches = spec.pipelineParallel ? spec.pipelineParallel->microbatches
                                           : spec.gradientAccumulationSteps;
  // Whole sequences per data-parallel rank and microbatch: the global
  // batch is a multiple of dp x microbatches x sequence length.
  int64_t parts = 0, unit = 0;
  bool overflows =
      mulOverflows(out.dataParallelRanks, out.microbatches, &parts) ||
      mulOverflows(parts, sequenceLength, &unit);
  if (globalTokens < 1 || sequenceLength < 1 || overflows ||
      globalTokens % unit != 0)
    return makeError(
        std::to_string(globalTokens) +
        " tokens do not split into whole sequences of " +
        std::to_string(sequenceLength) + " tokens over " +
        std::to_string(out.dataParallelRanks) + " data-parallel ranks x " +
        std::to_string(out.microbatches) +
        " microbatches: the global batch must be a multiple of " +
        (overflows ? std::string("more than 2^63") : std::to_string(unit)) +
        " tokens");
  out.tokensPerRank = globalTokens / parts;
  return out;
}

Result<MicrobatchWork> microbatchWork(const Spec &spec,
                                      const WorkRequest &request) {
  auto positive = [](const std::optional<int64_t> &value,
                     const std::string &name) -> Result<void> {
    if (value && *value < 1)
      return makeError(name + ": must be > 0, not " + std::to_string(*value));
    return {};
  };
  MESHPLAN_TRY(positive(request.tokensPerRank, request.tokensPerRankName));
  MESHPLAN_TRY(
      positive(request.globalBatchTokens, request.globalBatchTokensName));
  MESHPLAN_TRY(positive(request.sequenceLength, request.sequenceLengthName));
  if (request.tokensPerRank && request.globalBatchTokens)
    return makeError(request.tokensPerRankName + ": give it or " +
                     request.globalBatchTokensName +
                     ", not both (one is the other split over the "
                     "data-parallel ranks and microbatches)");
  const std::optional<BatchSpec> &batch = spec.batch;
  MicrobatchWork work;
  work.sequenceLength = request.sequenceLength ? *request.sequenceLength
                        : batch                ? batch->sequenceLength
                                               : 8192;
  auto split = [&](int64_t globalTokens,
                   const std::string &name) -> Result<MicrobatchWork> {
    auto shape = batchPerMicrobatch(spec, globalTokens, work.sequenceLength);
    if (!shape)
      return makeError(name + ": " + shape.error().message);
    work.tokensPerRank = shape->tokensPerRank;
    return work;
  };
  if (request.tokensPerRank) {
    work.tokensPerRank = *request.tokensPerRank;
    return work;
  }
  if (request.globalBatchTokens)
    return split(*request.globalBatchTokens, request.globalBatchTokensName);
  // parseSpec checked the spec's own sequence length; a requested one may
  // not split the spec's batch into whole sequences, which is the request's
  // error.
  if (batch)
    return split(batch->globalTokens,
                 request.sequenceLengthName +
                     " (with the spec's batch.global_tokens)");
  work.tokensPerRank = 8192;
  return work;
}

Result<void> checkSpec(Spec &spec, const SpecOptions &options) {
  return checkSections(spec, options, "/gradient_accumulation/steps");
}

Result<Spec> parseSpec(std::string_view jsonText, const SpecOptions &options) {
  auto doc = parseJson(jsonText);
  MESHPLAN_TRY(doc);
  const Json &root = *doc;
  MESHPLAN_TRY(checkObject(root, "", section("")));
  Spec spec;
  if (const Json *v = member(root, "description"))
    spec.description = str(*v);
  spec.model = str(*member(root, "model"));
  if (spec.model.empty())
    return errorAt("/model", "expected a preset (" + presetNameList() +
                                 ") or a path to a model JSON file, got an "
                                 "empty string");
  if (const Json *v = member(root, "world_size")) {
    auto world = readInt(*v, "/world_size", 1, kMaxMeshDevices);
    MESHPLAN_TRY(world);
    spec.worldSize = *world;
  }

  auto mesh = parseMesh(*sectionOf(root, "mesh"));
  MESHPLAN_TRY(mesh);
  spec.mesh = std::move(*mesh);
  if (const Json *v = sectionOf(root, "data_parallel")) {
    auto dp = parseDataParallel(*v);
    MESHPLAN_TRY(dp);
    spec.dataParallel = std::move(*dp);
  }
  if (const Json *v = sectionOf(root, "tensor_parallel")) {
    auto tp = parseTensorParallel(*v);
    MESHPLAN_TRY(tp);
    spec.tensorParallel = std::move(*tp);
  }
  if (const Json *v = member(root, "extra_axes"))
    spec.extraAxes = *readStringArray(*v, "/extra_axes");
  if (const Json *v = sectionOf(root, "pipeline_parallel")) {
    auto pp = parsePipelineParallel(*v);
    MESHPLAN_TRY(pp);
    spec.pipelineParallel = std::move(*pp);
  }
  if (const Json *v = sectionOf(root, "mixed_precision")) {
    auto mp = parseMixedPrecision(*v);
    MESHPLAN_TRY(mp);
    spec.mixedPrecision = *mp;
  }
  if (const Json *v = sectionOf(root, "float8")) {
    auto f8 = parseFloat8(*v);
    MESHPLAN_TRY(f8);
    spec.float8 = std::move(*f8);
  }
  if (const Json *v = sectionOf(root, "optimizer")) {
    auto opt = parseOptimizer(*v);
    MESHPLAN_TRY(opt);
    spec.optimizer = *opt;
  }
  if (const Json *v = member(root, "gradient_accumulation_steps")) {
    auto steps = readInt(*v, "/gradient_accumulation_steps", 1, 1 << 30);
    MESHPLAN_TRY(steps);
    spec.gradientAccumulationSteps = *steps;
  }
  if (const Json *v = sectionOf(root, "gradient_accumulation")) {
    const std::string ptr = "/gradient_accumulation";
    MESHPLAN_TRY(checkObject(*v, ptr, section("gradient_accumulation")));
    if (const Json *steps = member(*v, "steps")) {
      // One spelling per spec: the short key and the object would otherwise
      // have to agree, and a reader could not tell which one wins.
      if (member(root, "gradient_accumulation_steps"))
        return errorAt(childPointer(ptr, "steps"),
                       "gradient_accumulation_steps is given as well; "
                       "keep one of the two");
      auto n = readInt(*steps, childPointer(ptr, "steps"), 1, 1 << 30);
      MESHPLAN_TRY(n);
      spec.gradientAccumulationSteps = *n;
    }
    if (const Json *reduce = member(*v, "reduce"))
      spec.accumulationReduce = static_cast<AccumulationReduce>(
          indexOf(kAccumulationReduceNames, str(*reduce)));
  }
  if (const Json *v = member(root, "activation_checkpointing"))
    spec.activationCheckpointing = static_cast<ActivationCheckpointing>(
        indexOf(kActivationCheckpointingNames, str(*v)));

  if (const Json *v = sectionOf(root, "batch")) {
    const std::string ptr = "/batch";
    MESHPLAN_TRY(checkObject(*v, ptr, section("batch")));
    // 2^62 keeps tokens x anything the cost model multiplies in range.
    auto global =
        readInt(*member(*v, "global_tokens"),
                childPointer(ptr, "global_tokens"), 1, int64_t(1) << 62);
    MESHPLAN_TRY(global);
    auto seq = readInt(*member(*v, "sequence_length"),
                       childPointer(ptr, "sequence_length"), 1, 1 << 30);
    MESHPLAN_TRY(seq);
    spec.batch = BatchSpec{*global, *seq};
  }

  // Cross-section checks, in the order a reader would fix them.
  MESHPLAN_TRY(checkSections(spec, options,
                             member(root, "gradient_accumulation_steps")
                                 ? "/gradient_accumulation_steps"
                                 : "/gradient_accumulation/steps"));
  return spec;
}

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

static bool looksLikePath(std::string_view text) {
  return text.find('/') != std::string_view::npos ||
         (text.size() >= 5 && text.substr(text.size() - 5) == ".json");
}

/// The model of a spec; `inDocument` tells whether an error lies in the spec
/// text itself (an unknown name, an unreadable path) rather than inside the
/// model file it names.
static Result<std::shared_ptr<const Model>>
loadModelOf(const Spec &spec, const std::string &baseDir, bool &inDocument) {
  inDocument = true;
  if (const TransformerConfig *config = findPreset(spec.model))
    return std::make_shared<const Model>(buildTransformer(*config));
  if (!looksLikePath(spec.model)) {
    std::vector<std::string_view> names;
    for (const TransformerConfig &config : presetConfigs())
      names.push_back(config.name);
    return errorAt("/model", "unknown model " + quote(spec.model) +
                                 "; expected a preset (" + presetNameList() +
                                 ") or a path to a model JSON file" +
                                 didYouMean(spec.model, names));
  }
  std::string path = spec.model;
  if (path[0] != '/' && !baseDir.empty())
    path = baseDir + "/" + path;
  auto text = readFile(path);
  if (!text)
    return errorAt("/model", text.error().message);
  auto model = parseModel(*text);
  if (!model) {
    inDocument = false;
    return model.error().within(path);
  }
  return std::make_shared<const Model>(std::move(*model));
}

Result<std::shared_ptr<const Model>> loadSpecModel(const Spec &spec,
                                                   const std::string &baseDir) {
  bool inDocument;
  return loadModelOf(spec, baseDir, inDocument);
}

static Result<ResolvedSpec> load(std::string_view jsonText,
                                 const std::string &baseDir,
                                 const SpecOptions &options, bool &inDocument) {
  inDocument = true;
  auto spec = parseSpec(jsonText, options);
  MESHPLAN_TRY(spec);
  if (options.model)
    return resolveSpec(std::move(*spec), options.model);
  auto model = loadModelOf(*spec, baseDir, inDocument);
  MESHPLAN_TRY(model);
  return resolveSpec(std::move(*spec), std::move(*model));
}

Result<DataParallelRank> dataParallelRankOf(const ResolvedSpec &spec,
                                            int64_t rank) {
  const Mesh &mesh = *spec.mesh;
  auto coords = mesh.coordinate(rank);
  MESHPLAN_TRY(coords);
  DataParallelRank out;
  for (const auto *axes :
       {&spec.spec.dataParallel.replicateAxes,
        &spec.spec.dataParallel.shardAxes, &spec.spec.extraAxes})
    for (const std::string &name : *axes) {
      auto i = mesh.findAxis(name);
      if (!i)
        return makeError("data-parallel axis " + quote(name) +
                         " is not in the mesh");
      int64_t size = mesh.axis(*i).size;
      out.index = out.index * size + (*coords)[size_t(*i)];
      out.size *= size;
    }
  return out;
}

Result<ResolvedSpec> loadSpec(std::string_view jsonText,
                              const std::string &baseDir,
                              const SpecOptions &options) {
  bool inDocument;
  return load(jsonText, baseDir, options, inDocument);
}

Result<ResolvedSpec> loadSpecFile(const std::string &path,
                                  const SpecOptions &options) {
  auto text = readFile(path);
  MESHPLAN_TRY(text);
  size_t slash = path.rfind('/');
  std::string baseDir = slash == std::string::npos ? std::string(".")
                        : slash == 0               ? std::string("/")
                                                   : path.substr(0, slash);
  bool inDocument;
  auto resolved = load(*text, baseDir, options, inDocument);
  if (!resolved && inDocument)
    return resolved.error().within(path);
  return resolved;
}

} // namespace meshplan::frontend
