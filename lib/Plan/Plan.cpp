//===- Plan.cpp - Plan reader, validator and writer -----------------------===//
//
// No exceptions: JSON is parsed through nlohmann's SAX interface (errors come
// back by callback), and every value's type is checked before it is read.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Plan/Plan.h"

#include "meshplan/Core/MeshView.h"
#include "meshplan/Core/Text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <sys/stat.h>
#include <unordered_map>
#include <unordered_set>

namespace meshplan::plan {

using Json = nlohmann::ordered_json;

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
static constexpr std::array<std::string_view, 12> kOpNames = {
    "all_gather", "reduce_scatter",   "all_reduce", "all_to_all",
    "permute",    "broadcast",        "fp8_amax",   "fp8_cast",
    "compute",    "optimizer_update", "free",       "wait"};

template <typename E, size_t N>
static std::optional<E> lookup(const std::array<std::string_view, N> &names,
                               std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == name)
      return static_cast<E>(i);
  return std::nullopt;
}

template <size_t N>
static std::string listNames(const std::array<std::string_view, N> &names) {
  std::string out;
  for (size_t i = 0; i < N; ++i)
    out += (i ? ", " : "") + std::string(names[i]);
  return out;
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

static std::string quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text.substr(0, 200)) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += '?';
      continue;
    }
    out += c;
  }
  if (text.size() > 200)
    out += "...";
  return out + "\"";
}

static std::string child(const std::string &ptr, std::string_view key) {
  std::string out = ptr + "/";
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}
static std::string child(const std::string &ptr, size_t index) {
  return ptr + "/" + std::to_string(index);
}
static Error errorAt(const std::string &ptr, const std::string &message) {
  return Error{(ptr.empty() ? std::string("/") : ptr) + ": " + message};
}
static std::string ints(const std::vector<int64_t> &v) {
  return "[" + joinInts(v) + "]";
}

//===----------------------------------------------------------------------===//
// JSON parsing without exceptions
//===----------------------------------------------------------------------===//

namespace {
/// Builds the DOM through nlohmann's own SAX DOM builder, additionally
/// rejecting duplicate keys and documents nested deeper than kMaxDepth, and
/// recording a syntax error instead of throwing it.
class Builder {
public:
  static constexpr int kMaxDepth = 32;
  explicit Builder(Json &root) : dom(root, /*allow_exceptions=*/false) {}

  bool null() { return dom.null(); }
  bool boolean(bool v) { return dom.boolean(v); }
  bool number_integer(Json::number_integer_t v) {
    return dom.number_integer(v);
  }
  bool number_unsigned(Json::number_unsigned_t v) {
    return dom.number_unsigned(v);
  }
  bool number_float(Json::number_float_t v, const std::string &s) {
    return dom.number_float(v, s);
  }
  bool string(std::string &v) { return dom.string(v); }
  bool binary(Json::binary_t &v) { return dom.binary(v); }
  bool start_object(std::size_t n) {
    if (!enter())
      return false;
    keys.emplace_back();
    return dom.start_object(n);
  }
  bool key(std::string &k) {
    if (!keys.back().insert(k).second) {
      message = "duplicate key " + quote(k);
      return false;
    }
    return dom.key(k);
  }
  bool end_object() {
    keys.pop_back();
    --depth;
    return dom.end_object();
  }
  bool start_array(std::size_t n) {
    if (!enter())
      return false;
    keys.emplace_back(); // placeholder keeps keys.back() per level
    return dom.start_array(n);
  }
  bool end_array() {
    keys.pop_back();
    --depth;
    return dom.end_array();
  }
  bool parse_error(std::size_t position, const std::string &,
                   const nlohmann::detail::exception &ex) {
    syntaxPosition = position;
    message = ex.what();
    size_t at = message.find("syntax error");
    if (at != std::string::npos)
      message = message.substr(at);
    isSyntax = true;
    return false;
  }

  std::string message;
  bool isSyntax = false;
  size_t syntaxPosition = 0;

private:
  bool enter() {
    if (++depth > kMaxDepth) {
      message = "nested deeper than " + std::to_string(kMaxDepth) + " levels";
      return false;
    }
    return true;
  }
  nlohmann::detail::json_sax_dom_parser<Json> dom;
  std::vector<std::set<std::string>> keys;
  int depth = 0;
};
} // namespace

