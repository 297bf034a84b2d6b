//===- TuneTest.cpp - meshplan tune against planning every candidate -----===//
//
// The tiny model on 8 ranks with every candidate confirmed (confirm = 0):
// the winner's spec plans and verifies, and no other candidate that fits is
// faster when the test plans it itself (the same pipeline, one rank's plan,
// plan::simulate; under a pipeline one template per pp coordinate and the
// plans of one pipeline laid out together, plan::simulateTogether) under
// the same cost model. The same over tiny-4 (the tiny shapes with 4 blocks,
// test/planner/Inputs/tune/tiny-4.json), where pp 2 with two stages per
// rank (interleaved_1f1b, zbv) and pp 4 are tried; and a global batch too
// small for any layout without a pipeline, where only a pipeline fits the
// world.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Pipeline/Tune.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/Template.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Plan/Verify.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>

namespace {

using namespace meshplan;
namespace fe = meshplan::frontend;
namespace pl = meshplan::plan;
namespace pp = meshplan::pipeline;

pp::TuneOptions tinyOptions() {
  pp::TuneOptions o;
  o.model = "tiny";
  o.baseDir = MESHPLAN_SOURCE_DIR;
  o.world = 8;
  o.sequenceLength = 64;
  o.maxContextParallel = 2;
  o.maxAccumulationSteps = 2;
  o.confirm = 0;
  return o;
}

/// Plans `c`'s spec as `meshplan plan` would and simulates one rank (under
/// a pipeline: every pp coordinate's template, the ranks of rank 0's
/// pipeline laid out together; the step is the slowest's, the peak the
/// largest). With `verifyAll`, every rank's plan and verifyPlans.
struct Planned {
  double stepSeconds = 0;
  int64_t peakBytes = 0;
};
Result<Planned> planCandidate(const pp::TuneOptions &o,
                              const pp::TuneCandidate &c, bool verifyAll) {
  auto spec = fe::loadSpec(c.specJson, o.baseDir);
  if (!spec)
    return spec.error();
  if ((c.pp > 1) != spec->pipeline.has_value())
    return makeError("the spec's pipeline_parallel does not match pp");
  int64_t tokensPerStep =
      o.tokensPerStep ? o.tokensPerStep : o.world * o.sequenceLength;
  int64_t microbatches = c.pp > 1 ? c.microbatches : c.accumulationSteps;
  auto context = pp::makeContext();
  pp::CompileOptions options;
  options.import.tokensPerMicrobatch =
      tokensPerStep / (c.replicate * c.shard * microbatches);
  options.import.sequenceLength = o.sequenceLength;
  // One template per pp coordinate (one in all without a pipeline).
  std::vector<pl::PreparedTemplate> templates;
  for (int64_t k = 0; k < c.pp; ++k) {
    if (c.pp > 1)
      options.pipelineRank = k;
    auto compiled = pp::compile(*context, *spec, options);
    if (!compiled)
      return compiled.error();
    auto prepared = pl::PreparedTemplate::prepare(compiled->program);
    if (!prepared)
      return prepared.error();
    templates.push_back(std::move(*prepared));
  }
  const Mesh &mesh = *spec->mesh;
  int axis = c.pp > 1 ? spec->pipeline->axisIndex : -1;
  auto templateOf = [&](int64_t rank) -> const pl::PreparedTemplate & {
    if (axis < 0)
      return templates.front();
    return templates[size_t(mesh.coordinateAt(*mesh.positionOf(rank), axis))];
  };
  // The ranks of rank 0's pipeline, by pp coordinate.
  std::vector<pl::Plan> pipeline;
  std::vector<std::vector<double>> flops;
  for (int64_t k = 0; k < c.pp; ++k) {
    int64_t rank = axis < 0 ? 0 : mesh.rankAt(k * mesh.stride(axis));
    auto plan = templateOf(rank).instantiate(rank);
    if (!plan)
      return plan.error();
    pipeline.push_back(std::move(*plan));
    flops.push_back(templateOf(rank).flops());
  }
  if (verifyAll) {
    std::vector<pl::Plan> plans;
    for (int64_t r = 0; r < mesh.size(); ++r) {
      auto plan = templateOf(r).instantiate(r);
      if (!plan)
        return plan.error();
      plans.push_back(std::move(*plan));
    }
    auto verified = pl::verifyPlans(plans);
    if (!verified)
      return verified.error();
    if (!verified->ok())
      return makeError("verify: " + verified->failure->message);
  }
  Planned out;
  if (c.pp == 1) {
    auto schedule = pl::simulate(pipeline.front(), flops.front(), o.cost);
    if (!schedule)
      return schedule.error();
    out.stepSeconds = schedule->stepSeconds;
    out.peakBytes = pipeline.front().estimates->peakMemoryBytes.at("total");
    return out;
  }
  std::vector<const pl::Plan *> pointers;
  for (const pl::Plan &one : pipeline)
    pointers.push_back(&one);
  auto schedules = pl::simulateTogether(pointers, flops, o.cost);
  if (!schedules)
    return schedules.error();
  for (size_t k = 0; k < pipeline.size(); ++k) {
    out.stepSeconds = std::max(out.stepSeconds, (*schedules)[k].stepSeconds);
    out.peakBytes = std::max(
        out.peakBytes, pipeline[k].estimates->peakMemoryBytes.at("total"));
  }
  return out;
}

/// tune with every screened candidate confirmed, the winner planned and
/// verified on every rank, every other candidate that fits planned again
/// here: none is faster than the winner on the ranking's metric (the
/// plan's step plus the trainer's TP/CP collectives). Returns the result.
pp::TuneResult tuneAndCheck(const pp::TuneOptions &o) {
  auto result = pp::tune(o);
  EXPECT_TRUE(result.ok()) << result.error().message;
  if (!result.ok())
    return {};
  EXPECT_FALSE(result->ranked.empty());
  EXPECT_EQ(result->compiled,
            result->ranked.size() + result->overCapacity.size());
  const pp::TuneCandidate &best = result->ranked.front();
  auto winner = planCandidate(o, best, /*verifyAll=*/true);
  EXPECT_TRUE(winner.ok()) << best.describe() << ": " << winner.error().message;
  if (!winner.ok())
    return *result;
  EXPECT_DOUBLE_EQ(winner->stepSeconds, best.planStepSeconds);
  EXPECT_EQ(winner->peakBytes, best.peakBytes);
  EXPECT_LE(best.peakBytes, result->capacityBytes);

  // The sanitizer build (MESHPLAN_SWEEP_STRIDE=k, as the exhaustive sweeps
  // of unittests/Core read it) plans every k-th candidate again: the same
  // code paths for 1/k of the time; the default build plans them all.
  const char *strideText = std::getenv("MESHPLAN_SWEEP_STRIDE");
  const size_t stride =
      strideText ? std::max<size_t>(1, std::strtoull(strideText, nullptr, 10))
                 : 1;
  std::set<std::string> seen;
  for (size_t k = 0; k < result->ranked.size(); ++k) {
    const pp::TuneCandidate &c = result->ranked[k];
    EXPECT_TRUE(seen.insert(c.describe()).second) << "twice: " << c.describe();
    EXPECT_EQ(c.pp * c.replicate * c.shard * c.cp * c.tp, o.world)
        << c.describe();
    if (k % stride != 0)
      continue;
    auto planned = planCandidate(o, c, /*verifyAll=*/false);
    EXPECT_TRUE(planned.ok())
        << c.describe() << ": " << planned.error().message;
    if (!planned.ok())
      continue;
    EXPECT_DOUBLE_EQ(planned->stepSeconds, c.planStepSeconds) << c.describe();
    // The ranking: the plan's step plus the trainer's TP/CP collectives.
    EXPECT_LE(best.stepSeconds, planned->stepSeconds + c.trainerCommSeconds)
        << best.describe() << " vs " << c.describe();
    EXPECT_EQ(planned->peakBytes, c.peakBytes) << c.describe();
    EXPECT_LE(planned->peakBytes, result->capacityBytes) << c.describe();
  }
  return *result;
}

TEST(Tune, TheWinnerPlansAndNoCandidateIsFaster) {
  pp::TuneOptions o = tinyOptions();
  pp::TuneResult result = tuneAndCheck(o);
  EXPECT_GT(result.enumerated, result.ranked.size());
  // TP over 8 does not divide the tiny model's heads: refused by the spec.
  EXPECT_GT(result.infeasible, 0u);
  // Two blocks: pp 2 with one stage per rank (gpipe, 1f1b) is tried.
  EXPECT_GT(result.pipelined, 0u);
  bool pipelined = false, plain = false;
  for (const pp::TuneCandidate &c : result.ranked) {
    pipelined = pipelined || c.pp == 2;
    plain = plain || c.pp == 1;
    EXPECT_LE(c.pp * c.stagesPerRank, 2) << c.describe();
  }
  EXPECT_TRUE(pipelined);
  EXPECT_TRUE(plain);
}

/// Four blocks: pp 2 with two stages per rank and pp 4, every schedule.
TEST(Tune, PipelineSchedulesAndDegreesAgainstPlanningEach) {
  pp::TuneOptions o = tinyOptions();
  o.model = "test/planner/Inputs/tune/tiny-4.json";
  pp::TuneResult result = tuneAndCheck(o);
  std::set<std::string> schedules;
  std::set<int64_t> degrees;
  for (const pp::TuneCandidate &c : result.ranked) {
    degrees.insert(c.pp);
    if (c.pp > 1) {
      schedules.insert(std::string(pipelineScheduleKindName(c.schedule)) +
                       "/v" + std::to_string(c.stagesPerRank));
      EXPECT_EQ(c.accumulationSteps, 1) << c.describe();
      EXPECT_LE(c.pp * c.stagesPerRank, 4) << c.describe();
      EXPECT_GE(c.microbatches,
                c.schedule == PipelineScheduleKind::OneFOneB ? c.pp : 1)
          << c.describe();
      EXPECT_GT(c.bubbleFraction, 0) << c.describe();
    }
  }
  EXPECT_EQ(degrees, (std::set<int64_t>{1, 2, 4}));
  EXPECT_EQ(schedules,
            (std::set<std::string>{"gpipe/v1", "1f1b/v1", "interleaved_1f1b/v2",
                                   "zbv/v2"}));
}

/// Two sequences for 8 ranks and no context parallelism: without a
/// pipeline the data-parallel ranks (at most 2) times TP (at most 2, the
/// KV heads) cannot fill the world, so the winner must pipeline; its spec
/// plans and verifies on every rank.
TEST(Tune, APipelineIsNeededWhenTheBatchCannotFillTheWorld) {
  pp::TuneOptions o = tinyOptions();
  o.model = "test/planner/Inputs/tune/tiny-4.json";
  o.tokensPerStep = 2 * o.sequenceLength;
  o.maxContextParallel = 1;
  pp::TuneResult result = tuneAndCheck(o);
  ASSERT_FALSE(result.ranked.empty());
  for (const pp::TuneCandidate &c : result.ranked)
    EXPECT_GT(c.pp, 1) << c.describe();
  EXPECT_GT(result.ranked.front().pp, 1);

  // --pp 1: nothing fits the world.
  o.pipelineParallel = 1;
  auto none = pp::tune(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("no candidate fits"), std::string::npos)
      << none.error().message;
}

/// llama3-405b on 1,024 H100s with torchtitan's 405B global batch (256
/// sequences of 8192, benchmarks/llama3_h100_202412_torchtitan.md Table
/// 5): the cost model prefers a pipeline, whose step, planned here per pp
/// coordinate and laid out together, beats the best layout without one.
TEST(Tune, APipelineWinsFor405BOn1024) {
  pp::TuneOptions o;
  o.model = "llama3-405b";
  o.world = 1024;
  o.tokensPerStep = 256 * 8192;
  auto result = pp::tune(o);
  ASSERT_TRUE(result.ok()) << result.error().message;
  const pp::TuneCandidate &best = result->ranked.front();
  EXPECT_GT(best.pp, 1) << best.describe();
  auto planned = planCandidate(o, best, /*verifyAll=*/false);
  ASSERT_TRUE(planned.ok()) << planned.error().message;
  EXPECT_DOUBLE_EQ(planned->stepSeconds, best.planStepSeconds);
  EXPECT_EQ(planned->peakBytes, best.peakBytes);
  o.pipelineParallel = 1;
  auto plain = pp::tune(o);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_LT(best.stepSeconds, plain->ranked.front().stepSeconds)
      << best.describe() << " vs " << plain->ranked.front().describe();
}

TEST(Tune, PipelineDegreeRestricted) {
  pp::TuneOptions o = tinyOptions();
  o.model = "test/planner/Inputs/tune/tiny-4.json";
  o.confirm = 4;
  for (int64_t degree : {1, 4}) {
    o.pipelineParallel = degree;
    auto result = pp::tune(o);
    ASSERT_TRUE(result.ok()) << result.error().message;
    EXPECT_EQ(result->pipelined, degree == 1 ? 0u : result->enumerated);
    for (const pp::TuneCandidate &c : result->ranked)
      EXPECT_EQ(c.pp, degree) << c.describe();
  }
  o.maxPipelineParallel = 2;
  o.pipelineParallel = 0;
  auto result = pp::tune(o);
  ASSERT_TRUE(result.ok()) << result.error().message;
  for (const pp::TuneCandidate &c : result->ranked)
    EXPECT_LE(c.pp, 2) << c.describe();
}

TEST(Tune, NothingFitsIsAClearError) {
  pp::TuneOptions o = tinyOptions();
  o.cost.deviceMemoryBytes = int64_t(64) << 10;
  o.cost.reservedMemoryBytes = 0;
  auto result = pp::tune(o);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error().message.find("no candidate fits the device"),
            std::string::npos)
      << result.error().message;
}

TEST(Tune, BadInput) {
  pp::TuneOptions o = tinyOptions();
  o.world = 0;
  EXPECT_FALSE(pp::tune(o).ok());
  o = tinyOptions();
  o.model = "no-such-model";
  auto r = pp::tune(o);
  ASSERT_FALSE(r.ok());
  o = tinyOptions();
  o.pipelineParallel = 3; // does not divide 8
  r = pp::tune(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("pp 3 does not divide the world size 8"),
            std::string::npos)
      << r.error().message;
  o.pipelineParallel = 4; // tiny has 2 blocks
  r = pp::tune(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("leaves a stage without a block"),
            std::string::npos)
      << r.error().message;
  o.pipelineParallel = -1;
  EXPECT_FALSE(pp::tune(o).ok());
}

} // namespace
