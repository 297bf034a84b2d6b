//===- Plan.cpp - Plan reader and writer ----------------------------------===//
//
// No exceptions. Plans are read through meshplan/Support/JsonReader.h: the
// document is tokenized into a flat array of nodes (syntax, depth and
// repeated keys checked in that one pass), and the readers below fill the
// Plan straight from it, every value's type checked before it is read, with
// JSON pointers built only for an error. The writer serializes through
// nlohmann/json. What a plan means is checked by validatePlan
// (PlanValidate.cpp).
//
//===----------------------------------------------------------------------===//

#include "meshplan/Plan/Plan.h"

#include "PlanRead.h"

#include "meshplan/Core/MeshView.h"
#include "meshplan/Core/Text.h"
#include "meshplan/Support/Json.h"
#include "meshplan/Support/JsonReader.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace meshplan::plan {

using namespace meshplan::json;

//===----------------------------------------------------------------------===//
// Name tables
//===----------------------------------------------------------------------===//

static constexpr std::array<std::string_view, 10> kDTypeNames = {
    "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2",
    "float64", "int8",     "uint8",   "int32",         "int64"};
static constexpr std::array<int64_t, 10> kDTypeBytes = {4, 2, 2, 1, 1,
                                                        8, 1, 1, 4, 8};
static constexpr std::array<std::string_view, 6> kBufferKindNames = {
    "param_shard",     "gathered",   "gradient",
    "optimizer_state", "activation", "scratch"};
static constexpr std::array<std::string_view, 19> kOpNames = {
    "all_gather", "reduce_scatter", "all_reduce",
    "all_to_all", "permute",        "broadcast",
    "send",       "recv",           "fp8_amax",
    "fp8_cast",   "cast",           "sum",
    "accumulate", "compute",        "optimizer_update",
    "free",       "wait",           "grad_norm",
    "clip_grad"};

template <typename E, size_t N>
static std::optional<E> lookup(const std::array<std::string_view, N> &names,
                               std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == name)
      return static_cast<E>(i);
  return std::nullopt;
}

std::string_view dtypeName(DType d) { return kDTypeNames[int(d)]; }
std::optional<DType> parseDType(std::string_view n) {
  return lookup<DType>(kDTypeNames, n);
}
int64_t dtypeBytes(DType d) { return kDTypeBytes[int(d)]; }
std::string_view bufferKindName(BufferKind k) {
  return kBufferKindNames[int(k)];
}
std::optional<BufferKind> parseBufferKind(std::string_view n) {
  return lookup<BufferKind>(kBufferKindNames, n);
}
std::string_view opKindName(OpKind op) { return kOpNames[int(op)]; }
std::optional<OpKind> parseOpKind(std::string_view n) {
  return lookup<OpKind>(kOpNames, n);
}
bool isCollective(OpKind op) { return int(op) <= int(OpKind::Recv); }
bool isPointToPoint(OpKind op) {
  return op == OpKind::Send || op == OpKind::Recv;
}
bool isReduction(OpKind op) {
  return op == OpKind::ReduceScatter || op == OpKind::AllReduce;
}

double OptimizerConfig::weightDecayOf(std::string_view tensor) const {
  return std::binary_search(noDecay.begin(), noDecay.end(), tensor)
             ? 0.0
             : weightDecay;
}

double OptimizerConfig::lrAt(int64_t step) const {
  return schedule ? lr * lrFactor(*schedule, step) : lr;
}

bool PlanMesh::operator==(const PlanMesh &o) const {
  if (axes.size() != o.axes.size() || deviceOrder != o.deviceOrder ||
      pipelineAxis != o.pipelineAxis)
    return false;
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name != o.axes[i].name || axes[i].size != o.axes[i].size ||
        axes[i].managed != o.axes[i].managed)
      return false;
  return true;
}

const Communicator *Plan::findCommunicator(std::string_view id) const {
  for (const Communicator &c : communicators)
    if (c.id == id)
      return &c;
  return nullptr;
}

//===----------------------------------------------------------------------===//
// Small helpers
//===----------------------------------------------------------------------===//

Result<std::string> readTextFile(const std::string &path) {
  return readFile(path, kMaxPlanFileBytes);
}

//===----------------------------------------------------------------------===//
// Key tables
//===----------------------------------------------------------------------===//

