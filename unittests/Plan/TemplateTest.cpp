//===- TemplateTest.cpp - Templates, cost model, trace, plan directories --===//
//
// Templates are instantiated for every rank and checked against brute-force
// models written here independently of core: groups by enumerating the mesh
// (ranks that differ only along the axes, in mixed-radix order), buffer boxes
// by torch.chunk arithmetic, estimates by a string-keyed liveness walk. The
// whole set must then pass verifyPlans.
//
//===----------------------------------------------------------------------===//

#include "PlanTestHelpers.h"

#include "meshplan/Plan/CostModel.h"
#include "meshplan/Plan/PlanDirectory.h"
#include "meshplan/Plan/Template.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Plan/Verify.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

using namespace plantest;
namespace fs = std::filesystem;

namespace {

//===----------------------------------------------------------------------===//
// Building templates
//===----------------------------------------------------------------------===//

struct BufferSpec {
  std::string id;
  BufferKind kind;
  DType dtype;
  std::vector<int64_t> shape;
  std::string layout; ///< parseLayout syntax over the root mesh
  bool persistent;
};

struct TemplateBuilder {
  std::shared_ptr<const Mesh> mesh;
  std::optional<View> root;
  std::optional<AxisNamespace> ns;
  ProgramTemplate t;

  TemplateBuilder(std::vector<MeshAxis> axes,
                  std::optional<std::vector<int64_t>> order = std::nullopt) {
    auto m = Mesh::create(axes, order);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
    mesh = std::make_shared<const Mesh>(std::move(m).value());
    root = View::root(mesh);
    ns.emplace(mesh);
    t.mesh.axes = axes;
    t.mesh.deviceOrder = order;
    t.streams = {"compute", "comm"};
  }
  Layout layout(const std::string &text) {
    auto l = parseLayout(*root, *ns, text);
    EXPECT_TRUE(l.ok()) << text << ": " << (l.ok() ? "" : l.error().message);
    return l.ok() ? *l : Layout{};
  }
  void comm(const std::string &id, std::vector<std::string> axes,
            bool faultTolerant = false) {
    t.comms.push_back({id, std::move(axes), "root", faultTolerant});
  }
  /// Parameter shards get the next tensor id (the model's order) unless
  /// one is set afterwards.
  BufferTemplate &buffer(const BufferSpec &b) {
    BufferTemplate bt{b.id,    b.kind,           b.dtype,
                      b.shape, layout(b.layout), b.persistent};
    if (b.kind == BufferKind::ParamShard) {
      bt.tensor = b.id;
      bt.tensorId = nextTensorId++;
    }
    t.buffers.push_back(std::move(bt));
    return t.buffers.back();
  }
  int64_t nextTensorId = 0;
  Instruction &add(const std::string &id, const std::string &stream, OpKind op,
                   std::vector<std::string> inputs = {},
                   std::vector<std::string> outputs = {},
                   std::vector<std::string> deps = {}, double flops = 0) {
    Instruction in;
    in.id = id;
    in.stream = stream;
    in.op = op;
    in.inputs = std::move(inputs);
    in.outputs = std::move(outputs);
    in.deps = std::move(deps);
    in.label = id;
    if (op == OpKind::Compute) {
      // The trainer callback: backward for "bwd..." ids, else forward.
      in.phase = id.rfind("bwd", 0) == 0 ? "backward" : "forward";
      in.unit = id;
    }
    t.program.push_back(std::move(in));
    t.flops.push_back(flops);
    return t.program.back();
  }
  Instruction &collective(const std::string &id, OpKind op,
                          const std::string &comm, DType dtype, int64_t count,
                          std::vector<std::string> inputs,
                          std::vector<std::string> outputs,
                          std::vector<std::string> deps = {}) {
    Instruction &in = add(id, "comm", op, std::move(inputs), std::move(outputs),
                          std::move(deps));
    in.comm = comm;
    in.dtype = dtype;
    in.count = count;
    if (isReduction(op))
      in.reduce = ReduceOp::Sum;
    return in;
  }
};

PreparedTemplate prepared(ProgramTemplate t) {
  auto p = PreparedTemplate::prepare(std::move(t));
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  if (!p.ok())
    std::abort();
  return std::move(p).value();
}

std::string prepareError(ProgramTemplate t) {
  auto p = PreparedTemplate::prepare(std::move(t));
  return p.ok() ? std::string("<ok>") : p.error().message;
}

/// The docs/plan-format.md example (test/planner/Inputs/verify/ok) as a
/// template.
TemplateBuilder docExample() {
  TemplateBuilder b({{"dp", 2, false}, {"tp", 2, false}});
  b.t.comms.push_back({"tp", {"tp"}, "slice(tp)", false});
  b.t.comms.push_back({"dp", {"dp"}, "slice(dp)", false});
  const std::string weight = "layers.0.weight";
  b.buffer({"w",
            BufferKind::ParamShard,
            DType::BFloat16,
            {8, 4},
            "[{tp},{}]",
            true})
      .tensor = weight;
  b.buffer({"w.full",
            BufferKind::Gathered,
            DType::BFloat16,
            {8, 4},
            "[{},{}]",
            false})
      .tensor = weight;
  b.buffer({"g",
            BufferKind::Gradient,
            DType::Float32,
            {8, 4},
            "[{tp},{}] partial(avg)={dp}",
            false})
      .tensor = weight;
  b.buffer({"g.avg",
            BufferKind::Gradient,
            DType::Float32,
            {8, 4},
            "[{tp},{}]",
            false})
      .tensor = weight;
  for (const char *state : {"w.exp_avg", "w.exp_avg_sq"})
    b.buffer({state,
              BufferKind::OptimizerState,
              DType::Float32,
              {8, 4},
              "[{tp},{}]",
              true})
        .tensor = weight;
  b.collective("ag.w", OpKind::AllGather, "tp", DType::BFloat16, 16, {"w"},
               {"w.full"})
      .label = "all-gather w";
  Instruction &fwd =
      b.add("fwd", "compute", OpKind::Compute, {"w.full"}, {}, {"ag.w"}, 4e9);
  fwd.label = "forward layers.0";
  fwd.unit = "layers.0";
  b.add("free.w", "compute", OpKind::Free, {"w.full"}).label = "";
  Instruction &bwd =
      b.add("bwd", "compute", OpKind::Compute, {}, {"g"}, {}, 8e9);
  bwd.label = "backward layers.0";
  bwd.unit = "layers.0";
  Instruction &ar = b.collective("ar.g", OpKind::AllReduce, "dp",
                                 DType::Float32, 16, {"g"}, {"g.avg"}, {"bwd"});
  ar.reduce = ReduceOp::Avg;
  ar.label = "all-reduce grad";
  b.add("opt", "compute", OpKind::OptimizerUpdate,
        {"w", "g.avg", "w.exp_avg", "w.exp_avg_sq"},
        {"w", "w.exp_avg", "w.exp_avg_sq"}, {"ar.g"}, 1e6)
      .label = "optimizer";
  OptimizerConfig adamw;
  adamw.stochasticRounding = true; // w is bfloat16
  b.t.optimizer = adamw;
  return b;
}

//===----------------------------------------------------------------------===//
// Brute-force models (no core group or shard arithmetic)
//===----------------------------------------------------------------------===//

struct BruteMesh {
  std::vector<int64_t> sizes, strides;
  std::vector<int64_t> order; ///< rank at each position
  int64_t size = 1;

