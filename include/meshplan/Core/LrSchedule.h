//===- LrSchedule.h - The learning rate of each optimizer step ------------===//
//
// torchtitan's `lr_scheduler` (torchtitan/components/lr_scheduler.py,
// `linear_warmup_stable_decay` under torch's LambdaLR): a linear warmup over
// `warmupSteps`, a stable phase, then a decay (linear, sqrt or cosine) over
// the last `decayRatio` of the run (or over everything after the warmup),
// from 1 down to `minLrFactor`. LambdaLR hands optimizer step s (1-based) the
// factor of its 0-based index s - 1; the rate is lr * factor.
//
// The factor is a pure function of (schedule, step) evaluated in double with
// the same operations in the same order as the Python code, so every rank
// and the single-process reference get the same bits, and so does torch's
// LambdaLR for the same settings (unittests/Core/LrScheduleTest.cpp
// tabulates it). One deliberate difference: torchtitan clamps a warmup
// longer than the run with a warning; checkLrSchedule refuses it instead.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_LRSCHEDULE_H
#define MESHPLAN_CORE_LRSCHEDULE_H

#include "meshplan/Core/Result.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace meshplan {

enum class LrDecayType { Linear, Sqrt, Cosine };
inline constexpr std::array<std::string_view, 3> kLrDecayTypeNames = {
    "linear", "sqrt", "cosine"};
std::string_view lrDecayTypeName(LrDecayType type);
std::optional<LrDecayType> parseLrDecayType(std::string_view name);

struct LrSchedule {
  int64_t warmupSteps = 0;
  /// Decay over the last round(totalSteps * decayRatio) steps (Python's
  /// round: half to even); none: over every step after the warmup.
  std::optional<double> decayRatio;
  LrDecayType decayType = LrDecayType::Linear;
  double minLrFactor = 0.0;
  /// The run's optimizer steps (torchtitan's training.steps).
  int64_t totalSteps = 1;

  bool operator==(const LrSchedule &) const = default;
};

/// The schedule's phases in steps, as torchtitan derives them (its
/// "virtual last step" included: stable = total + 1 - warmup - decay, so
/// that the last step's rate is not 0).
struct LrPhases {
  int64_t warmup = 0, stable = 0, decay = 0;
};
LrPhases lrPhases(const LrSchedule &schedule);

/// Checks 1 <= totalSteps <= 2^40, 0 <= warmupSteps <= totalSteps,
/// decayRatio in [0, 1] and finite, minLrFactor in [0, 1]. Messages name
/// the field as the spec writes it ("warmup_steps 30 is beyond the run's 20
/// steps").
Result<void> checkLrSchedule(const LrSchedule &schedule);

/// The multiplier of optimizer step `step` (1-based); steps past the run
/// keep following the formula, as LambdaLR does.
double lrFactor(const LrSchedule &schedule, int64_t step);

} // namespace meshplan

#endif // MESHPLAN_CORE_LRSCHEDULE_H
