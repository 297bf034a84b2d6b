//===- OptimizerStep.cpp - Schedule, clipping and decay groups in a plan --===//

#include "meshplan/Pipeline/OptimizerStep.h"

#include <algorithm>
#include <map>
#include <set>

using namespace meshplan;
namespace pl = meshplan::plan;

/// An id not yet used by `taken` (`base`, else `base.2`, `base.3`, ...),
/// added to it.
static std::string takeFreshId(std::set<std::string> &taken,
                               const std::string &base) {
  std::string id = base;
  for (int n = 2; taken.count(id); ++n)
    id = base + "." + std::to_string(n);
  taken.insert(id);
  return id;
}

namespace {

/// Gradient clipping added to one program: the norm, its all-reduce and the
/// clip go before the updates, which move (with the frees of the gradients
/// they read, and whatever depends on them) after the clip.
class ClipPlanner {
public:
  ClipPlanner(pl::ProgramTemplate &t, const frontend::ResolvedSpec &spec)
      : t(t), spec(spec), opt(spec.spec.optimizer), n(t.program.size()) {}

  /// The updates and the gradients they read, in program order; false if
  /// the program has no update.
  bool findUpdates();
  Result<void> findNormAxes();
  /// Splits the gradients off the program's frees: they are freed after the
  /// updates.
  void splitGradientFrees();
  /// The updates and every instruction depending on one, transitively.
  void markMoved();
  /// grad_norm, the all-reduce of its buffer (with axes to reduce over),
  /// clip_grad, and the buffers and communicator they use.
  void buildClip();
  /// The program in its new order: what stays, the clip, what moved, the
  /// late frees.
  void reorder();

private:
  std::vector<std::string> normDeps() const;
  /// The all-reduce's stream (added to the program's if new).
  std::string normStream();

  pl::ProgramTemplate &t;
  const frontend::ResolvedSpec &spec;
  const frontend::OptimizerSpec &opt;
  const size_t n; ///< instructions before clipping
  std::vector<size_t> updates;
  std::string updateStream; ///< the first update's: the clip's too
  std::vector<std::string> grads;
  std::set<std::string> gradSet;
  AxisRefList axes;
  std::vector<bool> moved;
  std::map<std::string, size_t> position;
  std::set<std::string> ids, emptied;
  std::vector<pl::Instruction> lateFrees, clip;
};

bool ClipPlanner::findUpdates() {
  for (size_t i = 0; i < t.program.size(); ++i) {
    const pl::Instruction &in = t.program[i];
    if (in.op != pl::OpKind::OptimizerUpdate)
      continue;
    updates.push_back(i);
    for (size_t k = 1; k < in.inputs.size(); k += 4)
      if (gradSet.insert(in.inputs[k]).second)
        grads.push_back(in.inputs[k]);
  }
  if (updates.empty())
    return false;
  updateStream = t.program[updates.front()].stream;
  return true;
}

Result<void> ClipPlanner::findNormAxes() {
  std::map<std::string, size_t> bufferIndex;
  for (size_t i = 0; i < t.buffers.size(); ++i)
    bufferIndex[t.buffers[i].id] = i;
  std::vector<Layout> layouts;
  for (const std::string &g : grads)
    layouts.push_back(t.buffers[bufferIndex.at(g)].layout);
  std::optional<int> ppAxis;
  if (spec.pipeline)
    ppAxis = spec.pipeline->axisIndex;
  auto found = gradNormAxes(*spec.mesh, layouts, ppAxis);
  if (!found)
    return found.error().within("gradient clipping");
  axes = std::move(*found);
  return {};
}

void ClipPlanner::splitGradientFrees() {
  for (const pl::Instruction &in : t.program)
    ids.insert(in.id);
  for (size_t i = 0; i < n; ++i) {
    pl::Instruction &in = t.program[i];
    if (in.op != pl::OpKind::Free)
      continue;
    std::vector<std::string> keep, late;
    for (const std::string &b : in.inputs)
      (gradSet.count(b) ? late : keep).push_back(b);
    if (late.empty())
      continue;
    // On the updates' stream, after them in its order: nothing to wait
    // for across streams.
    pl::Instruction f = in;
    f.inputs = late;
    f.deps.clear();
    f.stream = updateStream;
    f.id = takeFreshId(ids, in.id + ".after_clip");
    f.label =
        "free " + late.front() +
        (late.size() > 1 ? " (+" + std::to_string(late.size() - 1) + " more)"
                         : "");
    lateFrees.push_back(std::move(f));
    if (keep.empty()) {
      // Its deps may still order others: it stays as a join point (and is
      // dropped below when nothing waits for it).
      emptied.insert(in.id);
      in.op = pl::OpKind::Wait;
      in.inputs.clear();
      in.label = "wait (" + in.label + " moved after the clip)";
    } else {
      in.inputs = std::move(keep);
    }
  }
}

void ClipPlanner::markMoved() {
  moved.assign(n, false);
  for (size_t i : updates)
    moved[i] = true;
  for (size_t i = 0; i < n; ++i)
    position[t.program[i].id] = i;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i)
      if (!moved[i])
        for (const std::string &d : t.program[i].deps)
          if (moved[position.at(d)]) {
            moved[i] = true;
            changed = true;
            break;
          }
  }
}

