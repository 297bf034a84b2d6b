//===- Pipeline.cpp - spec -> dist module -> passes -> plan template ------===//

#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Pipeline/OptimizerStep.h"

#include "meshplan/Dialect/Dist/IR/DistDialect.h"
#include "meshplan/Dialect/Dist/Transforms/Passes.h"
#include "meshplan/Pipeline/Export.h"
#include "meshplan/Support/Timing.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/ErrorHandling.h"

#include <algorithm>
#include <chrono>

using namespace mlir;
using namespace meshplan;
using namespace meshplan::pipeline;

const std::vector<std::string_view> &meshplan::pipeline::pipelinePasses() {
  static const std::vector<std::string_view> passes = {
      "dist-propagate-layouts", "dist-lower-redistribute",
      "dist-fuse-fp8-gather",   "dist-lower-optimizer",
      "dist-materialize-comms", "dist-schedule"};
  return passes;
}

static std::unique_ptr<Pass> createPass(std::string_view flag) {
  if (flag == "dist-propagate-layouts")
    return dist::createDistPropagateLayouts();
  if (flag == "dist-lower-redistribute")
    return dist::createDistLowerRedistribute();
  if (flag == "dist-fuse-fp8-gather")
    return dist::createDistFuseFp8Gather();
  if (flag == "dist-lower-optimizer")
    return dist::createDistLowerOptimizer();
  if (flag == "dist-materialize-comms")
    return dist::createDistMaterializeComms();
  return dist::createDistSchedule();
}

std::unique_ptr<MLIRContext> meshplan::pipeline::makeContext() {
  DialectRegistry registry;
  registry.insert<dist::DistDialect, func::FuncDialect, arith::ArithDialect>();
  auto context =
      std::make_unique<MLIRContext>(registry, MLIRContext::Threading::DISABLED);
  context->loadAllAvailableDialects();
  return context;
}

namespace {
/// Collects diagnostics so a failing stage reports them in its error.
struct DiagnosticCollector {
  explicit DiagnosticCollector(MLIRContext &context)
      : handler(&context, [this](Diagnostic &diag) {
          if (!text.empty())
            text += "\n";
          llvm::raw_string_ostream os(text);
          os << diag.getLocation() << ": " << diag;
          for (Diagnostic &note : diag.getNotes())
            os << "\n  note: " << note;
          return success();
        }) {}
  std::string text;
  ScopedDiagnosticHandler handler;
};

using Clock = SteadyClock;
} // namespace

Result<Compiled> meshplan::pipeline::compile(MLIRContext &context,
                                             const frontend::ResolvedSpec &spec,
                                             const CompileOptions &options) {
  DiagnosticCollector diagnostics(context);
  Compiled out;
  // A pipeline's program differs per pp coordinate (its stages, the
  // schedule's order): one compile per coordinate. (Callers that plan one
  // template for all ranks, and fuzz-spec, rely on "not planned yet".)
  if (spec.pipeline) {
    int64_t p = spec.pipeline->config.ranks;
    if (options.pipelineRank < 0 || options.pipelineRank >= p)
      return Error{"pipeline_parallel is not planned yet for pp coordinate " +
                   std::to_string(options.pipelineRank) +
                   ": a pipeline is planned one pp coordinate (0.." +
                   std::to_string(p - 1) + ") at a time"};
  }
  // The trainer's activations (docs/memory.md): an input error (the
  // context-parallel axis) is reported before anything is built.
  auto activations = estimateActivations(spec, options.import);
  if (!activations)
    return activations.error();
  auto start = Clock::now();
  out.module = importTrainStep(context, spec, options.import);
  out.timings.push_back({"import", secondsSince(start)});
  auto finishStage = [&](std::string_view stage) -> Result<void> {
    if (options.verifyEachStage && failed(verify(*out.module)))
      return Error("internal error: the module after " + std::string(stage) +
                   " does not verify:\n" + diagnostics.text);
    if (options.afterStage)
      return options.afterStage(stage, *out.module);
    return {};
  };
  if (auto ok = finishStage("import"); !ok)
    return ok.error();
  if (spec.pipeline) {
    PassManager pm(&context);
    pm.enableVerifier(false);
    dist::DistLowerPipelineOptions lower;
    lower.ppRank = options.pipelineRank;
    pm.addPass(dist::createDistLowerPipeline(lower));
    start = Clock::now();
    if (failed(pm.run(*out.module)))
      return Error("internal error: pass dist-lower-pipeline failed:\n" +
                   diagnostics.text);
    out.timings.push_back({"dist-lower-pipeline", secondsSince(start)});
    if (auto ok = finishStage("dist-lower-pipeline"); !ok)
      return ok.error();
  }
  for (std::string_view flag : pipelinePasses()) {
    PassManager pm(&context);
    pm.enableVerifier(false); // finishStage verifies (and says which stage)
    pm.addPass(createPass(flag));
    start = Clock::now();
    if (failed(pm.run(*out.module)))
      return Error("internal error: pass " + std::string(flag) + " failed:\n" +
                   diagnostics.text);
    out.timings.push_back({std::string(flag), secondsSince(start)});
    if (auto ok = finishStage(flag); !ok)
      return ok.error();
  }
  start = Clock::now();
  auto program = exportTemplate(*out.module);
  if (!program)
    return Error("internal error: export: " + program.error().message);
  out.program = std::move(*program);
  if (auto ok = planOptimizerStep(out.program, spec); !ok)
    return Error("internal error: " + ok.error().message);
  out.program.activations = std::move(activations->units);
  out.timings.push_back({"export", secondsSince(start)});
  return out;
}

