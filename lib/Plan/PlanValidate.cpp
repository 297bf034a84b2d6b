//===- PlanValidate.cpp - What a plan means, checked ----------------------===//
//
// validatePlan (Plan.h): the semantics of one rank's plan once read (mesh,
// communicators and their groups, buffers and layouts, every
// instruction's operands), and parseAxisRefText. Reading and writing plans
// is Plan.cpp.
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
  MESHPLAN_ASSIGN(g.ranks, groupOf(mesh, refs, rank, live));
  SplitKey split;
  MESHPLAN_ASSIGN(split, splitKeyOf(mesh, refs, rank, live));
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

namespace {

/// One validatePlan, section by section in the plan's order: each step
/// checks one section and keeps what later ones look up (the mesh, the
/// stream names, the communicator, buffer and instruction ids).
class PlanValidator {
public:
  /// With `operandBuffers`, checkProgram records what it resolves (see
  /// parsePlanInto).
  PlanValidator(const Plan &plan, std::vector<int32_t> *operandBuffers)
      : plan(plan), operandBuffers(operandBuffers) {}

  /// The version, the mesh and this plan's rank in it.
  Result<void> checkHeader();
  Result<void> checkStreams();
  Result<void> checkCommunicators();
  Result<void> checkBuffers();
  /// Scales name an amax buffer: float32, with the element they index.
  Result<void> checkScales() const;
  Result<void> checkProgram();
  Result<void> checkOptimizer() const;
  Result<void> checkEstimates() const;

private:
  Result<void> checkCommunicator(size_t i, const Path &p) const;
  Result<void> checkBuffer(size_t i, const Path &p, const View &root,
                           AxisNamespace &names, LayoutCache &layouts,
                           std::unordered_map<int64_t, size_t> &tensorIds);
  /// An instruction's communicator, dtype, count, reduce op, root and peer
  /// (or their absence, for a local one).
  Result<void> checkCollectiveFields(const Instruction &in,
                                     const Path &p) const;
  Result<void> checkInstruction(size_t i, const Path &p) const;

  const Plan &plan;
  std::vector<int32_t> *operandBuffers;
  std::shared_ptr<const Mesh> mesh;
  std::unordered_set<std::string_view> streams;
  std::unordered_map<std::string_view, size_t> comms;
  IdIndex buffers;
  IdIndex ids;
};

Result<void> PlanValidator::checkHeader() {
  if (plan.version != kPlanVersion)
    return errorAt("/version",
                   "unsupported plan version " + std::to_string(plan.version));
  Result<Mesh> meshOr = Mesh::create(plan.mesh.axes, plan.mesh.deviceOrder);
  if (!meshOr)
    return errorAt("/mesh", meshOr.error().message);
  mesh = std::make_shared<const Mesh>(std::move(meshOr).value());
  if (!mesh->contains(plan.rank))
    return errorAt("/rank", "rank " + std::to_string(plan.rank) +
                                " is not in the mesh (" + rankRange(*mesh) +
                                ")");
  return {};
}

Result<void> PlanValidator::checkStreams() {
  for (size_t i = 0; i < plan.streams.size(); ++i) {
    const std::string &s = plan.streams[i];
    if (s.empty())
      return errorAt(Path().child("streams").child(i), "stream name is empty");
    if (!streams.insert(s).second)
      return errorAt(Path().child("streams").child(i),
                     "duplicate stream " + quote(s));
  }
  return {};
}

Result<void> PlanValidator::checkCommunicators() {
  // Pointers are Paths, built into strings only for an error.
  const Path top;
  const Path commsPath = top.child("communicators");
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
    MESHPLAN_TRY(checkCommunicator(i, p));
  }
  return {};
}

