//===- Template.cpp - Rank-independent program templates ------------------===//
//
// prepare() does every name lookup and parse once; instantiate() is the
// per-rank path: O(axes) core queries per communicator and buffer (plus the
// members of each group), one copy of the program, and an estimate sweep over
// precomputed buffer liveness events. No string lookups per instruction.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Plan/Template.h"

#include "meshplan/Plan/CostModel.h"
#include "meshplan/Support/Json.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <string_view>
#include <unordered_map>

namespace meshplan::plan {

using json::quote;

namespace {

constexpr size_t kNumBufferKinds = 6;

int64_t saturatingAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out))
    return std::numeric_limits<int64_t>::max();
  return out;
}

std::string itemName(std::string_view what, const std::string &id,
                     size_t index) {
  if (id.empty())
    return std::string(what) + " #" + std::to_string(index);
  return std::string(what) + " " + quote(id);
}

std::string joinStrings(const std::vector<std::string> &list) {
  std::string out;
  for (const std::string &s : list)
    out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// Checks a layout's refs are well-formed refs of this mesh before
/// verifyLayout (which assumes valid axis indices) sees them.
Result<void> checkLayoutRefs(const Mesh &mesh, const Layout &layout) {
  auto check = [&](const AxisRef &ref,
                   const std::string &where) -> Result<void> {
    if (ref.axis < 0 || ref.axis >= mesh.numAxes())
      return makeError(where + " uses axis index " + std::to_string(ref.axis) +
                       ", but the mesh has " + std::to_string(mesh.numAxes()) +
                       " axes (" + mesh.axisNameList() + ")");
    Result<AxisRef> ok = makeAxisRef(mesh, ref.axis, ref.pre, ref.size);
    if (!ok)
      return ok.error().within(where);
    return {};
  };
  for (int d = 0; d < layout.rank(); ++d)
    for (const AxisRefList &level : layout.dims[d])
      for (const AxisRef &ref : level)
        MESHPLAN_TRY(check(ref, "dim " + std::to_string(d)));
  for (const AxisRef &ref : layout.partial)
    MESHPLAN_TRY(check(ref, "partial"));
  return {};
}

} // namespace

/// PreparedTemplate::prepare in steps, in the template's order: each checks
/// one section, fills the PreparedTemplate's tables for it, and keeps the
/// name indexes later sections look up.
class TemplatePreparer {
public:
  explicit TemplatePreparer(PreparedTemplate &p) : p(p), tm(p.tmpl) {}

  Result<void> prepareMesh();
  Result<void> checkStreams();
  Result<void> prepareComms();
  /// grad_norm_axes and the pipeline axis.
  Result<void> prepareAxes();
  Result<void> prepareBuffers();
  /// Every instruction's fields and references, and the buffers' liveness.
  Result<void> prepareProgram();
  Result<void> prepareFlops();
  /// The estimates that do not depend on the rank: buffer kinds present,
  /// activation events, bytes per communicator.
  Result<void> prepareEstimates();

private:
  Result<void> prepareComm(size_t i);
  Result<void> checkInstructionFields(const Instruction &in,
                                      const std::string &name) const;
  /// Resolves the instruction's buffers and deps, and records the births
  /// and deaths it causes.
  Result<void> trackLiveness(size_t i, const std::string &name,
                             std::vector<char> &live);
  Result<void> prepareActivations();

  PreparedTemplate &p;
  const ProgramTemplate &tm;
  const Mesh *mesh = nullptr;
  std::unordered_map<std::string_view, size_t> streams, comms, buffers, ids;
  std::vector<int64_t> groupSize;
};

Result<void> TemplatePreparer::prepareMesh() {
  Result<Mesh> meshOr = Mesh::create(tm.mesh.axes, tm.mesh.deviceOrder);
  if (!meshOr)
    return meshOr.error().within("mesh");
  p.meshPtr = std::make_shared<const Mesh>(std::move(meshOr).value());
  p.root = View::root(p.meshPtr);
  mesh = p.meshPtr.get();
  return {};
}

Result<void> TemplatePreparer::checkStreams() {
  for (size_t i = 0; i < tm.streams.size(); ++i) {
    const std::string &s = tm.streams[i];
    if (s.empty())
      return makeError("stream #" + std::to_string(i) + ": name is empty");
    if (!streams.emplace(s, i).second)
      return makeError("stream " + quote(s) + ": listed twice");
  }
  return {};
}