/// The gradients are final once every producer the updates waited for is
/// done: the norm inherits their deps.
std::vector<std::string> ClipPlanner::normDeps() const {
  std::vector<std::string> deps;
  for (size_t i : updates)
    for (const std::string &d : t.program[i].deps)
      if (!moved[position.at(d)] &&
          std::find(deps.begin(), deps.end(), d) == deps.end())
        deps.push_back(d);
  return deps;
}

/// On the stream of the program's last collective, or its own.
std::string ClipPlanner::normStream() {
  std::string commStream;
  for (const pl::Instruction &in : t.program)
    if (pl::isCollective(in.op) && !pl::isPointToPoint(in.op))
      commStream = in.stream;
  if (commStream.empty()) {
    commStream = "comm";
    if (std::find(t.streams.begin(), t.streams.end(), commStream) ==
        t.streams.end())
      t.streams.push_back(commStream);
  }
  return commStream;
}

void ClipPlanner::buildClip() {
  pl::BufferTemplate acc;
  std::set<std::string> bufferIds;
  for (const pl::BufferTemplate &b : t.buffers)
    bufferIds.insert(b.id);
  acc.id = takeFreshId(bufferIds, "grad_norm");
  acc.kind = pl::BufferKind::Scratch;
  acc.dtype = pl::DType::Int64;
  acc.globalShape = {gradNormBufferLength(opt.normType)};
  acc.layout = replicatedLayout(1);
  t.buffers.push_back(acc);

  std::string normName =
      opt.normType == GradNormType::L2 ? "sum of squares" : "largest magnitude";
  // With axes to reduce over, each rank's own sum goes to a buffer partial
  // over them (as the float8 amaxes do), which the all-reduce reduces into
  // `acc`: verify then sees every axis reduced exactly once.
  std::string localId = acc.id;
  if (!axes.empty()) {
    pl::BufferTemplate local = acc;
    local.id = takeFreshId(bufferIds, "grad_norm.local");
    local.layout.partial = axes;
    local.layout.reduceOp = gradNormReduceOp(opt.normType);
    localId = local.id;
    t.buffers.push_back(local);
  }
  pl::Instruction norm;
  norm.id = takeFreshId(ids, "grad_norm");
  norm.stream = updateStream;
  norm.op = pl::OpKind::GradNorm;
  norm.inputs = grads;
  norm.outputs = {localId};
  norm.deps = normDeps();
  norm.dtype = pl::DType::Int64;
  norm.label = "gradient norm (" + std::string(gradNormTypeName(opt.normType)) +
               "): exact " + normName + " of the gradients this rank counts";
  clip.push_back(norm);

  std::string clipDep = norm.id;
  if (!axes.empty()) {
    pl::CommTemplate comm;
    std::set<std::string> commIds;
    for (const pl::CommTemplate &c : t.comms)
      commIds.insert(c.id);
    comm.id = takeFreshId(commIds, "grad_norm");
    for (const AxisRef &r : axes)
      comm.axes.push_back(formatAxisRef(*spec.mesh, r));
    t.gradNormAxes = comm.axes;
    t.comms.push_back(comm);
    std::string commStream = normStream();
    pl::Instruction ar;
    ar.id = takeFreshId(ids, "grad_norm.all_reduce");
    ar.stream = commStream;
    ar.op = pl::OpKind::AllReduce;
    ar.comm = comm.id;
    ar.dtype = pl::DType::Int64;
    ar.count = acc.globalShape[0];
    ar.reduce = gradNormReduceOp(opt.normType);
    ar.inputs = {localId};
    ar.outputs = {acc.id};
    ar.deps = {norm.id};
    ar.label =
        "all-reduce the gradient norm over " + formatAxisRefs(*spec.mesh, axes);
    clipDep = ar.id;
    clip.push_back(std::move(ar));
  }
  pl::Instruction scale;
  scale.id = takeFreshId(ids, "clip_grad");
  scale.stream = updateStream;
  scale.op = pl::OpKind::ClipGradients;
  scale.inputs = {acc.id};
  scale.inputs.insert(scale.inputs.end(), grads.begin(), grads.end());
  scale.outputs = grads;
  if (clipDep != norm.id)
    scale.deps = {clipDep};
  scale.label = "clip " + std::to_string(grads.size()) +
                " gradients to max_norm " + std::to_string(*opt.maxNorm);
  clip.push_back(std::move(scale));
}