  explicit BruteMesh(const PlanMesh &m) {
    for (const MeshAxis &a : m.axes)
      sizes.push_back(a.size);
    strides.assign(sizes.size(), 1);
    for (size_t a = sizes.size(); a-- > 0;) {
      strides[a] = size;
      size *= sizes[a];
    }
    for (int64_t p = 0; p < size; ++p)
      order.push_back(m.deviceOrder ? (*m.deviceOrder)[p] : p);
  }
  std::vector<int64_t> coord(int64_t p) const {
    std::vector<int64_t> c(sizes.size());
    for (size_t a = 0; a < sizes.size(); ++a)
      c[a] = (p / strides[a]) % sizes[a];
    return c;
  }
  int64_t positionOf(int64_t rank) const {
    for (int64_t p = 0; p < size; ++p)
      if (order[p] == rank)
        return p;
    ADD_FAILURE() << "rank " << rank << " not in the mesh";
    return 0;
  }
  int64_t digit(const AxisRef &r, const std::vector<int64_t> &c) const {
    int64_t post = sizes[r.axis] / (r.pre * r.size);
    return (c[r.axis] / post) % r.size;
  }
  /// The coordinate with the refs' digits cleared.
  std::vector<int64_t> rest(const AxisRefList &refs,
                            std::vector<int64_t> c) const {
    for (const AxisRef &r : refs)
      c[r.axis] -= digit(r, c) * (sizes[r.axis] / (r.pre * r.size));
    return c;
  }
  int64_t mixedRadix(const AxisRefList &refs,
                     const std::vector<int64_t> &c) const {
    int64_t v = 0;
    for (const AxisRef &r : refs)
      v = v * r.size + digit(r, c);
    return v;
  }

  /// Members of rank's group in key order, and the group's lowest position.
  std::pair<std::vector<int64_t>, int64_t> group(const AxisRefList &refs,
                                                 int64_t rank) const {
    auto mine = rest(refs, coord(positionOf(rank)));
    std::vector<std::pair<int64_t, int64_t>> members; // (key, position)
    for (int64_t q = 0; q < size; ++q)
      if (rest(refs, coord(q)) == mine)
        members.push_back({mixedRadix(refs, coord(q)), q});
    std::sort(members.begin(), members.end());
    std::vector<int64_t> ranks;
    int64_t lowest = size;
    for (auto [key, q] : members) {
      ranks.push_back(order[q]);
      lowest = std::min(lowest, q);
    }
    return {ranks, lowest};
  }

  /// torch.chunk, level after level: (offset, size); an empty shard's
  /// offset is the dim size, as torch reports it.
  std::pair<std::vector<int64_t>, std::vector<int64_t>>
  box(const Layout &layout, const std::vector<int64_t> &shape,
      int64_t rank) const {
    auto c = coord(positionOf(rank));
    std::vector<int64_t> offset, local;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t lo = 0, hi = shape[d];
      for (const AxisRefList &level : layout.dims[d]) {
        int64_t k = 1;
        for (const AxisRef &r : level)
          k *= r.size;
        int64_t idx = mixedRadix(level, c);
        int64_t chunk = (hi - lo + k - 1) / k;
        int64_t nlo = std::min(lo + idx * chunk, hi);
        int64_t nhi = std::min(nlo + chunk, hi);
        lo = nlo;
        hi = nhi;
      }
      local.push_back(hi - lo);
      offset.push_back(hi == lo ? shape[d] : lo);
    }
    return {offset, local};
  }
};

AxisRefList refsOf(const Mesh &mesh, const std::vector<std::string> &texts) {
  AxisRefList refs;
  for (const std::string &s : texts) {
    auto r = parseAxisRefText(mesh, s);
    EXPECT_TRUE(r.ok()) << s;
    refs.push_back(*r);
  }
  return refs;
}

/// Peak bytes by kind and "total", by walking the program with buffer ids.
std::map<std::string, int64_t> brutePeaks(const ProgramTemplate &t,
                                          const Plan &plan) {
  std::map<std::string, int64_t> bytes, kind;
  std::map<std::string, bool> persistent;
  std::map<std::string, int64_t> peak;
  for (size_t i = 0; i < t.buffers.size(); ++i) {
    const Buffer &b = plan.buffers[i];
    bytes[b.id] = product(b.localShape) * dtypeBytes(b.dtype);
    persistent[b.id] = t.buffers[i].persistent;
    peak[std::string(bufferKindName(b.kind))] = 0;
  }
  std::set<std::string> live;
  for (const auto &[id, p] : persistent)
    if (p)
      live.insert(id);
  auto record = [&] {
    std::map<std::string, int64_t> now;
    int64_t total = 0;
    for (const std::string &id : live) {
      for (const Buffer &b : plan.buffers)
        if (b.id == id)
          now[std::string(bufferKindName(b.kind))] += bytes[id];
      total += bytes[id];
    }
    for (const auto &[k, n] : now)
      peak[k] = std::max(peak[k], n);
    peak["total"] = std::max(peak["total"], total);
  };
  record();
  for (const Instruction &in : plan.program) {
    if (in.op == OpKind::Free) {
      for (const std::string &b : in.outputs)
        live.insert(b);
      record();
      for (const std::string &b : in.inputs)
        live.erase(b);
    } else {
      for (const std::string &b : in.inputs)
        live.insert(b);
      for (const std::string &b : in.outputs)
        live.insert(b);
      record();
    }
  }
  return peak;
}

/// Instantiates every rank and checks it against the brute-force models;
/// returns the plans (sorted by rank).
std::vector<Plan> checkAllRanks(const PreparedTemplate &pt) {
  const ProgramTemplate &t = pt.get();
  BruteMesh brute(t.mesh);
  std::vector<Plan> plans;
  for (int64_t rank : pt.ranks()) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    Result<Plan> p = pt.instantiate(rank);
    EXPECT_TRUE(p.ok()) << p.error().message;
    if (!p.ok())
      continue;
    Plan plan = std::move(p).value();
    Result<void> valid = validatePlan(plan);
    EXPECT_TRUE(valid.ok()) << valid.error().message;
    EXPECT_EQ(plan.rank, rank);
    EXPECT_EQ(plan.mesh, t.mesh);
    EXPECT_EQ(plan.streams, t.streams);
    EXPECT_EQ(plan.program, t.program);

    EXPECT_EQ(plan.communicators.size(), t.comms.size());
    for (size_t i = 0; i < t.comms.size(); ++i) {
      const Communicator &c = plan.communicators[i];
      AxisRefList refs = refsOf(pt.mesh(), t.comms[i].axes);
      auto [members, lowest] = brute.group(refs, rank);
      EXPECT_EQ(c.id, t.comms[i].id);
      EXPECT_EQ(c.ranks, members) << c.id;
      EXPECT_EQ(c.color, lowest) << c.id;
      EXPECT_EQ(c.ranks[c.key], rank) << c.id;
      EXPECT_EQ(c.axes, t.comms[i].axes);
      EXPECT_EQ(c.view, t.comms[i].view);
      EXPECT_EQ(c.faultTolerant, t.comms[i].faultTolerant);
      auto derived = deriveGroup(pt.mesh(), t.comms[i].axes, rank);
      EXPECT_TRUE(derived.ok());
      EXPECT_EQ(derived->ranks, c.ranks);
      EXPECT_EQ(derived->color, c.color);
      EXPECT_EQ(derived->key, c.key);
    }

    EXPECT_EQ(plan.buffers.size(), t.buffers.size());
    for (size_t i = 0; i < t.buffers.size(); ++i) {
      const Buffer &b = plan.buffers[i];
      const BufferTemplate &bt = t.buffers[i];
      auto [offset, local] = brute.box(bt.layout, bt.globalShape, rank);
      EXPECT_EQ(b.id, bt.id);
      EXPECT_EQ(b.kind, bt.kind);
      EXPECT_EQ(b.dtype, bt.dtype);
      EXPECT_EQ(b.globalShape, bt.globalShape);
      EXPECT_EQ(b.localShape, local) << b.id;
      EXPECT_EQ(b.offset, offset) << b.id;
    }

    EXPECT_TRUE(plan.estimates.has_value());
    if (plan.estimates) {
      EXPECT_EQ(plan.estimates->peakMemoryBytes, brutePeaks(t, plan));
      std::map<std::string, int64_t> sent;
      for (const Communicator &c : plan.communicators)
        sent[c.id] = 0;
      for (const Instruction &in : plan.program)
        if (isCollective(in.op))
          sent[in.comm] +=
              bytesSent(in.op, *in.dtype, in.count,
                        int64_t(plan.findCommunicator(in.comm)->ranks.size()));
      EXPECT_EQ(plan.estimates->bytesPerStepPerComm, sent);
    }
    Result<Plan> bare = pt.instantiate(rank, /*withEstimates=*/false);
    EXPECT_TRUE(bare.ok() && !bare->estimates.has_value());
    plans.push_back(std::move(plan));
  }
  // The templates here exercise groups, boxes and counts with placeholder
  // buffers (a reduce-scatter of a gradient that is not partial, a
  // gradient of no tensor), so only the structural checks (Verify.h
  // (a)-(c)) apply: no facts, no (d). Planned sets are verified in full
  // (test/planner/verify-step.test).
  Result<VerifyResult> v = verifyPlans(plans, PlanSetFacts{});
  EXPECT_TRUE(v.ok()) << v.error().message;
  if (v.ok()) {
    EXPECT_TRUE(v->ok()) << v->failure->message;
  }
  return plans;
}