Result<void> TemplatePreparer::prepareComms() {
  for (size_t i = 0; i < tm.comms.size(); ++i)
    MESHPLAN_TRY(prepareComm(i));
  return {};
}

/// A pair's axis and coordinates, or the parsed axes of a group.
Result<void> TemplatePreparer::prepareComm(size_t i) {
  const CommTemplate &c = tm.comms[i];
  std::string name = itemName("communicator", c.id, i);
  if (c.id.empty())
    return makeError(name + ": id is empty");
  if (auto [it, fresh] = comms.emplace(c.id, i); !fresh)
    return makeError(name + ": duplicate id (also communicator #" +
                     std::to_string(it->second) + ")");
  if (c.pair) {
    if (!c.axes.empty())
      return makeError(name + ": a pair has no axes");
    std::optional<int> axis = mesh->findAxis(c.pair->axis);
    if (!axis)
      return makeError(name + ": pair axis " + quote(c.pair->axis) +
                       " is not in the mesh (axes: " + mesh->axisNameList() +
                       ")");
    int64_t size = mesh->axis(*axis).size;
    const int64_t *k = c.pair->coords;
    if (k[0] == k[1] || k[0] < 0 || k[1] < 0 || k[0] >= size || k[1] >= size)
      return makeError(
          name + ": pair coordinates " + std::to_string(k[0]) + ", " +
          std::to_string(k[1]) + " are not two distinct coordinates of axis " +
          quote(c.pair->axis) + " (size " + std::to_string(size) + ")");
    groupSize.push_back(2);
    p.commRefs.emplace_back();
    p.pairAxis.push_back(*axis);
    return {};
  }
  if (c.axes.empty())
    return makeError(name + ": no axes (a template communicator is the "
                            "group of each rank along root-mesh axes)");
  p.pairAxis.push_back(-1);
  AxisRefList refs;
  for (const std::string &text : c.axes) {
    Result<AxisRef> ref = parseAxisRefText(*mesh, text);
    if (!ref)
      return ref.error().within(name);
    refs.push_back(*ref);
  }
  if (Result<void> ok = checkRefsCompatible(*mesh, refs, "communicator axes");
      !ok)
    return ok.error().within(name);
  groupSize.push_back(groupSizeOf(*mesh, refs));
  p.commRefs.push_back(std::move(refs));
  return {};
}

Result<void> TemplatePreparer::prepareAxes() {
  for (const std::string &text : tm.gradNormAxes) {
    Result<AxisRef> ref = parseAxisRefText(*mesh, text);
    if (!ref)
      return ref.error().within("grad_norm_axes");
    p.gradNormRefs.push_back(*ref);
  }
  if (tm.mesh.pipelineAxis) {
    p.pipelineAxis = mesh->findAxis(*tm.mesh.pipelineAxis);
    if (!p.pipelineAxis)
      return makeError("mesh: pipeline axis " + quote(*tm.mesh.pipelineAxis) +
                       " is not in the mesh (axes: " + mesh->axisNameList() +
                       ")");
  }
  return {};
}

Result<void> TemplatePreparer::prepareBuffers() {
  for (size_t i = 0; i < tm.buffers.size(); ++i) {
    const BufferTemplate &b = tm.buffers[i];
    std::string name = itemName("buffer", b.id, i);
    if (b.id.empty())
      return makeError(name + ": id is empty");
    if (auto [it, fresh] = buffers.emplace(b.id, i); !fresh)
      return makeError(name + ": duplicate id (also buffer #" +
                       std::to_string(it->second) + ")");
    if (Result<void> ok = checkShape(b.globalShape); !ok)
      return ok.error().within(name + ": global_shape");
    if (b.layout.rank() != static_cast<int>(b.globalShape.size()))
      return makeError(
          name + ": the layout has " + std::to_string(b.layout.rank()) +
          " dims but global_shape has " + std::to_string(b.globalShape.size()));
    if (Result<void> ok = checkLayoutRefs(*mesh, b.layout); !ok)
      return ok.error().within(name + ": layout");
    if (Result<void> ok = verifyLayout(*p.root, b.layout); !ok)
      return ok.error().within(name + ": layout");
    p.layoutTexts.push_back(formatLayout(*mesh, b.layout));
    p.bufferIndex.emplace(b.id, i);
  }
  return {};
}

