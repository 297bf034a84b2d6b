//===- PlanTestHelpers.h - Synthesizing plan sets from core ---------------===//
//
// Builds a complete, consistent plan set the way the planner will: for a
// mesh and a list of tensor redistributions, core's planRedistribute gives
// the collectives, groupOf/splitKeyOf give each rank's communicators, and
// padded shapes give the counts. Every rank issues the same collectives on
// its own groups, so the set verifies; tests then mutate one rank.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_UNITTESTS_PLAN_PLANTESTHELPERS_H
#define MESHPLAN_UNITTESTS_PLAN_PLANTESTHELPERS_H

#include "meshplan/Core/Redistribute.h"
#include "meshplan/Plan/Plan.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace plantest {

using namespace meshplan;
using namespace meshplan::plan;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string from, to; ///< layouts in parseLayout's syntax
};

struct SynthOptions {
  std::vector<MeshAxis> axes;
  std::optional<std::vector<int64_t>> order;
  std::vector<TensorSpec> tensors;
  DType dtype = DType::Float32;
  /// Repeat the tensor list this many times (layers), to make long programs.
  int layers = 1;
};

inline OpKind opOfStep(StepKind k) {
  switch (k) {
  case StepKind::AllGather:
    return OpKind::AllGather;
  case StepKind::ReduceScatter:
    return OpKind::ReduceScatter;
  case StepKind::AllReduce:
    return OpKind::AllReduce;
  case StepKind::AllToAll:
    return OpKind::AllToAll;
  case StepKind::Permute:
    return OpKind::Permute;
  default:
    return OpKind::Broadcast;
  }
}

inline int64_t product(const std::vector<int64_t> &v) {
  int64_t n = 1;
  for (int64_t x : v)
    n *= x;
  return n;
}

