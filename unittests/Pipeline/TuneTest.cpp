//===- TuneTest.cpp - meshplan tune against planning every candidate -----===//
//
// The tiny model on 8 ranks with every candidate confirmed (confirm = 0):
// the winner's spec plans and verifies, and no other candidate that fits is
// faster when the test plans it itself (the same pipeline, one rank's plan,
// plan::simulate) under the same cost model.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Pipeline/Tune.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/Template.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Plan/Verify.h"

#include <gtest/gtest.h>

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

/// Plans `c`'s spec as `meshplan plan` would and simulates one rank.
struct Planned {
  double stepSeconds = 0;
  int64_t peakBytes = 0;
};
Result<Planned> planCandidate(const pp::TuneOptions &o,
                              const pp::TuneCandidate &c, bool verifyAll) {
  auto spec = fe::loadSpec(c.specJson, o.baseDir);
  if (!spec)
    return spec.error();
  auto context = pp::makeContext();
  pp::CompileOptions options;
  options.import.tokensPerMicrobatch =
      (o.world * o.sequenceLength) /
      (c.replicate * c.shard * c.accumulationSteps);
  options.import.sequenceLength = o.sequenceLength;
  auto compiled = pp::compile(*context, *spec, options);
  if (!compiled)
    return compiled.error();
  auto prepared = pl::PreparedTemplate::prepare(compiled->program);
  if (!prepared)
    return prepared.error();
  std::vector<pl::Plan> plans;
  for (int64_t r : prepared->ranks()) {
    auto plan = prepared->instantiate(r);
    if (!plan)
      return plan.error();
    plans.push_back(std::move(*plan));
    if (!verifyAll)
      break;
  }
  if (verifyAll) {
    auto verified = pl::verifyPlans(plans);
    if (!verified)
      return verified.error();
    if (!verified->ok())
      return makeError("verify: " + verified->failure->message);
  }
  auto schedule = pl::simulate(plans.front(), prepared->flops(), o.cost);
  if (!schedule)
    return schedule.error();
  Planned out;
  out.stepSeconds = schedule->stepSeconds;
  out.peakBytes = plans.front().estimates->peakMemoryBytes.at("total");
  return out;
}

TEST(Tune, TheWinnerPlansAndNoCandidateIsFaster) {
  pp::TuneOptions o = tinyOptions();
  auto result = pp::tune(o);
  ASSERT_TRUE(result.ok()) << result.error().message;
  ASSERT_FALSE(result->ranked.empty());
  EXPECT_GT(result->enumerated, result->ranked.size());
  // TP over 8 does not divide the tiny model's heads: refused by the spec.
  EXPECT_GT(result->infeasible, 0u);
  EXPECT_EQ(result->compiled,
            result->ranked.size() + result->overCapacity.size());

  const pp::TuneCandidate &best = result->ranked.front();
  auto winner = planCandidate(o, best, /*verifyAll=*/true);
  ASSERT_TRUE(winner.ok()) << best.describe() << ": " << winner.error().message;
  EXPECT_DOUBLE_EQ(winner->stepSeconds, best.planStepSeconds);
  EXPECT_EQ(winner->peakBytes, best.peakBytes);
  EXPECT_LE(best.peakBytes, result->capacityBytes);

  std::set<std::string> seen;
  for (const pp::TuneCandidate &c : result->ranked) {
    EXPECT_TRUE(seen.insert(c.describe()).second) << "twice: " << c.describe();
    EXPECT_EQ(c.replicate * c.shard * c.cp * c.tp, o.world) << c.describe();
    auto planned = planCandidate(o, c, /*verifyAll=*/false);
    ASSERT_TRUE(planned.ok())
        << c.describe() << ": " << planned.error().message;
    EXPECT_DOUBLE_EQ(planned->stepSeconds, c.planStepSeconds) << c.describe();
    // The ranking: the plan's step plus the trainer's TP/CP collectives.
    EXPECT_LE(best.stepSeconds, planned->stepSeconds + c.trainerCommSeconds)
        << best.describe() << " vs " << c.describe();
    EXPECT_LE(planned->peakBytes, result->capacityBytes) << c.describe();
  }
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
}

} // namespace
