//===- Plan.cpp - Plan reader, validator and writer -----------------------===//
//
// No exceptions: JSON is parsed and read through meshplan/Support/Json.h
// (SAX parsing, errors by callback, every value's type checked before it is
// read).
//
//===----------------------------------------------------------------------===//

#include "meshplan/Plan/Plan.h"

#include "meshplan/Core/MeshView.h"
#include "meshplan/Core/Text.h"
#include "meshplan/Support/Json.h"

#include <algorithm>
#include <array>
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
static constexpr std::array<std::string_view, 15> kOpNames = {
    "all_gather", "reduce_scatter", "all_reduce",       "all_to_all", "permute",
    "broadcast",  "fp8_amax",       "fp8_cast",         "cast",       "sum",
    "accumulate", "compute",        "optimizer_update", "free",       "wait"};

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
bool isCollective(OpKind op) { return int(op) <= int(OpKind::Broadcast); }
bool isReduction(OpKind op) {
  return op == OpKind::ReduceScatter || op == OpKind::AllReduce;
}

bool PlanMesh::operator==(const PlanMesh &o) const {
  if (axes.size() != o.axes.size() || deviceOrder != o.deviceOrder)
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
Result<E> readEnumAs(const Json &v, const std::string &ptr,
                     std::string_view what,
                     const std::array<std::string_view, N> &names) {
  Result<int> index = readEnum(v, ptr, what, names);
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
//===----------------------------------------------------------------------===//

Result<PlanMesh> readMesh(const Json &v, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(v, ptr, kMeshRule));
  PlanMesh mesh;
  const Json &axes = v["axes"];
  std::string axesPtr = childPointer(ptr, "axes");
  if (!axes.is_array())
    return typeError(axesPtr, axes, "an array of axes");
  for (size_t i = 0; i < axes.size(); ++i) {
    std::string p = childPointer(axesPtr, i);
    MESHPLAN_TRY(checkObject(axes[i], p, kMeshAxisRule));
    MeshAxis axis;
    MP_ASSIGN(axis.name, readString(axes[i]["name"], childPointer(p, "name")));
    MP_ASSIGN(axis.size, readInt(axes[i]["size"], childPointer(p, "size"), 1));
    mesh.axes.push_back(std::move(axis));
  }
  if (const Json *order = member(v, "device_order")) {
    std::vector<int64_t> ids;
    MP_ASSIGN(ids, readIntArray(*order, childPointer(ptr, "device_order"), 0));
    mesh.deviceOrder = std::move(ids);
  }
  if (const Json *managed = member(v, "managed")) {
    std::vector<std::string> names;
    std::string p = childPointer(ptr, "managed");
    MP_ASSIGN(names, readStringArray(*managed, p));
    for (size_t i = 0; i < names.size(); ++i) {
      auto it =
          std::find_if(mesh.axes.begin(), mesh.axes.end(),
                       [&](const MeshAxis &a) { return a.name == names[i]; });
      if (it == mesh.axes.end())
        return errorAt(childPointer(p, i),
                       "axis " + quote(names[i]) + " is not in the mesh");
      if (it->managed)
        return errorAt(childPointer(p, i),
                       "axis " + quote(names[i]) + " is listed twice");
      it->managed = true;
    }
  }
  return mesh;
}

Result<Communicator> readCommunicator(const Json &v, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(v, ptr, kCommunicatorRule));
  Communicator c;
  MP_ASSIGN(c.id, readString(v["id"], childPointer(ptr, "id")));
  // A listed group is bounded like every other (docs/limits.md).
  if (v["ranks"].is_array() &&
      static_cast<int64_t>(v["ranks"].size()) > kMaxGroupMembers)
    return errorAt(childPointer(ptr, "ranks"),
                   "lists " + std::to_string(v["ranks"].size()) +
                       " members; groups that are listed member by member "
                       "have at most " +
                       kMaxGroupMembersText + " (docs/limits.md)");
  MP_ASSIGN(c.ranks, readIntArray(v["ranks"], childPointer(ptr, "ranks"), 0));
  MP_ASSIGN(c.color, readInt(v["color"], childPointer(ptr, "color"), 0));
  MP_ASSIGN(c.key, readInt(v["key"], childPointer(ptr, "key"), 0));
  if (const Json *axes = member(v, "axes"))
    MP_ASSIGN(c.axes, readStringArray(*axes, childPointer(ptr, "axes")));
  if (const Json *view = member(v, "view"); view && !view->is_null())
    MP_ASSIGN(c.view, readString(*view, childPointer(ptr, "view")));
  if (const Json *ft = member(v, "fault_tolerant"))
    MP_ASSIGN(c.faultTolerant,
              readBool(*ft, childPointer(ptr, "fault_tolerant")));
  return c;
}

