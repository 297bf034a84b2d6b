//===- StepTest.cpp - planned steps agree with applyStep ------------------===//
//
// The dist dialect verifies each collective with applyStep; the planner emits
// steps with their layouts. Both come from core, and this sweep checks they
// agree: for every layout pair on small meshes and shapes (even and uneven),
// every step's `after` has the same shards as applyStep(before, step), so
// every lowered redistribute verifies.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/Redistribute.h"

#include <gtest/gtest.h>

using namespace meshplan;

namespace {

/// Every layout of a tensor of the given rank on a root view whose axes are
/// all whole axes: each axis replicated, partial (sum), or one level of one
/// dim, in every order.
std::vector<Layout> allLayouts(const View &view, int rank) {
  std::vector<Layout> out;
  int n = view.numAxes();
  // Assignment per axis: 0 = replicated, 1 = partial, 2 + d = dim d.
  int choices = 2 + rank;
  int64_t total = 1;
  for (int i = 0; i < n; ++i)
    total *= choices;
  for (int64_t code = 0; code < total; ++code) {
    std::vector<int> assign(n);
    int64_t c = code;
    for (int i = 0; i < n; ++i) {
      assign[i] = static_cast<int>(c % choices);
      c /= choices;
    }
    // Orders within dims: permute the axis indices and keep distinct results.
    std::vector<int> perm(n);
    for (int i = 0; i < n; ++i)
      perm[i] = i;
    std::vector<std::vector<std::vector<int>>> seen;
    do {
      std::vector<std::vector<int>> dims(rank);
      for (int i : perm)
        if (assign[i] >= 2)
          dims[assign[i] - 2].push_back(i);
      if (std::find(seen.begin(), seen.end(), dims) != seen.end())
        continue;
      seen.push_back(dims);
      Layout l = replicatedLayout(rank);
      for (int d = 0; d < rank; ++d)
        for (int i : dims[d])
          l.dims[d].push_back(view.axes()[i].refs);
      for (int i = 0; i < n; ++i)
        if (assign[i] == 1)
          l.partial.insert(l.partial.end(), view.axes()[i].refs.begin(),
                           view.axes()[i].refs.end());
      out.push_back(l);
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
  return out;
}

TEST(Step, EveryPlannedStepIsWhatApplyStepMakesOfItsOperand) {
  struct Case {
    std::vector<MeshAxis> axes;
    std::vector<int64_t> shape;
  };
  std::vector<Case> cases = {
      {{{"a", 2}, {"b", 2}}, {8}},
      {{{"a", 2}, {"b", 2}}, {5}},
      {{{"a", 2}, {"b", 3}}, {7, 6}},
      {{{"a", 2}, {"b", 2}}, {4, 6}},
      {{{"a", 2}, {"b", 2}}, {5, 3}},
      {{{"a", 2}, {"b", 2}, {"c", 2}}, {8}},
      {{{"a", 2}, {"b", 2}, {"c", 2}}, {7}},
  };
  int64_t plans = 0, steps = 0;
  for (const Case &c : cases) {
    auto mesh = std::make_shared<const Mesh>(*Mesh::create(c.axes));
    View view = View::root(mesh);
    std::vector<Layout> layouts =
        allLayouts(view, static_cast<int>(c.shape.size()));
    for (const Layout &from : layouts) {
      for (const Layout &to : layouts) {
        auto plan = planRedistribute(view, from, to, c.shape);
        ASSERT_TRUE(plan.ok()) << plan.error().message;
        ++plans;
        for (const RedistributeStep &s : plan->steps) {
          ++steps;
          StepSpec spec{s.kind, s.axes, s.dim, s.dstDim, s.dstAxes, s.op};
          auto after = applyStep(view, s.before, spec, c.shape);
          ASSERT_TRUE(after.ok())
              << stepKindName(s.kind) << " from "
              << formatLayout(*mesh, s.before) << ": " << after.error().message;
          EXPECT_TRUE(sameShards(view, *after, s.after, c.shape))
              << stepKindName(s.kind) << ": applyStep gives "
              << formatLayout(*mesh, *after) << ", the plan says "
              << formatLayout(*mesh, s.after);
        }
        if (!plan->steps.empty()) {
          EXPECT_TRUE(sameShards(view, plan->steps.back().after, to, c.shape))
              << "plan ends at "
              << formatLayout(*mesh, plan->steps.back().after) << ", not at "
              << formatLayout(*mesh, to);
        }
      }
    }
  }
  std::printf("[sweep] %lld plans, %lld steps checked against applyStep\n",
              static_cast<long long>(plans), static_cast<long long>(steps));
  EXPECT_GT(steps, 1000);
}

TEST(Step, ApplyStepRejectsStepsThatDoNotFit) {
  auto mesh =
      std::make_shared<const Mesh>(*Mesh::create({{"dp", 2}, {"tp", 2}}));
  View view = View::root(mesh);
  Layout l = replicatedLayout(1);
  l.dims[0] = {{AxisRef{1, 1, 2}}, {AxisRef{0, 1, 2}}}; // [{tp, dp}]
  AxisRefList tp{AxisRef{1, 1, 2}}, dp{AxisRef{0, 1, 2}};
  // tp is not the minor-most level.
  EXPECT_FALSE(applyStep(view, l, {StepKind::AllGather, tp, 0}, {8}).ok());
  EXPECT_TRUE(applyStep(view, l, {StepKind::AllGather, dp, 0}, {8}).ok());
  // Not partial.
  EXPECT_FALSE(applyStep(view, l, {StepKind::AllReduce, dp}, {8}).ok());
  // Split already.
  EXPECT_FALSE(applyStep(view, l, {StepKind::LocalSlice, dp, 0}, {8}).ok());
  // Permute needs an even dim.
  StepSpec permute{StepKind::Permute, {dp}, 0};
  permute.axes = {tp[0], dp[0]};
  permute.dstAxes = {dp[0], tp[0]};
  EXPECT_TRUE(applyStep(view, l, permute, {8}).ok());
  EXPECT_FALSE(applyStep(view, l, permute, {7}).ok());
}

} // namespace