namespace {
/// Plans are machine-written and shallow; anything deeper is not a plan.
constexpr int kMaxPlanDepth = kMaxPlanJsonDepth;

using T = JsonType;
const SectionRule kRootRule = {
    "",
    {
        {.name = "format", .type = T::String, .required = true},
        {.name = "version", .type = T::Integer, .required = true},
        {.name = "mesh", .type = T::Object, .required = true},
        {.name = "rank", .type = T::Integer, .required = true},
        {.name = "communicators",
         .type = T::Array,
         .required = true,
         .items = T::Object},
        {.name = "buffers",
         .type = T::Array,
         .required = true,
         .items = T::Object},
        {.name = "streams",
         .type = T::Array,
         .required = true,
         .items = T::String},
        {.name = "program",
         .type = T::Array,
         .required = true,
         .items = T::Object},
        {.name = "optimizer", .type = T::Object},
        {.name = "estimates", .type = T::Object},
    }};
const SectionRule kOptimizerRule = {
    "optimizer",
    {
        {.name = "name", .type = T::String, .required = true},
        {.name = "lr", .type = T::Number, .required = true},
        {.name = "beta1", .type = T::Number, .required = true},
        {.name = "beta2", .type = T::Number, .required = true},
        {.name = "eps", .type = T::Number, .required = true},
        {.name = "weight_decay", .type = T::Number, .required = true},
        {.name = "stochastic_rounding", .type = T::Boolean, .required = true},
        {.name = "seed", .type = T::Integer, .required = true},
        {.name = "lr_schedule", .type = T::Object},
        {.name = "max_norm", .type = T::Number},
        {.name = "norm_type", .type = T::String},
        {.name = "no_decay", .type = T::Array, .items = T::String},
    }};
const SectionRule kLrScheduleRule = {
    "lr_schedule",
    {
        {.name = "warmup_steps", .type = T::Integer, .required = true},
        {.name = "decay_ratio", .type = T::Number},
        {.name = "decay_type", .type = T::String, .required = true},
        {.name = "min_lr_factor", .type = T::Number, .required = true},
        {.name = "total_steps", .type = T::Integer, .required = true},
    }};
const SectionRule kScaleRule = {
    "scale",
    {
        {.name = "amax", .type = T::String, .required = true},
        {.name = "index", .type = T::Integer, .required = true},
        {.name = "power_of_2", .type = T::Boolean, .required = true},
    }};
const SectionRule kMeshRule = {
    "mesh",
    {
        {.name = "axes",
         .type = T::Array,
         .required = true,
         .items = T::Object},
        {.name = "device_order", .type = T::Array, .items = T::Integer},
        {.name = "managed", .type = T::Array, .items = T::String},
        {.name = "pipeline", .type = T::String},
    }};
const SectionRule kMeshAxisRule = {
    "mesh_axis",
    {
        {.name = "name", .type = T::String, .required = true},
        {.name = "size", .type = T::Integer, .required = true},
    }};
const SectionRule kCommunicatorRule = {
    "communicator",
    {
        {.name = "id", .type = T::String, .required = true},
        {.name = "ranks",
         .type = T::Array,
         .required = true,
         .items = T::Integer},
        {.name = "color", .type = T::Integer, .required = true},
        {.name = "key", .type = T::Integer, .required = true},
        {.name = "axes", .type = T::Array, .items = T::String},
        {.name = "view", .type = T::String, .nullable = true},
        {.name = "fault_tolerant", .type = T::Boolean},
    }};
const SectionRule kBufferRule = {
    "buffer",
    {
        {.name = "id", .type = T::String, .required = true},
        {.name = "kind", .type = T::String, .required = true},
        {.name = "dtype", .type = T::String, .required = true},
        {.name = "global_shape",
         .type = T::Array,
         .required = true,
         .items = T::Integer},
        {.name = "local_shape",
         .type = T::Array,
         .required = true,
         .items = T::Integer},
        {.name = "offset",
         .type = T::Array,
         .required = true,
         .items = T::Integer},
        {.name = "layout", .type = T::String, .required = true},
        {.name = "tensor", .type = T::String},
        {.name = "tensor_id", .type = T::Integer},
        {.name = "scale", .type = T::Object},
    }};
const SectionRule kInstructionRule = {
    "instruction",
    {
        {.name = "id", .type = T::String, .required = true},
        {.name = "stream", .type = T::String, .required = true},
        {.name = "op", .type = T::String, .required = true},
        {.name = "comm", .type = T::String},
        {.name = "dtype", .type = T::String},
        {.name = "count", .type = T::Integer},
        {.name = "reduce", .type = T::String},
        {.name = "root", .type = T::Integer},
        {.name = "peer", .type = T::Integer},
        {.name = "tag", .type = T::String},
        {.name = "inputs", .type = T::Array, .items = T::String},
        {.name = "outputs", .type = T::Array, .items = T::String},
        {.name = "deps", .type = T::Array, .items = T::String},
        {.name = "label", .type = T::String},
        {.name = "phase", .type = T::String},
        {.name = "unit", .type = T::String},
        {.name = "microbatch", .type = T::Integer},
    }};
const SectionRule kEstimatesRule = {
    "estimates",
    {
        {.name = "peak_memory_bytes", .type = T::Object},
        {.name = "bytes_per_step_per_comm", .type = T::Object},
    }};

/// readEnum for one of the name tables above, as its enum type.
template <typename E, size_t N>
Result<E> readEnumAs(Value v, const Path &path, std::string_view what,
                     const std::array<std::string_view, N> &names) {
  Result<int> index = readEnum(v, path, what, names);
  if (!index)
    return index.error();
  return static_cast<E>(*index);
}

//===----------------------------------------------------------------------===//
// JSON -> Plan (types and shapes only; semantics in validatePlan)
//
// Each reader assigns every field of the structure it is given (optional
// ones are reset when absent), reusing the capacity of its strings and
// vectors: readPlanDirectory reads a thousand plans into one per thread.
//===----------------------------------------------------------------------===//

Result<PlanMesh> readMesh(Value v, const Path &path) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kMeshRule));
  PlanMesh mesh;
  Value axes = f.at("axes");
  Path axesPath = path.child("axes");
  if (!axes.isArray())
    return typeError(axesPath, axes, "an array of axes");
  size_t i = 0;
  for (Value a : axes.elements()) {
    Path p = axesPath.child(i++);
    Fields af;
    MESHPLAN_ASSIGN(af, checkObject(a, p, kMeshAxisRule));
    MeshAxis axis;
    MESHPLAN_TRY(readStringInto(af.at("name"), p.child("name"), axis.name));
    MESHPLAN_ASSIGN(axis.size, readInt(af.at("size"), p.child("size"), 1));
    mesh.axes.push_back(std::move(axis));
  }
  if (std::optional<Value> order = f.get("device_order")) {
    std::vector<int64_t> ids;
    MESHPLAN_ASSIGN(ids, readIntArray(*order, path.child("device_order"), 0));
    mesh.deviceOrder = std::move(ids);
  }
  if (std::optional<Value> managed = f.get("managed")) {
    std::vector<std::string> names;
    Path p = path.child("managed");
    MESHPLAN_ASSIGN(names, readStringArray(*managed, p));
    for (size_t k = 0; k < names.size(); ++k) {
      auto it =
          std::find_if(mesh.axes.begin(), mesh.axes.end(),
                       [&](const MeshAxis &a) { return a.name == names[k]; });
      if (it == mesh.axes.end())
        return errorAt(p.child(k),
                       "axis " + quote(names[k]) + " is not in the mesh");
      if (it->managed)
        return errorAt(p.child(k),
                       "axis " + quote(names[k]) + " is listed twice");
      it->managed = true;
    }
  }
  if (std::optional<Value> pipeline = f.get("pipeline")) {
    Path p = path.child("pipeline");
    std::string name;
    MESHPLAN_TRY(readStringInto(*pipeline, p, name));
    auto it = std::find_if(mesh.axes.begin(), mesh.axes.end(),
                           [&](const MeshAxis &a) { return a.name == name; });
    if (it == mesh.axes.end())
      return errorAt(p, "axis " + quote(name) + " is not in the mesh");
    // A managed axis replicates; its members hold the same tensors.
    if (it->managed)
      return errorAt(p, "axis " + quote(name) +
                            " is managed; a pipeline axis cannot be");
    mesh.pipelineAxis = std::move(name);
  }
  return mesh;
}

