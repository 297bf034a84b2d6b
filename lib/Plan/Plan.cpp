//===- Plan.cpp - Plan reader, validator and writer -----------------------===//
//
// No exceptions. Plans are read through meshplan/Support/JsonReader.h: the
// document is tokenized into a flat array of nodes (syntax, depth and
// repeated keys checked in that one pass), and the readers below fill the
// Plan straight from it, every value's type checked before it is read, with
// JSON pointers built only for an error. The writer serializes through
// nlohmann/json.
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

static std::string ints(const std::vector<int64_t> &v) {
  return "[" + joinInts(v) + "]";
}

/// A rank list for a one-line message: "[0,1,...,4095] (4096 ranks)" when
/// long, since a group may have up to kMaxGroupMembers members.
static std::string rankListText(const std::vector<int64_t> &v) {
  if (v.size() <= 16)
    return ints(v);
  std::vector<int64_t> head(v.begin(), v.begin() + 8);
  return "[" + joinInts(head) + ",...," + std::to_string(v.back()) + "] (" +
         std::to_string(v.size()) + " ranks)";
}

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

#define MP_ASSIGN(lhs, expr)                                                   \
  do {                                                                         \
    auto mpRes_ = (expr);                                                      \
    if (!mpRes_.ok())                                                          \
      return mpRes_.error();                                                   \
    lhs = std::move(mpRes_.value());                                           \
  } while (0)

//===----------------------------------------------------------------------===//
// JSON -> Plan (types and shapes only; semantics in validatePlan)
//
// Each reader assigns every field of the structure it is given (optional
// ones are reset when absent), reusing the capacity of its strings and
// vectors: readPlanDirectory reads a thousand plans into one per thread.
//===----------------------------------------------------------------------===//

