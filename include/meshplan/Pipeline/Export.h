//===- Export.h - A scheduled dist module as a plan template --------------===//
//
// Export is a translation, not a decision: every op of the scheduled
// `dist.train_step` function becomes one plan instruction (the collectives
// of one `dist.bucket` become one, and so do the `dist.adamw` updates of one
// FSDP unit), every value one buffer, every `dist.comm` one communicator
// template. Deps are the producers of an op's operands on other streams plus
// its `dist.after`. Counts, buffer boxes and groups come from core (padded
// shapes, shardOf, groupOf) when the template is instantiated per rank.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PIPELINE_EXPORT_H
#define MESHPLAN_PIPELINE_EXPORT_H

#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Template.h"

#include "mlir/IR/BuiltinOps.h"

namespace meshplan::pipeline {

/// The program of the module's `dist.train_step` function (after
/// dist-schedule). Errors name the op that cannot be exported.
Result<plan::ProgramTemplate> exportTemplate(mlir::ModuleOp module);

} // namespace meshplan::pipeline

#endif // MESHPLAN_PIPELINE_EXPORT_H