Result<Buffer> readBuffer(const Json &v, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(v, ptr, kBufferRule));
  Buffer b;
  MP_ASSIGN(b.id, readString(v["id"], childPointer(ptr, "id")));
  MP_ASSIGN(b.kind,
            (readEnumAs<BufferKind>(v["kind"], childPointer(ptr, "kind"),
                                    "buffer kind", kBufferKindNames)));
  MP_ASSIGN(b.dtype, (readEnumAs<DType>(v["dtype"], childPointer(ptr, "dtype"),
                                        "dtype", kDTypeNames)));
  MP_ASSIGN(b.globalShape, readIntArray(v["global_shape"],
                                        childPointer(ptr, "global_shape"), 0));
  MP_ASSIGN(b.localShape, readIntArray(v["local_shape"],
                                       childPointer(ptr, "local_shape"), 0));
  MP_ASSIGN(b.offset,
            readIntArray(v["offset"], childPointer(ptr, "offset"), 0));
  MP_ASSIGN(b.layout, readString(v["layout"], childPointer(ptr, "layout")));
  if (const Json *t = member(v, "tensor"))
    MP_ASSIGN(b.tensor, readString(*t, childPointer(ptr, "tensor")));
  if (const Json *id = member(v, "tensor_id")) {
    int64_t n;
    MP_ASSIGN(n, readInt(*id, childPointer(ptr, "tensor_id"), 0));
    b.tensorId = n;
  }
  if (const Json *scale = member(v, "scale")) {
    std::string p = childPointer(ptr, "scale");
    MESHPLAN_TRY(checkObject(*scale, p, kScaleRule));
    Fp8Scale f;
    MP_ASSIGN(f.amax, readString((*scale)["amax"], childPointer(p, "amax")));
    MP_ASSIGN(f.index, readInt((*scale)["index"], childPointer(p, "index"), 0));
    MP_ASSIGN(f.powerOf2,
              readBool((*scale)["power_of_2"], childPointer(p, "power_of_2")));
    b.scale = std::move(f);
  }
  return b;
}

Result<Instruction> readInstruction(const Json &v, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(v, ptr, kInstructionRule));
  Instruction in;
  MP_ASSIGN(in.id, readString(v["id"], childPointer(ptr, "id")));
  MP_ASSIGN(in.stream, readString(v["stream"], childPointer(ptr, "stream")));
  MP_ASSIGN(in.op, (readEnumAs<OpKind>(v["op"], childPointer(ptr, "op"), "op",
                                       kOpNames)));
  bool collective = isCollective(in.op);
  std::string opName(opKindName(in.op));
  if (const Json *comm = member(v, "comm")) {
    if (!collective)
      return errorAt(childPointer(ptr, "comm"),
                     opName + " is not a collective and takes no comm");
    MP_ASSIGN(in.comm, readString(*comm, childPointer(ptr, "comm")));
  } else if (collective)
    return errorAt(ptr, opName + " needs \"comm\"");
  if (const Json *dtype = member(v, "dtype")) {
    DType d;
    MP_ASSIGN(d, (readEnumAs<DType>(*dtype, childPointer(ptr, "dtype"), "dtype",
                                    kDTypeNames)));
    in.dtype = d;
  } else if (collective)
    return errorAt(ptr, opName + " needs \"dtype\"");
  if (const Json *count = member(v, "count"))
    MP_ASSIGN(in.count, readInt(*count, childPointer(ptr, "count"), 0,
                                kMaxTensorElements));
  else if (collective)
    return errorAt(ptr, opName + " needs \"count\"");
  if (const Json *reduce = member(v, "reduce")) {
    std::string p = childPointer(ptr, "reduce");
    if (!isReduction(in.op))
      return errorAt(p, opName + " takes no reduce op (only reduce_scatter "
                                 "and all_reduce do)");
    if (!reduce->is_string())
      return typeError(p, *reduce, "a string");
    Result<ReduceOp> op = parseReduceOp(reduce->get_ref<const std::string &>());
    if (!op)
      return errorAt(p, op.error().message);
    in.reduce = *op;
  } else if (isReduction(in.op))
    return errorAt(ptr, opName + " needs \"reduce\"");
  if (const Json *root = member(v, "root")) {
    if (in.op != OpKind::Broadcast)
      return errorAt(childPointer(ptr, "root"), "only broadcast takes a root");
    MP_ASSIGN(in.root, readInt(*root, childPointer(ptr, "root"), 0));
  } else if (in.op == OpKind::Broadcast)
    return errorAt(ptr, "broadcast needs \"root\"");
  if (const Json *x = member(v, "inputs"))
    MP_ASSIGN(in.inputs, readStringArray(*x, childPointer(ptr, "inputs")));
  if (const Json *x = member(v, "outputs"))
    MP_ASSIGN(in.outputs, readStringArray(*x, childPointer(ptr, "outputs")));
  if (const Json *x = member(v, "deps"))
    MP_ASSIGN(in.deps, readStringArray(*x, childPointer(ptr, "deps")));
  if (const Json *x = member(v, "label"))
    MP_ASSIGN(in.label, readString(*x, childPointer(ptr, "label")));
  // The callback a compute instruction calls; only compute has one.
  for (std::string_view key : {"phase", "unit", "microbatch"}) {
    const Json *x = member(v, key);
    if (x && in.op != OpKind::Compute)
      return errorAt(childPointer(ptr, key), opName + " takes no " +
                                                 std::string(key) +
                                                 " (only compute does)");
    if (!x && in.op == OpKind::Compute)
      return errorAt(ptr, "compute needs " + quote(key));
  }
  if (in.op == OpKind::Compute) {
    MP_ASSIGN(in.phase, readString(v["phase"], childPointer(ptr, "phase")));
    MP_ASSIGN(in.unit, readString(v["unit"], childPointer(ptr, "unit")));
    MP_ASSIGN(in.microbatch,
              readInt(v["microbatch"], childPointer(ptr, "microbatch"), 0));
  }
  return in;
}