Result<PlanMesh> readMesh(Value v, const Path &path) {
  Fields f;
  MP_ASSIGN(f, checkObject(v, path, kMeshRule));
  PlanMesh mesh;
  Value axes = f.at("axes");
  Path axesPath = path.child("axes");
  if (!axes.isArray())
    return typeError(axesPath, axes, "an array of axes");
  size_t i = 0;
  for (Value a : axes.elements()) {
    Path p = axesPath.child(i++);
    Fields af;
    MP_ASSIGN(af, checkObject(a, p, kMeshAxisRule));
    MeshAxis axis;
    MESHPLAN_TRY(readStringInto(af.at("name"), p.child("name"), axis.name));
    MP_ASSIGN(axis.size, readInt(af.at("size"), p.child("size"), 1));
    mesh.axes.push_back(std::move(axis));
  }
  if (std::optional<Value> order = f.get("device_order")) {
    std::vector<int64_t> ids;
    MP_ASSIGN(ids, readIntArray(*order, path.child("device_order"), 0));
    mesh.deviceOrder = std::move(ids);
  }
  if (std::optional<Value> managed = f.get("managed")) {
    std::vector<std::string> names;
    Path p = path.child("managed");
    MP_ASSIGN(names, readStringArray(*managed, p));
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
  MP_ASSIGN(f, checkObject(v, path, kCommunicatorRule));
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
  MP_ASSIGN(c.color, readInt(f.at("color"), path.child("color"), 0));
  MP_ASSIGN(c.key, readInt(f.at("key"), path.child("key"), 0));
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
    MP_ASSIGN(c.faultTolerant, readBool(*ft, path.child("fault_tolerant")));
  return {};
}

Result<void> readBuffer(Value v, const Path &path, Buffer &b) {
  Fields f;
  MP_ASSIGN(f, checkObject(v, path, kBufferRule));
  MESHPLAN_TRY(readStringInto(f.at("id"), path.child("id"), b.id));
  MP_ASSIGN(b.kind, (readEnumAs<BufferKind>(f.at("kind"), path.child("kind"),
                                            "buffer kind", kBufferKindNames)));
  MP_ASSIGN(b.dtype, (readEnumAs<DType>(f.at("dtype"), path.child("dtype"),
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
    MP_ASSIGN(b.tensorId, readInt(*id, path.child("tensor_id"), 0));
  if (std::optional<Value> scale = f.get("scale")) {
    Path p = path.child("scale");
    Fields sf;
    MP_ASSIGN(sf, checkObject(*scale, p, kScaleRule));
    Fp8Scale &s = b.scale ? *b.scale : b.scale.emplace();
    MESHPLAN_TRY(readStringInto(sf.at("amax"), p.child("amax"), s.amax));
    MP_ASSIGN(s.index, readInt(sf.at("index"), p.child("index"), 0));
    MP_ASSIGN(s.powerOf2, readBool(sf.at("power_of_2"), p.child("power_of_2")));
  } else {
    b.scale.reset();
  }
  return {};
}

Result<void> readInstruction(Value v, const Path &path, Instruction &in) {
  Fields f;
  MP_ASSIGN(f, checkObject(v, path, kInstructionRule));
  MESHPLAN_TRY(readStringInto(f.at("id"), path.child("id"), in.id));
  MESHPLAN_TRY(readStringInto(f.at("stream"), path.child("stream"), in.stream));
  MP_ASSIGN(in.op,
            (readEnumAs<OpKind>(f.at("op"), path.child("op"), "op", kOpNames)));
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
    MP_ASSIGN(in.dtype, (readEnumAs<DType>(*dtype, path.child("dtype"), "dtype",
                                           kDTypeNames)));
  } else if (collective) {
    return errorAt(path, opName() + " needs \"dtype\"");
  }
  in.count = 0;
  if (std::optional<Value> count = f.get("count"))
    MP_ASSIGN(in.count,
              readInt(*count, path.child("count"), 0, kMaxTensorElements));
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
    MP_ASSIGN(in.root, readInt(*root, path.child("root"), 0));
  } else if (in.op == OpKind::Broadcast) {
    return errorAt(path, "broadcast needs \"root\"");
  }
  in.peer = 0;
  if (std::optional<Value> peer = f.get("peer")) {
    if (!isPointToPoint(in.op))
      return errorAt(path.child("peer"), "only send and recv take a peer");
    MP_ASSIGN(in.peer, readInt(*peer, path.child("peer"), 0));
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
    MP_ASSIGN(in.microbatch, readInt(*microbatch, path.child("microbatch"), 0));
  }
  return {};
}

Result<OptimizerConfig> readOptimizer(Value v, const Path &path) {
  Fields f;
  MP_ASSIGN(f, checkObject(v, path, kOptimizerRule));
  OptimizerConfig o;
  MESHPLAN_TRY(readStringInto(f.at("name"), path.child("name"), o.name));
  MP_ASSIGN(o.lr, readNumber(f.at("lr"), path.child("lr")));
  MP_ASSIGN(o.beta1, readNumber(f.at("beta1"), path.child("beta1")));
  MP_ASSIGN(o.beta2, readNumber(f.at("beta2"), path.child("beta2")));
  MP_ASSIGN(o.eps, readNumber(f.at("eps"), path.child("eps")));
  MP_ASSIGN(o.weightDecay,
            readNumber(f.at("weight_decay"), path.child("weight_decay")));
  MP_ASSIGN(o.stochasticRounding, readBool(f.at("stochastic_rounding"),
                                           path.child("stochastic_rounding")));
  MP_ASSIGN(o.seed, readInt(f.at("seed"), path.child("seed"), 0));
  if (std::optional<Value> sv = f.get("lr_schedule")) {
    Path sp = path.child("lr_schedule");
    Fields sf;
    MP_ASSIGN(sf, checkObject(*sv, sp, kLrScheduleRule));
    LrSchedule schedule;
    MP_ASSIGN(schedule.warmupSteps,
              readInt(sf.at("warmup_steps"), sp.child("warmup_steps"), 0));
    MP_ASSIGN(schedule.totalSteps,
              readInt(sf.at("total_steps"), sp.child("total_steps"), 1));
    if (std::optional<Value> ratio = sf.get("decay_ratio")) {
      double r;
      MP_ASSIGN(r, readNumber(*ratio, sp.child("decay_ratio")));
      schedule.decayRatio = r;
    }
    MP_ASSIGN(schedule.minLrFactor,
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
    MP_ASSIGN(m, readNumber(*mv, path.child("max_norm")));
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
    MP_ASSIGN(n, readInt(m.value, path.child(m.key), 0));
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

Result<void> parsePlanInto(std::string_view text, Plan &plan) {
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
  MP_ASSIGN(f, checkObject(doc, root, kRootRule));
  plan.version = kPlanVersion;
  MP_ASSIGN(plan.mesh, readMesh(f.at("mesh"), root.child("mesh")));
  MP_ASSIGN(plan.rank, readInt(f.at("rank"), root.child("rank"), 0));
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
    MP_ASSIGN(plan.optimizer, readOptimizer(*opt, root.child("optimizer")));
  plan.estimates.reset();
  if (std::optional<Value> est = f.get("estimates")) {
    Path p = root.child("estimates");
    Fields ef;
    MP_ASSIGN(ef, checkObject(*est, p, kEstimatesRule));
    Estimates &e = plan.estimates.emplace();
    if (std::optional<Value> m = ef.get("peak_memory_bytes"))
      MP_ASSIGN(e.peakMemoryBytes,
                readByteMap(*m, p.child("peak_memory_bytes")));
    if (std::optional<Value> m = ef.get("bytes_per_step_per_comm"))
      MP_ASSIGN(e.bytesPerStepPerComm,
                readByteMap(*m, p.child("bytes_per_step_per_comm")));
  }
  return validatePlan(plan);
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
// Validation
//===----------------------------------------------------------------------===//

Result<AxisRef> parseAxisRefText(const Mesh &mesh, std::string_view text) {
  std::string_view name = text, rest;
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    name = text.substr(0, colon);
    rest = text.substr(colon + 1);
  }
  name = unquote(trim(name));
  std::optional<int> axis = mesh.findAxis(name);
  if (!axis)
    return makeError("axis " + quote(name) +
                     " is not in the mesh (axes: " + mesh.axisNameList() + ")");
  if (rest.empty() && text.find(':') == std::string_view::npos)
    return makeAxisRef(mesh, *axis, 1, mesh.axis(*axis).size);
  // "(pre)size"
  rest = trim(rest);
  size_t close = rest.find(')');
  if (rest.empty() || rest[0] != '(' || close == std::string_view::npos)
    return makeError("axis ref " + quote(text) +
                     " is not name or name:(pre)size");
  std::optional<int64_t> pre = parseInt(rest.substr(1, close - 1));
  std::optional<int64_t> size = parseInt(rest.substr(close + 1));
  if (!pre || !size)
    return makeError("axis ref " + quote(text) +
                     " is not name or name:(pre)size");
  return makeAxisRef(mesh, *axis, *pre, *size);
}

Result<DerivedGroup> deriveGroup(const Mesh &mesh,
                                 const std::vector<std::string> &axes,
                                 int64_t rank, const LiveMembers *live) {
  AxisRefList refs;
  for (size_t i = 0; i < axes.size(); ++i) {
    Result<AxisRef> ref = parseAxisRefText(mesh, axes[i]);
    if (!ref)
      return ref.error().within("/" + std::to_string(i));
    refs.push_back(*ref);
  }
  MESHPLAN_TRY(checkRefsCompatible(mesh, refs, "communicator axes"));
  DerivedGroup g;
  MP_ASSIGN(g.ranks, groupOf(mesh, refs, rank, live));
  SplitKey split;
  MP_ASSIGN(split, splitKeyOf(mesh, refs, rank, live));
  g.color = split.color;
  g.key = split.key;
  return g;
}

/// Ids (views of the plan's own strings) to indices, by open addressing.
/// std::unordered_map allocated a node per id, thousands per plan, and its
/// lookups (6,000 buffer references in a plan of the 8B model) were a tenth
/// of reading a plan directory; here a slot is 8 bytes (a hash tag and the
/// entry's position), so the table stays in cache and only a tag match
/// looks at the text. The interface is the part of unordered_map's that
/// validatePlan uses (end() is null).
class IdIndex {
public:
  struct Entry {
    std::string_view first;
    size_t second;
  };

  void reserve(size_t n) {
    entries.reserve(n);
    if (slots.size() < 2 * n)
      rehash(std::bit_ceil(std::max<size_t>(2 * n, 16)));
  }
  std::pair<const Entry *, bool> emplace(std::string_view id, size_t index) {
    if (slots.size() < 2 * (entries.size() + 1))
      rehash(std::max<size_t>(2 * slots.size(), 16));
    uint64_t h = hash(id);
    uint64_t &slot = probe(id, h);
    if (slot)
      return {&entries[(slot & 0xFFFFFFFF) - 1], false};
    entries.push_back(Entry{id, index});
    slot = (h & ~uint64_t(0xFFFFFFFF)) | entries.size();
    return {&entries.back(), true};
  }
  const Entry *find(std::string_view id) const {
    if (slots.empty())
      return nullptr;
    uint64_t slot = const_cast<IdIndex *>(this)->probe(id, hash(id));
    return slot ? &entries[(slot & 0xFFFFFFFF) - 1] : nullptr;
  }
  const Entry *end() const { return nullptr; }
  size_t count(std::string_view id) const { return find(id) ? 1 : 0; }
  /// Precondition: `id` is present.
  size_t at(std::string_view id) const { return find(id)->second; }

private:
  static uint64_t hash(std::string_view id) {
    auto load8 = [](const char *at) {
      uint64_t w;
      std::memcpy(&w, at, 8);
      return w;
    };
    uint64_t h = id.size() * 0x9E3779B97F4A7C15ull;
    size_t n = id.size(), i = 0;
    for (; i + 8 <= n; i += 8)
      h = ((h ^ load8(id.data() + i)) * 0xBF58476D1CE4E5B9ull) ^ (h >> 29);
    if (i < n) {
      uint64_t tail = 0;
      if (n >= 8) {
        tail = load8(id.data() + n - 8); // overlaps the last full word
      } else {
        for (; i < n; ++i)
          tail = tail << 8 | static_cast<unsigned char>(id[i]);
      }
      h = (h ^ tail) * 0x94D049BB133111EBull;
    }
    return h ^ (h >> 31);
  }
  /// The slot holding `id` (tag in the high half, entry + 1 in the low
  /// half), or the empty (zero) one where it would go.
  uint64_t &probe(std::string_view id, uint64_t h) {
    uint64_t tag = h & ~uint64_t(0xFFFFFFFF);
    size_t mask = slots.size() - 1;
    for (size_t k = h & mask;; k = (k + 1) & mask) {
      uint64_t &slot = slots[k];
      if (!slot || ((slot & ~uint64_t(0xFFFFFFFF)) == tag &&
                    sameText(entries[(slot & 0xFFFFFFFF) - 1].first, id)))
        return slot;
    }
  }
  void rehash(size_t size) {
    slots.assign(size, 0);
    for (size_t e = 0; e < entries.size(); ++e) {
      uint64_t h = hash(entries[e].first);
      probe(entries[e].first, h) = (h & ~uint64_t(0xFFFFFFFF)) | (e + 1);
    }
  }

  std::vector<Entry> entries;
  std::vector<uint64_t> slots;
};

/// Layouts parsed once per distinct text, with the box each gave this rank
/// per global shape: a plan has thousands of buffers but a few dozen
/// layouts, the buffers of one tensor share a shape, and parsing a layout
/// and computing a box (three vectors) were most of checking a buffer.
struct CachedLayout {
  Result<Layout> layout;
  std::vector<std::pair<std::vector<int64_t>, Result<ShardBox>>> boxes;
};
using LayoutCache = std::unordered_map<std::string_view, CachedLayout>;
/// Shapes remembered per layout; past that, boxes are computed each time
/// (a plan with more distinct shapes would make the search quadratic).
constexpr size_t kMaxCachedShapes = 64;

/// The buffer's layout parses over the root mesh and gives this rank exactly
/// the buffer's box.
static Result<void> checkBufferLayout(const View &root,
                                      const AxisNamespace &names,
                                      LayoutCache &layouts, int64_t rank,
                                      const Buffer &b, const Path &p) {
  Path lp = p.child("layout");
  auto cached = layouts.find(b.layout);
  if (cached == layouts.end())
    cached = layouts
                 .emplace(b.layout,
                          CachedLayout{parseLayout(root, names, b.layout), {}})
                 .first;
  CachedLayout &entry = cached->second;
  const Result<Layout> &layout = entry.layout;
  if (!layout)
    return errorAt(lp, layout.error().message);
  if (layout->rank() != static_cast<int>(b.globalShape.size()))
    return errorAt(lp, "the layout has " + std::to_string(layout->rank()) +
                           " dims but global_shape has " +
                           std::to_string(b.globalShape.size()));
  const Result<ShardBox> *box = nullptr;
  std::optional<Result<ShardBox>> uncached;
  for (const auto &[shape, known] : entry.boxes)
    if (shape == b.globalShape)
      box = &known;
  if (!box && entry.boxes.size() < kMaxCachedShapes) {
    entry.boxes.emplace_back(b.globalShape,
                             shardOf(root, *layout, b.globalShape, rank));
    box = &entry.boxes.back().second;
  } else if (!box) {
    box = &uncached.emplace(shardOf(root, *layout, b.globalShape, rank));
  }
  if (!*box)
    return errorAt(lp, box->error().message);
  const ShardBox &got = box->value();
  if (got.offset != b.offset || got.localShape != b.localShape)
    return errorAt(lp, "gives rank " + std::to_string(rank) + " the box " +
                           ints(got.offset) + " + " + ints(got.localShape) +
                           ", but the buffer says " + ints(b.offset) + " + " +
                           ints(b.localShape));
  return {};
}

/// What an instruction's inputs and outputs must look like for its op to be
/// executable (the runtime relies on it).
static Result<void> checkOperands(const Plan &plan, const Instruction &in,
                                  const Path &p, const IdIndex &buffers) {
  auto buffer = [&](const std::string &id) -> const Buffer & {
    return plan.buffers[buffers.at(id)];
  };
  std::string opName(opKindName(in.op));
  switch (in.op) {
  case OpKind::Compute:
    // backward_input / backward_weight: a zero-bubble schedule's split
    // backward (docs/plan-format.md), the input gradient first, the weights'
    // later.
    if (in.phase != "forward" && in.phase != "backward" &&
        in.phase != "backward_input" && in.phase != "backward_weight")
      return errorAt(childPointer(p, "phase"),
                     "phase must be \"forward\", \"backward\", "
                     "\"backward_input\" or \"backward_weight\", not " +
                         quote(in.phase));
    if (in.unit.empty())
      return errorAt(childPointer(p, "unit"), "unit is empty");
    return {};
  case OpKind::OptimizerUpdate: {
    // Per parameter: inputs (param, grad, exp_avg, exp_avg_sq), outputs
    // (param, exp_avg, exp_avg_sq), updated in place.
    if (in.inputs.size() % 4 != 0 || in.inputs.empty() ||
        in.outputs.size() != in.inputs.size() / 4 * 3)
      return errorAt(p, "optimizer_update needs inputs (param, grad, exp_avg, "
                        "exp_avg_sq) per parameter and outputs (param, "
                        "exp_avg, exp_avg_sq)");
    for (size_t k = 0; k < in.inputs.size() / 4; ++k) {
      const Buffer &param = buffer(in.inputs[4 * k]);
      std::string ip = childPointer(childPointer(p, "inputs"), 4 * k);
      if (param.kind != BufferKind::ParamShard)
        return errorAt(ip, quote(param.id) + " is not a param_shard");
      for (int j = 1; j < 4; ++j) {
        const Buffer &other = buffer(in.inputs[4 * k + j]);
        if (other.localShape != param.localShape ||
            other.offset != param.offset)
          return errorAt(childPointer(childPointer(p, "inputs"), 4 * k + j),
                         quote(other.id) + " is not the same shard as " +
                             quote(param.id));
        if (other.dtype != DType::Float32)
          return errorAt(childPointer(childPointer(p, "inputs"), 4 * k + j),
                         quote(other.id) + " is not float32");
      }
      if (in.outputs[3 * k] != in.inputs[4 * k] ||
          in.outputs[3 * k + 1] != in.inputs[4 * k + 2] ||
          in.outputs[3 * k + 2] != in.inputs[4 * k + 3])
        return errorAt(childPointer(childPointer(p, "outputs"), 3 * k),
                       "optimizer_update updates in place: outputs must be "
                       "the param, exp_avg and exp_avg_sq inputs");
      if (plan.optimizer && plan.optimizer->stochasticRounding &&
          param.dtype != DType::BFloat16)
        return errorAt(ip, "stochastic rounding needs bfloat16 parameters, " +
                               quote(param.id) + " is " +
                               std::string(dtypeName(param.dtype)));
      if (!(plan.optimizer && plan.optimizer->stochasticRounding) &&
          param.dtype != DType::Float32)
        return errorAt(ip, "AdamW without stochastic rounding needs float32 "
                           "parameters, " +
                               quote(param.id) + " is " +
                               std::string(dtypeName(param.dtype)));
    }
    return {};
  }
  case OpKind::GradNorm:
  case OpKind::ClipGradients: {
    // grad_norm: inputs the float32 gradients this rank counts, output the
    // int64 norm buffer. clip_grad: inputs the reduced norm buffer, then
    // the gradients it scales in place (the outputs).
    if (!plan.optimizer || !plan.optimizer->maxNorm)
      return errorAt(p, opName + ", but the plan's optimizer has no max_norm");
    bool norm = in.op == OpKind::GradNorm;
    if (norm ? in.outputs.size() != 1 : in.inputs.empty())
      return errorAt(p, norm ? "grad_norm writes one norm buffer"
                             : "clip_grad reads the norm buffer first");
    const Buffer &acc = buffer(norm ? in.outputs[0] : in.inputs[0]);
    int64_t length = gradNormBufferLength(plan.optimizer->normType);
    if (acc.dtype != DType::Int64 || acc.localShape.size() != 1 ||
        acc.localShape[0] != length)
      return errorAt(
          childPointer(p, norm ? "outputs" : "inputs"),
          quote(acc.id) + " is not a norm buffer: norm_type " +
              std::string(gradNormTypeName(plan.optimizer->normType)) +
              " needs int64 [" + std::to_string(length) + "]");
    size_t first = norm ? 0 : 1;
    if (!norm && in.outputs.size() + 1 != in.inputs.size())
      return errorAt(p, "clip_grad scales in place: outputs must be the "
                        "inputs after the norm buffer");
    for (size_t k = first; k < in.inputs.size(); ++k) {
      const Buffer &g = buffer(in.inputs[k]);
      std::string ip = childPointer(childPointer(p, "inputs"), k);
      if (g.kind != BufferKind::Gradient || g.dtype != DType::Float32)
        return errorAt(ip, quote(g.id) + " is not a float32 gradient");
      if (!norm && in.outputs[k - 1] != g.id)
        return errorAt(childPointer(childPointer(p, "outputs"), k - 1),
                       "clip_grad scales in place: output " +
                           std::to_string(k - 1) + " must be input " +
                           std::to_string(k));
    }
    return {};
  }
  case OpKind::Fp8Cast: {
    // outputs[i] = float8(inputs[i] * scale of outputs[i]); the remaining
    // inputs are the amax buffers the scales read.
    if (in.outputs.empty() || in.inputs.size() < in.outputs.size())
      return errorAt(p, "fp8_cast needs one source input per output, then "
                        "the amax buffers");
    for (size_t k = 0; k < in.outputs.size(); ++k) {
      const Buffer &src = buffer(in.inputs[k]);
      const Buffer &dst = buffer(in.outputs[k]);
      if (!dst.scale)
        return errorAt(childPointer(childPointer(p, "outputs"), k),
                       quote(dst.id) + " is not a float8 buffer");
      if (src.localShape != dst.localShape)
        return errorAt(childPointer(childPointer(p, "inputs"), k),
                       quote(src.id) + " and " + quote(dst.id) +
                           " have different local shapes");
      if (std::find(in.inputs.begin(), in.inputs.end(), dst.scale->amax) ==
          in.inputs.end())
        return errorAt(childPointer(childPointer(p, "outputs"), k),
                       "the scale of " + quote(dst.id) + " reads " +
                           quote(dst.scale->amax) + ", which is not an input");
    }
    return {};
  }
  case OpKind::Accumulate: {
    // Per tensor: inputs (accumulator, addend), output the accumulator,
    // added into in place: the same shard, dtype and box.
    if (in.outputs.empty() || in.inputs.size() != 2 * in.outputs.size())
      return errorAt(p, "accumulate needs inputs (accumulator, addend) per "
                        "output");
    for (size_t k = 0; k < in.outputs.size(); ++k) {
      const Buffer &acc = buffer(in.inputs[2 * k]);
      const Buffer &add = buffer(in.inputs[2 * k + 1]);
      if (in.outputs[k] != acc.id)
        return errorAt(childPointer(childPointer(p, "outputs"), k),
                       "accumulate adds in place: output " + std::to_string(k) +
                           " must be input " + std::to_string(2 * k));
      if (add.localShape != acc.localShape || add.offset != acc.offset ||
          add.dtype != acc.dtype)
        return errorAt(childPointer(childPointer(p, "inputs"), 2 * k + 1),
                       quote(add.id) + " is not the same shard and dtype as " +
                           quote(acc.id));
      if (acc.dtype != DType::Float32 && acc.dtype != DType::BFloat16)
        return errorAt(childPointer(childPointer(p, "inputs"), 2 * k),
                       quote(acc.id) + " is " +
                           std::string(dtypeName(acc.dtype)) +
                           "; accumulate adds float32 or bfloat16");
    }
    return {};
  }
  case OpKind::Cast:
  case OpKind::Sum:
    if (in.inputs.size() != in.outputs.size())
      return errorAt(p, opName + " needs one input per output");
    return {};
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::AllReduce:
  case OpKind::AllToAll:
  case OpKind::Permute:
  case OpKind::Broadcast:
    if (in.inputs.size() != in.outputs.size())
      return errorAt(p, opName + " needs one input per output");
    return {};
  case OpKind::Send:
  case OpKind::Recv: {
    // One buffer, sent whole or received whole.
    bool send = in.op == OpKind::Send;
    const std::vector<std::string> &used = send ? in.inputs : in.outputs;
    const std::vector<std::string> &unused = send ? in.outputs : in.inputs;
    if (used.size() != 1 || !unused.empty())
      return errorAt(p, send ? "send needs one input and no outputs"
                             : "recv needs one output and no inputs");
    const Buffer &b = buffer(used[0]);
    std::string bp =
        childPointer(childPointer(p, send ? "inputs" : "outputs"), 0);
    if (b.dtype != *in.dtype)
      return errorAt(bp, quote(b.id) + " is " +
                             std::string(dtypeName(b.dtype)) + ", the " +
                             opName + " moves " +
                             std::string(dtypeName(*in.dtype)));
    int64_t elements = 1;
    for (int64_t d : b.localShape)
      elements *= d; // local within global, which checkShape bounded
    if (in.count != elements)
      return errorAt(childPointer(p, "count"),
                     "count " + std::to_string(in.count) + " is not the " +
                         std::to_string(elements) + " elements of " +
                         quote(b.id));
    return {};
  }
  default:
    return {};
  }
}

static std::string rankRange(const Mesh &mesh) {
  if (!mesh.hasDeviceOrder())
    return "ranks 0.." + std::to_string(mesh.size() - 1);
  return std::to_string(mesh.size()) + " ranks";
}

Result<void> validatePlan(const Plan &plan) {
  if (plan.version != kPlanVersion)
    return errorAt("/version",
                   "unsupported plan version " + std::to_string(plan.version));
  Result<Mesh> meshOr = Mesh::create(plan.mesh.axes, plan.mesh.deviceOrder);
  if (!meshOr)
    return errorAt("/mesh", meshOr.error().message);
  const Mesh &mesh = *meshOr;
  if (!mesh.contains(plan.rank))
    return errorAt("/rank", "rank " + std::to_string(plan.rank) +
                                " is not in the mesh (" + rankRange(mesh) +
                                ")");

  // Streams.
  std::unordered_set<std::string_view> streams;
  for (size_t i = 0; i < plan.streams.size(); ++i) {
    const std::string &s = plan.streams[i];
    if (s.empty())
      return errorAt(Path().child("streams").child(i), "stream name is empty");
    if (!streams.insert(s).second)
      return errorAt(Path().child("streams").child(i),
                     "duplicate stream " + quote(s));
  }

  // Communicators.
  // Pointers are Paths, built into strings only for an error.
  const Path top;
  const Path commsPath = top.child("communicators");
  std::unordered_map<std::string_view, size_t> comms;
  for (size_t i = 0; i < plan.communicators.size(); ++i) {
    const Communicator &c = plan.communicators[i];
    Path p = commsPath.child(i);
    if (c.id.empty())
      return errorAt(childPointer(p, "id"), "communicator id is empty");
    auto [it, fresh] = comms.emplace(c.id, i);
    if (!fresh)
      return errorAt(childPointer(p, "id"),
                     "duplicate communicator id " + quote(c.id) + " (also " +
                         childPointer("/communicators", it->second) + ")");
    if (c.ranks.empty())
      return errorAt(childPointer(p, "ranks"), "communicator has no ranks");
    std::unordered_set<int64_t> seen;
    std::optional<size_t> self;
    for (size_t k = 0; k < c.ranks.size(); ++k) {
      int64_t r = c.ranks[k];
      if (!mesh.contains(r))
        return errorAt(childPointer(childPointer(p, "ranks"), k),
                       "rank " + std::to_string(r) + " is not in the mesh (" +
                           rankRange(mesh) + ")");
      if (!seen.insert(r).second)
        return errorAt(childPointer(childPointer(p, "ranks"), k),
                       "rank " + std::to_string(r) + " is listed twice");
      if (r == plan.rank)
        self = k;
    }
    if (!self)
      return errorAt(childPointer(p, "ranks"),
                     "this plan's rank " + std::to_string(plan.rank) +
                         " is not a member of communicator " + quote(c.id));
    if (c.key != static_cast<int64_t>(*self))
      return errorAt(childPointer(p, "key"),
                     "key " + std::to_string(c.key) + " but rank " +
                         std::to_string(plan.rank) + " is at index " +
                         std::to_string(*self) + " of ranks");
    if (!c.axes.empty()) {
      Result<DerivedGroup> g = deriveGroup(mesh, c.axes, plan.rank);
      if (!g)
        return errorAt(childPointer(p, "axes"), g.error().message);
      if (g->ranks != c.ranks)
        return errorAt(
            childPointer(p, "ranks"),
            rankListText(c.ranks) + " but axes [" +
                [&] {
                  std::string s;
                  for (const std::string &a : c.axes)
                    s += (s.empty() ? "" : ",") + a;
                  return s;
                }() +
                "] give rank " + std::to_string(plan.rank) + " the group " +
                rankListText(g->ranks));
      if (g->color != c.color)
        return errorAt(childPointer(p, "color"),
                       "color " + std::to_string(c.color) +
                           " but the axes give color " +
                           std::to_string(g->color));
    }
  }

  // Buffers.
  auto sharedMesh = std::make_shared<const Mesh>(mesh);
  View root = View::root(sharedMesh);
  AxisNamespace names(sharedMesh);
  const Path buffersPath = top.child("buffers");
  IdIndex buffers;
  buffers.reserve(plan.buffers.size());
  std::unordered_map<int64_t, size_t> tensorIds;
  LayoutCache layouts;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const Buffer &b = plan.buffers[i];
    Path p = buffersPath.child(i);
    if (b.id.empty())
      return errorAt(childPointer(p, "id"), "buffer id is empty");
    auto [it, fresh] = buffers.emplace(b.id, i);
    if (!fresh)
      return errorAt(childPointer(p, "id"),
                     "duplicate buffer id " + quote(b.id) + " (also " +
                         childPointer("/buffers", it->second) + ")");
    if (Result<void> ok = checkShape(b.globalShape); !ok)
      return errorAt(childPointer(p, "global_shape"), ok.error().message);
    size_t rank = b.globalShape.size();
    if (b.localShape.size() != rank)
      return errorAt(childPointer(p, "local_shape"),
                     "has " + std::to_string(b.localShape.size()) +
                         " dims but global_shape has " + std::to_string(rank));
    if (b.offset.size() != rank)
      return errorAt(childPointer(p, "offset"),
                     "has " + std::to_string(b.offset.size()) +
                         " dims but global_shape has " + std::to_string(rank));
    for (size_t d = 0; d < rank; ++d)
      if (b.localShape[d] < 0 || b.offset[d] < 0 ||
          b.localShape[d] > b.globalShape[d] ||
          b.offset[d] > b.globalShape[d] - b.localShape[d])
        return errorAt(childPointer(p, "local_shape"),
                       "dim " + std::to_string(d) + ": [" +
                           std::to_string(b.offset[d]) + ", +" +
                           std::to_string(b.localShape[d]) +
                           ") does not fit in the global size " +
                           std::to_string(b.globalShape[d]));
    MESHPLAN_TRY(checkBufferLayout(root, names, layouts, plan.rank, b, p));
    if (b.kind == BufferKind::ParamShard) {
      if (!b.tensorId)
        return errorAt(p, "a param_shard needs \"tensor_id\"");
      auto [other, fresh] = tensorIds.emplace(*b.tensorId, i);
      if (!fresh)
        return errorAt(childPointer(p, "tensor_id"),
                       "tensor_id " + std::to_string(*b.tensorId) +
                           " is also " +
                           childPointer("/buffers", other->second));
    } else if (b.tensorId) {
      return errorAt(childPointer(p, "tensor_id"),
                     "only a param_shard has a tensor_id");
    }
    bool float8 = b.dtype == DType::Float8E4M3 || b.dtype == DType::Float8E5M2;
    if (float8 && !b.scale)
      return errorAt(p, "a float8 buffer needs \"scale\"");
    if (!float8 && b.scale)
      return errorAt(childPointer(p, "scale"),
                     "only a float8 buffer has a scale");
  }
  // Scales name an amax buffer: float32, with the element they index.
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const Buffer &b = plan.buffers[i];
    if (!b.scale)
      continue;
    Path bp = buffersPath.child(i);
    Path p = bp.child("scale");
    auto it = buffers.find(b.scale->amax);
    if (it == buffers.end())
      return errorAt(childPointer(p, "amax"),
                     "unknown buffer " + quote(b.scale->amax));
    const Buffer &amax = plan.buffers[it->second];
    int64_t n = 1;
    for (int64_t d : amax.localShape)
      n *= d;
    if (amax.dtype != DType::Float32 || amax.localShape.size() != 1)
      return errorAt(childPointer(p, "amax"),
                     quote(amax.id) + " is not a 1-D float32 buffer");
    if (b.scale->index < 0 || b.scale->index >= n)
      return errorAt(childPointer(p, "index"),
                     "index " + std::to_string(b.scale->index) + " but " +
                         quote(amax.id) + " has " + std::to_string(n) +
                         " elements");
  }

  // Program.
  const Path programPath = top.child("program");
  IdIndex ids;
  ids.reserve(plan.program.size());
  for (size_t i = 0; i < plan.program.size(); ++i) {
    const std::string &id = plan.program[i].id;
    Path p = programPath.child(i);
    if (id.empty())
      return errorAt(childPointer(p, "id"), "instruction id is empty");
    auto [it, fresh] = ids.emplace(id, i);
    if (!fresh)
      return errorAt(childPointer(p, "id"),
                     "duplicate instruction id " + quote(id) + " (also " +
                         childPointer("/program", it->second) + ")");
  }
  for (size_t i = 0; i < plan.program.size(); ++i) {
    const Instruction &in = plan.program[i];
    Path p = programPath.child(i);
    if (!streams.count(in.stream)) {
      std::string all;
      for (const std::string &s : plan.streams)
        all += (all.empty() ? "" : ", ") + s;
      return errorAt(childPointer(p, "stream"), "unknown stream " +
                                                    quote(in.stream) +
                                                    " (streams: " + all + ")");
    }
    std::string opName(opKindName(in.op));
    if (isCollective(in.op)) {
      auto c = comms.find(in.comm);
      if (c == comms.end())
        return errorAt(childPointer(p, "comm"),
                       "unknown communicator " + quote(in.comm));
      if (!in.dtype)
        return errorAt(p, opName + " needs a dtype");
      if (in.count < 0 || in.count > kMaxTensorElements)
        return errorAt(childPointer(p, "count"), "count " +
                                                     std::to_string(in.count) +
                                                     " is out of range");
      if (isReduction(in.op) != in.reduce.has_value())
        return errorAt(childPointer(p, "reduce"),
                       in.reduce ? opName + " takes no reduce op"
                                 : opName + " needs a reduce op");
      int64_t size =
          static_cast<int64_t>(plan.communicators[c->second].ranks.size());
      if (in.op == OpKind::Broadcast && (in.root < 0 || in.root >= size))
        return errorAt(childPointer(p, "root"),
                       "root " + std::to_string(in.root) +
                           " is not a key of communicator " + quote(in.comm) +
                           " (size " + std::to_string(size) + ")");
      if (isPointToPoint(in.op)) {
        // Pairs only: then the k-th operation on the communicator is one
        // transfer for both members, which is what the verifier matches.
        const Communicator &comm = plan.communicators[c->second];
        if (size != 2)
          return errorAt(childPointer(p, "comm"),
                         opName +
                             " needs a communicator of two members (a "
                             "pair), " +
                             quote(in.comm) + " has " + std::to_string(size));
        if (in.peer != 1 - comm.key)
          return errorAt(childPointer(p, "peer"),
                         "peer " + std::to_string(in.peer) +
                             " is not the other member of " + quote(in.comm) +
                             " (this rank is key " + std::to_string(comm.key) +
                             ", so the peer is key " +
                             std::to_string(1 - comm.key) + ")");
      }
    } else {
      if (!in.comm.empty())
        return errorAt(childPointer(p, "comm"),
                       opName + " is not a collective and takes no comm");
      if (in.reduce)
        return errorAt(childPointer(p, "reduce"),
                       opName + " takes no reduce op");
    }
    auto checkBuffers = [&](const std::vector<std::string> &list,
                            std::string_view key) -> Result<void> {
      for (size_t k = 0; k < list.size(); ++k)
        if (!buffers.count(list[k]))
          return errorAt(childPointer(childPointer(p, key), k),
                         "unknown buffer " + quote(list[k]));
      return {};
    };
    MESHPLAN_TRY(checkBuffers(in.inputs, "inputs"));
    MESHPLAN_TRY(checkBuffers(in.outputs, "outputs"));
    // Before the operands: without an optimizer, the parameter dtype rule
    // (stochastic rounding or not) has nothing to go by.
    if (in.op == OpKind::OptimizerUpdate && !plan.optimizer)
      return errorAt(p, "optimizer_update, but the plan has no \"optimizer\"");
    MESHPLAN_TRY(checkOperands(plan, in, p, buffers));
    for (size_t k = 0; k < in.deps.size(); ++k) {
      auto d = ids.find(in.deps[k]);
      if (d == ids.end())
        return errorAt(childPointer(childPointer(p, "deps"), k),
                       "unknown instruction " + quote(in.deps[k]));
      if (d->second == i)
        return errorAt(childPointer(childPointer(p, "deps"), k),
                       "instruction " + quote(in.id) + " depends on itself");
    }
  }

  if (plan.optimizer) {
    const OptimizerConfig &o = *plan.optimizer;
    if (o.name != "adamw")
      return errorAt("/optimizer/name", "unknown optimizer " + quote(o.name) +
                                            " (this runtime has adamw)");
    auto bad = [](double x, double lo, double hi) {
      return !(x >= lo && x <= hi);
    };
    if (bad(o.lr, 0, 1e6))
      return errorAt("/optimizer/lr", "lr must be in [0, 1e6]");
    if (bad(o.beta1, 0, 1) || o.beta1 == 1)
      return errorAt("/optimizer/beta1", "beta1 must be in [0, 1)");
    if (bad(o.beta2, 0, 1) || o.beta2 == 1)
      return errorAt("/optimizer/beta2", "beta2 must be in [0, 1)");
    if (bad(o.eps, 0, 1e6) || o.eps == 0)
      return errorAt("/optimizer/eps", "eps must be in (0, 1e6]");
    if (bad(o.weightDecay, 0, 1e6))
      return errorAt("/optimizer/weight_decay",
                     "weight_decay must be in [0, 1e6]");
    if (o.schedule)
      if (auto ok = checkLrSchedule(*o.schedule); !ok)
        return ok.error().within("/optimizer/lr_schedule");
    if (o.maxNorm && (!(*o.maxNorm > 0) || !std::isfinite(*o.maxNorm)))
      return errorAt("/optimizer/max_norm", "max_norm must be finite and > 0");
    // The names of this plan's parameters: every no_decay entry is one.
    std::set<std::string_view> params;
    for (const Buffer &b : plan.buffers)
      if (b.kind == BufferKind::ParamShard)
        params.insert(b.tensor);
    for (size_t k = 0; k < o.noDecay.size(); ++k) {
      std::string p = childPointer("/optimizer/no_decay", k);
      if (k && !(o.noDecay[k - 1] < o.noDecay[k]))
        return errorAt(p, "no_decay must be sorted and unique");
      if (!plan.buffers.empty() && !params.count(o.noDecay[k]))
        return errorAt(p, quote(o.noDecay[k]) +
                              " is not a parameter of this plan");
    }
  }

  if (plan.estimates) {
    for (const auto &[key, n] : plan.estimates->peakMemoryBytes)
      if (n < 0)
        return errorAt(childPointer("/estimates/peak_memory_bytes", key),
                       "negative byte count");
    for (const auto &[key, n] : plan.estimates->bytesPerStepPerComm) {
      std::string p = childPointer("/estimates/bytes_per_step_per_comm", key);
      if (!comms.count(key))
        return errorAt(p, "unknown communicator " + quote(key));
      if (n < 0)
        return errorAt(p, "negative byte count");
    }
  }
  return {};
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
