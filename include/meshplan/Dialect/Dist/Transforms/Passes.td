//===- Passes.td - dist passes ----------------------------*- tablegen -*-===//
#ifndef MESHPLAN_DIALECT_DIST_TRANSFORMS_PASSES_TD
#define MESHPLAN_DIALECT_DIST_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def DistPropagateLayouts : Pass<"dist-propagate-layouts", "mlir::ModuleOp"> {
  let summary = "Fills in missing layouts, forward and backward";
  let description = [{
    Starting from the layouts the IR states (annotations, function
    signatures), each op's layout rule (the `LayoutRuleOpInterface`, or core's
    elementwise rule for ops with the `Elementwise` trait) assigns layouts to
    the values that have none: forward from operands to results first, then
    backward from results to operands, until nothing changes. Stated layouts
    always win. Where an op needs an operand in another layout than the one it
    has, a `dist.redistribute` is inserted; `dist-lower-redistribute` turns it
    into collectives. A tensor that still has no layout is an error naming
    its producer.

    Before:
    ```mlir
    %w = dist.annotate %arg0 : tensor<8x4xf32> -> tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>>
    %s = arith.mulf %w, %w : tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>>  // typed by hand
    %t = arith.addf %s, %arg1 : tensor<8x4xf32>
    ```
    After: `%arg1` and `%t` get `#dist.layout<@m, [ {"dp"}, {} ]>` (elementwise
    ops keep one layout; the SR update on an FSDP shard stays local).
  }];
  let dependentDialects = ["::meshplan::dist::DistDialect"];
}

def DistLowerRedistribute : Pass<"dist-lower-redistribute", "mlir::ModuleOp"> {
  let summary = "Turns every dist.redistribute into the collectives core plans";
  let description = [{
    Each `dist.redistribute` becomes the steps of core's `planRedistribute`
    for its tensor shape and element size: one op per step, each with the
    layout the step produces. Common transitions take one collective.

    Before:
    ```mlir
    %1 = dist.redistribute %0 : tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>>
                             -> tensor<8x4xf32, #dist.layout<@m, [ {}, {"dp"} ]>>
    ```
    After:
    ```mlir
    %1 = dist.all_to_all %0 dim 0 to 1 over {"dp"}
        : tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>>
       -> tensor<8x4xf32, #dist.layout<@m, [ {}, {"dp"} ]>>
    ```
  }];
  let dependentDialects = ["::meshplan::dist::DistDialect"];
}

def DistFuseFp8Gather : Pass<"dist-fuse-fp8-gather", "mlir::ModuleOp"> {
  let summary = "All-gathers float8 weights in float8: amax, one MAX "
                "all-reduce, cast, 1-byte gather";
  let description = [{
    For every parameter argument marked `dist.float8` in a `dist.train_step`
    function with a `dist.float8 = {power_of_2 = ...}` dictionary, and that
    is all-gathered: one `dist.fp8_amax` over the stored (high-precision)
    shards of all of them at the start of the step, one MAX
    `dist.all_reduce` over exactly the axes that split them (one amax and
    all-reduce per distinct set of split axes), and a `dist.fp8_cast` of each
    stored shard in place of its mixed-precision cast, so that its
    all-gathers move one byte per element. Every `dist.compute` that reads a
    gathered float8 weight gets the reduced amax as an extra operand: the
    scale travels with the weight. Parameters that are never all-gathered
    are left alone. See docs/semantics.md, "Float8 all-gather: which
    communicator reduces the amax".

    Before (HSDP on (ddp, fsdp, abcd) = (2, 2, 2)):
    ```mlir
    %c = arith.truncf %w : tensor<16x8xf32, #dist.layout<@m, [ {"fsdp"}, {} ]>>
                        to tensor<16x8xbf16, #dist.layout<@m, [ {"fsdp"}, {} ]>>
    %g = dist.all_gather %c dim 0 over {"fsdp"} : tensor<16x8xbf16, ...> -> tensor<16x8xbf16, #dist.layout<@m, [ {}, {} ]>>
    dist.compute forward "layers.0" (%g) : tensor<16x8xbf16, #dist.layout<@m, [ {}, {} ]>>
    ```
    After:
    ```mlir
    %a = dist.fp8_amax %w : tensor<16x8xf32, ...> -> tensor<1xf32, #dist.layout<@m, [ {} ], partial(max) = {"fsdp"}>>
    %r = dist.all_reduce %a max over {"fsdp"} : ... -> tensor<1xf32, #dist.layout<@m, [ {} ]>>
    %q = dist.fp8_cast %w scale %r[0] power_of_2 : ... -> tensor<16x8xf8E4M3FN, #dist.layout<@m, [ {"fsdp"}, {} ]>>
    %g = dist.all_gather %q dim 0 over {"fsdp"} : ... -> tensor<16x8xf8E4M3FN, #dist.layout<@m, [ {}, {} ]>>
    dist.compute forward "layers.0" (%g, %r) : tensor<16x8xf8E4M3FN, ...>, tensor<1xf32, ...>
    ```
  }];
  let dependentDialects = ["::meshplan::dist::DistDialect"];
}

