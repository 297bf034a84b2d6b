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
    (ins Dist_ReduceOpAttr:$reduce, UnitAttr:$fault_tolerant),
    "custom<DistReduce>($reduce) (`fault_tolerant` $fault_tolerant^)?"> {
  let summary = "Reduces partial axes; the result is replicated over them";
  let description = [{
    `fault_tolerant` marks a reduction over a managed axis whose live
    members are known only at run time (torchft replicas); only allowed
    when `axes` include a managed axis.
  }];
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


//===----------------------------------------------------------------------===//
// Training-step ops: what the planner schedules around the collectives. The
// step is a func.func with `dist.train_step`; parameters, and after
// dist-lower-optimizer their optimizer state, are its arguments.
//===----------------------------------------------------------------------===//

// A zero-bubble pipeline schedule splits a stage's backward into the input
// gradient (sent upstream at once) and the weight gradient (run later, to
// fill the bubble); see docs/pipeline.md.
def Dist_PhaseAttr : I32EnumAttr<"Phase", "training-step phase", [
  I32EnumAttrCase<"Forward", 0, "forward">,
  I32EnumAttrCase<"Backward", 1, "backward">,
  I32EnumAttrCase<"BackwardInput", 2, "backward_input">,
  I32EnumAttrCase<"BackwardWeight", 3, "backward_weight">
]> {
  let cppNamespace = "::meshplan::dist";
}

def Dist_ComputeOp : Dist_Op<"compute",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "A trainer callback: forward or backward of one module";
  let description = [{
    ```mlir
    dist.compute forward "layers.0" (%wq, %wk) flops = 2.4e+09 : tensor<...>, tensor<...>
    %gq, %gk = dist.compute backward "layers.0" (%wq, %wk) : tensor<...>, tensor<...> -> tensor<...>, tensor<...>
    ```
    The trainer owns the math; meshplan only needs what the callback reads
    (gathered parameters, float8 scales) and, in backward, the gradients it
    produces: gradient i belongs to input i, with its shape, or stacked
    under one leading dim (a sequence-parallel weight's rows, one per TP
    rank), in a layout partial over the data-parallel axes. `flops` is the
    cost model's estimate.

    Under pipeline parallelism (`dist.pipeline`) each compute names the
    `stage` it belongs to, and activations travel between stages as
    rank-local tensors (no layout; each data-parallel rank has its own
    microbatch), which may sit among laid-out values:
    ```mlir
    %a = dist.compute forward "layers.1" (%w1) stage 0 : tensor<...> -> tensor<16x8xbf16>
    %x = dist.recv on @pp_0_1 from 0 tag "F s0 mb0" : tensor<16x8xbf16>
    dist.compute forward "layers.2" (%w2, %x) stage 1 : tensor<...>, tensor<16x8xbf16>
    ```
    A stage's forward may produce one value: the activation handed to the
    next stage. Its backward reads the output gradient as its last input
    and, if it reads the stage's input activation, produces that
    activation's gradient in the activation's position, like any other
    input's gradient. `backward_input` and `backward_weight` (zero-bubble
    schedules, pipeline stages only) split a backward into the input
    gradient (the activation's, nothing else) and the weight gradients.
  }];
  let arguments = (ins Dist_PhaseAttr:$phase, StrAttr:$module,
                       Variadic<AnyRankedTensor>:$inputs,
                       OptionalAttr<F64Attr>:$flops,
                       OptionalAttr<I64Attr>:$stage);
  let results = (outs Variadic<AnyRankedTensor>:$grads);
  let assemblyFormat = [{
    $phase $module `(` $inputs `)` (`stage` $stage^)? (`flops` `=` $flops^)?
    attr-dict (`:` type($inputs)^)? (`->` type($grads)^)?
  }];
  let hasVerifier = 1;
}

def Dist_OptimizerStepOp : Dist_Op<"optimizer_step",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Updates one parameter from its gradient (before lowering)";
  let description = [{
    ```mlir
    dist.optimizer_step %w, %grad : tensor<64x64xf32, #stored>, tensor<64x64xbf16, #partial>
    ```
    `%w` is a parameter argument in its stored (sharded) layout; `%grad` may
    be in any layout on the same mesh, typically the compute layout left
    partial over the data-parallel axes. The hyper-parameters are the
    function's `dist.optimizer` dictionary. `dist-lower-optimizer` turns this
    into the gradient reduction and a `dist.adamw` on the stored shard.
  }];
  let arguments = (ins AnyRankedTensor:$param, AnyRankedTensor:$grad);
  let assemblyFormat = [{
    $param `,` $grad attr-dict `:` type($param) `,` type($grad)
  }];
}