/// Every rank's plan, in rank order (of the device order when given).
inline std::vector<Plan> synthesize(const SynthOptions &opt) {
  auto meshOr = Mesh::create(opt.axes, opt.order);
  EXPECT_TRUE(meshOr.ok()) << (meshOr.ok() ? "" : meshOr.error().message);
  auto mesh = std::make_shared<const Mesh>(std::move(meshOr).value());
  View view = View::root(mesh);
  AxisNamespace ns(mesh);

  struct Planned {
    TensorSpec spec;
    Layout from, to;
    RedistributePlan plan;
  };
  std::vector<Planned> planned;
  for (const TensorSpec &t : opt.tensors) {
    auto from = parseLayout(view, ns, t.from);
    auto to = parseLayout(view, ns, t.to);
    EXPECT_TRUE(from.ok() && to.ok()) << t.name;
    auto rp =
        planRedistribute(view, *from, *to, t.shape, dtypeBytes(opt.dtype));
    EXPECT_TRUE(rp.ok()) << t.name << ": "
                         << (rp.ok() ? "" : rp.error().message);
    planned.push_back({t, *from, *to, *rp});
  }

  std::vector<int64_t> ranks;
  for (int64_t p = 0; p < mesh->size(); ++p)
    ranks.push_back(mesh->rankAt(p));
  std::sort(ranks.begin(), ranks.end());

  std::vector<Plan> plans;
  for (int64_t rank : ranks) {
    Plan plan;
    plan.mesh.axes = opt.axes;
    plan.mesh.deviceOrder = opt.order;
    plan.rank = rank;
    plan.streams = {"compute", "comm"};
    std::map<std::string, size_t> commIndex;
    Estimates est;
    auto commFor = [&](const AxisRefList &refs) {
      std::string id = "g:" + formatAxisRefs(*mesh, refs);
      if (commIndex.count(id))
        return id;
      Communicator c;
      c.id = id;
      c.ranks = *groupOf(*mesh, refs, rank);
      SplitKey sk = *splitKeyOf(*mesh, refs, rank);
      c.color = sk.color;
      c.key = sk.key;
      for (const AxisRef &r : refs)
        c.axes.push_back(formatAxisRef(*mesh, r));
      c.view = "root";
      c.faultTolerant = touchesManaged(*mesh, refs);
      commIndex[id] = plan.communicators.size();
      plan.communicators.push_back(std::move(c));
      return id;
    };
    std::string lastCompute;
    for (int layer = 0; layer < opt.layers; ++layer) {
      for (size_t t = 0; t < planned.size(); ++t) {
        const Planned &pt = planned[t];
        std::string prefix = "L" + std::to_string(layer) + "." + pt.spec.name;
        auto addBuffer = [&](const std::string &id, BufferKind kind,
                             const Layout &layout) {
          ShardBox box = *shardOf(view, layout, pt.spec.shape, rank);
          Buffer b{id,
                   kind,
                   opt.dtype,
                   pt.spec.shape,
                   box.localShape,
                   box.offset,
                   formatLayout(*mesh, layout)};
          b.tensor = prefix;
          // A parameter's index in the model: its position in the list.
          if (kind == BufferKind::ParamShard)
            b.tensorId = int64_t(plan.buffers.size() / 2);
          plan.buffers.push_back(std::move(b));
        };
        addBuffer(prefix + ".in", BufferKind::ParamShard, pt.from);
        addBuffer(prefix + ".out", BufferKind::Gathered, pt.to);
        std::string prev;
        for (size_t s = 0; s < pt.plan.steps.size(); ++s) {
          const RedistributeStep &step = pt.plan.steps[s];
          if (!step.isCollective())
            continue;
          Instruction in;
          in.id = prefix + ".s" + std::to_string(s);
          in.stream = "comm";
          in.op = opOfStep(step.kind);
          in.comm = commFor(step.axes);
          in.dtype = opt.dtype;
          // The collective's size parameter, from padded shapes.
          const Layout &sized =
              step.kind == StepKind::ReduceScatter ? step.after : step.before;
          in.count = product(paddedShapeOf(sized, pt.spec.shape));
          if (step.kind == StepKind::AllToAll)
            in.count /= step.groupSize;
          if (step.kind == StepKind::ReduceScatter ||
              step.kind == StepKind::AllReduce)
            in.reduce = step.op;
          in.inputs = {prefix + ".in"};
          in.outputs = {prefix + ".out"};
          if (!prev.empty())
            in.deps = {prev};
          in.label = "redistribute " + prefix + " step " + std::to_string(s);
          est.bytesPerStepPerComm[in.comm] += step.bytesPerRank;
          prev = in.id;
          plan.program.push_back(std::move(in));
        }
        Instruction use;
        use.id = prefix + ".use";
        use.stream = "compute";
        use.op = OpKind::Compute;
        use.inputs = {prefix + ".out"};
        if (!prev.empty())
          use.deps = {prev};
        use.label = "forward " + prefix;
        use.phase = "forward";
        use.unit = prefix;
        use.microbatch = 0; // one microbatch: each unit runs it once
        lastCompute = use.id;
        plan.program.push_back(std::move(use));
        Instruction fr;
        fr.id = prefix + ".free";
        fr.stream = "compute";
        fr.op = OpKind::Free;
        fr.inputs = {prefix + ".out"};
        plan.program.push_back(std::move(fr));
      }
    }
    for (const Buffer &b : plan.buffers)
      est.peakMemoryBytes[std::string(bufferKindName(b.kind))] +=
          product(b.localShape) * dtypeBytes(b.dtype);
    plan.estimates = std::move(est);
    plans.push_back(std::move(plan));
  }
  return plans;
}

/// A mixed workload on a 3-D mesh: every kind of planned collective, with
/// distinct counts so that any swap or drop changes a signature.
inline std::vector<TensorSpec> mixedTensors() {
  return {
      {"wq", {64, 24}, "[{c},{}]", "[{},{}]"},                   // all_gather c
      {"grad", {48, 8}, "[{},{}] partial(sum)={a}", "[{a},{}]"}, // RS a
      {"norm", {40}, "[{}] partial(max)={b}", "[{}]"},           // AR b
      {"emb", {32, 16}, "[{a},{}]", "[{},{a}]"},                 // a2a a
      {"wo", {56, 8}, "[{(a,b,c)},{}]", "[{},{}]"},              // AG all
      {"perm", {16, 4}, "[{b,c},{}]", "[{c,b},{}]"},             // permute
      {"wk", {72, 4}, "[{c},{}]", "[{},{}]"},                    // AG c again
  };
}

inline SynthOptions mixedOptions(int64_t a, int64_t b, int64_t c,
                                 int layers = 1) {
  SynthOptions o;
  o.axes = {{"a", a, false}, {"b", b, false}, {"c", c, false}};
  o.tensors = mixedTensors();
  o.layers = layers;
  return o;
}

} // namespace plantest

#endif // MESHPLAN_UNITTESTS_PLAN_PLANTESTHELPERS_H
