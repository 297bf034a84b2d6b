//===- DistBase.td - The dist dialect ---------------------*- tablegen -*-===//
//
// The dist dialect describes a training step on a device mesh: meshes,
// layouts attached to tensors, redistributions and the collectives they lower
// to. All semantics (groups, boxes, plans) come from meshplan's core library;
// the dialect's verifiers and passes call it.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISTBASE_TD
#define MESHPLAN_DIALECT_DIST_IR_DISTBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Dist_Dialect : Dialect {
  let name = "dist";
  let cppNamespace = "::meshplan::dist";
  let summary = "Device meshes, tensor layouts and collectives";
  let description = [{
    A `dist.mesh` names the axes of an N-D device mesh. Tensors carry a
    `#dist.layout` as their type's encoding: per tensor dim the ordered
    levels of mesh axes that split it, and the axes over which the value is
    still partial. `dist.redistribute` changes a layout; lowering turns it
    into the collectives meshplan's core plans (`dist.all_gather`,
    `dist.reduce_scatter`, `dist.all_reduce`, `dist.all_to_all`,
    `dist.permute`, `dist.local_slice`), each over the ranks that vary along
    its axes.
  }];
  let useDefaultAttributePrinterParser = 1;
  // The discardable attributes the passes, import and export exchange: the
  // one place their names are spelled. ODS generates a typed accessor per
  // attribute (`DistDialect::MicrobatchAttrHelper`, its `getNameStr()` for
  // argument attributes); the verifiers below check each one's type and
  // values (DiscardableAttrs.cpp). They stay discardable because they annotate
  // ops of other dialects (func.func, arith.addf) and function arguments.
  // docs/dialect.md "Discardable attributes" says what each one means.
  let discardableAttrs = (ins
    // On func.func: the training step and its step-level choices.
    "::mlir::UnitAttr":$train_step,
    "::mlir::FlatSymbolRefAttr":$pipeline,
    "::mlir::BoolAttr":$reshard_after_forward,
    "::mlir::IntegerAttr":$gradient_accumulation_steps,
    "::mlir::DictionaryAttr":$optimizer,
    "::mlir::ArrayAttr":$trainer_axes,
    // A dictionary on the function; a unit mark on a parameter argument.
    "::mlir::DictionaryAttr":$float8,
    "::mlir::IntegerAttr":$pp_rank,
    "::mlir::StringAttr":$pp_axis,
    // On the module after dist-specialize-rank.
    "::mlir::IntegerAttr":$rank,
    // On ops of the step: pipeline replay and gradient accumulation.
    "::mlir::IntegerAttr":$microbatch,
    "::mlir::StringAttr":$action,
    "::mlir::UnitAttr":$accumulate,
    // On ops of the step: the schedule dist-schedule sets.
    "::mlir::IntegerAttr":$id,
    "::mlir::StringAttr":$stream,
    "::mlir::DenseI64ArrayAttr":$after,
    "::mlir::IntegerAttr":$bucket,
    // On function arguments.
    "::meshplan::dist::LayoutAttr":$layout,
    "::mlir::StringAttr":$param,
    "::mlir::IntegerAttr":$tensor_id,
    "::mlir::StringAttr":$state
  );
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  // Attribute storage is only complete in DistAttrs.cpp, which registers them.
  let extraClassDeclaration = [{
    void registerAttributes();
    /// Memoized core conversions of this context's (uniqued) attributes;
    /// see CoreBridge.h.
    ::meshplan::dist::CoreCache &getCoreCache() const { return *coreCache; }

  private:
    std::shared_ptr<::meshplan::dist::CoreCache> coreCache;

  public:
  }];
}

def Dist_ReduceOp : I32EnumAttr<"ReduceKind", "pending or performed reduction", [
  I32EnumAttrCase<"Sum", 0, "sum">,
  I32EnumAttrCase<"Avg", 1, "avg">,
  I32EnumAttrCase<"Max", 2, "max">,
  I32EnumAttrCase<"Min", 3, "min">,
  I32EnumAttrCase<"Product", 4, "product">
]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::meshplan::dist";
}

def Dist_ReduceOpAttr : EnumAttr<Dist_Dialect, Dist_ReduceOp, "reduce"> {
  let assemblyFormat = "$value";
}

#endif // MESHPLAN_DIALECT_DIST_IR_DISTBASE_TD