Result<OwningOpRef<ModuleOp>>
meshplan::pipeline::specializeRank(ModuleOp module, int64_t rank) {
  MLIRContext &context = *module->getContext();
  DiagnosticCollector diagnostics(context);
  OwningOpRef<ModuleOp> copy = module.clone();
  PassManager pm(&context);
  dist::DistSpecializeRankOptions options;
  options.rank = rank;
  pm.addPass(dist::createDistSpecializeRank(options));
  if (failed(pm.run(*copy)))
    return Error("internal error: pass dist-specialize-rank failed:\n" +
                 diagnostics.text);
  return copy;
}

Result<CompiledTemplate>
meshplan::pipeline::compileTemplate(MLIRContext &context,
                                    const frontend::ResolvedSpec &spec,
                                    const CompileOptions &options) {
  auto compiled = compile(context, spec, options);
  if (!compiled)
    return compiled.error();
  auto prepared = plan::PreparedTemplate::prepare(compiled->program);
  if (!prepared)
    return Error{"internal error: the exported program is invalid: " +
                 prepared.error().message};
  return CompiledTemplate{std::move(*compiled), std::move(*prepared)};
}

int64_t meshplan::pipeline::PlannedSpec::pipelineRankOf(int64_t rank) const {
  if (!spec.pipeline)
    return 0;
  auto position = spec.mesh->positionOf(rank);
  return position ? spec.mesh->coordinateAt(*position, spec.pipeline->axisIndex)
                  : 0;
}

const plan::PreparedTemplate &meshplan::pipeline::PlannedSpec::first() const {
  for (const std::optional<plan::PreparedTemplate> &t : templates)
    if (t)
      return *t;
  // planSpec plans at least one template.
  llvm_unreachable("a PlannedSpec without a template");
}

const plan::PreparedTemplate &
meshplan::pipeline::PlannedSpec::templateFor(int64_t rank) const {
  size_t coordinate = size_t(pipelineRankOf(rank));
  if (coordinate < templates.size() && templates[coordinate])
    return *templates[coordinate];
  return first();
}

Result<PlannedSpec>
meshplan::pipeline::planSpec(frontend::ResolvedSpec spec,
                             const CompileOptions &options,
                             std::optional<std::vector<int64_t>> coordinates) {
  PlannedSpec out;
  out.context = makeContext();
  out.spec = std::move(spec);
  out.options = options;
  out.options.pipelineRank = -1;
  int64_t count = out.spec.pipeline ? out.spec.pipeline->config.ranks : 1;
  std::vector<int64_t> wanted;
  if (out.spec.pipeline && coordinates) {
    for (int64_t c : *coordinates)
      if (c < 0 || c >= count)
        return Error{"pp coordinate " + std::to_string(c) +
                     " does not exist (pipeline_parallel has " +
                     std::to_string(count) + ")"};
    wanted = *coordinates;
    std::sort(wanted.begin(), wanted.end());
    wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  } else {
    for (int64_t c = 0; c < count; ++c)
      wanted.push_back(c);
  }
  if (wanted.empty())
    return Error{"planSpec: no pp coordinate to plan"};
  out.templates.resize(size_t(count));
  for (int64_t c : wanted) {
    CompileOptions one = out.options;
    if (out.spec.pipeline)
      one.pipelineRank = c;
    auto planned = compileTemplate(*out.context, out.spec, one);
    if (!planned)
      return planned.error();
    out.compiled = std::move(planned->compiled);
    out.templates[size_t(c)].emplace(std::move(planned->prepared));
  }
  return out;
}
