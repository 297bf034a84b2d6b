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