static Result<Json> parseJson(std::string_view text) {
  Json root;
  Builder builder(root);
  bool ok = Json::sax_parse(text.begin(), text.end(), &builder,
                            Json::input_format_t::json, /*strict=*/true);
  if (ok)
    return root;
  if (!builder.isSyntax)
    return makeError(builder.message);
  size_t offending = builder.syntaxPosition > 0
                         ? std::min(builder.syntaxPosition - 1, text.size())
                         : 0;
  size_t line = 1, lineStart = 0;
  for (size_t i = 0; i < offending; ++i)
    if (text[i] == '\n') {
      ++line;
      lineStart = i + 1;
    }
  std::string message = builder.message;
  if (message.size() > 200)
    message = message.substr(0, 200) + "...";
  return makeError("line " + std::to_string(line) + ", column " +
                   std::to_string(offending - lineStart + 1) + ": " + message);
}

Result<std::string> readTextFile(const std::string &path) {
  constexpr long long kMaxFileBytes = 1LL << 30;
  struct stat info;
  if (::stat(path.c_str(), &info) != 0)
    return makeError("cannot read \"" + path + "\": " + std::strerror(errno));
  if (!S_ISREG(info.st_mode))
    return makeError("cannot read \"" + path + "\": not a regular file");
  if (info.st_size > kMaxFileBytes)
    return makeError("cannot read \"" + path + "\": larger than 1 GiB");
  std::FILE *file = std::fopen(path.c_str(), "rb");
  if (!file)
    return makeError("cannot read \"" + path + "\": " + std::strerror(errno));
  std::string text;
  text.resize(static_cast<size_t>(info.st_size));
  size_t n = text.empty() ? 0 : std::fread(text.data(), 1, text.size(), file);
  bool failed = std::ferror(file) || n != text.size();
  std::fclose(file);
  if (failed)
    return makeError("cannot read \"" + path + "\": read error");
  return text;
}

//===----------------------------------------------------------------------===//
// Typed access
//===----------------------------------------------------------------------===//

namespace {
std::string describe(const Json &v) {
  switch (v.type()) {
  case Json::value_t::null:
    return "null";
  case Json::value_t::boolean:
    return v.get<bool>() ? "true" : "false";
  case Json::value_t::string:
    return "string " + quote(v.get_ref<const std::string &>());
  case Json::value_t::number_integer:
  case Json::value_t::number_unsigned:
  case Json::value_t::number_float:
    return "number " + v.dump();
  case Json::value_t::array:
    return "an array";
  case Json::value_t::object:
    return "an object";
  default:
    return "a value";
  }
}

Error typeError(const std::string &ptr, const Json &v, std::string_view want) {
  return errorAt(ptr, "expected " + std::string(want) + ", got " + describe(v));
}

/// Checks that `v` is an object with only known keys and all required ones.
Result<void> checkObject(const Json &v, const std::string &ptr,
                         std::initializer_list<std::string_view> required,
                         std::initializer_list<std::string_view> optional) {
  if (!v.is_object())
    return typeError(ptr, v, "an object");
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string &k = it.key();
    bool known =
        std::find(required.begin(), required.end(), k) != required.end() ||
        std::find(optional.begin(), optional.end(), k) != optional.end();
    if (!known) {
      std::string all;
      for (std::string_view r : required)
        all += (all.empty() ? "" : ", ") + std::string(r);
      for (std::string_view o : optional)
        all += (all.empty() ? "" : ", ") + std::string(o);
      return errorAt(child(ptr, k),
                     "unknown key " + quote(k) + " (known keys: " + all + ")");
    }
  }
  for (std::string_view r : required)
    if (!v.contains(r))
      return errorAt(ptr, "missing required key " + quote(r));
  return {};
}

const Json *member(const Json &obj, std::string_view key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

Result<int64_t> readInt(const Json &v, const std::string &ptr, int64_t min = 0,
                        int64_t max = INT64_MAX) {
  int64_t x;
  if (v.is_number_integer())
    x = v.get<int64_t>();
  else if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      return errorAt(ptr, "integer " + v.dump() + " is out of range");
    x = static_cast<int64_t>(u);
  } else
    return typeError(ptr, v, "an integer");
  if (x < min || x > max)
    return errorAt(ptr, "integer " + std::to_string(x) + " is out of range [" +
                            std::to_string(min) + ", " +
                            (max == INT64_MAX ? std::string("2^63-1")
                                              : std::to_string(max)) +
                            "]");
  return x;
}

