//===- Import.h - A model and a spec as a dist training-step module -------===//
//
// Import is where the spec's words become layouts. It builds one
// rank-independent module: the mesh, and a `func.func @train_step` whose
// arguments are the parameters in their stored (FSDP-sharded) layouts and
// whose body is the step as the trainer sees it: per FSDP unit, the cast to
// the mixed-precision dtype and a dist.redistribute to the compute layout
// (the TP split only), the forward callback; in reverse, the backward
// callback returning gradients partial over the data-parallel axes, and one
// dist.optimizer_step per parameter. docs/dialect.md "The training step"
// fixes these conventions; the passes refine them (collectives, float8,
// optimizer, schedule) and export turns the result into per-rank plans.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PIPELINE_IMPORT_H
#define MESHPLAN_PIPELINE_IMPORT_H

#include "meshplan/Core/Layout.h"
#include "meshplan/Frontend/Spec.h"
#include "meshplan/Plan/CostModel.h"
#include "meshplan/Plan/Template.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshplan::pipeline {

/// The work per microbatch, for the cost model's FLOP and activation
/// estimates (the spec states parallelism, not the batch): tokens each
/// data-parallel rank processes per microbatch (torchtitan's local batch x
/// sequence length; the ranks of its TP group share them, context
/// parallelism splits them), and the sequence length (attention's cost).
struct ImportOptions {
  int64_t tokensPerMicrobatch = 8192;
  int64_t sequenceLength = 8192;
  /// The extra axis that splits each sequence (context parallelism): unset
  /// picks an extra axis named "cp" (torchtitan's mesh dim name) if the
  /// spec has one; "" means none; a name must be one of the spec's extra
  /// axes (contextParallelAxis).
  std::optional<std::string> contextParallelAxis;
};

/// The context-parallel axis ImportOptions::contextParallelAxis selects,
/// "" for none; an error names the axis when it is not an extra axis.
Result<std::string> contextParallelAxis(const frontend::ResolvedSpec &spec,
                                        const ImportOptions &options);

/// The trainer's activation memory per microbatch (plan/CostModel.h,
/// docs/memory.md) by FSDP unit, and what it was computed from.
struct ActivationEstimate {
  /// Tokens on each rank: ceil(tokensPerMicrobatch / context-parallel size).
  int64_t tokensPerRank = 0;
  std::string contextAxis; ///< "" when there is no context parallelism
  int64_t contextSize = 1;
  int64_t dtypeBytes = 0; ///< the compute dtype's (mixed_precision)
  plan::Recompute policy = plan::Recompute::None;
  int64_t blocks = 0; ///< transformer blocks counted
  /// By unit name, as ProgramTemplate::activations.
  std::map<std::string, plan::UnitActivation> units;
};

/// Estimates the activations of every transformer block (a block module
/// with an attention child and a feed_forward child), the token ids of
/// embeddings and the final norm, output projection and loss of an output
/// module, each charged to the FSDP unit holding the module's first
/// parameter; other modules keep nothing. Shapes come from the parameters
/// (h = wq's in features, d = wq's out features / n_heads, f = w1's out
/// features; a feed_forward with three linears is gated) and TP from the
/// spec's styles (colwise wq, colwise w1, sequence-parallel norms, colwise
/// output). Errors: as contextParallelAxis.
Result<ActivationEstimate>
estimateActivations(const frontend::ResolvedSpec &spec,
                    const ImportOptions &options = {});

/// One FSDP unit: the parameters gathered together and run by one callback.
struct Unit {
  std::string name;        ///< "tok_embeddings", "layers.3", "norm+output"
  std::vector<int> params; ///< indices into ResolvedSpec::params
  double forwardFlops = 0; ///< per rank, per microbatch
  /// Forward FLOPs backward runs again under the spec's activation
  /// checkpointing: transformer blocks' whole forward under "full"; under
  /// "selective" the matmuls torchtitan's policy does not keep (wk, wo, w3).
  double recomputeFlops = 0;
  /// Freed after forward and gathered again for backward (the spec's
  /// reshard_after_forward policy applied to this unit).
  bool reshardAfterForward = true;
};

/// The units of a resolved spec (ResolvedSpec::units, from the spec's
/// data_parallel.units: by default torchtitan's apply_fsdp grouping), in
/// forward order, with their FLOPs.
std::vector<Unit> fsdpUnits(const frontend::ResolvedSpec &spec,
                            const ImportOptions &options = {});

/// Where one parameter lives: stored (between steps, what the optimizer
/// updates), computed with (gathered), and its gradient (partial over the
/// data-parallel axes). Derived from the spec's roles in one place.
///
/// A sequence-parallel weight (replicated over TP while its activations are
/// split along the sequence) gets a gradient that is a *sum* over TP on top
/// of the data-parallel *average*, and a layout states one reduce op. So
/// backward returns it stacked: one leading dim of TP-size rows, split over
/// TP (each rank's own contribution), partial(avg) over the data-parallel
/// axes. The plan reduces it over the data-parallel axes into `stackedStored`
/// (the stored layout under a TP-split leading dim), sums the rows locally
/// (`dist.reduce_sum`, partial(sum) over TP) and all-reduces over TP into the
/// stored layout.
struct ParamLayouts {
  Layout stored;
  Layout compute;
  Layout grad;
  bool stacked = false; ///< grad has the leading TP dim
  Layout stackedStored; ///< when stacked
};
ParamLayouts paramLayouts(const frontend::ResolvedSpec &spec,
                          const frontend::ParamAssignment &param);

/// Builds the training-step module (see file comment) in `context`, which
/// must have the dist, func and arith dialects loaded.
mlir::OwningOpRef<mlir::ModuleOp>
importTrainStep(mlir::MLIRContext &context, const frontend::ResolvedSpec &spec,
                const ImportOptions &options = {});

} // namespace meshplan::pipeline

#endif // MESHPLAN_PIPELINE_IMPORT_H
