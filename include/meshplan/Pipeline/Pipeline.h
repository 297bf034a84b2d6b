//===- Pipeline.h - spec -> dist module -> passes -> plan template --------===//
//
// The planner's main job in one place:
//
//   import [-> dist-lower-pipeline] -> dist-propagate-layouts
//     -> dist-lower-redistribute
//     -> dist-fuse-fp8-gather -> dist-lower-optimizer -> dist-materialize-comms
//     -> dist-schedule -> export (one rank-independent ProgramTemplate)
//
// and then one plan per rank from the template (plan::PreparedTemplate),
// which asks core for that rank's groups and boxes. `dist-specialize-rank`
// is the same per-rank step on the IR; `meshplan plan --rank R --dump-ir`
// runs it to show one rank's program.
//
// Input errors are the frontend's (located, before anything is built); a
// pass failing on an imported module is a planner bug and is reported as an
// internal error with the pass's diagnostics.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PIPELINE_PIPELINE_H
#define MESHPLAN_PIPELINE_PIPELINE_H

#include "meshplan/Pipeline/Import.h"
#include "meshplan/Plan/Template.h"

#include "mlir/IR/MLIRContext.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::pipeline {

/// Pass flags in pipeline order (after "import").
const std::vector<std::string_view> &pipelinePasses();

/// A context with every dialect the pipeline uses loaded, single-threaded
/// (the machines this runs on are small; the passes are linear).
std::unique_ptr<mlir::MLIRContext> makeContext();

struct StageTiming {
  std::string stage; ///< "import", a pass flag, "export"
  double seconds = 0;
};

struct CompileOptions {
  ImportOptions import;
  /// Called with the module after import and after every pass (IR dumps).
  std::function<Result<void>(std::string_view stage, mlir::ModuleOp)>
      afterStage;
  /// Verify the module after every stage (on by default; the bench turns it
  /// off to time the passes alone).
  bool verifyEachStage = true;
  /// Under pipeline_parallel: the pp coordinate whose program to plan
  /// (dist-lower-pipeline's pp-rank). Ranks at one pp coordinate share one
  /// template; a pipelined spec without it is refused.
  int64_t pipelineRank = -1;
};

struct Compiled {
  mlir::OwningOpRef<mlir::ModuleOp> module; ///< after dist-schedule
  plan::ProgramTemplate program;
  std::vector<StageTiming> timings;
};

/// Runs import, the passes and export.
Result<Compiled> compile(mlir::MLIRContext &context,
                         const frontend::ResolvedSpec &spec,
                         const CompileOptions &options = {});

/// Runs dist-specialize-rank{rank} on a copy of a compiled module.
Result<mlir::OwningOpRef<mlir::ModuleOp>> specializeRank(mlir::ModuleOp module,
                                                         int64_t rank);

/// compile, then PreparedTemplate::prepare: one template ready to
/// instantiate, with what compile made it from.
struct CompiledTemplate {
  Compiled compiled;
  plan::PreparedTemplate prepared;
};
Result<CompiledTemplate> compileTemplate(mlir::MLIRContext &context,
                                         const frontend::ResolvedSpec &spec,
                                         const CompileOptions &options = {});

/// A spec planned: the one way the CLI (plan, explain, trace, the ckpt
/// commands) and meshplan-train turn a resolved spec into the templates
/// every rank's plan is instantiated from. Without pipeline_parallel one
/// template serves every rank; with it, one per pp coordinate (the ranks at
/// a coordinate share its stages and schedule).
struct PlannedSpec {
  /// Owns `compiled.module`; declared first, so that it goes last.
  std::unique_ptr<mlir::MLIRContext> context;
  frontend::ResolvedSpec spec;
  /// What the templates were compiled with (pipelineRank aside).
  CompileOptions options;
  /// Per pp coordinate (one entry without a pipeline): its template, where
  /// it was planned.
  std::vector<std::optional<plan::PreparedTemplate>> templates;
  /// compile's output for the last template planned (the IR that `plan
  /// --dump-ir` specializes, the stage timings).
  Compiled compiled;

  /// The pp coordinate of `rank` (0 without a pipeline).
  int64_t pipelineRankOf(int64_t rank) const;
  /// The first template planned.
  const plan::PreparedTemplate &first() const;
  /// The template `rank`'s plan is instantiated from: its coordinate's, or
  /// the first one where that coordinate was not planned.
  const plan::PreparedTemplate &templateFor(int64_t rank) const;
};

/// Plans `spec` with `options` (its pipelineRank is ignored): every pp
/// coordinate under a pipeline, or only `coordinates` when given (at least
/// one). Errors are compile's (located input errors, or internal ones).
Result<PlannedSpec>
planSpec(frontend::ResolvedSpec spec, const CompileOptions &options = {},
         std::optional<std::vector<int64_t>> coordinates = std::nullopt);

} // namespace meshplan::pipeline

#endif // MESHPLAN_PIPELINE_PIPELINE_H
