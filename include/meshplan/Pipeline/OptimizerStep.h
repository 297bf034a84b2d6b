//===- OptimizerStep.h - Schedule, clipping and decay groups in a plan ----===//
//
// What the optimizer step of a real run adds to the exported program
// (docs/trainer.md, "The optimizer step"): the spec's learning-rate
// schedule and weight-decay groups go into the plan's optimizer record, and
// with `optimizer.max_norm` the program gets three instructions before its
// updates: `grad_norm` (each rank's exact partial norm of the gradients it
// counts), an `all_reduce` of that int64 buffer over core's gradNormAxes,
// and `clip_grad` (the coefficient, applied to every gradient in place).
// Every update then waits for the clip: the updates, and the frees of the
// gradients they read, move to the end of the program.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PIPELINE_OPTIMIZERSTEP_H
#define MESHPLAN_PIPELINE_OPTIMIZERSTEP_H

#include "meshplan/Core/Result.h"
#include "meshplan/Frontend/Spec.h"
#include "meshplan/Plan/Template.h"

namespace meshplan::pipeline {

/// Adds the spec's schedule, clipping and no-decay parameters to an
/// exported program (a no-op for a spec without them).
Result<void> planOptimizerStep(plan::ProgramTemplate &program,
                               const frontend::ResolvedSpec &spec);

} // namespace meshplan::pipeline

#endif // MESHPLAN_PIPELINE_OPTIMIZERSTEP_H