def Dist_AdamWOp : Dist_Op<"adamw",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     AllTypesMatch<["param", "new_param"]>,
     AllTypesMatch<["exp_avg", "new_exp_avg"]>,
     AllTypesMatch<["exp_avg_sq", "new_exp_avg_sq"]>]> {
  let summary = "Fused per-shard AdamW update (optional bf16 stochastic rounding)";
  let description = [{
    ```mlir
    %p2, %m2, %v2 = dist.adamw %p, %g, %m, %v {lr = 3.0e-4, beta1 = 0.9,
        beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1,
        stochastic_rounding, seed = 7, tensor_id = 3}
        : tensor<...>, tensor<...>, tensor<...>, tensor<...>
    ```
    Every operand is the same shard of one parameter: the verifier checks
    that all four have the same shape and the same (non-partial) layout, so
    the update is purely local and no gather can hide in it. With
    `stochastic_rounding` the parameter is bfloat16 and the fp32 update is
    rounded stochastically with random bits drawn from (seed, step,
    tensor_id, global element index), so the result does not depend on the
    layout. State `%m`, `%v` is fp32.
  }];
  let arguments = (ins AnyRankedTensor:$param, AnyRankedTensor:$grad,
                       AnyRankedTensor:$exp_avg, AnyRankedTensor:$exp_avg_sq,
                       F64Attr:$lr, F64Attr:$beta1, F64Attr:$beta2,
                       F64Attr:$eps, F64Attr:$weight_decay,
                       UnitAttr:$stochastic_rounding, I64Attr:$seed,
                       I64Attr:$tensor_id);
  let results = (outs AnyRankedTensor:$new_param,
                      AnyRankedTensor:$new_exp_avg,
                      AnyRankedTensor:$new_exp_avg_sq);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq attr-dict `:`
    type($param) `,` type($grad) `,` type($exp_avg) `,` type($exp_avg_sq)
  }];
  let hasVerifier = 1;
}

def Dist_Fp8AmaxOp : Dist_Op<"fp8_amax",
    [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Local absolute maxima of float8 weights' shards";
  let description = [{
    ```mlir
    %a = dist.fp8_amax %wq, %wk : tensor<...>, tensor<...> -> tensor<2xf32, #dist.layout<@m, [ {} ], partial(max) = {"fsdp"}>>
    ```
    Element i is the largest |x| of operand i's local shard (0 for an empty
    shard). The result is partial(max) over exactly the axes that split the
    operands, which must be the same for all of them: one MAX all-reduce
    over those axes gives every rank the global amaxes.
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$inputs);
  let results = (outs AnyRankedTensor:$amax);
  let assemblyFormat =
      "$inputs attr-dict `:` type($inputs) `->` type($amax)";
}

def Dist_Fp8CastOp : Dist_Op<"fp8_cast",
    [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Casts a shard to float8 with a tensorwise scale";
  let description = [{
    ```mlir
    %q = dist.fp8_cast %w scale %amax[0] power_of_2 : tensor<64x64xbf16, #L>, tensor<2xf32, #R> -> tensor<64x64xf8E4M3FN, #L>
    ```
    scale = max_finite(float8) / max(amax[index], tiny), rounded down to a
    power of two with `power_of_2`. Only the element type changes; the
    layout stays, so the all-gather that follows moves one byte per
    element. `%amax` must be replicated (already all-reduced).
  }];
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$amax,
                       I64Attr:$index, UnitAttr:$power_of_2);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    $input `scale` $amax `[` $index `]` (`power_of_2` $power_of_2^)? attr-dict
    `:` type($input) `,` type($amax) `->` type($result)
  }];
}

//===----------------------------------------------------------------------===//
// Pipeline parallelism: the schedule, point-to-point communicators and
// transfers. Orders and placements come from core (PipelineSchedule.h).
//===----------------------------------------------------------------------===//

