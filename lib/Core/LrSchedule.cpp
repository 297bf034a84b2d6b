//===- LrSchedule.cpp - The learning rate of each optimizer step ----------===//

#include "meshplan/Core/LrSchedule.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace meshplan {

std::string_view lrDecayTypeName(LrDecayType type) {
  return kLrDecayTypeNames[static_cast<size_t>(type)];
}

std::optional<LrDecayType> parseLrDecayType(std::string_view name) {
  for (size_t i = 0; i < kLrDecayTypeNames.size(); ++i)
    if (kLrDecayTypeNames[i] == name)
      return static_cast<LrDecayType>(i);
  return std::nullopt;
}

LrPhases lrPhases(const LrSchedule &s) {
  LrPhases p;
  p.warmup = std::min(s.warmupSteps, s.totalSteps);
  if (s.decayRatio) {
    // Python's round() rounds half to even, as nearbyint does in the
    // default rounding mode.
    p.decay = static_cast<int64_t>(
        std::nearbyint(static_cast<double>(s.totalSteps) * *s.decayRatio));
    if (p.warmup + p.decay > s.totalSteps)
      p.decay = s.totalSteps - p.warmup;
  } else {
    p.decay = s.totalSteps - p.warmup;
  }
  p.stable = s.totalSteps + 1 - p.warmup - p.decay;
  return p;
}

Result<void> checkLrSchedule(const LrSchedule &s) {
  constexpr int64_t kMaxSteps = int64_t(1) << 40;
  if (s.totalSteps < 1 || s.totalSteps > kMaxSteps)
    return makeError("total_steps must be in [1, 2^40], got " +
                     std::to_string(s.totalSteps));
  if (s.warmupSteps < 0)
    return makeError("warmup_steps must be >= 0, got " +
                     std::to_string(s.warmupSteps));
  if (s.warmupSteps > s.totalSteps)
    return makeError("warmup_steps " + std::to_string(s.warmupSteps) +
                     " is beyond the run's " + std::to_string(s.totalSteps) +
                     " steps (torchtitan would shorten it silently)");
  if (s.decayRatio && !(*s.decayRatio >= 0 && *s.decayRatio <= 1))
    return makeError("decay_ratio must be in [0, 1], got " +
                     std::to_string(*s.decayRatio));
  if (!(s.minLrFactor >= 0 && s.minLrFactor <= 1))
    return makeError("min_lr_factor must be in [0, 1], got " +
                     std::to_string(s.minLrFactor));
  return {};
}

double lrFactor(const LrSchedule &s, int64_t step) {
  const LrPhases p = lrPhases(s);
  // LambdaLR's index of optimizer step `step`.
  int64_t current = step - 1;
  const int64_t warmupStable = p.warmup + p.stable;
  if (current < p.warmup)
    return static_cast<double>(current + 1) / static_cast<double>(p.warmup);
  if (current < warmupStable || p.decay == 0)
    return 1.0;
  double progress = static_cast<double>(current + 1 - warmupStable) /
                    static_cast<double>(p.decay);
  double adjustment = 0;
  switch (s.decayType) {
  case LrDecayType::Linear:
    adjustment = 1 - progress;
    break;
  case LrDecayType::Sqrt:
    adjustment = 1 - std::sqrt(progress);
    break;
  case LrDecayType::Cosine:
    adjustment = 0.5 * (1.0 + std::cos(M_PI * progress));
    break;
  }
  return s.minLrFactor + (1 - s.minLrFactor) * adjustment;
}

} // namespace meshplan
