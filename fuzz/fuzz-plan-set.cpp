//===- fuzz-plan-set.cpp - Cross-rank verification of plan sets -----------===//
//
// Input: up to 8 plan documents separated by lines "---" (FuzzSupport.h),
// one per rank, as `meshplan verify DIR` reads a directory. When every
// document parses (public API: parsePlan), the set goes through
// verifyPlans, which must answer (an error for an unusable set, or a report
// that names what disagrees) without crashing or hanging, whatever the plans
// claim: meshes, communicators, collective sequences, stream waits.
//
//===----------------------------------------------------------------------===//

#include "FuzzSupport.h"

#include "meshplan/Plan/Plan.h"
#include "meshplan/Plan/Verify.h"

using namespace meshplan;
using namespace meshplan::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<plan::Plan> plans;
  for (std::string_view text : splitDocuments(asText(data, size), 8)) {
    auto plan = plan::parsePlan(text);
    if (!plan)
      return 0; // the reader alone is fuzz-plan's
    plans.push_back(std::move(*plan));
  }
  auto report = plan::verifyPlans(plans);
  if (!report) {
    checkMessage(report.error().message, "verifyPlans");
    return 0;
  }
  if (report->failure)
    checkMessage(report->failure->message, "verification");
  return 0;
}