Result<void> TemplatePreparer::prepareProgram() {
  // Ids first (deps may point forward).
  ids.reserve(tm.program.size());
  for (size_t i = 0; i < tm.program.size(); ++i) {
    const Instruction &in = tm.program[i];
    std::string name = itemName("instruction", in.id, i);
    if (in.id.empty())
      return makeError(name + ": id is empty");
    if (auto [it, fresh] = ids.emplace(in.id, i); !fresh)
      return makeError(name + ": duplicate id (also instruction #" +
                       std::to_string(it->second) + ")");
  }
  if (tm.program.size() > size_t(std::numeric_limits<int32_t>::max()) ||
      tm.buffers.size() > size_t(std::numeric_limits<int32_t>::max()))
    return makeError("the template is too large");

  std::vector<char> live(tm.buffers.size(), 0);
  for (size_t i = 0; i < tm.program.size(); ++i) {
    const Instruction &in = tm.program[i];
    std::string name = itemName("instruction", in.id, i);
    MESHPLAN_TRY(checkInstructionFields(in, name));
    MESHPLAN_TRY(trackLiveness(i, name, live));
  }
  return {};
}

/// Its stream, and the communicator, dtype, count, peer, tag, reduce op and
/// root its op needs (or their absence, for a local op).
Result<void>
TemplatePreparer::checkInstructionFields(const Instruction &in,
                                         const std::string &name) const {
  std::string opName(opKindName(in.op));
  if (!streams.count(in.stream))
    return makeError(name + ": unknown stream " + quote(in.stream) +
                     " (streams: " + joinStrings(tm.streams) + ")");
  if (isPointToPoint(in.op)) {
    // Only on a pair: every rank that shares the template sits at the
    // same pair coordinate, so the peer's key is the same for all.
    auto c = comms.find(in.comm);
    if (c == comms.end() || !tm.comms[c->second].pair)
      return makeError(name + ": " + opName +
                       " needs a pair communicator, not " + quote(in.comm));
    if (!in.dtype)
      return makeError(name + ": " + opName + " needs a dtype");
    if (in.count < 0 || in.count > kMaxTensorElements)
      return makeError(name + ": count " + std::to_string(in.count) +
                       " is out of range");
    if (in.peer != 0 && in.peer != 1)
      return makeError(name + ": peer " + std::to_string(in.peer) +
                       " is not a key of a pair (0 or 1)");
    if (in.tag.empty())
      return makeError(name + ": " + opName + " needs a tag");
  } else if (isCollective(in.op)) {
    auto c = comms.find(in.comm);
    if (c == comms.end())
      return makeError(name + ": unknown communicator " + quote(in.comm));
    if (!in.dtype)
      return makeError(name + ": " + opName + " needs a dtype");
    if (in.count < 0 || in.count > kMaxTensorElements)
      return makeError(name + ": count " + std::to_string(in.count) +
                       " is out of range");
    if (isReduction(in.op) != in.reduce.has_value())
      return makeError(
          name + ": " + opName +
          (in.reduce ? " takes no reduce op" : " needs a reduce op"));
    if (in.op == OpKind::Broadcast &&
        (in.root < 0 || in.root >= groupSize[c->second]))
      return makeError(name + ": root " + std::to_string(in.root) +
                       " is not a key of communicator " + quote(in.comm) +
                       " (size " + std::to_string(groupSize[c->second]) + ")");
  } else {
    if (!in.comm.empty())
      return makeError(name + ": " + opName +
                       " is not a collective and takes no comm");
    if (in.reduce)
      return makeError(name + ": " + opName + " takes no reduce op");
  }
  return {};
}