Result<std::string> readString(const Json &v, const std::string &ptr) {
  if (!v.is_string())
    return typeError(ptr, v, "a string");
  return v.get<std::string>();
}

Result<bool> readBool(const Json &v, const std::string &ptr) {
  if (!v.is_boolean())
    return typeError(ptr, v, "true or false");
  return v.get<bool>();
}

Result<std::vector<int64_t>> readIntArray(const Json &v, const std::string &ptr,
                                          int64_t min = 0) {
  if (!v.is_array())
    return typeError(ptr, v, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    Result<int64_t> x = readInt(v[i], child(ptr, i), min);
    if (!x)
      return x.error();
    out.push_back(*x);
  }
  return out;
}

Result<std::vector<std::string>> readStringArray(const Json &v,
                                                 const std::string &ptr) {
  if (!v.is_array())
    return typeError(ptr, v, "an array of strings");
  std::vector<std::string> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      return typeError(child(ptr, i), v[i], "a string");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

template <typename E, size_t N>
Result<E> readEnum(const Json &v, const std::string &ptr, std::string_view what,
                   const std::array<std::string_view, N> &names) {
  if (!v.is_string())
    return typeError(ptr, v, "a string");
  const std::string &s = v.get_ref<const std::string &>();
  if (std::optional<E> e = lookup<E>(names, s))
    return *e;
  return errorAt(ptr, "unknown " + std::string(what) + " " + quote(s) +
                          "; expected one of " + listNames(names));
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
  MESHPLAN_TRY(checkObject(v, ptr, {"axes"}, {"device_order", "managed"}));
  PlanMesh mesh;
  const Json &axes = v["axes"];
  std::string axesPtr = child(ptr, "axes");
  if (!axes.is_array())
    return typeError(axesPtr, axes, "an array of axes");
  for (size_t i = 0; i < axes.size(); ++i) {
    std::string p = child(axesPtr, i);
    MESHPLAN_TRY(checkObject(axes[i], p, {"name", "size"}, {}));
    MeshAxis axis;
    MP_ASSIGN(axis.name, readString(axes[i]["name"], child(p, "name")));
    MP_ASSIGN(axis.size, readInt(axes[i]["size"], child(p, "size"), 1));
    mesh.axes.push_back(std::move(axis));
  }
  if (const Json *order = member(v, "device_order")) {
    std::vector<int64_t> ids;
    MP_ASSIGN(ids, readIntArray(*order, child(ptr, "device_order")));
    mesh.deviceOrder = std::move(ids);
  }
  if (const Json *managed = member(v, "managed")) {
    std::vector<std::string> names;
    std::string p = child(ptr, "managed");
    MP_ASSIGN(names, readStringArray(*managed, p));
    for (size_t i = 0; i < names.size(); ++i) {
      auto it =
          std::find_if(mesh.axes.begin(), mesh.axes.end(),
                       [&](const MeshAxis &a) { return a.name == names[i]; });
      if (it == mesh.axes.end())
        return errorAt(child(p, i),
                       "axis " + quote(names[i]) + " is not in the mesh");
      if (it->managed)
        return errorAt(child(p, i),
                       "axis " + quote(names[i]) + " is listed twice");
      it->managed = true;
    }
  }
  return mesh;
}

Result<Communicator> readCommunicator(const Json &v, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(v, ptr, {"id", "ranks", "color", "key"},
                           {"axes", "view", "fault_tolerant"}));
  Communicator c;
  MP_ASSIGN(c.id, readString(v["id"], child(ptr, "id")));
  MP_ASSIGN(c.ranks, readIntArray(v["ranks"], child(ptr, "ranks")));
  MP_ASSIGN(c.color, readInt(v["color"], child(ptr, "color")));
  MP_ASSIGN(c.key, readInt(v["key"], child(ptr, "key")));
  if (const Json *axes = member(v, "axes"))
    MP_ASSIGN(c.axes, readStringArray(*axes, child(ptr, "axes")));
  if (const Json *view = member(v, "view"); view && !view->is_null())
    MP_ASSIGN(c.view, readString(*view, child(ptr, "view")));
  if (const Json *ft = member(v, "fault_tolerant"))
    MP_ASSIGN(c.faultTolerant, readBool(*ft, child(ptr, "fault_tolerant")));
  return c;
}