Result<void> readCommunicator(Value v, const Path &path, Communicator &c) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kCommunicatorRule));
  MESHPLAN_TRY(readStringInto(f.at("id"), path.child("id"), c.id));
  // A listed group is bounded like every other (docs/limits.md).
  Value ranks = f.at("ranks");
  if (static_cast<int64_t>(ranks.size()) > kMaxGroupMembers)
    return errorAt(path.child("ranks"),
                   "lists " + std::to_string(ranks.size()) +
                       " members; groups that are listed member by member "
                       "have at most " +
                       kMaxGroupMembersText + " (docs/limits.md)");
  MESHPLAN_TRY(readIntArrayInto(ranks, path.child("ranks"), c.ranks, 0));
  MESHPLAN_ASSIGN(c.color, readInt(f.at("color"), path.child("color"), 0));
  MESHPLAN_ASSIGN(c.key, readInt(f.at("key"), path.child("key"), 0));
  if (std::optional<Value> axes = f.get("axes"))
    MESHPLAN_TRY(readStringArrayInto(*axes, path.child("axes"), c.axes));
  else
    c.axes.clear();
  // A null view reads as absent (the key table allows null).
  if (std::optional<Value> view = f.get("view"))
    MESHPLAN_TRY(readStringInto(*view, path.child("view"),
                                c.view ? *c.view : c.view.emplace()));
  else
    c.view.reset();
  c.faultTolerant = false;
  if (std::optional<Value> ft = f.get("fault_tolerant"))
    MESHPLAN_ASSIGN(c.faultTolerant,
                    readBool(*ft, path.child("fault_tolerant")));
  return {};
}

