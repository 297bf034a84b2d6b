//===- DistOps.td - dist operations -----------------------*- tablegen -*-===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISTOPS_TD
#define MESHPLAN_DIALECT_DIST_IR_DISTOPS_TD

include "meshplan/Dialect/Dist/IR/DistAttrs.td"
include "meshplan/Dialect/Dist/IR/DistInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

class Dist_Op<string mnemonic, list<Trait> traits = []>
    : Op<Dist_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Symbols
//===----------------------------------------------------------------------===//

def Dist_MeshOp : Dist_Op<"mesh", [Symbol]> {
  let summary = "An N-D device mesh with named axes";
  let description = [{
    ```mlir
    dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
    dist.mesh @ft ["dp_replicate" = 3, "dp_shard" = 4] managed = ["dp_replicate"]
    dist.mesh @perm ["dp" = 2, "tp" = 2] order = [3, 2, 1, 0]
    ```
    Axes are listed major to minor. Without `order`, the device at row-major
    position i is rank i. A managed axis has a nominal size but its live
    membership is supplied at run time (fault-tolerant replicas).
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axis_names,
                       DenseI64ArrayAttr:$shape,
                       OptionalAttr<StrArrayAttr>:$managed,
                       OptionalAttr<DenseI64ArrayAttr>:$device_order);
  let assemblyFormat = [{
    $sym_name custom<DistMeshAxes>($axis_names, $shape)
    (`managed` `=` $managed^)? (`order` `=` $device_order^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Dist_CommOp : Dist_Op<"comm", [Symbol,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "A communicator: the partition of a mesh into ordered groups";
  let description = [{
    ```mlir
    dist.comm @comm_fsdp on @world axes {"fsdp"}
    dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
    ```
    Each group holds the ranks that differ only along `axes` (major to minor),
    in mixed-radix order. `dist-materialize-comms` creates one per distinct
    partition; collectives then name it with `comm = @...`.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, FlatSymbolRefAttr:$mesh,
                       ArrayAttr:$axes, OptionalAttr<Dist_ViewAttr>:$view);
  let assemblyFormat = [{
    $sym_name `on` $mesh `axes` custom<DistAxisList>($axes)
    (`view` `=` qualified($view)^)? attr-dict
  }];
}

//===----------------------------------------------------------------------===//
// Layout changes
//===----------------------------------------------------------------------===//

class Dist_LayoutOp<string mnemonic, list<Trait> traits = []>
    : Dist_Op<mnemonic, !listconcat(traits, [Pure,
        DeclareOpInterfaceMethods<SymbolUserOpInterface>])> {
  let results = (outs AnyRankedTensor:$result);
}

def Dist_AnnotateOp : Dist_LayoutOp<"annotate"> {
  let summary = "Declares the layout of a value";
  let description = [{
    ```mlir
    %w = dist.annotate %0 : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [ {"tp", "dp"}, {} ]>>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
}

def Dist_RedistributeOp : Dist_LayoutOp<"redistribute"> {
  let summary = "Changes the layout of a value (lowered to collectives)";
  let arguments = (ins AnyRankedTensor:$input);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
}

//===----------------------------------------------------------------------===//
// Collectives. Types are global tensors with layouts; each collective changes
// the layout in exactly one way, which its verifier checks with core.
//===----------------------------------------------------------------------===//

// Global form: operand and result carry layouts and the verifier checks the
// step with core. Rank-local form (after dist-specialize-rank): plain local
// tensors, and `group` lists this rank's group members in order.
class Dist_CollectiveOp<string mnemonic, dag extraArgs, string extraFormat>
    : Dist_LayoutOp<mnemonic> {
  let arguments = !con((ins AnyRankedTensor:$input, ArrayAttr:$axes),
                       extraArgs,
                       (ins OptionalAttr<FlatSymbolRefAttr>:$comm,
                            OptionalAttr<DenseI64ArrayAttr>:$group));
  let assemblyFormat = "$input " # extraFormat #
      " `over` custom<DistAxisList>($axes) (`comm` `=` $comm^)?"
      " (`group` `=` $group^)? attr-dict"
      " `:` type($input) `->` type($result)";
}

def Dist_AllGatherOp : Dist_CollectiveOp<"all_gather",
    (ins I64Attr:$dim), "`dim` $dim"> {
  let summary = "Drops the minor-most levels of a dim by gathering over them";
}

def Dist_ReduceScatterOp : Dist_CollectiveOp<"reduce_scatter",
    (ins I64Attr:$dim, Dist_ReduceOpAttr:$reduce),
    "`dim` $dim custom<DistReduce>($reduce)"> {
  let summary = "Reduces partial axes and splits a dim by them";
}

def Dist_AllReduceOp : Dist_CollectiveOp<"all_reduce",
    (ins Dist_ReduceOpAttr:$reduce), "custom<DistReduce>($reduce)"> {
  let summary = "Reduces partial axes; the result is replicated over them";
}

def Dist_AllToAllOp : Dist_CollectiveOp<"all_to_all",
    (ins I64Attr:$src_dim, I64Attr:$dst_dim), "`dim` $src_dim `to` $dst_dim"> {
  let summary = "Moves the minor-most levels of one dim to the end of another";
}

def Dist_PermuteOp : Dist_CollectiveOp<"permute",
    (ins I64Attr:$dim, ArrayAttr:$dst_axes),
    "`dim` $dim `to` custom<DistAxisList>($dst_axes)"> {
  let summary = "Reorders the minor-most levels of an evenly split dim";
}

def Dist_LocalSliceOp : Dist_CollectiveOp<"local_slice",
    (ins I64Attr:$dim), "`dim` $dim"> {
  let summary = "Splits a dim by replicated axes, keeping the local chunk";
}

def Dist_MarkPartialOp : Dist_CollectiveOp<"mark_partial",
    (ins Dist_ReduceOpAttr:$reduce), "custom<DistReduce>($reduce)"> {
  let summary = "Declares replicated axes partial (no data moves)";
}

def Dist_BroadcastOp : Dist_CollectiveOp<"broadcast",
    (ins I64Attr:$root), "`root` $root"> {
  let summary = "Copies the value of the group's member `root` to all members";
}

//===----------------------------------------------------------------------===//
// Model ops: the few whose layout rules are not elementwise. Elementwise math
// uses upstream `arith` ops on tensors.
//===----------------------------------------------------------------------===//

class Dist_ModelOp<string mnemonic, list<Trait> traits = []>
    : Dist_Op<mnemonic, !listconcat(traits, [Pure,
        DeclareOpInterfaceMethods<Dist_LayoutRuleOpInterface>])>;

def Dist_MatmulOp : Dist_ModelOp<"matmul"> {
  let summary = "C[M,N] = A[M,K] x B[K,N]";
  let description = [{
    Linear layers under tensor parallelism: a column-wise weight
    (`B` split on N) gives `C` split on N; a row-wise weight (`A` and `B` split
    on K by the same axes) gives `C` partial(sum) over them.
  }];
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Dist_BitcastOp : Dist_ModelOp<"bitcast"> {
  let summary = "Reinterprets the last dim's bytes as another element type";
  let description = [{
    `view(dtype)`: fp32 x n as bf16 x 2n, or fp8 x 4n as fp32 x n. Each rank
    keeps its own bytes when the last dim splits evenly in both shapes, which
    is what makes a stochastic-rounding optimizer update on an FSDP shard a
    purely local computation.
  }];
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Dist_ReshapeOp : Dist_ModelOp<"reshape"> {
  let summary = "Same elements, another shape (row-major)";
  let description = [{
    A dim's split survives a reshape only where each rank keeps whole
    rows: unchanged dims, a merge whose major dim splits evenly (and whose
    other dims are unsplit), a split whose new major dim splits evenly.
  }];
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Dist_ReduceSumOp : Dist_ModelOp<"reduce_sum"> {
  let summary = "Sums over dims (removing them)";
  let description = [{
    A split of a reduced dim becomes a pending partial(sum) of the result: the
    cross-rank reduction is left to a later all_reduce or reduce_scatter.
  }];
  let arguments = (ins AnyRankedTensor:$input, DenseI64ArrayAttr:$dims);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat =
      "$input `dims` `=` $dims attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

#endif // MESHPLAN_DIALECT_DIST_IR_DISTOPS_TD