Result<Buffer> readBuffer(const Json &v, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(
      v, ptr, {"id", "kind", "dtype", "global_shape", "local_shape", "offset"},
      {}));
  Buffer b;
  MP_ASSIGN(b.id, readString(v["id"], child(ptr, "id")));
  MP_ASSIGN(b.kind, (readEnum<BufferKind>(v["kind"], child(ptr, "kind"),
                                          "buffer kind", kBufferKindNames)));
  MP_ASSIGN(b.dtype, (readEnum<DType>(v["dtype"], child(ptr, "dtype"), "dtype",
                                      kDTypeNames)));
  MP_ASSIGN(b.globalShape,
            readIntArray(v["global_shape"], child(ptr, "global_shape")));
  MP_ASSIGN(b.localShape,
            readIntArray(v["local_shape"], child(ptr, "local_shape")));
  MP_ASSIGN(b.offset, readIntArray(v["offset"], child(ptr, "offset")));
  return b;
}

Result<Instruction> readInstruction(const Json &v, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(v, ptr, {"id", "stream", "op"},
                           {"comm", "dtype", "count", "reduce", "root",
                            "inputs", "outputs", "deps", "label"}));
  Instruction in;
  MP_ASSIGN(in.id, readString(v["id"], child(ptr, "id")));
  MP_ASSIGN(in.stream, readString(v["stream"], child(ptr, "stream")));
  MP_ASSIGN(in.op,
            (readEnum<OpKind>(v["op"], child(ptr, "op"), "op", kOpNames)));
  bool collective = isCollective(in.op);
  std::string opName(opKindName(in.op));
  if (const Json *comm = member(v, "comm")) {
    if (!collective)
      return errorAt(child(ptr, "comm"),
                     opName + " is not a collective and takes no comm");
    MP_ASSIGN(in.comm, readString(*comm, child(ptr, "comm")));
  } else if (collective)
    return errorAt(ptr, opName + " needs \"comm\"");
  if (const Json *dtype = member(v, "dtype")) {
    DType d;
    MP_ASSIGN(d, (readEnum<DType>(*dtype, child(ptr, "dtype"), "dtype",
                                  kDTypeNames)));
    in.dtype = d;
  } else if (collective)
    return errorAt(ptr, opName + " needs \"dtype\"");
  if (const Json *count = member(v, "count"))
    MP_ASSIGN(in.count,
              readInt(*count, child(ptr, "count"), 0, kMaxTensorElements));
  else if (collective)
    return errorAt(ptr, opName + " needs \"count\"");
  if (const Json *reduce = member(v, "reduce")) {
    std::string p = child(ptr, "reduce");
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
      return errorAt(child(ptr, "root"), "only broadcast takes a root");
    MP_ASSIGN(in.root, readInt(*root, child(ptr, "root")));
  } else if (in.op == OpKind::Broadcast)
    return errorAt(ptr, "broadcast needs \"root\"");
  if (const Json *x = member(v, "inputs"))
    MP_ASSIGN(in.inputs, readStringArray(*x, child(ptr, "inputs")));
  if (const Json *x = member(v, "outputs"))
    MP_ASSIGN(in.outputs, readStringArray(*x, child(ptr, "outputs")));
  if (const Json *x = member(v, "deps"))
    MP_ASSIGN(in.deps, readStringArray(*x, child(ptr, "deps")));
  if (const Json *x = member(v, "label"))
    MP_ASSIGN(in.label, readString(*x, child(ptr, "label")));
  return in;
}

Result<std::map<std::string, int64_t>> readByteMap(const Json &v,
                                                   const std::string &ptr) {
  if (!v.is_object())
    return typeError(ptr, v, "an object");
  std::map<std::string, int64_t> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    int64_t n;
    MP_ASSIGN(n, readInt(it.value(), child(ptr, it.key())));
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
    Result<T> x = readOne(v[i], child(ptr, i));
    if (!x)
      return x.error();
    out.push_back(std::move(x.value()));
  }
  return out;
}
} // namespace