def DistLowerOptimizer : Pass<"dist-lower-optimizer", "mlir::ModuleOp"> {
  let summary = "Turns dist.optimizer_step into gradient reduction and a "
                "fused per-shard dist.adamw";
  let description = [{
    In every `dist.train_step` function, each `dist.optimizer_step %w, %g`
    (`%w` a `dist.param` argument in its stored layout) becomes:
    right after `%g` is produced, the collectives core's planner chooses to
    bring `%g` into `%w`'s layout: a reduce-scatter over the shard axes and an
    all-reduce over the replicate axes (HSDP), avg, in the gradient's reduce
    dtype. A gradient that would need an all-gather, all-to-all or permute is
    an error naming the parameter. An all-reduce over a managed axis (torchft
    replicas) is marked `fault_tolerant`. The optimizer state becomes two fp32
    arguments per parameter in its stored layout
    (`{dist.state = "<param>.exp_avg"}`, `.exp_avg_sq`), and the update is
    one `dist.adamw` on the stored shard at the end of the step, with the
    hyper-parameters of the function's `dist.optimizer` and `tensor_id` = the
    parameter's index among the `dist.param` arguments. See
    docs/semantics.md "Optimizer lowering". The update reads a float32
    gradient: one reduced in another dtype (bfloat16, float16) is widened
    (`arith.extf`) before the first update.

    Before (`@m = ["r" = 2, "s" = 4] managed = ["r"]`):
    ```mlir
    func.func @step(%w: tensor<16xbf16, #dist.layout<@m, [ {"s"} ]>> {dist.param = "w"})
        attributes {dist.train_step, dist.optimizer = {kind = "adamw", ...,
                    stochastic_rounding = true, seed = 7 : i64}} {
      %g = dist.compute backward "w" (...) : ... -> tensor<16xf32, #dist.layout<@m, [ {} ], partial(avg) = {"r", "s"}>>
      dist.optimizer_step %w, %g : ...
      return
    }
    ```
    After:
    ```mlir
    func.func @step(%w: tensor<16xbf16, #dist.layout<@m, [ {"s"} ]>> {dist.param = "w"},
                    %m: tensor<16xf32, #dist.layout<@m, [ {"s"} ]>> {dist.state = "w.exp_avg"},
                    %v: tensor<16xf32, #dist.layout<@m, [ {"s"} ]>> {dist.state = "w.exp_avg_sq"}) ... {
      %g = dist.compute backward "w" (...) : ...
      %0 = dist.reduce_scatter %g dim 0 avg over {"s"} : ... -> tensor<16xf32, #dist.layout<@m, [ {"s"} ], partial(avg) = {"r"}>>
      %1 = dist.all_reduce %0 avg fault_tolerant over {"r"} : ... -> tensor<16xf32, #dist.layout<@m, [ {"s"} ]>>
      %p2, %m2, %v2 = dist.adamw %w, %1, %m, %v {..., stochastic_rounding, seed = 7, tensor_id = 0} : ...
      return
    }
    ```
  }];
  let dependentDialects = ["::meshplan::dist::DistDialect",
                           "::mlir::arith::ArithDialect"];
}

