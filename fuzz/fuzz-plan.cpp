//===- fuzz-plan.cpp - Reading and validating one plan --------------------===//
//
// Input: a plan document (docs/plan-format.md), as `meshplan verify`, the
// runtime and the checkpoint writer read it. Written against the public API
// only (parsePlan, validatePlan, writePlan), so it holds for any reader
// behind it. Checks the reader's documented promises: what it accepts
// validates, writes back as text it accepts again, equal to what it read, and
// that text is stable. Then what the runtime derives from a plan read from
// disk: the checkpoint boxes it owns (persistentBoxesOf) and the timeline
// under the cost model (simulate, which must not hang on any plan).
//
//===----------------------------------------------------------------------===//

#include "FuzzSupport.h"

#include "meshplan/Checkpoint/Checkpoint.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Plan/Trace.h"

using namespace meshplan;
using namespace meshplan::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto plan = plan::parsePlan(asText(data, size));
  if (!plan) {
    checkMessage(plan.error().message, "parsePlan");
    return 0;
  }
  auto valid = plan::validatePlan(*plan);
  check(bool(valid), "parsePlan accepted a plan that validatePlan refuses: " +
                         (valid ? "" : valid.error().message));
  std::string written = plan::writePlan(*plan);
  auto again = plan::parsePlan(written);
  check(bool(again), "parsePlan refuses what writePlan wrote: " +
                         (again ? "" : again.error().message));
  check(*again == *plan, "parsePlan(writePlan(p)) != p");
  check(plan::writePlan(*again) == written, "writePlan is not stable");

  auto boxes = ckpt::persistentBoxesOf(*plan);
  if (!boxes)
    checkMessage(boxes.error().message, "persistentBoxesOf");
  auto schedule = plan::simulate(*plan, {}, plan::CostModel{});
  if (!schedule)
    checkMessage(schedule.error().message, "simulate");
  else
    (void)plan::chromeTrace(*plan, *schedule);
  return 0;
}