Result<void> readBuffer(Value v, const Path &path, Buffer &b) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kBufferRule));
  MESHPLAN_TRY(readStringInto(f.at("id"), path.child("id"), b.id));
  MESHPLAN_ASSIGN(b.kind,
                  (readEnumAs<BufferKind>(f.at("kind"), path.child("kind"),
                                          "buffer kind", kBufferKindNames)));
  MESHPLAN_ASSIGN(b.dtype,
                  (readEnumAs<DType>(f.at("dtype"), path.child("dtype"),
                                     "dtype", kDTypeNames)));
  MESHPLAN_TRY(readIntArrayInto(f.at("global_shape"),
                                path.child("global_shape"), b.globalShape, 0));
  MESHPLAN_TRY(readIntArrayInto(f.at("local_shape"), path.child("local_shape"),
                                b.localShape, 0));
  MESHPLAN_TRY(
      readIntArrayInto(f.at("offset"), path.child("offset"), b.offset, 0));
  MESHPLAN_TRY(readStringInto(f.at("layout"), path.child("layout"), b.layout));
  b.tensor.clear();
  if (std::optional<Value> t = f.get("tensor"))
    MESHPLAN_TRY(readStringInto(*t, path.child("tensor"), b.tensor));
  b.tensorId.reset();
  if (std::optional<Value> id = f.get("tensor_id"))
    MESHPLAN_ASSIGN(b.tensorId, readInt(*id, path.child("tensor_id"), 0));
  if (std::optional<Value> scale = f.get("scale")) {
    Path p = path.child("scale");
    Fields sf;
    MESHPLAN_ASSIGN(sf, checkObject(*scale, p, kScaleRule));
    Fp8Scale &s = b.scale ? *b.scale : b.scale.emplace();
    MESHPLAN_TRY(readStringInto(sf.at("amax"), p.child("amax"), s.amax));
    MESHPLAN_ASSIGN(s.index, readInt(sf.at("index"), p.child("index"), 0));
    MESHPLAN_ASSIGN(s.powerOf2,
                    readBool(sf.at("power_of_2"), p.child("power_of_2")));
  } else {
    b.scale.reset();
  }
  return {};
}