def Dist_PipelineScheduleOp : Dist_Op<"pipeline", [Symbol,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "A pipeline-parallel schedule over one mesh axis";
  let description = [{
    ```mlir
    dist.pipeline @pipe on @m axis "pp" schedule "interleaved_1f1b" microbatches 8 stages_per_rank 2 activation tensor<8192x4096xbf16>
    ```
    The model is cut into `size(axis) * stages_per_rank` stages, laid onto
    the coordinates of `axis` by the schedule's placement (loop, or V for
    `zbv`); `schedule` is one of core's (`gpipe`, `1f1b`,
    `interleaved_1f1b`, `zbv`) and `microbatches` must satisfy its rule
    (docs/pipeline.md). `activation` is one microbatch's activation on one
    rank as it crosses a stage boundary (its gradient has the same type):
    a rank-local tensor, without a layout. A `dist.train_step` function
    names its pipeline with `dist.pipeline = @pipe`;
    `dist-lower-pipeline` expands its stages into one pp rank's program.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, FlatSymbolRefAttr:$mesh,
                       StrAttr:$axis, StrAttr:$schedule, I64Attr:$microbatches,
                       I64Attr:$stages_per_rank, TypeAttr:$activation);
  let assemblyFormat = [{
    $sym_name `on` $mesh `axis` $axis `schedule` $schedule
    `microbatches` $microbatches `stages_per_rank` $stages_per_rank
    `activation` $activation attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The core schedule configuration with the axis size `ranks`, or an
    /// error naming the schedule.
    ::mlir::FailureOr<::meshplan::PipelineScheduleConfig>
    getConfig(int64_t ranks);
  }];
}

def Dist_PairOp : Dist_Op<"pair", [Symbol,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "A point-to-point communicator: two coordinates of one axis";
  let description = [{
    ```mlir
    dist.pair @pp_0_1 on @m axis "pp" coords [0, 1]
    ```
    Every rank whose coordinate along `axis` is one of `coords` belongs to
    the pair made of it and the rank at the other coordinate, all other
    coordinates equal; the member at `coords[i]` has key i. Pipeline stages
    on neighbouring pp ranks exchange activations on such pairs; one exists
    only for the pairs a program uses.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, FlatSymbolRefAttr:$mesh,
                       StrAttr:$axis, DenseI64ArrayAttr:$coords);
  let assemblyFormat = [{
    $sym_name `on` $mesh `axis` $axis `coords` `=` $coords attr-dict
  }];
  let hasVerifier = 1;
}

def Dist_SendOp : Dist_Op<"send",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Sends a rank-local tensor to the other member of a pair";
  let description = [{
    ```mlir
    dist.send %a on @pp_0_1 to 1 tag "F s0 mb3" : tensor<16x8xbf16>
    ```
    `to` is the receiver's key in the `dist.pair`; the receiver's
    `dist.recv` carries the same `tag` (what travels: "F s0 mb3" is stage
    0's forward activation of microbatch 3, "B s1 mb3" stage 1's input
    gradient). Becomes the plan's `send` instruction.
  }];
  let arguments = (ins AnyRankedTensor:$input, FlatSymbolRefAttr:$comm,
                       I64Attr:$peer, StrAttr:$tag);
  let assemblyFormat = [{
    $input `on` $comm `to` $peer `tag` $tag attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

def Dist_RecvOp : Dist_Op<"recv",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Receives a rank-local tensor from the other member of a pair";
  let description = [{
    ```mlir
    %a = dist.recv on @pp_0_1 from 0 tag "F s0 mb3" : tensor<16x8xbf16>
    ```
    Pairs with the peer's `dist.send` of the same tag and type. Becomes the
    plan's `recv` instruction.
  }];
  let arguments = (ins FlatSymbolRefAttr:$comm, I64Attr:$peer, StrAttr:$tag);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    `on` $comm `from` $peer `tag` $tag attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def Dist_FreeOp : Dist_Op<"free"> {
  let summary = "Releases buffers (reshard after forward, after last use)";
  let description = [{
    ```mlir
    dist.free %gathered : tensor<4096x4096xbf16, #dist.layout<@m, [ {}, {} ]>>
    ```
    Inserted by `dist-schedule`; values must not be used afterwards.
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$inputs);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs)";
  let hasVerifier = 1;
}

#endif // MESHPLAN_DIALECT_DIST_IR_DISTOPS_TD
