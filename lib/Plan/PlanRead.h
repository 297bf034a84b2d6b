//===- PlanRead.h - Reading plans into reused structures ------------------===//
//
// What the plan directory reader needs of the plan reader beyond Plan.h:
// reading into an existing Plan, whose strings and vectors keep their
// capacity from one plan to the next. Parsing a thousand fresh plans of
// ~20,000 allocations each made malloc and page faults the largest cost of
// `meshplan verify` (docs/performance.md, section B). Private to lib/Plan.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_LIB_PLAN_PLANREAD_H
#define MESHPLAN_LIB_PLAN_PLANREAD_H

#include "meshplan/Plan/Plan.h"

#include <cstdint>
#include <string_view>
#include <vector>

namespace meshplan::plan {

/// parsePlan into `plan`, reusing its storage. On an error `plan` holds a
/// partly read plan (to be overwritten by the next call, not used). With
/// `operandBuffers`, also what validation resolved anyway: per instruction in
/// program order, its inputs' then its outputs' indices into plan.buffers
/// (FactsBuilder::add takes them instead of looking every id up again).
Result<void> parsePlanInto(std::string_view text, Plan &plan,
                           std::vector<int32_t> *operandBuffers = nullptr);

/// validatePlan, also recording `operandBuffers` as parsePlanInto's.
Result<void> validatePlan(const Plan &plan,
                          std::vector<int32_t> *operandBuffers);

} // namespace meshplan::plan

#endif // MESHPLAN_LIB_PLAN_PLANREAD_H