/// A program over every communicator: every collective kind, compute, free
/// and re-gather (two live intervals of one buffer), optimizer update.
void addSweepProgram(TemplateBuilder &b, const std::string &param,
                     const std::string &full, const std::string &grad,
                     const std::string &act) {
  std::vector<std::string> comms;
  for (const CommTemplate &c : b.t.comms)
    comms.push_back(c.id);
  std::string prev;
  for (size_t i = 0; i < comms.size(); ++i) {
    const std::string &c = comms[i];
    std::vector<std::string> deps;
    if (!prev.empty())
      deps.push_back(prev);
    b.collective("ag." + c, OpKind::AllGather, c, DType::BFloat16, 7 + i,
                 {param}, {full}, deps);
    b.add("fwd." + c, "compute", OpKind::Compute, {full}, {act}, {"ag." + c},
          1e9 * (i + 1));
    b.add("free." + c, "compute", OpKind::Free, {full});
    prev = "fwd." + c;
  }
  for (size_t i = 0; i < comms.size(); ++i) {
    const std::string &c = comms[i];
    b.collective("reag." + c, OpKind::AllGather, c, DType::BFloat16, 7 + i,
                 {param}, {full});
    b.add("bwd." + c, "compute", OpKind::Compute, {full, act}, {grad},
          {"reag." + c}, 2e9);
    b.add("refree." + c, "compute", OpKind::Free, {full});
    b.collective("rs." + c, OpKind::ReduceScatter, c, DType::Float32, 3, {grad},
                 {grad}, {"bwd." + c});
    b.collective("ar." + c, OpKind::AllReduce, c, DType::Float32, 11, {grad},
                 {grad});
    b.collective("a2a." + c, OpKind::AllToAll, c, DType::Float16, 2, {act},
                 {act});
    b.collective("perm." + c, OpKind::Permute, c, DType::Int8, 5, {act}, {act});
    b.collective("bc." + c, OpKind::Broadcast, c, DType::Int32, 9, {act}, {act})
        .root = int64_t(i) % 2 == 0 ? 0 : 1;
  }
  b.add("free.act", "compute", OpKind::Free, {act});
  b.add("join", "compute", OpKind::Wait, {}, {}, {"bc." + comms.back()});
  // The update reads the parameter's shard of its reduced gradient and of
  // its state (fp32, in the parameter's layout); a bfloat16 parameter is
  // stochastically rounded.
  BufferTemplate p =
      *std::find_if(b.t.buffers.begin(), b.t.buffers.end(),
                    [&](const BufferTemplate &x) { return x.id == param; });
  std::vector<std::string> shard;
  for (const auto &[suffix, kind, persistent] :
       {std::tuple{".rgrad", BufferKind::Gradient, false},
        std::tuple{".exp_avg", BufferKind::OptimizerState, true},
        std::tuple{".exp_avg_sq", BufferKind::OptimizerState, true}}) {
    b.t.buffers.push_back({param + suffix, kind, DType::Float32, p.globalShape,
                           p.layout, persistent, param});
    shard.push_back(param + suffix);
  }
  b.add("opt", "compute", OpKind::OptimizerUpdate,
        {param, shard[0], shard[1], shard[2]}, {param, shard[1], shard[2]},
        {"join"}, 3e6);
  OptimizerConfig adamw;
  adamw.stochasticRounding = p.dtype == DType::BFloat16;
  b.t.optimizer = adamw;
}

//===----------------------------------------------------------------------===//
// Templates
//===----------------------------------------------------------------------===//

TEST(TemplateTest, ReproducesTheDocumentedExample) {
  PreparedTemplate pt = prepared(docExample().t);
  for (int64_t rank = 0; rank < 4; ++rank) {
    Result<Plan> got = pt.instantiate(rank);
    ASSERT_TRUE(got.ok()) << got.error().message;
    Result<Plan> want = readPlanFile(std::string(MESHPLAN_SOURCE_DIR) +
                                     "/test/planner/Inputs/verify/ok/rank" +
                                     std::to_string(rank) + ".json");
    ASSERT_TRUE(want.ok()) << want.error().message;
    EXPECT_EQ(*got, *want) << writePlan(*got);
  }
}