Result<void> readInstruction(Value v, const Path &path, Instruction &in) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kInstructionRule));
  MESHPLAN_TRY(readStringInto(f.at("id"), path.child("id"), in.id));
  MESHPLAN_TRY(readStringInto(f.at("stream"), path.child("stream"), in.stream));
  MESHPLAN_ASSIGN(in.op, (readEnumAs<OpKind>(f.at("op"), path.child("op"), "op",
                                             kOpNames)));
  bool collective = isCollective(in.op);
  // For messages only: not built for a plan that is fine.
  auto opName = [&] { return std::string(opKindName(in.op)); };
  in.comm.clear();
  if (std::optional<Value> comm = f.get("comm")) {
    if (!collective)
      return errorAt(path.child("comm"),
                     opName() + " is not a collective and takes no comm");
    MESHPLAN_TRY(readStringInto(*comm, path.child("comm"), in.comm));
  } else if (collective) {
    return errorAt(path, opName() + " needs \"comm\"");
  }
  in.dtype.reset();
  if (std::optional<Value> dtype = f.get("dtype")) {
    MESHPLAN_ASSIGN(in.dtype, (readEnumAs<DType>(*dtype, path.child("dtype"),
                                                 "dtype", kDTypeNames)));
  } else if (collective) {
    return errorAt(path, opName() + " needs \"dtype\"");
  }
  in.count = 0;
  if (std::optional<Value> count = f.get("count"))
    MESHPLAN_ASSIGN(
        in.count, readInt(*count, path.child("count"), 0, kMaxTensorElements));
  else if (collective)
    return errorAt(path, opName() + " needs \"count\"");
  in.reduce.reset();
  if (std::optional<Value> reduce = f.get("reduce")) {
    Path p = path.child("reduce");
    if (!isReduction(in.op))
      return errorAt(p, opName() + " takes no reduce op (only "
                                   "reduce_scatter and all_reduce do)");
    if (!reduce->isString())
      return typeError(p, *reduce, "a string");
    Result<ReduceOp> op = parseReduceOp(reduce->string());
    if (!op)
      return errorAt(p, op.error().message);
    in.reduce = *op;
  } else if (isReduction(in.op)) {
    return errorAt(path, opName() + " needs \"reduce\"");
  }
  in.root = 0;
  if (std::optional<Value> root = f.get("root")) {
    if (in.op != OpKind::Broadcast)
      return errorAt(path.child("root"), "only broadcast takes a root");
    MESHPLAN_ASSIGN(in.root, readInt(*root, path.child("root"), 0));
  } else if (in.op == OpKind::Broadcast) {
    return errorAt(path, "broadcast needs \"root\"");
  }
  in.peer = 0;
  if (std::optional<Value> peer = f.get("peer")) {
    if (!isPointToPoint(in.op))
      return errorAt(path.child("peer"), "only send and recv take a peer");
    MESHPLAN_ASSIGN(in.peer, readInt(*peer, path.child("peer"), 0));
  } else if (isPointToPoint(in.op)) {
    return errorAt(path, opName() + " needs \"peer\"");
  }
  in.tag.clear();
  if (std::optional<Value> tag = f.get("tag")) {
    if (!isPointToPoint(in.op))
      return errorAt(path.child("tag"), "only send and recv take a tag");
    MESHPLAN_TRY(readStringInto(*tag, path.child("tag"), in.tag));
  } else if (isPointToPoint(in.op)) {
    return errorAt(path, opName() + " needs \"tag\"");
  }
  // Not cleared first: the strings keep their storage for the next plan.
  auto list = [&](std::string_view key,
                  std::vector<std::string> &out) -> Result<void> {
    if (std::optional<Value> x = f.get(key))
      return readStringArrayInto(*x, path.child(key), out);
    out.clear();
    return {};
  };
  MESHPLAN_TRY(list("inputs", in.inputs));
  MESHPLAN_TRY(list("outputs", in.outputs));
  MESHPLAN_TRY(list("deps", in.deps));
  in.label.clear();
  if (std::optional<Value> x = f.get("label"))
    MESHPLAN_TRY(readStringInto(*x, path.child("label"), in.label));
  // The callback a compute instruction calls; only compute has one.
  bool compute = in.op == OpKind::Compute;
  std::optional<Value> phase = f.get("phase"), unit = f.get("unit"),
                       microbatch = f.get("microbatch");
  for (auto [key, x] : {std::pair{"phase", phase}, std::pair{"unit", unit},
                        std::pair{"microbatch", microbatch}}) {
    if (x && !compute)
      return errorAt(path.child(key),
                     opName() + " takes no " + key + " (only compute does)");
    if (!x && compute)
      return errorAt(path, "compute needs " + quote(key));
  }
  in.phase.clear();
  in.unit.clear();
  in.microbatch = 0;
  if (compute) {
    MESHPLAN_TRY(readStringInto(*phase, path.child("phase"), in.phase));
    MESHPLAN_TRY(readStringInto(*unit, path.child("unit"), in.unit));
    MESHPLAN_ASSIGN(in.microbatch,
                    readInt(*microbatch, path.child("microbatch"), 0));
  }
  return {};
}