Result<OptimizerConfig> readOptimizer(const Json &v, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(v, ptr, kOptimizerRule));
  OptimizerConfig o;
  MP_ASSIGN(o.name, readString(v["name"], childPointer(ptr, "name")));
  MP_ASSIGN(o.lr, readNumber(v["lr"], childPointer(ptr, "lr")));
  MP_ASSIGN(o.beta1, readNumber(v["beta1"], childPointer(ptr, "beta1")));
  MP_ASSIGN(o.beta2, readNumber(v["beta2"], childPointer(ptr, "beta2")));
  MP_ASSIGN(o.eps, readNumber(v["eps"], childPointer(ptr, "eps")));
  MP_ASSIGN(o.weightDecay,
            readNumber(v["weight_decay"], childPointer(ptr, "weight_decay")));
  MP_ASSIGN(o.stochasticRounding,
            readBool(v["stochastic_rounding"],
                     childPointer(ptr, "stochastic_rounding")));
  MP_ASSIGN(o.seed, readInt(v["seed"], childPointer(ptr, "seed"), 0));
  return o;
}

Result<std::map<std::string, int64_t>> readByteMap(const Json &v,
                                                   const std::string &ptr) {
  if (!v.is_object())
    return typeError(ptr, v, "an object");
  std::map<std::string, int64_t> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    int64_t n;
    MP_ASSIGN(n, readInt(it.value(), childPointer(ptr, it.key()), 0));
    out[it.key()] = n;
  }
  return out;
}

template <typename T, typename F>
Result<std::vector<T>> readArray(const Json &v, const std::string &ptr,
                                 std::string_view what, F readOne) {
  if (!v.is_array())
    return typeError(ptr, v, "an array of " + std::string(what));
  std::vector<T> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    Result<T> x = readOne(v[i], childPointer(ptr, i));
    if (!x)
      return x.error();
    out.push_back(std::move(x.value()));
  }
  return out;
}
} // namespace

