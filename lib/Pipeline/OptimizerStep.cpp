//===- OptimizerStep.cpp - Schedule, clipping and decay groups in a plan --===//

#include "meshplan/Pipeline/OptimizerStep.h"

#include <algorithm>
#include <map>
#include <set>

using namespace meshplan;
namespace pl = meshplan::plan;

/// An id not yet used by `taken`: `base`, else `base.2`, `base.3`, ...
static std::string freshId(const std::set<std::string> &taken,
                           const std::string &base) {
  std::string id = base;
  for (int n = 2; taken.count(id); ++n)
    id = base + "." + std::to_string(n);
  return id;
}

Result<void>
meshplan::pipeline::planOptimizerStep(pl::ProgramTemplate &t,
                                      const frontend::ResolvedSpec &spec) {
  if (!t.optimizer)
    return {};
  const frontend::OptimizerSpec &opt = spec.spec.optimizer;
  pl::OptimizerConfig &o = *t.optimizer;
  o.schedule = opt.schedule;
  std::set<std::string> noDecay;
  for (const frontend::ParamAssignment &p : spec.params)
    if (p.noDecay)
      noDecay.insert(p.name);
  // This program's parameters only (a pipeline stage holds some).
  std::set<std::string> held;
  for (const pl::BufferTemplate &b : t.buffers)
    if (b.kind == pl::BufferKind::ParamShard && noDecay.count(b.tensor))
      held.insert(b.tensor);
  o.noDecay.assign(held.begin(), held.end());
  if (!opt.maxNorm)
    return {};
  o.maxNorm = opt.maxNorm;
  o.normType = opt.normType;

  // The updates and the gradients they read, in program order.
  std::vector<size_t> updates;
  std::vector<std::string> grads;
  std::set<std::string> gradSet;
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
    return {};

  std::map<std::string, size_t> bufferIndex;
  for (size_t i = 0; i < t.buffers.size(); ++i)
    bufferIndex[t.buffers[i].id] = i;
  std::vector<Layout> layouts;
  for (const std::string &g : grads)
    layouts.push_back(t.buffers[bufferIndex.at(g)].layout);
  std::optional<int> ppAxis;
  if (spec.pipeline)
    ppAxis = spec.pipeline->axisIndex;
  auto axes = gradNormAxes(*spec.mesh, layouts, ppAxis);
  if (!axes)
    return axes.error().within("gradient clipping");

  // What moves after the clip: the updates, the gradient frees split off
  // their instructions, and whatever depends on a moved instruction.
  size_t n = t.program.size();
  std::vector<bool> moved(n, false);
  for (size_t i : updates)
    moved[i] = true;
  std::vector<pl::Instruction> lateFrees;
  std::set<std::string> ids, emptied;
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
    f.stream = t.program[updates.front()].stream;
    f.id = freshId(ids, in.id + ".after_clip");
    ids.insert(f.id);
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
  std::map<std::string, size_t> position;
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

  // The gradients are final once every producer the updates waited for
  // is done: the norm inherits their deps.
  const std::string stream = t.program[updates.front()].stream;
  std::vector<std::string> normDeps;
  for (size_t i : updates)
    for (const std::string &d : t.program[i].deps)
      if (!moved[position.at(d)] &&
          std::find(normDeps.begin(), normDeps.end(), d) == normDeps.end())
        normDeps.push_back(d);

  pl::BufferTemplate acc;
  std::set<std::string> bufferIds;
  for (const pl::BufferTemplate &b : t.buffers)
    bufferIds.insert(b.id);
  acc.id = freshId(bufferIds, "grad_norm");
  acc.kind = pl::BufferKind::Scratch;
  acc.dtype = pl::DType::Int64;
  acc.globalShape = {gradNormBufferLength(opt.normType)};
  acc.layout = replicatedLayout(1);
  bufferIds.insert(acc.id);
  t.buffers.push_back(acc);

  std::string normName =
      opt.normType == GradNormType::L2 ? "sum of squares" : "largest magnitude";
  // With axes to reduce over, each rank's own sum goes to a buffer partial
  // over them (as the float8 amaxes do), which the all-reduce reduces into
  // `acc`: verify then sees every axis reduced exactly once.
  std::string localId = acc.id;
  if (!axes->empty()) {
    pl::BufferTemplate local = acc;
    local.id = freshId(bufferIds, "grad_norm.local");
    bufferIds.insert(local.id);
    local.layout.partial = *axes;
    local.layout.reduceOp = gradNormReduceOp(opt.normType);
    localId = local.id;
    t.buffers.push_back(local);
  }
  pl::Instruction norm;
  norm.id = freshId(ids, "grad_norm");
  ids.insert(norm.id);
  norm.stream = stream;
  norm.op = pl::OpKind::GradNorm;
  norm.inputs = grads;
  norm.outputs = {localId};
  norm.deps = normDeps;
  norm.dtype = pl::DType::Int64;
  norm.label = "gradient norm (" + std::string(gradNormTypeName(opt.normType)) +
               "): exact " + normName + " of the gradients this rank counts";

  std::vector<pl::Instruction> tail;
  tail.push_back(norm);
  std::string clipDep = norm.id;
  if (!axes->empty()) {
    pl::CommTemplate comm;
    std::set<std::string> commIds;
    for (const pl::CommTemplate &c : t.comms)
      commIds.insert(c.id);
    comm.id = freshId(commIds, "grad_norm");
    for (const AxisRef &r : *axes)
      comm.axes.push_back(formatAxisRef(*spec.mesh, r));
    t.gradNormAxes = comm.axes;
    t.comms.push_back(comm);
    // On the stream of the program's last collective, or its own.
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
    pl::Instruction ar;
    ar.id = freshId(ids, "grad_norm.all_reduce");
    ids.insert(ar.id);
    ar.stream = commStream;
    ar.op = pl::OpKind::AllReduce;
    ar.comm = comm.id;
    ar.dtype = pl::DType::Int64;
    ar.count = acc.globalShape[0];
    ar.reduce = gradNormReduceOp(opt.normType);
    ar.inputs = {localId};
    ar.outputs = {acc.id};
    ar.deps = {norm.id};
    ar.label = "all-reduce the gradient norm over " +
               formatAxisRefs(*spec.mesh, *axes);
    clipDep = ar.id;
    tail.push_back(std::move(ar));
  }
  pl::Instruction clip;
  clip.id = freshId(ids, "clip_grad");
  ids.insert(clip.id);
  clip.stream = stream;
  clip.op = pl::OpKind::ClipGradients;
  clip.inputs = {acc.id};
  clip.inputs.insert(clip.inputs.end(), grads.begin(), grads.end());
  clip.outputs = grads;
  if (clipDep != norm.id)
    clip.deps = {clipDep};
  clip.label = "clip " + std::to_string(grads.size()) +
               " gradients to max_norm " + std::to_string(*opt.maxNorm);
  tail.push_back(std::move(clip));

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
  for (size_t i = 0; i < n; ++i)
    if (!moved[i] && !dropped[i]) {
      program.push_back(std::move(t.program[i]));
      if (hasFlops)
        flops.push_back(t.flops[i]);
    }
  for (pl::Instruction &in : tail) {
    program.push_back(std::move(in));
    if (hasFlops)
      flops.push_back(0);
  }
  const std::string clipId = program.back().id;
  for (size_t i = 0; i < n; ++i)
    if (moved[i]) {
      pl::Instruction &in = t.program[i];
      if (in.stream != stream)
        in.deps.push_back(clipId);
      program.push_back(std::move(in));
      if (hasFlops)
        flops.push_back(t.flops[i]);
    }
  for (pl::Instruction &in : lateFrees) {
    program.push_back(std::move(in));
    if (hasFlops)
      flops.push_back(0);
  }
  t.program = std::move(program);
  t.flops = std::move(flops);
  return {};
}