Result<OptimizerConfig> readOptimizer(Value v, const Path &path) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kOptimizerRule));
  OptimizerConfig o;
  MESHPLAN_TRY(readStringInto(f.at("name"), path.child("name"), o.name));
  MESHPLAN_ASSIGN(o.lr, readNumber(f.at("lr"), path.child("lr")));
  MESHPLAN_ASSIGN(o.beta1, readNumber(f.at("beta1"), path.child("beta1")));
  MESHPLAN_ASSIGN(o.beta2, readNumber(f.at("beta2"), path.child("beta2")));
  MESHPLAN_ASSIGN(o.eps, readNumber(f.at("eps"), path.child("eps")));
  MESHPLAN_ASSIGN(o.weightDecay,
                  readNumber(f.at("weight_decay"), path.child("weight_decay")));
  MESHPLAN_ASSIGN(
      o.stochasticRounding,
      readBool(f.at("stochastic_rounding"), path.child("stochastic_rounding")));
  MESHPLAN_ASSIGN(o.seed, readInt(f.at("seed"), path.child("seed"), 0));
  if (std::optional<Value> sv = f.get("lr_schedule")) {
    Path sp = path.child("lr_schedule");
    Fields sf;
    MESHPLAN_ASSIGN(sf, checkObject(*sv, sp, kLrScheduleRule));
    LrSchedule schedule;
    MESHPLAN_ASSIGN(schedule.warmupSteps, readInt(sf.at("warmup_steps"),
                                                  sp.child("warmup_steps"), 0));
    MESHPLAN_ASSIGN(schedule.totalSteps,
                    readInt(sf.at("total_steps"), sp.child("total_steps"), 1));
    if (std::optional<Value> ratio = sf.get("decay_ratio")) {
      double r;
      MESHPLAN_ASSIGN(r, readNumber(*ratio, sp.child("decay_ratio")));
      schedule.decayRatio = r;
    }
    MESHPLAN_ASSIGN(
        schedule.minLrFactor,
        readNumber(sf.at("min_lr_factor"), sp.child("min_lr_factor")));
    std::string type;
    MESHPLAN_TRY(
        readStringInto(sf.at("decay_type"), sp.child("decay_type"), type));
    auto decay = parseLrDecayType(type);
    if (!decay)
      return errorAt(sp.child("decay_type"),
                     "unknown decay_type " + quote(type) +
                         "; expected linear, sqrt or cosine");
    schedule.decayType = *decay;
    o.schedule = schedule;
  }
  if (std::optional<Value> mv = f.get("max_norm")) {
    double m;
    MESHPLAN_ASSIGN(m, readNumber(*mv, path.child("max_norm")));
    o.maxNorm = m;
  }
  if (std::optional<Value> nv = f.get("norm_type")) {
    std::string type;
    MESHPLAN_TRY(readStringInto(*nv, path.child("norm_type"), type));
    auto norm = parseGradNormType(type);
    if (!norm)
      return errorAt(path.child("norm_type"),
                     "unknown norm_type " + quote(type) +
                         "; expected \"2\" or \"inf\"");
    o.normType = *norm;
  }
  if (std::optional<Value> dv = f.get("no_decay"))
    MESHPLAN_TRY(readStringArrayInto(*dv, path.child("no_decay"), o.noDecay));
  return o;
}

Result<std::map<std::string, int64_t>> readByteMap(Value v, const Path &path) {
  if (!v.isObject())
    return typeError(path, v, "an object");
  std::map<std::string, int64_t> out;
  for (Member m : v.members()) {
    int64_t n;
    MESHPLAN_ASSIGN(n, readInt(m.value, path.child(m.key), 0));
    out.emplace(m.key, n); // keys are unique: the tokenizer refuses repeats
  }
  return out;
}

Result<void> checkCount(Value array, const Path &path, std::string_view what,
                        int64_t max, const char *maxText) {
  if (static_cast<int64_t>(array.size()) > max)
    return errorAt(path, std::to_string(array.size()) + " " +
                             std::string(what) + "; a plan has at most " +
                             maxText + " (docs/limits.md)");
  return {};
}

/// An array of objects, each read by `readOne(value, path, element)` into
/// the element of `out` at its index (existing elements are reused).
/// More than `max` elements is an error naming the limit (docs/limits.md),
/// before anything is allocated for them.
template <typename T, typename F>
Result<void> readArrayInto(Value v, const Path &path, std::string_view what,
                           std::vector<T> &out, F readOne, int64_t max,
                           const char *maxText) {
  if (!v.isArray())
    return typeError(path, v, "an array of " + std::string(what));
  MESHPLAN_TRY(checkCount(v, path, what, max, maxText));
  out.resize(v.size());
  size_t i = 0;
  for (Value e : v.elements()) {
    MESHPLAN_TRY(readOne(e, path.child(i), out[i]));
    ++i;
  }
  return {};
}
} // namespace

