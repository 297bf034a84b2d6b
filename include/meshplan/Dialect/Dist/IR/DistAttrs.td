//===- DistAttrs.td - dist attributes ---------------------*- tablegen -*-===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISTATTRS_TD
#define MESHPLAN_DIALECT_DIST_IR_DISTATTRS_TD

include "meshplan/Dialect/Dist/IR/DistBase.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"

class Dist_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Dist_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def Dist_AxisRefAttr : Dist_Attr<"AxisRef", "axis"> {
  let summary = "A mesh axis or a sub-axis of one";
  let description = [{
    A whole axis, `#dist.axis<"tp">`, or a sub-axis in OpenXLA Shardy's
    notation, `#dist.axis<"dp":(2)2>`: reshape axis dp (size n) to
    (pre, size, n / (pre * size)) and take the middle dimension. Inside
    layouts and axis lists the `#dist.axis<...>` wrapper is omitted.
  }];
  // pre = size = 0 marks the whole axis, whatever its size.
  let parameters = (ins "::mlir::StringAttr":$name, "int64_t":$pre,
                        "int64_t":$size);
  let hasCustomAssemblyFormat = 1;
  let extraClassDeclaration = [{
    bool isWhole() const { return getSize() == 0; }
    static AxisRefAttr getWhole(::mlir::MLIRContext *ctx, ::llvm::StringRef name);
  }];
}

def Dist_LayoutAttr : Dist_Attr<"Layout", "layout"> {
  let summary = "How a tensor is split, replicated and left partial on a mesh";
  let description = [{
    Attached to a tensor type as its encoding:

    ```mlir
    tensor<4096x1024xbf16, #dist.layout<@world, [ {"tp", "dp"}, {} ]>>
    tensor<1024xf32, #dist.layout<@world, [ {} ], partial(sum) = {"dp"}>>
    tensor<5xf32, #dist.layout<@world, [ {("r", "s")} ]>>
    ```

    Per tensor dim, the ordered levels that split it, major to minor. Each
    level is one axis ref, or a parenthesised group of refs chunked once by
    their product (a flattened axis); the next level chunks that chunk again
    (`torch.chunk` semantics, so FSDP2's chunking of a tensor-parallel shard is
    `{"tp", "dp"}`). `partial(op)` lists the axes over which the value still
    needs a reduction. Every other axis of the mesh replicates the tensor.
  }];
  let parameters = (ins
    "::mlir::FlatSymbolRefAttr":$mesh,
    // One ArrayAttr per tensor dim, of levels (ArrayAttr of AxisRefAttr).
    "::mlir::ArrayAttr":$dims,
    // AxisRefAttr list.
    "::mlir::ArrayAttr":$partial,
    "::meshplan::dist::ReduceKind":$reduce
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    int64_t getRank() const { return getDims().size(); }
    /// Levels of dim d.
    ::mlir::ArrayAttr getLevels(int64_t d) const {
      return ::llvm::cast<::mlir::ArrayAttr>(getDims()[d]);
    }
  }];
}

def Dist_ViewAttr : Dist_Attr<"View", "view"> {
  let summary = "A view of a mesh, as the expression that made it";
  let description = [{
    `#dist.view<"slice(ddp,fsdp).slice(fsdp)">`: slices, flattens and
    unflattens chained with `.`, evaluated by meshplan's core over the root
    mesh (a submesh of a submesh is an ordinary view). A `dist.comm` may say
    which view it comes from; its verifier checks the view's groups are the
    comm's.
  }];
  let parameters = (ins "::mlir::StringAttr":$expr);
  let assemblyFormat = "`<` $expr `>`";
}

#endif // MESHPLAN_DIALECT_DIST_IR_DISTATTRS_TD
