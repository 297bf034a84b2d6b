//===- ExplainTest.cpp - pipeline::explain against the plan it explains ---===//
//
// `meshplan explain` prints what pipeline::explain computes (its lit tests,
// test/planner/explain*.test, pin the text). Here the data itself: its
// totals agree with its rows and with the rank's plan, the JSON carries the
// same numbers, a pipeline's step is its slowest rank's, and bad input is
// an error value, not a crash.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Pipeline/Explain.h"

#include "meshplan/Plan/Plan.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

using namespace meshplan;
namespace pp = meshplan::pipeline;

namespace {

/// `path` (relative to the source tree) planned as `meshplan explain` plans
/// it, with its model replaced by `model` when given.
pp::PlannedSpec planFile(const std::string &path,
                         const std::string &model = "") {
  std::string file = std::string(MESHPLAN_SOURCE_DIR) + "/" + path;
  auto text = plan::readTextFile(file);
  EXPECT_TRUE(text) << file;
  nlohmann::json spec = nlohmann::json::parse(*text);
  if (!model.empty())
    spec["model"] = model;
  auto resolved = frontend::loadSpec(spec.dump(), ".");
  EXPECT_TRUE(resolved) << resolved.error().message;
  auto planned = pp::planSpec(std::move(*resolved));
  EXPECT_TRUE(planned) << planned.error().message;
  return std::move(*planned);
}

TEST(Explain, TotalsAgreeWithRowsAndThePlan) {
  pp::PlannedSpec p = planFile("examples/specs/fsdp-fp8-3d.json", "tiny");
  plan::CostModel cost;
  auto e = pp::explain(p, 5, cost);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->rank, 5);
  EXPECT_EQ(e->worldSize, 8);
  EXPECT_EQ(e->unitGrouping, "torchtitan");

  int64_t bytes = 0;
  for (const auto &row : e->collectives)
    bytes += row.bytes;
  EXPECT_EQ(e->collectiveBytes, bytes);
  // The plan's own per-communicator estimate counts the same bytes.
  auto plan = p.templateFor(5).instantiate(5);
  ASSERT_TRUE(plan && plan->estimates);
  int64_t planBytes = 0;
  for (const auto &[comm, sent] : plan->estimates->bytesPerStepPerComm)
    planBytes += sent;
  EXPECT_EQ(e->collectiveBytes, planBytes);

  int64_t gathers = 0;
  for (const auto &unit : e->units)
    gathers += unit.allGathers;
  EXPECT_EQ(e->unitAllGathers, gathers);
  ASSERT_TRUE(e->perModule);
  EXPECT_EQ(e->perModule->allGathers, 14);

  // float8 all-gather halves the bfloat16 bytes (explain.test's figures).
  ASSERT_TRUE(e->float8);
  EXPECT_EQ(e->float8->allGathers, 4);
  EXPECT_EQ(e->float8->bytes, 73728);
  EXPECT_EQ(e->float8->bytesInComputeDtype, 147456);

  ASSERT_TRUE(e->peakMemoryTotal);
  EXPECT_EQ(e->capacity.peakBytes, *e->peakMemoryTotal);
  EXPECT_EQ(e->capacity.capacityBytes, cost.memoryCapacityBytes());
  EXPECT_EQ(e->capacity.headroomBytes,
            e->capacity.capacityBytes - e->capacity.peakBytes);
  EXPECT_FALSE(e->pipeline);
  ASSERT_TRUE(e->step);
  EXPECT_GT(e->step->seconds, 0);
}

TEST(Explain, JsonCarriesTheSameNumbers) {
  pp::PlannedSpec p = planFile("examples/specs/hsdp-managed.json", "tiny");
  auto e = pp::explain(p, 0, plan::CostModel{});
  ASSERT_TRUE(e) << e.error().message;
  nlohmann::json j = pp::explanationJson(*e);
  EXPECT_EQ(j["rank"], 0);
  EXPECT_EQ(j["model"]["parameters"], e->parameterCount);
  EXPECT_EQ(j["mesh"]["text"], e->mesh);
  EXPECT_TRUE(j["roles"]["tensor_axis"].is_null());
  ASSERT_EQ(j["communicators"].size(), e->communicators.size());
  EXPECT_EQ(j["communicators"][0]["fault_tolerant"],
            e->communicators[0].faultTolerant);
  EXPECT_EQ(j["collectives"]["total_bytes"], e->collectiveBytes);
  EXPECT_EQ(j["collectives"]["rows"].size(), e->collectives.size());
  EXPECT_EQ(j["fsdp_units"]["units"].size(), e->units.size());
  for (const auto &kind : e->peakMemory)
    EXPECT_EQ(j["memory"]["peak_by_kind"][kind.kind], kind.bytes);
  EXPECT_EQ(j["memory"]["capacity"]["fits"], e->capacity.fits);
  EXPECT_TRUE(j["float8"].is_null());
  EXPECT_TRUE(j["pipeline"].is_null());
  EXPECT_EQ(j["step"]["seconds"], e->step->seconds);
}

TEST(Explain, PipelineStepIsTheSlowestRanks) {
  pp::PlannedSpec p =
      planFile("test/planner/Inputs/pipeline/tiny-1f1b-pp4.json");
  plan::CostModel cost;
  auto e = pp::explain(p, 1, cost);
  ASSERT_TRUE(e) << e.error().message;
  ASSERT_TRUE(e->pipeline && e->step);
  const auto &pipeline = *e->pipeline;
  EXPECT_EQ(pipeline.schedule, "1f1b");
  EXPECT_EQ(pipeline.coordinate, 1);
  ASSERT_EQ(pipeline.ranks.size(), 4u);
  double slowest = 0, idle = 0;
  for (const auto &row : pipeline.ranks) {
    slowest = std::max(slowest, row.stepSeconds);
    idle += row.idleFraction;
  }
  EXPECT_EQ(e->step->seconds, slowest);
  EXPECT_DOUBLE_EQ(pipeline.bubbleFraction, idle / 4);

  // trace shows the same joint layout.
  auto layout = pp::layOutPipeline(p, 1, cost);
  ASSERT_TRUE(layout) << layout.error().message;
  EXPECT_EQ(layout->ranks, pp::pipelinePeers(p, 1));
  EXPECT_EQ(e->step->exposedCommunicationSeconds,
            layout->schedules[1].exposedCommSeconds);
}

TEST(Explain, RankOutsideTheMeshIsAnError) {
  pp::PlannedSpec p = planFile("examples/specs/fsdp-fp8-3d.json", "tiny");
  auto e = pp::explain(p, 8, plan::CostModel{});
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().message, "rank 8 is not in the mesh (ranks 0..7)");
  auto layout = pp::layOutPipeline(p, 0, plan::CostModel{});
  ASSERT_FALSE(layout);
  EXPECT_EQ(layout.error().message.rfind("internal error: ", 0), 0u);
}

} // namespace