Result<void> parsePlanInto(std::string_view text, Plan &plan,
                           std::vector<int32_t> *operandBuffers) {
  Result<Document> parsed = Document::parse(
      text, kMaxPlanDepth, kMaxPlanJsonValues, kMaxPlanJsonValuesText);
  if (!parsed)
    return parsed.error();
  Value doc = parsed->root();
  const Path root;
  if (!doc.isObject())
    return typeError(root, doc, "a plan object");
  // Format and version first, so a newer or foreign document is named as
  // such rather than by its first unknown key.
  std::optional<Value> format = doc.find("format");
  if (!format)
    return errorAt(root, "missing required key \"format\" (a meshplan plan "
                         "starts with \"format\": \"meshplan.plan\")");
  if (!format->isString() || format->string() != kPlanFormat)
    return errorAt(root.child("format"), "expected " + quote(kPlanFormat) +
                                             ", got " + describe(*format));
  std::optional<Value> version = doc.find("version");
  if (!version)
    return errorAt(root, "missing required key \"version\"");
  if (version->kind() != ValueKind::Unsigned ||
      version->unsignedValue() != kPlanVersion)
    return errorAt(root.child("version"), "unsupported plan version " +
                                              dump(*version) +
                                              "; this meshplan reads version " +
                                              std::to_string(kPlanVersion));
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(doc, root, kRootRule));
  plan.version = kPlanVersion;
  MESHPLAN_ASSIGN(plan.mesh, readMesh(f.at("mesh"), root.child("mesh")));
  MESHPLAN_ASSIGN(plan.rank, readInt(f.at("rank"), root.child("rank"), 0));
  MESHPLAN_TRY(readArrayInto(f.at("communicators"), root.child("communicators"),
                             "communicators", plan.communicators,
                             readCommunicator, kMaxPlanCommunicators,
                             kMaxPlanCommunicatorsText));
  MESHPLAN_TRY(readArrayInto(f.at("buffers"), root.child("buffers"), "buffers",
                             plan.buffers, readBuffer, kMaxPlanBuffers,
                             kMaxPlanBuffersText));
  // Every stream becomes an executor thread.
  if (f.at("streams").isArray())
    MESHPLAN_TRY(checkCount(f.at("streams"), root.child("streams"), "streams",
                            kMaxPlanStreams, kMaxPlanStreamsText));
  MESHPLAN_TRY(readStringArrayInto(f.at("streams"), root.child("streams"),
                                   plan.streams));
  MESHPLAN_TRY(readArrayInto(f.at("program"), root.child("program"),
                             "instructions", plan.program, readInstruction,
                             kMaxPlanInstructions, kMaxPlanInstructionsText));
  plan.optimizer.reset();
  if (std::optional<Value> opt = f.get("optimizer"))
    MESHPLAN_ASSIGN(plan.optimizer,
                    readOptimizer(*opt, root.child("optimizer")));
  plan.estimates.reset();
  if (std::optional<Value> est = f.get("estimates")) {
    Path p = root.child("estimates");
    Fields ef;
    MESHPLAN_ASSIGN(ef, checkObject(*est, p, kEstimatesRule));
    Estimates &e = plan.estimates.emplace();
    if (std::optional<Value> m = ef.get("peak_memory_bytes"))
      MESHPLAN_ASSIGN(e.peakMemoryBytes,
                      readByteMap(*m, p.child("peak_memory_bytes")));
    if (std::optional<Value> m = ef.get("bytes_per_step_per_comm"))
      MESHPLAN_ASSIGN(e.bytesPerStepPerComm,
                      readByteMap(*m, p.child("bytes_per_step_per_comm")));
  }
  return validatePlan(plan, operandBuffers);
}

Result<Plan> parsePlan(std::string_view text) {
  Plan plan;
  MESHPLAN_TRY(parsePlanInto(text, plan));
  return plan;
}

Result<Plan> readPlanFile(const std::string &path) {
  Result<std::string> text = readTextFile(path);
  if (!text)
    return text.error();
  Result<Plan> plan = parsePlan(*text);
  if (!plan)
    return plan.error().within(path);
  return plan;
}

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

static Json meshJson(const PlanMesh &mesh) {
  Json axes = Json::array();
  Json managed = Json::array();
  for (const MeshAxis &a : mesh.axes) {
    axes.push_back(Json{{"name", a.name}, {"size", a.size}});
    if (a.managed)
      managed.push_back(a.name);
  }
  Json out = Json::object();
  out["axes"] = std::move(axes);
  if (mesh.deviceOrder)
    out["device_order"] = *mesh.deviceOrder;
  if (!managed.empty())
    out["managed"] = std::move(managed);
  if (mesh.pipelineAxis)
    out["pipeline"] = *mesh.pipelineAxis;
  return out;
}

static Json commJson(const Communicator &c) {
  Json out = Json::object();
  out["id"] = c.id;
  out["ranks"] = c.ranks;
  out["color"] = c.color;
  out["key"] = c.key;
  out["axes"] = c.axes;
  out["view"] = c.view ? Json(*c.view) : Json(nullptr);
  out["fault_tolerant"] = c.faultTolerant;
  return out;
}

static Json bufferJson(const Buffer &b) {
  Json out = Json::object();
  out["id"] = b.id;
  out["kind"] = bufferKindName(b.kind);
  out["dtype"] = dtypeName(b.dtype);
  out["global_shape"] = b.globalShape;
  out["local_shape"] = b.localShape;
  out["offset"] = b.offset;
  out["layout"] = b.layout;
  if (!b.tensor.empty())
    out["tensor"] = b.tensor;
  if (b.tensorId)
    out["tensor_id"] = *b.tensorId;
  if (b.scale)
    out["scale"] = Json{{"amax", b.scale->amax},
                        {"index", b.scale->index},
                        {"power_of_2", b.scale->powerOf2}};
  return out;
}

