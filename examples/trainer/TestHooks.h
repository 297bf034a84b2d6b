//===- TestHooks.h - meshplan-train's fault-injection hooks -----*- C++ -*-===//
//
// Each reads its environment variable once; each does nothing when it is
// unset. See TestHooks.cpp for the variables.
//
//===----------------------------------------------------------------------===//

#ifndef MESHPLAN_EXAMPLES_TRAINER_TESTHOOKS_H
#define MESHPLAN_EXAMPLES_TRAINER_TESTHOOKS_H

#include "meshplan/Runtime/Session.h"

#include <cstdint>

namespace meshplan::trainer {

/// MESHPLAN_TEST_STEP_DELAY_MS: sleep before each step.
void delayStepForTests();
/// MESHPLAN_TEST_HOLD="S:PATH": after step S, wait until PATH exists.
void holdStepForTests(int64_t stepsDone);
/// MESHPLAN_TEST_NAN_GRAD_STEP: a NaN in the embedding's gradient.
void poisonGradientForTests(runtime::ComputeCall &call);
/// MESHPLAN_TEST_KILL="STEP:RANK[,RANK...][:WHEN]": SIGKILL itself.
void maybeKillForTests(const runtime::ComputeCall &call, int64_t rank);

} // namespace meshplan::trainer

#endif // MESHPLAN_EXAMPLES_TRAINER_TESTHOOKS_H