def DistMaterializeComms : Pass<"dist-materialize-comms", "mlir::ModuleOp"> {
  let summary = "Creates one dist.comm per distinct partition of ranks";
  let description = [{
    Every collective names the communicator it runs on. Two collectives whose
    axes give the same partition of the mesh into ordered groups share one
    `dist.comm`, however their axes are spelled (sub-axes that form a whole
    axis, a flattened axis and its parts in order): the partition key comes
    from core. Existing comms with the same partition are reused.

    Before:
    ```mlir
    dist.mesh @m ["r" = 2, "s" = 2]
    %1 = dist.all_reduce %0 sum over {"r", "s"} : ...
    %2 = dist.all_reduce %3 max over {"r", "s"} : ...
    ```
    After:
    ```mlir
    dist.mesh @m ["r" = 2, "s" = 2]
    dist.comm @m_r_s on @m axes {"r", "s"}
    %1 = dist.all_reduce %0 sum over {"r", "s"} comm = @m_r_s : ...
    %2 = dist.all_reduce %3 max over {"r", "s"} comm = @m_r_s : ...
    ```
  }];
}

def DistSchedule : Pass<"dist-schedule", "mlir::ModuleOp"> {
  let summary = "Orders the step for overlap: streams, prefetch, reshard, "
                "frees, buckets";
  let description = [{
    For every `dist.train_step` function (after `dist-materialize-comms`):
    each compute's gather chains (casts, `dist.fp8_cast`, collectives, back
    to a parameter) are prefetched right before the previous compute and
    wait (`dist.after`) for the compute two back, so at most two units are
    gathered at once. A compute reading a gather an earlier compute read
    gets a copy of its chain (sharing the float8 amax) when it is a backward
    and `dist.reshard_after_forward` (default true) holds, or a forward of a
    later microbatch; not when the compute right before it read the same
    gather, and never in one pp rank's program (`dist.pp_rank`, after
    `dist-lower-pipeline`), whose stages gather once per step. Gradient reductions go right after their backward compute. A
    group's collectives that share comm, op, dtype and reduce op form one
    `dist.bucket`. Every value gets a `dist.free` after its last use; every
    op a `dist.stream` ("compute", "comm.ag", "comm.rs") and a `dist.id`
    (block order). See docs/dialect.md "The training step".

    Before (forward of two units, types elided):
    ```mlir
    %c0 = arith.truncf %w0 : ...
    %g0 = dist.all_gather %c0 dim 0 over {"dp"} comm = @comm_m_dp : ...
    dist.compute forward "a" (%g0) : ...
    %c1 = arith.truncf %w1 : ...
    %g1 = dist.all_gather %c1 dim 0 over {"dp"} comm = @comm_m_dp : ...
    dist.compute forward "b" (%g1) : ...
    ```
    After:
    ```mlir
    %c0 = arith.truncf %w0 {dist.id = 0, dist.stream = "compute"}
    %g0 = dist.all_gather %c0 ... {dist.id = 1, dist.stream = "comm.ag"}
    dist.free %c0 {dist.after = array<i64: 1>, dist.id = 2, ...}
    %c1 = arith.truncf %w1 {dist.id = 3, ...}
    %g1 = dist.all_gather %c1 ... {dist.id = 4, dist.stream = "comm.ag"}
    dist.free %c1 {dist.after = array<i64: 4>, dist.id = 5, ...}
    dist.compute forward "a" (%g0) {dist.id = 6, dist.stream = "compute"}
    dist.free %g0 {dist.id = 7, ...}
    dist.compute forward "b" (%g1) {dist.id = 8, ...}
    dist.free %g1 {dist.id = 9, ...}
    ```
  }];
}

