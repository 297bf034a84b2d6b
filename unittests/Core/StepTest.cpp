//===- StepTest.cpp - planned steps agree with applyStep ------------------===//
//
// The dist dialect verifies each collective with applyStep; the planner emits
// steps with their layouts. Both come from core, and this sweep checks they
// agree: for every layout pair on small meshes and shapes (even and uneven),
// every step's `after` has the same shards as applyStep(before, step), so
// every lowered redistribute verifies.
//
//===----------------------------------------------------------------------===//

#include "TestHelpers.h"

#include "meshplan/Core/Redistribute.h"

#include <gtest/gtest.h>

using namespace meshplan;

namespace {

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
    std::vector<Layout> layouts = testutil::wholeAxisLayouts(
        view, static_cast<int>(c.shape.size()), /*withPartial=*/true);
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