Result<void> TemplatePreparer::trackLiveness(size_t i, const std::string &name,
                                             std::vector<char> &live) {
  const Instruction &in = tm.program[i];
  auto resolve = [&](const std::vector<std::string> &list, std::string_view key,
                     std::vector<size_t> &out) -> Result<void> {
    for (const std::string &id : list) {
      auto b = buffers.find(id);
      if (b == buffers.end())
        return makeError(name + ": " + std::string(key) + ": unknown buffer " +
                         quote(id));
      out.push_back(b->second);
    }
    return {};
  };
  std::vector<size_t> inputs, outputs;
  MESHPLAN_TRY(resolve(in.inputs, "inputs", inputs));
  MESHPLAN_TRY(resolve(in.outputs, "outputs", outputs));
  for (const std::string &d : in.deps) {
    auto it = ids.find(d);
    if (it == ids.end())
      return makeError(name + ": deps: unknown instruction " + quote(d));
    if (it->second == i)
      return makeError(name + ": deps: depends on itself");
  }

  // Liveness: births (first mention, or mention after a free), then the
  // deaths of a free's live inputs.
  auto born = [&](size_t b) {
    if (tm.buffers[b].persistent || live[b])
      return;
    live[b] = 1;
    p.events.push_back({int32_t(i), int32_t(b), true});
  };
  if (in.op == OpKind::Free) {
    for (size_t b : inputs)
      if (tm.buffers[b].persistent)
        return makeError(name + ": frees " + quote(tm.buffers[b].id) +
                         ", a persistent buffer (live for the whole step)");
    for (size_t b : outputs)
      born(b);
    for (size_t b : inputs)
      if (live[b]) {
        live[b] = 0;
        p.events.push_back({int32_t(i), int32_t(b), false});
      }
  } else {
    for (size_t b : inputs)
      born(b);
    for (size_t b : outputs)
      born(b);
  }
  return {};
}

Result<void> TemplatePreparer::prepareFlops() {
  if (!tm.flops.empty() && tm.flops.size() != tm.program.size())
    return makeError("flops has " + std::to_string(tm.flops.size()) +
                     " entries but the program has " +
                     std::to_string(tm.program.size()) + " instructions");
  for (size_t i = 0; i < tm.flops.size(); ++i)
    if (!std::isfinite(tm.flops[i]) || tm.flops[i] < 0)
      return makeError(itemName("instruction", tm.program[i].id, i) +
                       ": flops " + std::to_string(tm.flops[i]) +
                       " is not a finite number >= 0");
  p.flopsOrZero =
      tm.flops.empty() ? std::vector<double>(tm.program.size(), 0) : tm.flops;
  return {};
}

Result<void> TemplatePreparer::prepareEstimates() {
  std::array<bool, kNumBufferKinds> present{};
  for (const BufferTemplate &b : tm.buffers)
    present[size_t(b.kind)] = true;
  for (size_t k = 0; k < kNumBufferKinds; ++k)
    if (present[k])
      p.kindsPresent.push_back(static_cast<BufferKind>(k));
  for (const CommTemplate &c : tm.comms)
    p.commBytes[c.id] = 0;
  MESHPLAN_TRY(prepareActivations());
  for (const Instruction &in : tm.program) {
    if (!isCollective(in.op))
      continue;
    int64_t &sum = p.commBytes[in.comm];
    sum = saturatingAdd(sum, bytesSent(in.op, *in.dtype, in.count,
                                       groupSize[comms.at(in.comm)]));
  }
  return {};
}

// Activations: a forward adds its unit's saved bytes for that microbatch, the
// matching backward releases them (only what a forward added, so a backward
// without its forward releases nothing). A zero-bubble split backward holds
// them until its weight part: backward_input takes the backward's transient
// bytes and releases nothing, backward_weight releases what the forward saved
// (the weight gradients need the layers' saved inputs), as ZB-H1's memory
// analysis has it.
Result<void> TemplatePreparer::prepareActivations() {
  for (const auto &[unit, a] : tm.activations)
    if (a.saved < 0 || a.forwardTransient < 0 || a.backwardTransient < 0)
      return makeError("activations of unit " + quote(unit) +
                       ": bytes must be >= 0");
  p.hasActivations = !tm.activations.empty();
  if (!p.hasActivations)
    return {};
  std::map<std::pair<std::string_view, int64_t>, int64_t> pending;
  for (size_t i = 0; i < tm.program.size(); ++i) {
    const Instruction &in = tm.program[i];
    if (in.op != OpKind::Compute)
      continue;
    auto a = tm.activations.find(in.unit);
    if (a == tm.activations.end())
      continue;
    const UnitActivation &u = a->second;
    if (in.phase == "forward") {
      int64_t &kept = pending[{in.unit, in.microbatch}];
      kept = saturatingAdd(kept, u.saved);
      p.activationEvents.push_back({int32_t(i),
                                    saturatingAdd(u.saved, u.forwardTransient),
                                    u.forwardTransient});
    } else if (in.phase == "backward_input") {
      p.activationEvents.push_back(
          {int32_t(i), u.backwardTransient, u.backwardTransient});
    } else if (in.phase == "backward" || in.phase == "backward_weight") {
      int64_t released = 0;
      if (auto it = pending.find({in.unit, in.microbatch});
          it != pending.end()) {
        released = it->second;
        pending.erase(it);
      }
      int64_t transient = in.phase == "backward" ? u.backwardTransient : 0;
      p.activationEvents.push_back(
          {int32_t(i), transient, saturatingAdd(transient, released)});
    }
  }
  return {};
}