void ClipPlanner::reorder() {
  // A free emptied into a wait that nothing waits for is dropped.
  std::set<std::string> waitedFor;
  for (const pl::Instruction &in : t.program)
    waitedFor.insert(in.deps.begin(), in.deps.end());
  std::vector<bool> dropped(n, false);
  for (size_t i = 0; i < n; ++i)
    dropped[i] =
        t.program[i].op == pl::OpKind::Wait && t.program[i].inputs.empty() &&
        emptied.count(t.program[i].id) && !waitedFor.count(t.program[i].id);

  std::vector<pl::Instruction> program;
  std::vector<double> flops;
  bool hasFlops = !t.flops.empty();
  // Instruction i of the old program, or a new one (no FLOPs).
  auto append = [&](pl::Instruction &&in, std::optional<size_t> old) {
    program.push_back(std::move(in));
    if (hasFlops)
      flops.push_back(old ? t.flops[*old] : 0);
  };
  for (size_t i = 0; i < n; ++i)
    if (!moved[i] && !dropped[i])
      append(std::move(t.program[i]), i);
  for (pl::Instruction &in : clip)
    append(std::move(in), std::nullopt);
  const std::string clipId = program.back().id;
  for (size_t i = 0; i < n; ++i)
    if (moved[i]) {
      pl::Instruction &in = t.program[i];
      if (in.stream != updateStream)
        in.deps.push_back(clipId);
      append(std::move(in), i);
    }
  for (pl::Instruction &in : lateFrees)
    append(std::move(in), std::nullopt);
  t.program = std::move(program);
  t.flops = std::move(flops);
}

} // namespace

/// The spec's learning-rate schedule and this program's no-decay
/// parameters (a pipeline stage holds some).
static void addDecayGroups(pl::OptimizerConfig &o, const pl::ProgramTemplate &t,
                           const frontend::ResolvedSpec &spec) {
  o.schedule = spec.spec.optimizer.schedule;
  std::set<std::string> noDecay;
  for (const frontend::ParamAssignment &p : spec.params)
    if (p.noDecay)
      noDecay.insert(p.name);
  std::set<std::string> held;
  for (const pl::BufferTemplate &b : t.buffers)
    if (b.kind == pl::BufferKind::ParamShard && noDecay.count(b.tensor))
      held.insert(b.tensor);
  o.noDecay.assign(held.begin(), held.end());
}

Result<void>
meshplan::pipeline::planOptimizerStep(pl::ProgramTemplate &t,
                                      const frontend::ResolvedSpec &spec) {
  if (!t.optimizer)
    return {};
  const frontend::OptimizerSpec &opt = spec.spec.optimizer;
  pl::OptimizerConfig &o = *t.optimizer;
  addDecayGroups(o, t, spec);
  if (!opt.maxNorm)
    return {};
  o.maxNorm = opt.maxNorm;
  o.normType = opt.normType;

  ClipPlanner clip(t, spec);
  if (!clip.findUpdates())
    return {};
  MESHPLAN_TRY(clip.findNormAxes());
  clip.splitGradientFrees();
  clip.markMoved();
  clip.buildClip();
  clip.reorder();
  return {};
}