static Json instructionJson(const Instruction &in) {
  Json out = Json::object();
  out["id"] = in.id;
  out["stream"] = in.stream;
  out["op"] = opKindName(in.op);
  if (isCollective(in.op))
    out["comm"] = in.comm;
  if (in.dtype)
    out["dtype"] = dtypeName(*in.dtype);
  if (isCollective(in.op) || in.count != 0)
    out["count"] = in.count;
  if (in.reduce)
    out["reduce"] = reduceOpName(*in.reduce);
  if (in.op == OpKind::Broadcast)
    out["root"] = in.root;
  if (isPointToPoint(in.op)) {
    out["peer"] = in.peer;
    out["tag"] = in.tag;
  }
  if (!in.inputs.empty())
    out["inputs"] = in.inputs;
  if (!in.outputs.empty())
    out["outputs"] = in.outputs;
  if (!in.deps.empty())
    out["deps"] = in.deps;
  if (!in.label.empty())
    out["label"] = in.label;
  if (in.op == OpKind::Compute) {
    out["phase"] = in.phase;
    out["unit"] = in.unit;
    out["microbatch"] = in.microbatch;
  }
  return out;
}

/// One array element per line: diffable, greppable, and compact.
template <typename T, typename F>
static void writeArray(std::string &out, const std::vector<T> &items,
                       F toJson) {
  if (items.empty()) {
    out += "[]";
    return;
  }
  out += "[\n";
  for (size_t i = 0; i < items.size(); ++i) {
    out += "  ";
    out +=
        toJson(items[i]).dump(-1, ' ', false, Json::error_handler_t::replace);
    out += i + 1 < items.size() ? ",\n" : "\n";
  }
  out += " ]";
}

std::string writePlan(const Plan &plan) {
  auto dump = [](const Json &j) {
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  std::string out = "{\n";
  out += " \"format\": " + dump(Json(kPlanFormat)) + ",\n";
  out += " \"version\": " + std::to_string(plan.version) + ",\n";
  out += " \"mesh\": " + dump(meshJson(plan.mesh)) + ",\n";
  out += " \"rank\": " + std::to_string(plan.rank) + ",\n";
  out += " \"communicators\": ";
  writeArray(out, plan.communicators, commJson);
  out += ",\n \"buffers\": ";
  writeArray(out, plan.buffers, bufferJson);
  out += ",\n \"streams\": " + dump(Json(plan.streams));
  out += ",\n \"program\": ";
  writeArray(out, plan.program, instructionJson);
  if (plan.optimizer) {
    const OptimizerConfig &o = *plan.optimizer;
    Json opt = Json::object();
    opt["name"] = o.name;
    opt["lr"] = o.lr;
    opt["beta1"] = o.beta1;
    opt["beta2"] = o.beta2;
    opt["eps"] = o.eps;
    opt["weight_decay"] = o.weightDecay;
    opt["stochastic_rounding"] = o.stochasticRounding;
    opt["seed"] = o.seed;
    // The keys of a schedule, clipping and decay groups appear only when
    // used, so plans without them read exactly as before.
    if (o.schedule) {
      Json sj = Json::object();
      sj["warmup_steps"] = o.schedule->warmupSteps;
      if (o.schedule->decayRatio)
        sj["decay_ratio"] = *o.schedule->decayRatio;
      sj["decay_type"] = std::string(lrDecayTypeName(o.schedule->decayType));
      sj["min_lr_factor"] = o.schedule->minLrFactor;
      sj["total_steps"] = o.schedule->totalSteps;
      opt["lr_schedule"] = std::move(sj);
    }
    if (o.maxNorm) {
      opt["max_norm"] = *o.maxNorm;
      opt["norm_type"] = std::string(gradNormTypeName(o.normType));
    }
    if (!o.noDecay.empty())
      opt["no_decay"] = o.noDecay;
    out += ",\n \"optimizer\": " + dump(opt);
  }
  if (plan.estimates) {
    Json est = Json::object();
    Json peak = Json::object(), bytes = Json::object();
    for (const auto &[k, n] : plan.estimates->peakMemoryBytes)
      peak[k] = n;
    for (const auto &[k, n] : plan.estimates->bytesPerStepPerComm)
      bytes[k] = n;
    est["peak_memory_bytes"] = std::move(peak);
    est["bytes_per_step_per_comm"] = std::move(bytes);
    out += ",\n \"estimates\": " + dump(est);
  }
  out += "\n}\n";
  return out;
}

} // namespace meshplan::plan