Result<Plan> parsePlan(std::string_view text) {
  Json doc;
  MP_ASSIGN(doc, parseJson(text));
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
  MESHPLAN_TRY(checkObject(doc, "",
                           {"format", "version", "mesh", "rank",
                            "communicators", "buffers", "streams", "program"},
                           {"estimates"}));
  Plan plan;
  plan.version = kPlanVersion;
  MP_ASSIGN(plan.mesh, readMesh(doc["mesh"], "/mesh"));
  MP_ASSIGN(plan.rank, readInt(doc["rank"], "/rank"));
  MP_ASSIGN(plan.communicators,
            readArray<Communicator>(doc["communicators"], "/communicators",
                                    "communicators", readCommunicator));
  MP_ASSIGN(plan.buffers, readArray<Buffer>(doc["buffers"], "/buffers",
                                            "buffers", readBuffer));
  MP_ASSIGN(plan.streams, readStringArray(doc["streams"], "/streams"));
  MP_ASSIGN(plan.program,
            readArray<Instruction>(doc["program"], "/program", "instructions",
                                   readInstruction));
  if (const Json *est = member(doc, "estimates")) {
    MESHPLAN_TRY(checkObject(*est, "/estimates", {},
                             {"peak_memory_bytes", "bytes_per_step_per_comm"}));
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
      return errorAt(child("/streams", i), "stream name is empty");
    if (!streams.insert(s).second)
      return errorAt(child("/streams", i), "duplicate stream " + quote(s));
  }

  // Communicators.
  std::unordered_map<std::string_view, size_t> comms;
  for (size_t i = 0; i < plan.communicators.size(); ++i) {
    const Communicator &c = plan.communicators[i];
    std::string p = child("/communicators", i);
    if (c.id.empty())
      return errorAt(child(p, "id"), "communicator id is empty");
    auto [it, fresh] = comms.emplace(c.id, i);
    if (!fresh)
      return errorAt(child(p, "id"),
                     "duplicate communicator id " + quote(c.id) + " (also " +
                         child("/communicators", it->second) + ")");
    if (c.ranks.empty())
      return errorAt(child(p, "ranks"), "communicator has no ranks");
    std::unordered_set<int64_t> seen;
    std::optional<size_t> self;
    for (size_t k = 0; k < c.ranks.size(); ++k) {
      int64_t r = c.ranks[k];
      if (!mesh.contains(r))
        return errorAt(child(child(p, "ranks"), k),
                       "rank " + std::to_string(r) + " is not in the mesh (" +
                           rankRange(mesh) + ")");
      if (!seen.insert(r).second)
        return errorAt(child(child(p, "ranks"), k),
                       "rank " + std::to_string(r) + " is listed twice");
      if (r == plan.rank)
        self = k;
    }
    if (!self)
      return errorAt(child(p, "ranks"),
                     "this plan's rank " + std::to_string(plan.rank) +
                         " is not a member of communicator " + quote(c.id));
    if (c.key != static_cast<int64_t>(*self))
      return errorAt(child(p, "key"),
                     "key " + std::to_string(c.key) + " but rank " +
                         std::to_string(plan.rank) + " is at index " +
                         std::to_string(*self) + " of ranks");
    if (!c.axes.empty()) {
      Result<DerivedGroup> g = deriveGroup(mesh, c.axes, plan.rank);
      if (!g)
        return errorAt(child(p, "axes"), g.error().message);
      if (g->ranks != c.ranks)
        return errorAt(
            child(p, "ranks"), ints(c.ranks) + " but axes [" +
                                   [&] {
                                     std::string s;
                                     for (const std::string &a : c.axes)
                                       s += (s.empty() ? "" : ",") + a;
                                     return s;
                                   }() +
                                   "] give rank " + std::to_string(plan.rank) +
                                   " the group " + ints(g->ranks));
      if (g->color != c.color)
        return errorAt(child(p, "color"), "color " + std::to_string(c.color) +
                                              " but the axes give color " +
                                              std::to_string(g->color));
    }
  }

  // Buffers.
  std::unordered_map<std::string_view, size_t> buffers;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const Buffer &b = plan.buffers[i];
    std::string p = child("/buffers", i);
    if (b.id.empty())
      return errorAt(child(p, "id"), "buffer id is empty");
    auto [it, fresh] = buffers.emplace(b.id, i);
    if (!fresh)
      return errorAt(child(p, "id"), "duplicate buffer id " + quote(b.id) +
                                         " (also " +
                                         child("/buffers", it->second) + ")");
    if (Result<void> ok = checkShape(b.globalShape); !ok)
      return errorAt(child(p, "global_shape"), ok.error().message);
    size_t rank = b.globalShape.size();
    if (b.localShape.size() != rank)
      return errorAt(child(p, "local_shape"),
                     "has " + std::to_string(b.localShape.size()) +
                         " dims but global_shape has " + std::to_string(rank));
    if (b.offset.size() != rank)
      return errorAt(child(p, "offset"),
                     "has " + std::to_string(b.offset.size()) +
                         " dims but global_shape has " + std::to_string(rank));
    for (size_t d = 0; d < rank; ++d)
      if (b.localShape[d] < 0 || b.offset[d] < 0 ||
          b.localShape[d] > b.globalShape[d] ||
          b.offset[d] > b.globalShape[d] - b.localShape[d])
        return errorAt(child(p, "local_shape"),
                       "dim " + std::to_string(d) + ": [" +
                           std::to_string(b.offset[d]) + ", +" +
                           std::to_string(b.localShape[d]) +
                           ") does not fit in the global size " +
                           std::to_string(b.globalShape[d]));
  }

  // Program.
  std::unordered_map<std::string_view, size_t> ids;
  ids.reserve(plan.program.size());
  for (size_t i = 0; i < plan.program.size(); ++i) {
    const std::string &id = plan.program[i].id;
    std::string p = child("/program", i);
    if (id.empty())
      return errorAt(child(p, "id"), "instruction id is empty");
    auto [it, fresh] = ids.emplace(id, i);
    if (!fresh)
      return errorAt(child(p, "id"), "duplicate instruction id " + quote(id) +
                                         " (also " +
                                         child("/program", it->second) + ")");
  }
  for (size_t i = 0; i < plan.program.size(); ++i) {
    const Instruction &in = plan.program[i];
    std::string p = child("/program", i);
    if (!streams.count(in.stream)) {
      std::string all;
      for (const std::string &s : plan.streams)
        all += (all.empty() ? "" : ", ") + s;
      return errorAt(child(p, "stream"), "unknown stream " + quote(in.stream) +
                                             " (streams: " + all + ")");
    }
    std::string opName(opKindName(in.op));
    if (isCollective(in.op)) {
      auto c = comms.find(in.comm);
      if (c == comms.end())
        return errorAt(child(p, "comm"),
                       "unknown communicator " + quote(in.comm));
      if (!in.dtype)
        return errorAt(p, opName + " needs a dtype");
      if (in.count < 0 || in.count > kMaxTensorElements)
        return errorAt(child(p, "count"), "count " + std::to_string(in.count) +
                                              " is out of range");
      if (isReduction(in.op) != in.reduce.has_value())
        return errorAt(child(p, "reduce"), in.reduce
                                               ? opName + " takes no reduce op"
                                               : opName + " needs a reduce op");
      int64_t size =
          static_cast<int64_t>(plan.communicators[c->second].ranks.size());
      if (in.op == OpKind::Broadcast && (in.root < 0 || in.root >= size))
        return errorAt(child(p, "root"), "root " + std::to_string(in.root) +
                                             " is not a key of communicator " +
                                             quote(in.comm) + " (size " +
                                             std::to_string(size) + ")");
    } else {
      if (!in.comm.empty())
        return errorAt(child(p, "comm"),
                       opName + " is not a collective and takes no comm");
      if (in.reduce)
        return errorAt(child(p, "reduce"), opName + " takes no reduce op");
    }
    auto checkBuffers = [&](const std::vector<std::string> &list,
                            std::string_view key) -> Result<void> {
      for (size_t k = 0; k < list.size(); ++k)
        if (!buffers.count(list[k]))
          return errorAt(child(child(p, key), k),
                         "unknown buffer " + quote(list[k]));
      return {};
    };
    MESHPLAN_TRY(checkBuffers(in.inputs, "inputs"));
    MESHPLAN_TRY(checkBuffers(in.outputs, "outputs"));
    for (size_t k = 0; k < in.deps.size(); ++k) {
      auto d = ids.find(in.deps[k]);
      if (d == ids.end())
        return errorAt(child(child(p, "deps"), k),
                       "unknown instruction " + quote(in.deps[k]));
      if (d->second == i)
        return errorAt(child(child(p, "deps"), k),
                       "instruction " + quote(in.id) + " depends on itself");
    }
  }

  if (plan.estimates) {
    for (const auto &[key, n] : plan.estimates->peakMemoryBytes)
      if (n < 0)
        return errorAt(child("/estimates/peak_memory_bytes", key),
                       "negative byte count");
    for (const auto &[key, n] : plan.estimates->bytesPerStepPerComm) {
      std::string p = child("/estimates/bytes_per_step_per_comm", key);
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