def DistLowerPipeline : Pass<"dist-lower-pipeline", "mlir::ModuleOp"> {
  let summary = "Expands a pipeline's stages into one pp rank's program";
  let description = [{
    For every `dist.train_step` function naming a `dist.pipeline`
    (`dist.pipeline = @pipe`), whose body is one microbatch's step with
    every `dist.compute` tagged with its `stage`: keeps only the stages
    core places on pp coordinate `pp-rank` (other stages' computes, what
    reads their results, and then every parameter argument, gather and
    optimizer step nothing needs any more are erased; each remaining
    parameter keeps its index in the whole model as `dist.tensor_id`, the
    optimizer's `tensor_id`), and replays their
    computes per (stage, microbatch) in the order core's
    `buildPipelineSchedule` gives that coordinate, with a `dist.send` /
    `dist.recv` of the activation (forward) or activation gradient
    (backward) wherever core places one, on a `dist.pair` created for each
    pair of pp coordinates that exchange (none between two stages on one
    rank). A stage's last forward produces the activation its successor
    reads as its first forward's last input; its first backward reads the
    output gradient as its last input, and its last backward produces the
    gradient of the stage's input activation. Backwards of later
    microbatches read the gradients accumulated so far (inputs after the
    activation); the gradient consumers (reductions, optimizer steps) move
    after the program and read the last microbatch's. zbv's `I` and `W`
    become `backward_input` (activation gradient only) and
    `backward_weight` (weight gradients), each with half the backward's
    flops. Every op the schedule creates carries `dist.microbatch` and
    `dist.action`, core's text of its action ("1F0", "1SEND_F0"). The
    function gets `dist.pp_rank` and `dist.pp_axis` (the axis, which the
    plan's mesh names); a function that has them is left alone.

    Before (`dist.pipeline @pipe on @m axis "pp" schedule "gpipe"
    microbatches 2 stages_per_rank 1 activation tensor<4x8xbf16>`,
    `pp-rank=1`):
    ```mlir
    dist.compute forward "a" (%w0) stage 0 : ...
    dist.compute forward "b" (%w1) stage 1 : ...
    %g1 = dist.compute backward "b" (%w1) stage 1 : ... -> ...
    %g0 = dist.compute backward "a" (%w0) stage 0 : ... -> ...
    dist.optimizer_step %w1, %g1 : ...
    dist.optimizer_step %w0, %g0 : ...
    ```
    After (`%w0` and its uses are gone):
    ```mlir
    dist.pair @pp_0_1 on @m axis "pp" coords = [0, 1]
    %x0 = dist.recv on @pp_0_1 from 0 tag "F s0 mb0" {dist.action = "1RECV_F0", ...}
    dist.compute forward "b" (%w1, %x0) stage 1 {dist.microbatch = 0 : i64, ...}
    %x1 = dist.recv on @pp_0_1 from 0 tag "F s0 mb1" ...
    dist.compute forward "b" (%w1, %x1) stage 1 {dist.microbatch = 1 : i64, ...}
    %b0:2 = dist.compute backward "b" (%w1, %x0) stage 1 ...
    dist.send %b0#1 on @pp_0_1 to 0 tag "B s1 mb0" ...
    %b1:2 = dist.compute backward "b" (%w1, %x1, %b0#0) stage 1 ...
    dist.send %b1#1 on @pp_0_1 to 0 tag "B s1 mb1" ...
    dist.optimizer_step %w1, %b1#0 : ...
    ```
  }];
  let options = [
    Option<"ppRank", "pp-rank", "int64_t", /*default=*/"-1",
           "The coordinate along the pipeline axis whose program to build">
  ];
  let dependentDialects = ["::meshplan::dist::DistDialect"];
}

def DistSpecializeRank : Pass<"dist-specialize-rank", "mlir::ModuleOp"> {
  let summary = "Rewrites the module as one rank's program: local shapes, "
                "concrete groups";
  let description = [{
    Every tensor with a `#dist.layout` becomes the local (unpadded) tensor the
    given rank holds, from core's `shardOf`; every collective gets the rank's
    group (ordered global ranks) from core's `groupOf`, and annotate /
    redistribute ops, which have no rank-local meaning, must be gone (lower
    them first). `dist.comm` ops gain the rank's `color` and `key` for a
    communicator split.

    Before (`rank=3` on a (dp=2, tp=2) mesh):
    ```mlir
    %1 = dist.all_gather %0 dim 0 over {"tp"}
        : tensor<8xf32, #dist.layout<@m, [ {"dp", "tp"} ]>>
       -> tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>
    ```
    After:
    ```mlir
    %1 = dist.all_gather %0 dim 0 over {"tp"} group = [2, 3]
        : tensor<2xf32> -> tensor<4xf32>
    ```
  }];
  let options = [
    Option<"rank", "rank", "int64_t", /*default=*/"-1",
           "The global rank whose program to produce">
  ];
}

#endif // MESHPLAN_DIALECT_DIST_TRANSFORMS_PASSES_TD
