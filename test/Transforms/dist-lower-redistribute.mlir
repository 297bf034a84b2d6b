// RUN: %meshplan-opt %s --dist-lower-redistribute --split-input-file | FileCheck %s

// Shard(0) -> Shard(1) on one axis: one all_to_all.
dist.mesh @m ["dp" = 2, "tp" = 2]
// CHECK-LABEL: func.func @shard_to_shard
// CHECK-SAME: (%[[ARG:.*]]: tensor
func.func @shard_to_shard(%a: tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>) -> tensor<8x4xf32, #dist.layout<@m, [{}, {"dp"}]>> {
  // CHECK-NEXT: %[[R:.*]] = dist.all_to_all %[[ARG]] dim 0 to 1 over {"dp"} : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x4xf32, #dist.layout<@m, [{}, {"dp"}]>>
  // CHECK-NEXT: return %[[R]]
  %0 = dist.redistribute %a : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x4xf32, #dist.layout<@m, [{}, {"dp"}]>>
  return %0 : tensor<8x4xf32, #dist.layout<@m, [{}, {"dp"}]>>
}

// -----

// Partial(sum) -> Shard: one reduce_scatter; Partial -> Replicate: one all_reduce.
dist.mesh @m ["dp" = 2, "tp" = 2]
// CHECK-LABEL: func.func @partial
func.func @partial(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) -> (tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{}]>>) {
  // CHECK: dist.reduce_scatter %{{.*}} dim 0 sum over {"dp"}
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  // CHECK: dist.all_reduce %{{.*}} sum over {"dp"}
  %1 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  // CHECK-NOT: dist.redistribute
  return %0, %1 : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{}]>>
}

// -----

// FSDP x TP weight unsharded along dp for the forward: gather dp only.
dist.mesh @m ["dp" = 4, "tp" = 2]
// CHECK-LABEL: func.func @fsdp_tp_unshard
func.func @fsdp_tp_unshard(%w: tensor<15x5xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>>) -> tensor<15x5xbf16, #dist.layout<@m, [{"tp"}, {}]>> {
  // CHECK-NEXT: dist.all_gather %{{.*}} dim 0 over {"dp"} : tensor<15x5xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>> -> tensor<15x5xbf16, #dist.layout<@m, [{"tp"}, {}]>>
  // CHECK-NEXT: return
  %0 = dist.redistribute %w : tensor<15x5xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>> -> tensor<15x5xbf16, #dist.layout<@m, [{"tp"}, {}]>>
  return %0 : tensor<15x5xbf16, #dist.layout<@m, [{"tp"}, {}]>>
}

// -----

// Axis reorder on an even dim: one permute.
dist.mesh @m ["dp" = 2, "tp" = 2]
// CHECK-LABEL: func.func @reorder
func.func @reorder(%a: tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>>) -> tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>> {
  // CHECK-NEXT: dist.permute %{{.*}} dim 0 to {"tp", "dp"} over {"dp", "tp"}
  // CHECK-NEXT: return
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>
  return %0 : tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>
}

// -----

// Uneven flat level (FSDP over a flattened dp) to nested levels: gather the
// level whole, then slice level by level.
dist.mesh @m ["r" = 2, "s" = 2]
// CHECK-LABEL: func.func @uneven_flat
func.func @uneven_flat(%a: tensor<5xf32, #dist.layout<@m, [{("r", "s")}]>>) -> tensor<5xf32, #dist.layout<@m, [{"r", "s"}]>> {
  // CHECK-NEXT: %[[G:.*]] = dist.all_gather %{{.*}} dim 0 over {"r", "s"} : tensor<5xf32, #dist.layout<@m, [{("r", "s")}]>> -> tensor<5xf32, #dist.layout<@m, [{}]>>
  // CHECK-NEXT: %[[S:.*]] = dist.local_slice %[[G]] dim 0 over {"r"} : tensor<5xf32, #dist.layout<@m, [{}]>> -> tensor<5xf32, #dist.layout<@m, [{"r"}]>>
  // CHECK-NEXT: dist.local_slice %[[S]] dim 0 over {"s"} : tensor<5xf32, #dist.layout<@m, [{"r"}]>> -> tensor<5xf32, #dist.layout<@m, [{"r", "s"}]>>
  %0 = dist.redistribute %a : tensor<5xf32, #dist.layout<@m, [{("r", "s")}]>> -> tensor<5xf32, #dist.layout<@m, [{"r", "s"}]>>
  return %0 : tensor<5xf32, #dist.layout<@m, [{"r", "s"}]>>
}

// -----

// Same layout: the redistribute disappears.
dist.mesh @m ["dp" = 2]
// CHECK-LABEL: func.func @identity
// CHECK-SAME: (%[[ARG:.*]]: tensor
func.func @identity(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {
  // CHECK-NEXT: return %[[ARG]]
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return %0 : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
}
