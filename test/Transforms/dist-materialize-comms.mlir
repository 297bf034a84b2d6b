// RUN: %meshplan-opt %s --dist-materialize-comms --split-input-file | FileCheck %s

// Motivating failure 3: a flatten of (dp_replicate, dp_shard) with a managed
// replicate axis. Spelled as the two axes, or with dp_shard cut into its
// halves, it is one partition and so one comm; local_slice needs none.
dist.mesh @ft ["dp_replicate" = 3, "dp_shard" = 4] managed = ["dp_replicate"]
// CHECK:     dist.mesh @ft
// CHECK-NEXT: dist.comm @comm_ft_dp_replicate_dp_shard on @ft axes {"dp_replicate", "dp_shard"}
// CHECK-NOT: dist.comm
// CHECK-LABEL: func.func @managed_flatten
func.func @managed_flatten(%g: tensor<8xf32, #dist.layout<@ft, [{}], partial(avg) = {"dp_replicate", "dp_shard"}>>,
                           %h: tensor<8xf32, #dist.layout<@ft, [{}], partial(avg) = {"dp_replicate", "dp_shard"}>>,
                           %r: tensor<8xf32, #dist.layout<@ft, [{}]>>) {
  // CHECK: dist.all_reduce %{{.*}} avg over {"dp_replicate", "dp_shard"} comm = @comm_ft_dp_replicate_dp_shard
  %0 = dist.all_reduce %g avg over {"dp_replicate", "dp_shard"} : tensor<8xf32, #dist.layout<@ft, [{}], partial(avg) = {"dp_replicate", "dp_shard"}>> -> tensor<8xf32, #dist.layout<@ft, [{}]>>
  // CHECK: dist.all_reduce %{{.*}} avg over {"dp_replicate", "dp_shard":(1)2, "dp_shard":(2)2} comm = @comm_ft_dp_replicate_dp_shard
  %1 = dist.all_reduce %h avg over {"dp_replicate", "dp_shard":(1)2, "dp_shard":(2)2} : tensor<8xf32, #dist.layout<@ft, [{}], partial(avg) = {"dp_replicate", "dp_shard"}>> -> tensor<8xf32, #dist.layout<@ft, [{}]>>
  // CHECK: dist.local_slice %{{.*}} dim 0 over {"dp_shard"} :
  %2 = dist.local_slice %r dim 0 over {"dp_shard"} : tensor<8xf32, #dist.layout<@ft, [{}]>> -> tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}]>>
  return
}

// -----

// Motivating failure 1: the FP8 amax all-reduce over fsdp on
// (ddp, fsdp, abcd) = (2, 2, 2), reached through a submesh of a submesh, and
// the weight all-gather over fsdp: one comm, the existing one.
dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
dist.comm @fsdp_group on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
// CHECK:     dist.comm @fsdp_group on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
// CHECK-NOT: dist.comm
// CHECK-LABEL: func.func @fp8
func.func @fp8(%amax: tensor<1xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>>,
               %w: tensor<16x8xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>) {
  // CHECK: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @fsdp_group
  %0 = dist.all_reduce %amax max over {"fsdp"} : tensor<1xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>> -> tensor<1xf32, #dist.layout<@world, [{}]>>
  // CHECK: dist.all_gather %{{.*}} dim 0 over {"fsdp"} comm = @fsdp_group
  %1 = dist.all_gather %w dim 0 over {"fsdp"} : tensor<16x8xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<16x8xf8E4M3FN, #dist.layout<@world, [{}, {}]>>
  return
}

// -----

// Different orders of the same axes are different communicators (member
// order differs), and so are different meshes.
dist.mesh @m ["dp" = 2, "tp" = 2]
// CHECK-DAG: dist.comm @comm_m_dp_tp on @m axes {"dp", "tp"}
// CHECK-DAG: dist.comm @comm_m_tp_dp on @m axes {"tp", "dp"}
func.func @orders(%a: tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>>,
                  %b: tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>) {
  %0 = dist.all_gather %a dim 0 over {"dp", "tp"} : tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  %1 = dist.all_gather %b dim 0 over {"tp", "dp"} : tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