Result<PreparedTemplate> PreparedTemplate::prepare(ProgramTemplate t) {
  PreparedTemplate p;
  p.tmpl = std::move(t);
  TemplatePreparer steps(p);
  MESHPLAN_TRY(steps.prepareMesh());
  MESHPLAN_TRY(steps.checkStreams());
  MESHPLAN_TRY(steps.prepareComms());
  MESHPLAN_TRY(steps.prepareAxes());
  MESHPLAN_TRY(steps.prepareBuffers());
  MESHPLAN_TRY(steps.prepareProgram());
  MESHPLAN_TRY(steps.prepareFlops());
  MESHPLAN_TRY(steps.prepareEstimates());
  return p;
}

std::vector<int64_t> PreparedTemplate::ranks() const {
  std::vector<int64_t> out(static_cast<size_t>(meshPtr->size()));
  for (int64_t pos = 0; pos < meshPtr->size(); ++pos)
    out[pos] = meshPtr->rankAt(pos);
  std::sort(out.begin(), out.end());
  return out;
}

Result<Plan> PreparedTemplate::instantiate(int64_t rank, bool withEstimates,
                                           bool verificationOnly) const {
  const Mesh &mesh = *meshPtr;
  if (!mesh.contains(rank))
    return makeError("rank " + std::to_string(rank) + " is not in the mesh " +
                     mesh.str());
  Plan plan;
  plan.mesh = tmpl.mesh;
  plan.rank = rank;

  plan.communicators.reserve(tmpl.comms.size());
  for (size_t i = 0; i < tmpl.comms.size(); ++i) {
    const CommTemplate &c = tmpl.comms[i];
    Communicator out;
    out.id = c.id;
    if (c.pair) {
      // The rank at the other coordinate of the pair, O(1): one stride.
      int axis = pairAxis[i];
      Result<int64_t> position = mesh.positionOf(rank);
      if (!position)
        return position.error().within("communicator " + quote(c.id));
      int64_t coord = mesh.coordinateAt(*position, axis);
      const int64_t *k = c.pair->coords;
      if (coord != k[0] && coord != k[1])
        return makeError("communicator " + quote(c.id) + ": rank " +
                         std::to_string(rank) + " is at coordinate " +
                         std::to_string(coord) + " of axis " +
                         quote(c.pair->axis) + ", not one of the pair's " +
                         std::to_string(k[0]) + ", " + std::to_string(k[1]));
      for (int64_t member : c.pair->coords)
        out.ranks.push_back(
            mesh.rankAt(*position + (member - coord) * mesh.stride(axis)));
      out.key = coord == k[0] ? 0 : 1;
      // Distinct per group of one id: its key-0 member.
      out.color = out.ranks[0];
      plan.communicators.push_back(std::move(out));
      continue;
    }
    Result<std::vector<int64_t>> group = groupOf(mesh, commRefs[i], rank);
    if (!group)
      return group.error().within("communicator " + quote(c.id));
    Result<SplitKey> split = splitKeyOf(mesh, commRefs[i], rank);
    if (!split)
      return split.error().within("communicator " + quote(c.id));
    out.ranks = std::move(group).value();
    out.color = split->color;
    out.key = split->key;
    out.axes = c.axes;
    out.view = c.view;
    out.faultTolerant = c.faultTolerant;
    plan.communicators.push_back(std::move(out));
  }

  plan.streams = tmpl.streams;
  if (verificationOnly) {
    // What verifyPlans reads: no buffers, no buffer lists, no labels.
    plan.program.reserve(tmpl.program.size());
    for (const Instruction &in : tmpl.program) {
      Instruction lean;
      lean.id = in.id;
      lean.stream = in.stream;
      lean.op = in.op;
      lean.comm = in.comm;
      lean.dtype = in.dtype;
      lean.count = in.count;
      lean.reduce = in.reduce;
      lean.root = in.root;
      lean.peer = in.peer;
      lean.tag = in.tag;
      lean.deps = in.deps;
      plan.program.push_back(std::move(lean));
    }
    return plan;
  }

  std::vector<int64_t> bufferBytes(tmpl.buffers.size());
  plan.buffers.reserve(tmpl.buffers.size());
  for (size_t i = 0; i < tmpl.buffers.size(); ++i) {
    const BufferTemplate &b = tmpl.buffers[i];
    Result<ShardBox> box = shardOf(*root, b.layout, b.globalShape, rank);
    if (!box)
      return box.error().within("buffer " + quote(b.id));
    bufferBytes[i] = box->numElements() * dtypeBytes(b.dtype);
    plan.buffers.push_back({b.id, b.kind, b.dtype, b.globalShape,
                            std::move(box->localShape), std::move(box->offset),
                            layoutTexts[i], b.tensor, b.tensorId, b.scale});
  }

  plan.program = tmpl.program;
  plan.optimizer = tmpl.optimizer;
  // Each gradient counts once in the norm: on the ranks core picks.
  for (Instruction &in : plan.program) {
    if (in.op != OpKind::GradNorm)
      continue;
    std::vector<std::string> counted;
    for (const std::string &id : in.inputs) {
      const BufferTemplate &b = tmpl.buffers[bufferIndex.at(id)];
      Result<bool> counts =
          countsInGradNorm(*root, b.layout, gradNormRefs, rank, pipelineAxis);
      if (!counts)
        return counts.error().within("instruction " + quote(in.id));
      if (*counts)
        counted.push_back(id);
    }
    in.inputs = std::move(counted);
  }

  if (withEstimates) {
    std::array<int64_t, kNumBufferKinds> cur{}, peak{};
    int64_t total = 0, peakTotal = 0;
    for (size_t i = 0; i < tmpl.buffers.size(); ++i)
      if (tmpl.buffers[i].persistent) {
        cur[size_t(tmpl.buffers[i].kind)] += bufferBytes[i];
        total += bufferBytes[i];
      }
    peak = cur;
    peakTotal = total;
    auto add = [&](size_t kind, int64_t bytes) {
      cur[kind] = saturatingAdd(cur[kind], bytes);
      total = saturatingAdd(total, bytes);
      peak[kind] = std::max(peak[kind], cur[kind]);
      peakTotal = std::max(peakTotal, total);
    };
    auto remove = [&](size_t kind, int64_t bytes) {
      cur[kind] -= bytes;
      total -= bytes;
    };
    // Activation events at a position apply after that position's buffer
    // events: they sit on compute instructions, which free nothing, so the
    // buffers a compute names are live with its activations.
    constexpr size_t kActivation = size_t(BufferKind::Activation);
    size_t next = 0;
    auto activationsBefore = [&](int32_t position) {
      for (; next < activationEvents.size() &&
             activationEvents[next].position < position;
           ++next) {
        add(kActivation, activationEvents[next].enter);
        remove(kActivation, activationEvents[next].leave);
      }
    };
    for (const BufferEvent &e : events) {
      activationsBefore(e.position);
      size_t kind = size_t(tmpl.buffers[e.buffer].kind);
      int64_t bytes = bufferBytes[e.buffer];
      if (e.birth)
        add(kind, bytes);
      else
        remove(kind, bytes);
    }
    activationsBefore(std::numeric_limits<int32_t>::max());
    Estimates est;
    for (BufferKind k : kindsPresent)
      est.peakMemoryBytes[std::string(bufferKindName(k))] = peak[size_t(k)];
    if (hasActivations)
      est.peakMemoryBytes[std::string(bufferKindName(BufferKind::Activation))] =
          peak[kActivation];
    est.peakMemoryBytes["total"] = peakTotal;
    est.bytesPerStepPerComm = commBytes;
    plan.estimates = std::move(est);
  }
  return plan;
}

} // namespace meshplan::plan
