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
    function: one `dist.fp8_amax` over all of them at the start of the step,
    one MAX `dist.all_reduce` over exactly the axes that split them, and a
    `dist.fp8_cast` of each local shard before its all-gathers, which then
    move one byte per element. See docs/semantics.md for which
    communicator the amax reduction uses and why.
  }];
}

def DistLowerOptimizer : Pass<"dist-lower-optimizer", "mlir::ModuleOp"> {
  let summary = "Turns dist.optimizer_step into gradient reduction and a "
                "fused per-shard dist.adamw";
  let description = [{
    The gradient is reduce-scattered over the shard axes and all-reduced over
    the replicate axes into the parameter's stored layout (core's planner);
    an all-reduce over a managed axis is marked `fault_tolerant`. The
    optimizer state becomes function arguments; the update is one
    `dist.adamw` on the stored shard, never a gather.
  }];
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
    Assigns every op of a `dist.train_step` function a stream and an id,
    prefetches the next unit's all-gathers during the current compute,
    frees gathered parameters after forward and re-gathers them for backward
    (`dist.reshard_after_forward`), frees every buffer after its last use,
    lets reduce-scatters run on their own stream under the next backward
    compute, and buckets a unit's collectives that share a communicator,
    kind and dtype. See docs/dialect.md "The training step".
  }];
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