TEST(TemplateTest, DpTpGroupsAndUnevenBoxes) {
  TemplateBuilder b({{"dp", 2, false}, {"tp", 2, false}});
  b.comm("tp", {"tp"});
  b.comm("dp", {"dp"});
  b.comm("all", {"dp", "tp"});
  b.comm("rev", {"tp", "dp"});
  b.buffer({"flat",
            BufferKind::ParamShard,
            DType::Float32,
            {5, 3},
            "[{(dp,tp)},{}]",
            true});
  b.buffer({"nested",
            BufferKind::Gathered,
            DType::BFloat16,
            {5, 3},
            "[{dp,tp},{}]",
            false});
  b.buffer({"grad",
            BufferKind::Gradient,
            DType::Float32,
            {3, 7},
            "[{},{tp}] partial(sum)={dp}",
            false});
  b.buffer({"act",
            BufferKind::Activation,
            DType::BFloat16,
            {6, 2},
            "[{tp},{dp}]",
            false});
  addSweepProgram(b, "flat", "nested", "grad", "act");
  PreparedTemplate pt = prepared(b.t);
  std::vector<Plan> plans = checkAllRanks(pt);
  ASSERT_EQ(plans.size(), 4u);

  // By hand: 5 rows over (dp,tp) as one level of 4: 2,2,1,0 at 0,2,4,5.
  std::vector<int64_t> sizes, offsets;
  for (const Plan &p : plans) {
    sizes.push_back(p.buffers[0].localShape[0]);
    offsets.push_back(p.buffers[0].offset[0]);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 4, 5}));
  // Nested dp then tp: [0,3) -> [0,2),[2,3); [3,5) -> [3,4),[4,5).
  sizes.clear();
  offsets.clear();
  for (const Plan &p : plans) {
    sizes.push_back(p.buffers[1].localShape[0]);
    offsets.push_back(p.buffers[1].offset[0]);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 1, 1, 1}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 3, 4}));
  // Groups by hand for rank 2 = (dp 1, tp 0).
  EXPECT_EQ(plans[2].findCommunicator("tp")->ranks,
            (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(plans[2].findCommunicator("dp")->ranks,
            (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(plans[2].findCommunicator("rev")->ranks,
            (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(plans[2].findCommunicator("rev")->key, 1);
}

TEST(TemplateTest, ThreeAxisMeshAndFlattenedGroups) {
  TemplateBuilder b(
      {{"ddp", 2, false}, {"fsdp", 2, false}, {"abcd", 2, false}});
  b.comm("ddp", {"ddp"});
  b.comm("fsdp", {"fsdp"});
  b.comm("abcd", {"abcd"});
  b.comm("dp", {"ddp", "fsdp"});
  b.comm("abcd_ddp", {"abcd", "ddp"});
  b.comm("world", {"ddp", "fsdp", "abcd"});
  b.buffer({"w",
            BufferKind::ParamShard,
            DType::BFloat16,
            {7, 5},
            "[{(ddp,fsdp)},{abcd}]",
            true});
  b.buffer({"w.full",
            BufferKind::Gathered,
            DType::BFloat16,
            {7, 5},
            "[{},{abcd}]",
            false});
  b.buffer({"g",
            BufferKind::Gradient,
            DType::Float32,
            {3, 9},
            "[{fsdp,ddp},{}]",
            false});
  b.buffer({"opt.m",
            BufferKind::OptimizerState,
            DType::Float32,
            {7, 5},
            "[{(ddp,fsdp)},{abcd}]",
            true});
  b.buffer({"act",
            BufferKind::Activation,
            DType::BFloat16,
            {1, 1},
            "[{abcd},{}]",
            false});
  addSweepProgram(b, "w", "w.full", "g", "act");
  std::vector<Plan> plans = checkAllRanks(prepared(b.t));
  ASSERT_EQ(plans.size(), 8u);
  // 1 row over abcd: rank with abcd = 1 holds an empty box at the end.
  EXPECT_EQ(plans[1].buffers[4].localShape, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(plans[1].buffers[4].offset, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(plans[5].findCommunicator("dp")->ranks,
            (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(plans[5].findCommunicator("abcd_ddp")->ranks,
            (std::vector<int64_t>{0, 4, 1, 5}));
}

TEST(TemplateTest, ShuffledSparseDeviceOrderAndSubAxes) {
  // 24 devices with ids 5, 8, ..., 74 in a shuffled order.
  std::vector<int64_t> order;
  for (int64_t i = 0; i < 24; ++i)
    order.push_back(5 + 3 * ((i * 7 + 3) % 24));
  TemplateBuilder b({{"x", 2, false}, {"y", 4, false}, {"z", 3, false}}, order);
  b.comm("y.hi", {"y:(1)2"});
  b.comm("y.lo", {"y:(2)2"});
  b.comm("z_yhi", {"z", "y:(1)2"});
  b.comm("xy", {"x", "y"});
  b.comm("ylo_x", {"y:(2)2", "x"});
  b.buffer({"w",
            BufferKind::ParamShard,
            DType::Float32,
            {11, 4},
            "[{\"y\":(2)2, z},{x}]",
            true});
  b.buffer({"w.full",
            BufferKind::Gathered,
            DType::Float32,
            {11, 4},
            "[{},{x}]",
            false});
  b.buffer({"g",
            BufferKind::Gradient,
            DType::Float32,
            {10},
            "[{(z,\"y\":(1)2)}]",
            false});
  b.buffer({"act",
            BufferKind::Activation,
            DType::BFloat16,
            {5, 5},
            "[{(x,y)},{}]",
            false});
  addSweepProgram(b, "w", "w.full", "g", "act");
  std::vector<Plan> plans = checkAllRanks(prepared(b.t));
  ASSERT_EQ(plans.size(), 24u);
  EXPECT_EQ(plans.front().rank, 5);
  EXPECT_EQ(plans.back().rank, 74);
}

TEST(TemplateTest, ManagedAxisCommunicatorsAreNominal) {
  TemplateBuilder b({{"r", 3, true}, {"s", 2, false}});
  b.comm("r", {"r"}, /*faultTolerant=*/true);
  b.comm("s", {"s"});
  b.buffer({"w", BufferKind::ParamShard, DType::Float32, {4}, "[{s}]", true});
  b.buffer(
      {"w.full", BufferKind::Gathered, DType::Float32, {4}, "[{}]", false});
  b.buffer({"g",
            BufferKind::Gradient,
            DType::Float32,
            {4},
            "[{s}] partial(avg)={r}",
            false});
  b.buffer({"a", BufferKind::Scratch, DType::UInt8, {8}, "[{}]", false});
  addSweepProgram(b, "w", "w.full", "g", "a");
  std::vector<Plan> plans = checkAllRanks(prepared(b.t));
  EXPECT_EQ(plans[3].findCommunicator("r")->ranks,
            (std::vector<int64_t>{1, 3, 5}));
  EXPECT_TRUE(plans[3].findCommunicator("r")->faultTolerant);

  // A managed axis cannot split a tensor dim (the layout is parsed on an
  // unmanaged twin of the mesh, since parseLayout refuses it too).
  TemplateBuilder twin({{"r", 3, false}, {"s", 2, false}});
  TemplateBuilder bad({{"r", 3, true}, {"s", 2, false}});
  bad.t.buffers.push_back({"w",
                           BufferKind::ParamShard,
                           DType::Float32,
                           {6},
                           twin.layout("[{r}]"),
                           true});
  EXPECT_EQ(prepareError(bad.t),
            "buffer \"w\": layout: managed axis \"r\" cannot split tensor "
            "dim 0: its live size is known only at run time (use it as a "
            "replicate or partial axis)");
}

TEST(TemplateTest, EstimatesByHand) {
  // dp=2: p (param, 8 floats over dp = 4 -> 16 B), m and v (optimizer state,
  // 16 B each), f (gathered 8 floats = 32 B), a (activation 3x2 bf16 =
  // 12 B), t (scratch 10 B), g (gradient over dp: 4 floats = 16 B).
  TemplateBuilder b({{"dp", 2, false}});
  b.comm("dp", {"dp"});
  b.buffer({"p", BufferKind::ParamShard, DType::Float32, {8}, "[{dp}]", true});
  b.buffer(
      {"m", BufferKind::OptimizerState, DType::Float32, {8}, "[{dp}]", true});
  b.buffer(
      {"v", BufferKind::OptimizerState, DType::Float32, {8}, "[{dp}]", true});
  b.buffer({"f", BufferKind::Gathered, DType::Float32, {8}, "[{}]", false});
  b.buffer(
      {"a", BufferKind::Activation, DType::BFloat16, {3, 2}, "[{},{}]", false});
  b.buffer({"t", BufferKind::Scratch, DType::UInt8, {10}, "[{}]", false});
  b.buffer({"g", BufferKind::Gradient, DType::Float32, {8}, "[{dp}]", false});
  b.buffer(
      {"unused", BufferKind::Scratch, DType::Float64, {100}, "[{}]", false});
  b.collective("ag", OpKind::AllGather, "dp", DType::Float32, 4, {"p"}, {"f"});
  // live: p m v f (80)
  b.add("fwd", "compute", OpKind::Compute, {"f"}, {"a"}, {"ag"});
  // + a (92)
  b.add("tmp", "compute", OpKind::Compute, {"t"}, {});
  // + t (102)
  b.add("free.f", "compute", OpKind::Free, {"f", "t"});
  // - f, t (60)
  b.add("free.again", "compute", OpKind::Free, {"f"}); // releases nothing
  b.collective("ag2", OpKind::AllGather, "dp", DType::Float32, 4, {"p"}, {"f"});
  // + f (92)
  b.add("bwd", "compute", OpKind::Compute, {"f", "a"}, {"g"}, {"ag2"});
  // + g (108)
  b.add("free.fa", "compute", OpKind::Free, {"f", "a"});
  // - f, a (64)
  Instruction &rs = b.collective("ar", OpKind::AllReduce, "dp", DType::Float32,
                                 4, {"g"}, {"g"}, {"bwd"});
  rs.reduce = ReduceOp::Avg;
  b.add("opt", "compute", OpKind::OptimizerUpdate, {"p", "g", "m", "v"},
        {"p", "m", "v"}, {"ar"});
  b.t.optimizer = OptimizerConfig{};
  PreparedTemplate pt = prepared(b.t);
  Result<Plan> p = pt.instantiate(1);
  ASSERT_TRUE(p.ok()) << p.error().message;
  std::map<std::string, int64_t> peak = {
      {"param_shard", 16}, {"optimizer_state", 32}, {"gathered", 32},
      {"activation", 12},  {"scratch", 10},         {"gradient", 16},
      {"total", 108}};
  EXPECT_EQ(p->estimates->peakMemoryBytes, peak);
  // ag, ag2: (2-1)*4*4 = 16 each; ar: 2*(1)/2*16 = 16.
  EXPECT_EQ(p->estimates->bytesPerStepPerComm,
            (std::map<std::string, int64_t>{{"dp", 48}}));
  checkAllRanks(pt);
}

TEST(TemplateTest, SingletonGroupsAreEmitted) {
  TemplateBuilder b({{"dp", 1, false}, {"tp", 2, false}});
  b.comm("dp", {"dp"});
  b.buffer({"g", BufferKind::Gradient, DType::Float32, {4}, "[{}]", false});
  b.collective("ar", OpKind::AllReduce, "dp", DType::Float32, 4, {"g"}, {"g"});
  PreparedTemplate pt = prepared(b.t);
  std::vector<Plan> plans = checkAllRanks(pt);
  EXPECT_EQ(plans[1].communicators.at(0).ranks, (std::vector<int64_t>{1}));
  EXPECT_EQ(plans[1].estimates->bytesPerStepPerComm.at("dp"), 0);
}

TEST(TemplateTest, InstantiateIsThreadSafe) {
  TemplateBuilder b({{"a", 2, false}, {"b", 4, false}});
  b.comm("a", {"a"});
  b.comm("b", {"b"});
  b.buffer(
      {"w", BufferKind::ParamShard, DType::Float32, {9, 3}, "[{b},{a}]", true});
  b.buffer(
      {"f", BufferKind::Gathered, DType::Float32, {9, 3}, "[{},{}]", false});
  b.buffer({"g", BufferKind::Gradient, DType::Float32, {9}, "[{a}]", false});
  b.buffer({"x", BufferKind::Activation, DType::Float32, {2}, "[{}]", false});
  addSweepProgram(b, "w", "f", "g", "x");
  PreparedTemplate pt = prepared(b.t);
  std::vector<Plan> serial;
  for (int64_t r = 0; r < 8; ++r)
    serial.push_back(*pt.instantiate(r));
  std::vector<std::optional<Plan>> parallel(8);
  std::vector<std::thread> pool;
  for (int64_t r = 0; r < 8; ++r)
    pool.emplace_back([&, r] { parallel[r] = *pt.instantiate(r); });
  for (std::thread &t : pool)
    t.join();
  for (int64_t r = 0; r < 8; ++r)
    EXPECT_EQ(*parallel[r], serial[r]);
}

TEST(TemplateTest, PrepareErrorsNameTheItem) {
  auto expectError = [](const ProgramTemplate &t, const std::string &want) {
    std::string got = prepareError(t);
    EXPECT_EQ(got, want);
  };
  {
    TemplateBuilder b = docExample();
    b.comm("bad", {"dp", "zz"});
    expectError(b.t, "communicator \"bad\": axis \"zz\" is not in the mesh "
                     "(axes: dp, tp)");
  }
  {
    TemplateBuilder b = docExample();
    b.comm("sub", {"tp:(1)3"});
    EXPECT_EQ(prepareError(b.t).rfind("communicator \"sub\": ", 0), 0u)
        << prepareError(b.t);
  }
  {
    TemplateBuilder b = docExample();
    b.comm("twice", {"dp", "dp"});
    expectError(b.t,
                "communicator \"twice\": communicator axes uses axis \"dp\" "
                "twice");
  }
  {
    TemplateBuilder b = docExample();
    b.comm("none", {});
    EXPECT_EQ(prepareError(b.t).rfind("communicator \"none\": no axes", 0), 0u)
        << prepareError(b.t);
  }
  {
    TemplateBuilder b = docExample();
    b.comm("dp", {"dp"});
    expectError(b.t, "communicator \"dp\": duplicate id (also communicator "
                     "#1)");
  }
  {
    // A layout over a third axis the mesh does not have.
    TemplateBuilder three(
        {{"dp", 2, false}, {"tp", 2, false}, {"cp", 2, false}});
    TemplateBuilder b = docExample();
    b.t.buffers[0].layout = three.layout("[{cp},{}]");
    expectError(b.t, "buffer \"w\": layout: dim 0 uses axis index 2, but the "
                     "mesh has 2 axes (dp, tp)");
  }
  {
    TemplateBuilder b = docExample();
    b.t.buffers[0].layout.dims[0][0][0].pre = 3; // dp:(3)2 does not divide
    EXPECT_EQ(prepareError(b.t).rfind("buffer \"w\": layout: dim 0: ", 0), 0u)
        << prepareError(b.t);
  }
  {
    TemplateBuilder b = docExample();
    Layout twice = b.layout("[{tp},{}]");
    twice.dims[1] = twice.dims[0];
    b.t.buffers[0].layout = twice;
    EXPECT_EQ(prepareError(b.t).rfind("buffer \"w\": layout: ", 0), 0u)
        << prepareError(b.t);
  }
  {
    TemplateBuilder b = docExample();
    b.t.buffers[2].globalShape = {8};
    expectError(b.t, "buffer \"g\": the layout has 2 dims but global_shape has "
                     "1");
  }
  {
    TemplateBuilder b = docExample();
    b.t.buffers[2].globalShape = {8, -1};
    EXPECT_EQ(prepareError(b.t).rfind("buffer \"g\": global_shape: ", 0), 0u)
        << prepareError(b.t);
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[1].inputs = {"nope"};
    expectError(b.t, "instruction \"fwd\": inputs: unknown buffer \"nope\"");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[3].outputs = {"g", "g2"};
    expectError(b.t, "instruction \"bwd\": outputs: unknown buffer \"g2\"");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[0].comm = "ep";
    expectError(b.t, "instruction \"ag.w\": unknown communicator \"ep\"");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[1].stream = "side";
    expectError(b.t, "instruction \"fwd\": unknown stream \"side\" (streams: "
                     "compute, comm)");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[4].reduce.reset();
    expectError(b.t, "instruction \"ar.g\": all_reduce needs a reduce op");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[0].dtype.reset();
    expectError(b.t, "instruction \"ag.w\": all_gather needs a dtype");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[1].comm = "tp";
    expectError(b.t, "instruction \"fwd\": compute is not a collective and "
                     "takes no comm");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[0].op = OpKind::Broadcast;
    b.t.program[0].root = 2;
    expectError(b.t, "instruction \"ag.w\": root 2 is not a key of "
                     "communicator \"tp\" (size 2)");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[5].deps = {"later"};
    expectError(b.t, "instruction \"opt\": deps: unknown instruction "
                     "\"later\"");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[5].deps = {"opt"};
    expectError(b.t, "instruction \"opt\": deps: depends on itself");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[2].id = "fwd";
    expectError(b.t, "instruction \"fwd\": duplicate id (also instruction #1)");
  }
  {
    TemplateBuilder b = docExample();
    b.t.program[2].inputs = {"w"};
    expectError(b.t, "instruction \"free.w\": frees \"w\", a persistent "
                     "buffer (live for the whole step)");
  }
  {
    TemplateBuilder b = docExample();
    b.t.buffers[1].id = "w";
    expectError(b.t, "buffer \"w\": duplicate id (also buffer #0)");
  }
  {
    TemplateBuilder b = docExample();
    b.t.streams = {"compute", "compute"};
    expectError(b.t, "stream \"compute\": listed twice");
  }
  {
    TemplateBuilder b = docExample();
    b.t.flops.pop_back();
    expectError(b.t, "flops has 5 entries but the program has 6 instructions");
  }
  {
    TemplateBuilder b = docExample();
    b.t.flops[1] = -1;
    EXPECT_EQ(prepareError(b.t).rfind("instruction \"fwd\": flops ", 0), 0u);
  }
  {
    TemplateBuilder b = docExample();
    b.t.mesh.axes[1].size = 0;
    EXPECT_EQ(prepareError(b.t).rfind("mesh: ", 0), 0u) << prepareError(b.t);
  }
  {
    PreparedTemplate pt = prepared(docExample().t);
    Result<Plan> p = pt.instantiate(4);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.error().message.rfind("rank 4 is not in the mesh", 0), 0u)
        << p.error().message;
  }
}

//===----------------------------------------------------------------------===//
// Cost model
//===----------------------------------------------------------------------===//

TEST(CostModelTest, BytesSent) {
  EXPECT_EQ(bytesSent(OpKind::AllGather, DType::BFloat16, 16, 4), 3 * 16 * 2);
  EXPECT_EQ(bytesSent(OpKind::ReduceScatter, DType::Float32, 10, 8),
            7 * 10 * 4);
  EXPECT_EQ(bytesSent(OpKind::AllReduce, DType::Float32, 16, 2), 64);
  // 2 * 2/3 * 20 = 26.67, rounded down.
  EXPECT_EQ(bytesSent(OpKind::AllReduce, DType::Float32, 5, 3), 26);
  EXPECT_EQ(bytesSent(OpKind::AllReduce, DType::Float32, 1, 8), 7);
  EXPECT_EQ(bytesSent(OpKind::AllToAll, DType::Int8, 100, 5), 400);
  EXPECT_EQ(bytesSent(OpKind::Permute, DType::Float64, 3, 4), 24);
  EXPECT_EQ(bytesSent(OpKind::Broadcast, DType::Float16, 7, 16), 14);
  for (OpKind op : {OpKind::AllGather, OpKind::ReduceScatter, OpKind::AllReduce,
                    OpKind::AllToAll, OpKind::Permute, OpKind::Broadcast})
    EXPECT_EQ(bytesSent(op, DType::Float32, 1000, 1), 0);
  EXPECT_EQ(bytesSent(OpKind::Compute, DType::Float32, 1000, 4), 0);
  EXPECT_EQ(bytesSent(OpKind::AllGather, DType::Float64, int64_t(1) << 50,
                      int64_t(1) << 40),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ringSteps(OpKind::AllReduce, 4), 6);
  EXPECT_EQ(ringSteps(OpKind::AllGather, 4), 3);
  EXPECT_EQ(ringSteps(OpKind::Permute, 4), 1);
  EXPECT_EQ(ringSteps(OpKind::Broadcast, 1), 0);
}

TEST(CostModelTest, NodesAndDurations) {
  CostModel m;
  Communicator intra{"tp", {0, 1, 2, 3, 4, 5, 6, 7}, 0, 0, {}, {}, false};
  Communicator inter{"dp", {3, 11}, 3, 0, {}, {}, false};
  Communicator shifted{"x", {4, 5, 6, 7, 8, 9, 10, 11}, 4, 0, {}, {}, false};
  EXPECT_TRUE(isIntraNode(intra, m));
  EXPECT_FALSE(isIntraNode(inter, m));
  EXPECT_FALSE(isIntraNode(shifted, m));
  CostModel big = m;
  big.ranksPerNode = 16;
  EXPECT_TRUE(isIntraNode(shifted, big));

  Instruction ag;
  ag.op = OpKind::AllGather;
  ag.comm = "tp";
  ag.dtype = DType::BFloat16;
  ag.count = 1 << 20;
  double want = 7 * 10e-6 + 7.0 * (1 << 20) * 2 / 450e9;
  EXPECT_DOUBLE_EQ(durationSeconds(ag, &intra, 0, m), want);
  Instruction ar = ag;
  ar.op = OpKind::AllReduce;
  ar.reduce = ReduceOp::Sum;
  // 2 ranks across nodes: 2 steps of 20 us, 2*(1/2)*2 MiB over 50 GB/s.
  EXPECT_DOUBLE_EQ(durationSeconds(ar, &inter, 0, m),
                   2 * 20e-6 + double(1 << 21) / 50e9);
  EXPECT_EQ(durationSeconds(ar, nullptr, 0, m), 0);

  Instruction compute;
  compute.op = OpKind::Compute;
  EXPECT_DOUBLE_EQ(durationSeconds(compute, nullptr, 989e12 * 0.4, m), 1.0);
  Instruction opt;
  opt.op = OpKind::OptimizerUpdate;
  EXPECT_DOUBLE_EQ(durationSeconds(opt, nullptr, 1e6, m, 3350000000),
                   1e-3); // memory bound
  EXPECT_DOUBLE_EQ(durationSeconds(opt, nullptr, 989e12 * 0.4, m, 3350), 1.0);
  Instruction cast;
  cast.op = OpKind::Fp8Cast;
  EXPECT_DOUBLE_EQ(durationSeconds(cast, nullptr, 0, m, 6700000), 2e-6);
  Instruction widen;
  widen.op = OpKind::Cast;
  EXPECT_DOUBLE_EQ(durationSeconds(widen, nullptr, 0, m, 3350000), 1e-6);
  Instruction fr;
  fr.op = OpKind::Free;
  EXPECT_EQ(durationSeconds(fr, nullptr, 1e12, m, 1 << 30), 0);

  EXPECT_TRUE(checkCostModel(m).ok());
  CostModel bad = m;
  bad.mfu = 0;
  EXPECT_FALSE(checkCostModel(bad).ok());
  bad = m;
  bad.interNodeBytesPerSecond = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(checkCostModel(bad).ok());
  bad = m;
  bad.ranksPerNode = 0;
  EXPECT_FALSE(checkCostModel(bad).ok());
}

//===----------------------------------------------------------------------===//
// Trace
//===----------------------------------------------------------------------===//

/// Round numbers: 1 TFLOP/s, 1 GB/s and 1 ms per ring step everywhere.
CostModel roundModel() {
  CostModel m;
  m.peakFlopsPerSecond = 1e12;
  m.mfu = 1;
  m.intraNodeBytesPerSecond = m.interNodeBytesPerSecond = 1e9;
  m.intraNodeLatencySeconds = m.interNodeLatencySeconds = 1e-3;
  m.hbmBytesPerSecond = 1e9;
  return m;
}

/// Rank 0 of dp=2: two prefetched all-gathers, two forwards, an all-reduce,
/// an optimizer update.
TemplateBuilder twoStreamExample() {
  TemplateBuilder b({{"dp", 2, false}});
  b.comm("dp", {"dp"});
  b.buffer(
      {"p", BufferKind::ParamShard, DType::Float32, {500000}, "[{dp}]", true});
  b.buffer(
      {"f", BufferKind::Gathered, DType::Float32, {500000}, "[{}]", false});
  b.buffer(
      {"g", BufferKind::Gradient, DType::Float32, {500000}, "[{}]", false});
  b.buffer(
      {"s", BufferKind::OptimizerState, DType::UInt8, {1000000}, "[{}]", true});
  // 1 step + 250000*4 B / 1 GB/s = 2 ms.
  b.collective("ag1", OpKind::AllGather, "dp", DType::Float32, 250000, {"p"},
               {"f"});
  b.add("fwd1", "compute", OpKind::Compute, {"f"}, {}, {"ag1"}, 5e9); // 5 ms
  b.collective("ag2", OpKind::AllGather, "dp", DType::Float32, 250000, {"p"},
               {"f"});
  b.add("fwd2", "compute", OpKind::Compute, {"f"}, {"g"}, {"ag2"}, 5e9);
  // 2 steps + 2*(1/2)*2e6 B = 4 ms.
  Instruction &ar = b.collective("ar", OpKind::AllReduce, "dp", DType::Float32,
                                 500000, {"g"}, {"g"}, {"fwd2"});
  ar.reduce = ReduceOp::Avg;
  // max(1e9 flops = 1 ms, (g 2e6 + s 1e6) bytes / 1 GB/s = 3 ms) = 3 ms.
  b.add("opt", "compute", OpKind::OptimizerUpdate, {"g"}, {"s"}, {"ar"}, 1e9);
  b.add("done", "compute", OpKind::Wait, {}, {}, {"opt"});
  return b;
}

TEST(TraceTest, TwoStreamsExactTimes) {
  PreparedTemplate pt = prepared(twoStreamExample().t);
  Result<Plan> plan = pt.instantiate(0);
  ASSERT_TRUE(plan.ok());
  Result<Schedule> s = simulate(*plan, pt.flops(), roundModel());
  ASSERT_TRUE(s.ok()) << s.error().message;
  std::vector<double> start = {0, 2e-3, 2e-3, 7e-3, 12e-3, 16e-3, 19e-3};
  std::vector<double> end = {2e-3, 7e-3, 4e-3, 12e-3, 16e-3, 19e-3, 19e-3};
  for (size_t i = 0; i < start.size(); ++i) {
    EXPECT_NEAR(s->start[i], start[i], 1e-12) << plan->program[i].id;
    EXPECT_NEAR(s->end[i], end[i], 1e-12) << plan->program[i].id;
  }
  EXPECT_NEAR(s->stepSeconds, 19e-3, 1e-12);
  EXPECT_EQ(s->computeStream, 0);
  EXPECT_NEAR(s->streamBusySeconds[0], 13e-3, 1e-12);
  EXPECT_NEAR(s->streamBusySeconds[1], 8e-3, 1e-12);
  // Comm [0,4) and [12,16); compute [2,12) and [16,19): exposed 2 + 4 ms.
  EXPECT_NEAR(s->exposedCommSeconds, 6e-3, 1e-12);
  EXPECT_EQ(s->bytes[0], 1000000);
  EXPECT_EQ(s->bytes[4], 2000000);
  EXPECT_EQ(s->bytes[5], 3000000);

  // The trace: valid JSON, one X event per instruction, streams named.
  std::string text = chromeTrace(*plan, *s);
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << text;
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  EXPECT_DOUBLE_EQ(doc["otherData"]["mfu"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(doc["otherData"]["exposed_comm_seconds"].get<double>(),
                   s->exposedCommSeconds);
  size_t complete = 0;
  std::map<int, std::string> threads;
  for (const nlohmann::json &e : doc["traceEvents"]) {
    EXPECT_EQ(e["pid"], 0);
    if (e["ph"] == "X") {
      const Instruction &in = plan->program[complete];
      EXPECT_EQ(e["name"], in.label);
      EXPECT_EQ(e["args"]["id"], in.id);
      EXPECT_EQ(e["args"]["op"], std::string(opKindName(in.op)));
      EXPECT_EQ(e["args"]["count"], in.count);
      EXPECT_EQ(e["args"]["bytes"], s->bytes[complete]);
      EXPECT_NEAR(e["ts"].get<double>(), s->start[complete] * 1e6, 1e-6);
      EXPECT_NEAR(e["dur"].get<double>(),
                  (s->end[complete] - s->start[complete]) * 1e6, 1e-6);
      EXPECT_EQ(e["tid"], s->streamIndex[complete]);
      if (isCollective(in.op)) {
        EXPECT_EQ(e["args"]["comm"], "dp");
        EXPECT_EQ(e["args"]["dtype"], "float32");
      }
      ++complete;
    } else if (e["name"] == "thread_name") {
      threads[e["tid"].get<int>()] = e["args"]["name"];
    }
  }
  EXPECT_EQ(complete, plan->program.size());
  EXPECT_EQ(threads, (std::map<int, std::string>{{0, "compute"}, {1, "comm"}}));
}

TEST(TraceTest, DefaultModelOnEveryRankOfASweep) {
  TemplateBuilder b({{"a", 2, false}, {"b", 8, false}});
  b.comm("a", {"a"}); // members 8 apart: across nodes
  b.comm("b", {"b"}); // one node
  b.buffer({"w",
            BufferKind::ParamShard,
            DType::BFloat16,
            {1024, 512},
            "[{b},{a}]",
            true});
  b.buffer({"f",
            BufferKind::Gathered,
            DType::BFloat16,
            {1024, 512},
            "[{},{}]",
            false});
  b.buffer({"g", BufferKind::Gradient, DType::Float32, {1024}, "[{a}]", false});
  b.buffer({"x",
            BufferKind::Activation,
            DType::BFloat16,
            {64, 64},
            "[{},{}]",
            false});
  addSweepProgram(b, "w", "f", "g", "x");
  PreparedTemplate pt = prepared(b.t);
  for (int64_t r : pt.ranks()) {
    Result<Plan> plan = pt.instantiate(r);
    ASSERT_TRUE(plan.ok());
    Result<Schedule> s = simulate(*plan, pt.flops(), CostModel{});
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_GT(s->stepSeconds, 0);
    EXPECT_GT(s->exposedCommSeconds, 0);
    EXPECT_LE(s->exposedCommSeconds, s->stepSeconds);
    nlohmann::json doc =
        nlohmann::json::parse(chromeTrace(*plan, *s), nullptr, false);
    ASSERT_FALSE(doc.is_discarded());
    size_t x = 0;
    for (const nlohmann::json &e : doc["traceEvents"])
      x += e["ph"] == "X";
    EXPECT_EQ(x, plan->program.size());
    // The a-group crosses nodes and is slower per byte than the b-group.
    const Communicator *a = plan->findCommunicator("a");
    EXPECT_FALSE(isIntraNode(*a, CostModel{}));
    EXPECT_TRUE(isIntraNode(*plan->findCommunicator("b"), CostModel{}));
  }
}

TEST(TraceTest, CyclesAndBadInputAreErrors) {
  PreparedTemplate pt = prepared(twoStreamExample().t);
  Plan plan = *pt.instantiate(0);
  Plan cyc = plan;
  cyc.program[0].deps = {"fwd1"}; // ag1 <-> fwd1
  Result<Schedule> s = simulate(cyc, {}, roundModel());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("wait cycle"), std::string::npos);
  EXPECT_NE(s.error().message.find("\"ag1\""), std::string::npos)
      << s.error().message;
  EXPECT_NE(s.error().message.find("\"fwd1\""), std::string::npos)
      << s.error().message;
  // A cycle through stream order: fwd1 waits for fwd2, which follows it.
  cyc = plan;
  cyc.program[1].deps = {"fwd2"};
  s = simulate(cyc, {}, roundModel());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("/program/1 \"fwd1\" waits for"),
            std::string::npos)
      << s.error().message;

  s = simulate(plan, {1.0}, roundModel());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message,
            "flops has 1 entries but the program has 7 instructions");
  std::vector<double> nan(plan.program.size(), 0);
  nan[3] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(simulate(plan, nan, roundModel()).ok());
  CostModel bad = roundModel();
  bad.hbmBytesPerSecond = -1;
  EXPECT_FALSE(simulate(plan, {}, bad).ok());
  // Empty flops: compute costs nothing, collectives still do.
  s = simulate(plan, {}, roundModel());
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(s->end[1], 2e-3, 1e-12);
}

//===----------------------------------------------------------------------===//
// Plan directories
//===----------------------------------------------------------------------===//

class PlanDirectoryTest : public ::testing::Test {
protected:
  fs::path base;
  std::string dir;
  std::optional<PreparedTemplate> pt;

  void SetUp() override {
    std::string pattern =
        (fs::temp_directory_path() / "meshplan-plandir-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    base = pattern;
    dir = (base / "plans").string();
    pt = prepared(docExample().t);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base, ec);
  }
  std::function<Result<Plan>(int64_t)> source() const {
    return [this](int64_t r) { return pt->instantiate(r); };
  }
  /// Names in `base`, sorted.
  std::vector<std::string> siblings() const {
    std::vector<std::string> out;
    for (const auto &e : fs::directory_iterator(base))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto &e : fs::directory_iterator(dir))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::string slurp(const fs::path &p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

TEST_F(PlanDirectoryTest, WritesAReadableVerifiedSet) {
  std::vector<std::pair<int64_t, int64_t>> calls;
  Result<void> ok = writePlanDirectory(dir, 4, source(), {0, 1, 2, 3},
                                       [&](int64_t done, int64_t total) {
                                         calls.push_back({done, total});
                                       });
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{
                       {1, 4}, {2, 4}, {3, 4}, {4, 4}}));
  EXPECT_EQ(siblings(), std::vector<std::string>{"plans"});
  EXPECT_EQ(files(),
            (std::vector<std::string>{"index.json", "rank0.json", "rank1.json",
                                      "rank2.json", "rank3.json"}));
  EXPECT_EQ(slurp(fs::path(dir) / "rank2.json"),
            writePlan(*pt->instantiate(2)));
  Result<std::vector<Plan>> read = readPlanDirectory(dir);
  ASSERT_TRUE(read.ok()) << read.error().message;
  ASSERT_EQ(read->size(), 4u);
  for (int64_t r = 0; r < 4; ++r)
    EXPECT_EQ((*read)[r], *pt->instantiate(r));
  Result<VerifyResult> v = verifyPlans(*read);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok());
  nlohmann::json index =
      nlohmann::json::parse(slurp(fs::path(dir) / "index.json"));
  EXPECT_EQ(index["format"], "meshplan.plan-index");
  EXPECT_EQ(index["ranks"], (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST_F(PlanDirectoryTest, ThreadsWriteTheSameFiles) {
  ASSERT_TRUE(
      writePlanDirectory(dir, 4, source(), {3, 1, 0, 2}, nullptr, 4).ok());
  for (int64_t r = 0; r < 4; ++r)
    EXPECT_EQ(slurp(fs::path(dir) / ("rank" + std::to_string(r) + ".json")),
              writePlan(*pt->instantiate(r)));
  nlohmann::json index =
      nlohmann::json::parse(slurp(fs::path(dir) / "index.json"));
  EXPECT_EQ(index["ranks"], (std::vector<int64_t>{3, 1, 0, 2}));
  EXPECT_TRUE(readPlanDirectory(dir).ok());
}

TEST_F(PlanDirectoryTest, ReplacesAnEarlierPlan) {
  ASSERT_TRUE(writePlanDirectory(dir, 4, source(), {0, 1, 2, 3}).ok());
  // The new plan lists two ranks: the old rank2/rank3 files must go.
  ASSERT_TRUE(writePlanDirectory(dir + "/", 4, source(), {0, 1}).ok());
  EXPECT_EQ(files(), (std::vector<std::string>{"index.json", "rank0.json",
                                               "rank1.json"}));
  EXPECT_EQ(siblings(), std::vector<std::string>{"plans"});
  // An empty directory is fine too.
  fs::remove_all(dir);
  fs::create_directory(dir);
  ASSERT_TRUE(writePlanDirectory(dir, 4, source(), {0, 1, 2, 3}).ok());
  EXPECT_EQ(files().size(), 5u);
}

TEST_F(PlanDirectoryTest, RefusesForeignContent) {
  fs::create_directory(dir);
  { std::ofstream(fs::path(dir) / "notes.txt") << "mine"; }
  { std::ofstream(fs::path(dir) / "rank0.json") << "old"; }
  Result<void> r = writePlanDirectory(dir, 4, source(), {0, 1, 2, 3});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "\"" + dir +
                "\" holds \"notes.txt\", which is not part of a plan directory "
                "(only rankN.json and index.json); refusing to replace it");
  EXPECT_EQ(files(), (std::vector<std::string>{"notes.txt", "rank0.json"}));
  EXPECT_EQ(slurp(fs::path(dir) / "rank0.json"), "old");
  EXPECT_EQ(siblings(), std::vector<std::string>{"plans"});

  // A subdirectory, a leading-zero rank file, a regular file at DIR.
  fs::remove(fs::path(dir) / "notes.txt");
  fs::create_directory(fs::path(dir) / "sub");
  EXPECT_FALSE(writePlanDirectory(dir, 4, source(), {0}).ok());
  fs::remove(fs::path(dir) / "sub");
  { std::ofstream(fs::path(dir) / "rank01.json") << "x"; }
  EXPECT_FALSE(writePlanDirectory(dir, 4, source(), {0}).ok());
  fs::remove_all(dir);
  { std::ofstream(dir) << "a file"; }
  r = writePlanDirectory(dir, 4, source(), {0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("is not a directory"), std::string::npos);
  EXPECT_EQ(slurp(dir), "a file");
  EXPECT_EQ(siblings(), std::vector<std::string>{"plans"});
}

TEST_F(PlanDirectoryTest, FailureLeavesNothingBehind) {
  auto failAt3 = [this](int64_t r) -> Result<Plan> {
    if (r == 3)
      return makeError("no plan for you");
    return pt->instantiate(r);
  };
  // DIR did not exist: it still does not.
  Result<void> r = writePlanDirectory(dir, 4, failAt3, {0, 1, 2, 3});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, dir +
                                   "/rank3.json: the plan of rank 3: no "
                                   "plan for you (\"" +
                                   dir + "\" was left unchanged)");
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(siblings().empty());
  // Also with several threads.
  r = writePlanDirectory(dir, 4, failAt3, {0, 1, 2, 3}, nullptr, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(siblings().empty());

  // DIR held an earlier plan: it is intact.
  ASSERT_TRUE(writePlanDirectory(dir, 4, source(), {0, 1}).ok());
  std::string before = slurp(fs::path(dir) / "rank1.json");
  std::string index = slurp(fs::path(dir) / "index.json");
  r = writePlanDirectory(dir, 4, failAt3, {0, 1, 2, 3});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(files(), (std::vector<std::string>{"index.json", "rank0.json",
                                               "rank1.json"}));
  EXPECT_EQ(slurp(fs::path(dir) / "rank1.json"), before);
  EXPECT_EQ(slurp(fs::path(dir) / "index.json"), index);
  EXPECT_EQ(siblings(), std::vector<std::string>{"plans"});

  // A plan for the wrong rank or mesh is refused the same way.
  r = writePlanDirectory(dir, 4, [this](int64_t) { return pt->instantiate(0); },
                         {0, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("asked for the plan of rank 1 but got the "
                                   "plan of rank 0"),
            std::string::npos)
      << r.error().message;
  r = writePlanDirectory(dir, 8, source(), {0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("mesh has 4 devices but the world has 8"),
            std::string::npos)
      << r.error().message;
  EXPECT_EQ(slurp(fs::path(dir) / "rank1.json"), before);
  EXPECT_EQ(siblings(), std::vector<std::string>{"plans"});

  // Bad rank lists create nothing.
  EXPECT_FALSE(writePlanDirectory(dir, 4, source(), {}).ok());
  EXPECT_FALSE(writePlanDirectory(dir, 4, source(), {1, 1}).ok());
  EXPECT_FALSE(writePlanDirectory(dir, 4, source(), {-1}).ok());
  EXPECT_FALSE(writePlanDirectory(dir, 1, source(), {0, 1}).ok());
  EXPECT_FALSE(writePlanDirectory((base / "missing" / "plans").string(), 4,
                                  source(), {1, 1})
                   .ok());
  EXPECT_EQ(siblings(), std::vector<std::string>{"plans"});

  // Missing parents are created, as `mkdir -p` would (issue 12).
  r = writePlanDirectory((base / "missing" / "deeper" / "plans").string(), 4,
                         source(), {0});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(fs::exists(base / "missing" / "deeper" / "plans" / "rank0.json"));
  // A parent that is a file cannot be created; the error names the path.
  { std::ofstream(base / "afile") << "x"; }
  r = writePlanDirectory((base / "afile" / "plans").string(), 4, source(), {0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("afile/plans"), std::string::npos)
      << r.error().message;
  r = writePlanDirectory((base / "afile" / "sub" / "plans").string(), 4,
                         source(), {0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("afile/sub/plans"), std::string::npos)
      << r.error().message;
}

} // namespace