Result<Plan> parsePlan(std::string_view text) {
  Json doc;
  MP_ASSIGN(doc, parseJson(text, kMaxPlanDepth));
  if (!doc.is_object())
    return typeError("", doc, "a plan object");
  // Format and version first, so a newer or foreign document is named as
  // such rather than by its first unknown key.
  const Json *format = member(doc, "format");
  if (!format)
    return errorAt("", "missing required key \"format\" (a meshplan plan "
                       "starts with \"format\": \"meshplan.plan\")");
  if (!format->is_string() ||
      format->get_ref<const std::string &>() != kPlanFormat)
    return errorAt("/format", "expected " + quote(kPlanFormat) + ", got " +
                                  describe(*format));
  const Json *version = member(doc, "version");
  if (!version)
    return errorAt("", "missing required key \"version\"");
  if (!version->is_number_integer() || version->get<int64_t>() != kPlanVersion)
    return errorAt("/version", "unsupported plan version " + version->dump() +
                                   "; this meshplan reads version " +
                                   std::to_string(kPlanVersion));
  MESHPLAN_TRY(checkObject(doc, "", kRootRule));
  Plan plan;
  plan.version = kPlanVersion;
  MP_ASSIGN(plan.mesh, readMesh(doc["mesh"], "/mesh"));
  MP_ASSIGN(plan.rank, readInt(doc["rank"], "/rank", 0));
  MP_ASSIGN(plan.communicators,
            readArray<Communicator>(doc["communicators"], "/communicators",
                                    "communicators", readCommunicator));
  MP_ASSIGN(plan.buffers, readArray<Buffer>(doc["buffers"], "/buffers",
                                            "buffers", readBuffer));
  MP_ASSIGN(plan.streams, readStringArray(doc["streams"], "/streams"));
  MP_ASSIGN(plan.program,
            readArray<Instruction>(doc["program"], "/program", "instructions",
                                   readInstruction));
  if (const Json *opt = member(doc, "optimizer")) {
    OptimizerConfig o;
    MP_ASSIGN(o, readOptimizer(*opt, "/optimizer"));
    plan.optimizer = std::move(o);
  }
  if (const Json *est = member(doc, "estimates")) {
    MESHPLAN_TRY(checkObject(*est, "/estimates", kEstimatesRule));
    Estimates e;
    if (const Json *m = member(*est, "peak_memory_bytes"))
      MP_ASSIGN(e.peakMemoryBytes,
                readByteMap(*m, "/estimates/peak_memory_bytes"));
    if (const Json *m = member(*est, "bytes_per_step_per_comm"))
      MP_ASSIGN(e.bytesPerStepPerComm,
                readByteMap(*m, "/estimates/bytes_per_step_per_comm"));
    plan.estimates = std::move(e);
  }
  MESHPLAN_TRY(validatePlan(plan));
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
                                 int64_t rank) {
  AxisRefList refs;
  for (size_t i = 0; i < axes.size(); ++i) {
    Result<AxisRef> ref = parseAxisRefText(mesh, axes[i]);
    if (!ref)
      return ref.error().within("/" + std::to_string(i));
    refs.push_back(*ref);
  }
  MESHPLAN_TRY(checkRefsCompatible(mesh, refs, "communicator axes"));
  DerivedGroup g;
  MP_ASSIGN(g.ranks, groupOf(mesh, refs, rank));
  SplitKey split;
  MP_ASSIGN(split, splitKeyOf(mesh, refs, rank));
  g.color = split.color;
  g.key = split.key;
  return g;
}

/// The buffer's layout parses over the root mesh and gives this rank exactly
/// the buffer's box.
static Result<void> checkBufferLayout(const View &root,
                                      const AxisNamespace &names, int64_t rank,
                                      const Buffer &b, const std::string &p) {
  std::string lp = childPointer(p, "layout");
  Result<Layout> layout = parseLayout(root, names, b.layout);
  if (!layout)
    return errorAt(lp, layout.error().message);
  if (layout->rank() != static_cast<int>(b.globalShape.size()))
    return errorAt(lp, "the layout has " + std::to_string(layout->rank()) +
                           " dims but global_shape has " +
                           std::to_string(b.globalShape.size()));
  Result<ShardBox> box = shardOf(root, *layout, b.globalShape, rank);
  if (!box)
    return errorAt(lp, box.error().message);
  if (box->offset != b.offset || box->localShape != b.localShape)
    return errorAt(lp, "gives rank " + std::to_string(rank) + " the box " +
                           ints(box->offset) + " + " + ints(box->localShape) +
                           ", but the buffer says " + ints(b.offset) + " + " +
                           ints(b.localShape));
  return {};
}

/// What an instruction's inputs and outputs must look like for its op to be
/// executable (the runtime relies on it).
static Result<void>
checkOperands(const Plan &plan, const Instruction &in, const std::string &p,
              const std::unordered_map<std::string_view, size_t> &buffers) {
  auto buffer = [&](const std::string &id) -> const Buffer & {
    return plan.buffers[buffers.at(id)];
  };
  std::string opName(opKindName(in.op));
  switch (in.op) {
  case OpKind::Compute:
    if (in.phase != "forward" && in.phase != "backward")
      return errorAt(childPointer(p, "phase"),
                     "phase must be \"forward\" or \"backward\", not " +
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
      return errorAt(childPointer("/streams", i), "stream name is empty");
    if (!streams.insert(s).second)
      return errorAt(childPointer("/streams", i),
                     "duplicate stream " + quote(s));
  }

  // Communicators.
  std::unordered_map<std::string_view, size_t> comms;
  for (size_t i = 0; i < plan.communicators.size(); ++i) {
    const Communicator &c = plan.communicators[i];
    std::string p = childPointer("/communicators", i);
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
  std::unordered_map<std::string_view, size_t> buffers;
  std::unordered_map<int64_t, size_t> tensorIds;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const Buffer &b = plan.buffers[i];
    std::string p = childPointer("/buffers", i);
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
    MESHPLAN_TRY(checkBufferLayout(root, names, plan.rank, b, p));
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
    std::string p = childPointer(childPointer("/buffers", i), "scale");
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
  std::unordered_map<std::string_view, size_t> ids;
  ids.reserve(plan.program.size());
  for (size_t i = 0; i < plan.program.size(); ++i) {
    const std::string &id = plan.program[i].id;
    std::string p = childPointer("/program", i);
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
    std::string p = childPointer("/program", i);
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