/// Its ranks are distinct mesh ranks including this one at `key`, and the
/// group its axes (if any) give this rank.
Result<void> PlanValidator::checkCommunicator(size_t i, const Path &p) const {
  const Communicator &c = plan.communicators[i];
  if (c.ranks.empty())
    return errorAt(childPointer(p, "ranks"), "communicator has no ranks");
  std::unordered_set<int64_t> seen;
  std::optional<size_t> self;
  for (size_t k = 0; k < c.ranks.size(); ++k) {
    int64_t r = c.ranks[k];
    if (!mesh->contains(r))
      return errorAt(childPointer(childPointer(p, "ranks"), k),
                     "rank " + std::to_string(r) + " is not in the mesh (" +
                         rankRange(*mesh) + ")");
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
  if (c.axes.empty())
    return {};
  Result<DerivedGroup> g = deriveGroup(*mesh, c.axes, plan.rank);
  if (!g)
    return errorAt(childPointer(p, "axes"), g.error().message);
  if (g->ranks != c.ranks)
    return errorAt(
        childPointer(p, "ranks"), rankListText(c.ranks) + " but axes [" +
                                      [&] {
                                        std::string s;
                                        for (const std::string &a : c.axes)
                                          s += (s.empty() ? "" : ",") + a;
                                        return s;
                                      }() +
                                      "] give rank " +
                                      std::to_string(plan.rank) +
                                      " the group " + rankListText(g->ranks));
  if (g->color != c.color)
    return errorAt(childPointer(p, "color"),
                   "color " + std::to_string(c.color) +
                       " but the axes give color " + std::to_string(g->color));
  return {};
}

Result<void> PlanValidator::checkBuffers() {
  View root = View::root(mesh);
  AxisNamespace names(mesh);
  const Path top;
  const Path buffersPath = top.child("buffers");
  buffers.reserve(plan.buffers.size());
  std::unordered_map<int64_t, size_t> tensorIds;
  LayoutCache layouts;
  for (size_t i = 0; i < plan.buffers.size(); ++i)
    MESHPLAN_TRY(
        checkBuffer(i, buffersPath.child(i), root, names, layouts, tensorIds));
  return {};
}

/// Its id, shapes, box and layout, tensor id and scale.
Result<void>
PlanValidator::checkBuffer(size_t i, const Path &p, const View &root,
                           AxisNamespace &names, LayoutCache &layouts,
                           std::unordered_map<int64_t, size_t> &tensorIds) {
  const Buffer &b = plan.buffers[i];
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
                     "tensor_id " + std::to_string(*b.tensorId) + " is also " +
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
  return {};
}

Result<void> PlanValidator::checkScales() const {
  const Path top;
  const Path buffersPath = top.child("buffers");
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
  return {};
}

Result<void> PlanValidator::checkProgram() {
  const Path top;
  const Path programPath = top.child("program");
  // Ids first: deps may point forward.
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
  for (size_t i = 0; i < plan.program.size(); ++i)
    MESHPLAN_TRY(checkInstruction(i, programPath.child(i)));
  return {};
}

Result<void> PlanValidator::checkCollectiveFields(const Instruction &in,
                                                  const Path &p) const {
  std::string opName(opKindName(in.op));
  if (!isCollective(in.op)) {
    if (!in.comm.empty())
      return errorAt(childPointer(p, "comm"),
                     opName + " is not a collective and takes no comm");
    if (in.reduce)
      return errorAt(childPointer(p, "reduce"), opName + " takes no reduce op");
    return {};
  }
  auto c = comms.find(in.comm);
  if (c == comms.end())
    return errorAt(childPointer(p, "comm"),
                   "unknown communicator " + quote(in.comm));
  if (!in.dtype)
    return errorAt(p, opName + " needs a dtype");
  if (in.count < 0 || in.count > kMaxTensorElements)
    return errorAt(childPointer(p, "count"),
                   "count " + std::to_string(in.count) + " is out of range");
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
  return {};
}

Result<void> PlanValidator::checkInstruction(size_t i, const Path &p) const {
  const Instruction &in = plan.program[i];
  if (!streams.count(in.stream)) {
    std::string all;
    for (const std::string &s : plan.streams)
      all += (all.empty() ? "" : ", ") + s;
    return errorAt(childPointer(p, "stream"), "unknown stream " +
                                                  quote(in.stream) +
                                                  " (streams: " + all + ")");
  }
  MESHPLAN_TRY(checkCollectiveFields(in, p));
  auto checkBuffers = [&](const std::vector<std::string> &list,
                          std::string_view key) -> Result<void> {
    for (size_t k = 0; k < list.size(); ++k) {
      const IdIndex::Entry *b = buffers.find(list[k]);
      if (!b)
        return errorAt(childPointer(childPointer(p, key), k),
                       "unknown buffer " + quote(list[k]));
      if (operandBuffers)
        operandBuffers->push_back(static_cast<int32_t>(b->second));
    }
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
  return {};
}

Result<void> PlanValidator::checkOptimizer() const {
  if (!plan.optimizer)
    return {};
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
      return errorAt(p,
                     quote(o.noDecay[k]) + " is not a parameter of this plan");
  }
  return {};
}

Result<void> PlanValidator::checkEstimates() const {
  if (!plan.estimates)
    return {};
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
  return {};
}

} // namespace

Result<void> validatePlan(const Plan &plan) {
  return validatePlan(plan, nullptr);
}

Result<void> validatePlan(const Plan &plan,
                          std::vector<int32_t> *operandBuffers) {
  if (operandBuffers)
    operandBuffers->clear();
  PlanValidator v(plan, operandBuffers);
  MESHPLAN_TRY(v.checkHeader());
  MESHPLAN_TRY(v.checkStreams());
  MESHPLAN_TRY(v.checkCommunicators());
  MESHPLAN_TRY(v.checkBuffers());
  MESHPLAN_TRY(v.checkScales());
  MESHPLAN_TRY(v.checkProgram());
  MESHPLAN_TRY(v.checkOptimizer());
  MESHPLAN_TRY(v.checkEstimates());
  return {};
}

} // namespace meshplan::plan
