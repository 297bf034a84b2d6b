// Round trip: every op and attribute prints in the form it parses.
// RUN: %meshplan-opt %s | %meshplan-opt | FileCheck %s
// RUN: %meshplan-opt %s --verify-roundtrip -o /dev/null

// CHECK-LABEL: dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
// CHECK: dist.mesh @ft ["dp_replicate" = 3, "dp_shard" = 4] managed = ["dp_replicate"]
dist.mesh @ft ["dp_replicate" = 3, "dp_shard" = 4] managed = ["dp_replicate"]
// CHECK: dist.mesh @perm ["dp" = 2, "tp" = 2] order = [3, 2, 1, 0]
dist.mesh @perm ["dp" = 2, "tp" = 2] order = [3, 2, 1, 0]
// CHECK: dist.mesh @sub ["x" = 8]
dist.mesh @sub ["x" = 8]

// CHECK: dist.comm @comm_fsdp on @world axes {"fsdp"}
dist.comm @comm_fsdp on @world axes {"fsdp"}
// CHECK: dist.comm @comm_dp on @ft axes {"dp_replicate", "dp_shard"}
dist.comm @comm_dp on @ft axes {"dp_replicate", "dp_shard"}
// CHECK: dist.comm @comm_sub on @sub axes {"x":(2)4}
dist.comm @comm_sub on @sub axes {"x":(2)4}
// CHECK: dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
// CHECK: dist.comm @dp on @ft axes {"dp_replicate", "dp_shard"} view = #dist.view<"slice(dp_replicate,dp_shard).flatten(dp_replicate,dp_shard as dp)">
dist.comm @dp on @ft axes {"dp_replicate", "dp_shard"} view = #dist.view<"slice(dp_replicate,dp_shard).flatten(dp_replicate,dp_shard as dp)">

// CHECK-LABEL: func.func @layouts
// CHECK-SAME: tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
// CHECK-SAME: tensor<5xf32, #dist.layout<@ft, [{("dp_replicate", "dp_shard")}]>>
// CHECK-SAME: tensor<8xf32, #dist.layout<@sub, [{"x":(1)2}], partial(max) = {"x":(2)4}>>
// CHECK-SAME: tensor<8xf32, #dist.layout<@world, [{}], partial(sum) = {"ddp"}>>
func.func @layouts(
    %a: tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>,
    %b: tensor<5xf32, #dist.layout<@ft, [{("dp_replicate", "dp_shard")}]>>,
    %c: tensor<8xf32, #dist.layout<@sub, [{"x":(1)2}], partial(max) = {"x":(2)4}>>,
    %d: tensor<8xf32, #dist.layout<@world, [{}], partial(sum) = {"ddp"}>>) {
  return
}

// CHECK-LABEL: func.func @model
func.func @model(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>) {
  // CHECK: dist.matmul %{{.*}}, %{{.*}} : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %0 = dist.matmul %x, %w : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: dist.bitcast %{{.*}} : tensor<4x16xf32> -> tensor<4x32xbf16>
  %1 = dist.bitcast %0 : tensor<4x16xf32> -> tensor<4x32xbf16>
  // CHECK: dist.reduce_sum %{{.*}} dims = [1] : tensor<4x32xbf16> -> tensor<4xbf16>
  %2 = dist.reduce_sum %1 dims = [1] : tensor<4x32xbf16> -> tensor<4xbf16>
  // CHECK: dist.reshape %{{.*}} : tensor<4x16xf32> -> tensor<64xf32>
  %3 = dist.reshape %0 : tensor<4x16xf32> -> tensor<64xf32>
  return
}

// CHECK-LABEL: func.func @steps
func.func @steps(%arg0: tensor<16x8xf32>) {
  // CHECK: dist.annotate %{{.*}} : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
  %0 = dist.annotate %arg0 : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
  // CHECK: dist.all_gather %{{.*}} dim 0 over {"fsdp"} comm = @comm_fsdp
  %1 = dist.all_gather %0 dim 0 over {"fsdp"} comm = @comm_fsdp : tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{"abcd"}, {}]>>
  // CHECK: dist.all_to_all %{{.*}} dim 0 to 1 over {"abcd"}
  %2 = dist.all_to_all %1 dim 0 to 1 over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{"abcd"}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>>
  // CHECK: dist.local_slice %{{.*}} dim 0 over {"ddp", "fsdp"}
  %3 = dist.local_slice %2 dim 0 over {"ddp", "fsdp"} : tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>> -> tensor<16x8xf32, #dist.layout<@world, [{("ddp", "fsdp")}, {"abcd"}]>>
  // CHECK: dist.permute %{{.*}} dim 0 to {"fsdp", "ddp"} over {"ddp", "fsdp"}
  %4 = dist.permute %3 dim 0 to {"fsdp", "ddp"} over {"ddp", "fsdp"} : tensor<16x8xf32, #dist.layout<@world, [{("ddp", "fsdp")}, {"abcd"}]>> -> tensor<16x8xf32, #dist.layout<@world, [{"fsdp", "ddp"}, {"abcd"}]>>
  // CHECK: dist.mark_partial %{{.*}} sum over {"abcd"}
  %5 = dist.annotate %arg0 : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  %6 = dist.mark_partial %5 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>>
  // CHECK: dist.reduce_scatter %{{.*}} dim 1 sum over {"abcd"}
  %7 = dist.reduce_scatter %6 dim 1 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>>
  // CHECK: dist.all_reduce %{{.*}} sum over {"abcd"}
  %8 = dist.all_reduce %6 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  // CHECK: dist.broadcast %{{.*}} root 1 over {"ddp"}
  %9 = dist.broadcast %8 root 1 over {"ddp"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  return
}

// Training-step ops, global form (layouts on @world).
// CHECK-LABEL: func.func @train_step
func.func @train_step(
    %wq: tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>,
    %wk: tensor<64x64xbf16, #dist.layout<@world, [{}, {"fsdp"}]>>,
    %wv: tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>,
    %gathered: tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>,
    %m: tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>,
    %v: tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>,
    %w32: tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>) {
  // CHECK: dist.compute forward "layers.0"(%{{.*}}, %{{.*}}) flops = 2.400000e+09 : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>{{$}}
  dist.compute forward "layers.0" (%gathered, %wv) flops = 2.4e+09 : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>
  // CHECK: dist.compute forward "layers.1"(%{{.*}}) : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>{{$}}
  dist.compute forward "layers.1" (%gathered) : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>
  // CHECK: dist.compute forward "loss"() flops = 1.000000e+06{{$}}
  dist.compute forward "loss" () flops = 1.0e+06
  // CHECK: dist.compute forward "noop"(){{$}}
  dist.compute forward "noop" ()
  // CHECK: %[[G:.*]]:2 = dist.compute backward "layers.0"(%{{.*}}, %{{.*}}) flops = 4.800000e+09 : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<64x64xbf16, #dist.layout<@world, [{}, {}], partial(sum) = {"ddp", "fsdp"}>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}], partial(sum) = {"ddp"}>>{{$}}
  %g0, %g1 = dist.compute backward "layers.0" (%gathered, %wv) flops = 4.8e+09 : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<64x64xbf16, #dist.layout<@world, [{}, {}], partial(sum) = {"ddp", "fsdp"}>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}], partial(sum) = {"ddp"}>>
  // CHECK: dist.compute backward "loss"(){{$}}
  dist.compute backward "loss" ()
  // CHECK: dist.optimizer_step %{{.*}}, %[[G]]#0 : tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {}], partial(sum) = {"ddp", "fsdp"}>>{{$}}
  dist.optimizer_step %w32, %g0 : tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {}], partial(sum) = {"ddp", "fsdp"}>>
  // CHECK: dist.adamw %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, lr = 3.000000e-04 : f64, seed = 7 : i64, stochastic_rounding, tensor_id = 3 : i64, weight_decay = 1.000000e-01 : f64} : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>{{$}}
  %p, %m2, %v2 = dist.adamw %wq, %wq, %m, %v {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, stochastic_rounding, seed = 7, tensor_id = 3} : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>
  // CHECK: dist.adamw %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, seed = 0 : i64, tensor_id = 4 : i64, weight_decay = 0.000000e+00 : f64} : tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>{{$}}
  %p3, %m3, %v3 = dist.adamw %w32, %w32, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 4} : tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>
  // CHECK: %[[A:.*]] = dist.fp8_amax %{{.*}}, %{{.*}}, %{{.*}} : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<3xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>>{{$}}
  %a = dist.fp8_amax %wq, %wk, %wv : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<3xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>>
  // CHECK: %[[R:.*]] = dist.all_reduce %[[A]] max over {"fsdp"}
  %r = dist.all_reduce %a max over {"fsdp"} : tensor<3xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>> -> tensor<3xf32, #dist.layout<@world, [{}]>>
  // CHECK: %[[Q:.*]] = dist.fp8_cast %{{.*}} scale %[[R]][0] power_of_2 : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<3xf32, #dist.layout<@world, [{}]>> -> tensor<64x64xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>{{$}}
  %q = dist.fp8_cast %wq scale %r[0] power_of_2 : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<3xf32, #dist.layout<@world, [{}]>> -> tensor<64x64xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>
  // CHECK: %[[Q2:.*]] = dist.fp8_cast %{{.*}} scale %[[R]][1] : tensor<64x64xbf16, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<3xf32, #dist.layout<@world, [{}]>> -> tensor<64x64xf8E5M2, #dist.layout<@world, [{}, {"fsdp"}]>>{{$}}
  %q2 = dist.fp8_cast %wk scale %r[1] : tensor<64x64xbf16, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<3xf32, #dist.layout<@world, [{}]>> -> tensor<64x64xf8E5M2, #dist.layout<@world, [{}, {"fsdp"}]>>
  // CHECK: dist.free %[[Q]], %[[Q2]], %{{.*}} : tensor<64x64xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf8E5M2, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>{{$}}
  dist.free %q, %q2, %gathered : tensor<64x64xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf8E5M2, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>
  return
}

// Inputs split by the same axes in different orders and dims share one
// partial(max) result.
// CHECK-LABEL: func.func @fp8_amax_axes
func.func @fp8_amax_axes(
    %a: tensor<64x64xbf16, #dist.layout<@world, [{"ddp", "fsdp"}, {}]>>,
    %b: tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {"ddp"}]>>) {
  // CHECK: dist.fp8_amax %{{.*}}, %{{.*}} : tensor<64x64xbf16, #dist.layout<@world, [{"ddp", "fsdp"}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {"ddp"}]>> -> tensor<2xf32, #dist.layout<@world, [{}], partial(max) = {"ddp", "fsdp"}>>{{$}}
  %0 = dist.fp8_amax %a, %b : tensor<64x64xbf16, #dist.layout<@world, [{"ddp", "fsdp"}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {"ddp"}]>> -> tensor<2xf32, #dist.layout<@world, [{}], partial(max) = {"ddp", "fsdp"}>>
  return
}

// CHECK-LABEL: func.func @fault_tolerant
func.func @fault_tolerant(
    %g: tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}], partial(sum) = {"dp_replicate"}>>,
    %l: tensor<2xf32>) {
  // CHECK: dist.all_reduce %{{.*}} sum fault_tolerant over {"dp_replicate"} : tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}], partial(sum) = {"dp_replicate"}>> -> tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}]>>{{$}}
  %0 = dist.all_reduce %g sum fault_tolerant over {"dp_replicate"} : tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}], partial(sum) = {"dp_replicate"}>> -> tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}]>>
  // CHECK: dist.all_reduce %{{.*}} avg fault_tolerant over {"dp_replicate"} group = [1, 5, 9] : tensor<2xf32> -> tensor<2xf32>{{$}}
  %1 = dist.all_reduce %l avg fault_tolerant over {"dp_replicate"} group = [1, 5, 9] : tensor<2xf32> -> tensor<2xf32>
  return
}

// Training-step ops, rank-local form (after dist-specialize-rank: no layouts).
// CHECK-LABEL: func.func @train_step_rank_local
func.func @train_step_rank_local(%x: tensor<32x64xbf16>, %y: tensor<64x32xbf16>,
    %w: tensor<32x64xf32>, %m: tensor<32x64xf32>, %v: tensor<32x64xf32>) {
  // CHECK: dist.compute forward "layers.0"(%{{.*}}, %{{.*}}) flops = 2.400000e+09 : tensor<32x64xbf16>, tensor<64x32xbf16>{{$}}
  dist.compute forward "layers.0" (%x, %y) flops = 2.4e+09 : tensor<32x64xbf16>, tensor<64x32xbf16>
  // CHECK: %[[G:.*]]:2 = dist.compute backward "layers.0"(%{{.*}}, %{{.*}}) : tensor<32x64xbf16>, tensor<64x32xbf16> -> tensor<32x64xbf16>, tensor<64x32xbf16>{{$}}
  %gx, %gy = dist.compute backward "layers.0" (%x, %y) : tensor<32x64xbf16>, tensor<64x32xbf16> -> tensor<32x64xbf16>, tensor<64x32xbf16>
  // CHECK: dist.optimizer_step %{{.*}}, %[[G]]#0 : tensor<32x64xf32>, tensor<32x64xbf16>{{$}}
  dist.optimizer_step %w, %gx : tensor<32x64xf32>, tensor<32x64xbf16>
  // CHECK: dist.adamw %{{.*}}, %[[G]]#0, %{{.*}}, %{{.*}} {beta1 = {{.*}}, stochastic_rounding, tensor_id = 3 : i64, weight_decay = {{.*}}} : tensor<32x64xbf16>, tensor<32x64xbf16>, tensor<32x64xf32>, tensor<32x64xf32>{{$}}
  %p, %m2, %v2 = dist.adamw %x, %gx, %m, %v {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, stochastic_rounding, seed = 7, tensor_id = 3} : tensor<32x64xbf16>, tensor<32x64xbf16>, tensor<32x64xf32>, tensor<32x64xf32>
  // CHECK: dist.adamw %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {beta1 = {{.*}}, tensor_id = 5 : i64, weight_decay = {{.*}}} : tensor<32x64xf32>, tensor<32x64xf32>, tensor<32x64xf32>, tensor<32x64xf32>{{$}}
  %p3, %m3, %v3 = dist.adamw %w, %w, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 5} : tensor<32x64xf32>, tensor<32x64xf32>, tensor<32x64xf32>, tensor<32x64xf32>
  // CHECK: %[[A:.*]] = dist.fp8_amax %{{.*}}, %{{.*}} : tensor<32x64xbf16>, tensor<64x32xbf16> -> tensor<2xf32>{{$}}
  %a = dist.fp8_amax %x, %y : tensor<32x64xbf16>, tensor<64x32xbf16> -> tensor<2xf32>
  // CHECK: %[[R:.*]] = dist.all_reduce %[[A]] max over {"ddp", "fsdp"} group = [0, 2, 4, 6] : tensor<2xf32> -> tensor<2xf32>{{$}}
  %r = dist.all_reduce %a max over {"ddp", "fsdp"} group = [0, 2, 4, 6] : tensor<2xf32> -> tensor<2xf32>
  // CHECK: %[[Q:.*]] = dist.fp8_cast %{{.*}} scale %[[R]][0] power_of_2 : tensor<32x64xbf16>, tensor<2xf32> -> tensor<32x64xf8E4M3FN>{{$}}
  %q = dist.fp8_cast %x scale %r[0] power_of_2 : tensor<32x64xbf16>, tensor<2xf32> -> tensor<32x64xf8E4M3FN>
  // CHECK: %[[Q2:.*]] = dist.fp8_cast %{{.*}} scale %[[R]][1] : tensor<64x32xbf16>, tensor<2xf32> -> tensor<64x32xf8E5M2>{{$}}
  %q2 = dist.fp8_cast %y scale %r[1] : tensor<64x32xbf16>, tensor<2xf32> -> tensor<64x32xf8E5M2>
  // CHECK: dist.free %[[Q]], %[[Q2]], %[[G]]#1 : tensor<32x64xf8E4M3FN>, tensor<64x32xf8E5M2>, tensor<64x32xbf16>{{$}}
  dist.free %q, %q2, %gy : tensor<32x64xf8E4M3FN>, tensor<64x32xf8E5M2>, tensor<64x32xbf16>
  return
}

// Pipelines: the schedule, a pair of pp coordinates, transfers and staged
// computes (a stage's activations are rank-local among laid-out weights).
// CHECK-LABEL: dist.mesh @pmesh ["pp" = 4, "dp" = 2]
dist.mesh @pmesh ["pp" = 4, "dp" = 2]
// CHECK: dist.pipeline @pipe on @pmesh axis "pp" schedule "interleaved_1f1b" microbatches 8 stages_per_rank 2 activation tensor<16x8xbf16>{{$}}
dist.pipeline @pipe on @pmesh axis "pp" schedule "interleaved_1f1b" microbatches 8 stages_per_rank 2 activation tensor<16x8xbf16>
// CHECK: dist.pipeline @zb on @pmesh axis "pp" schedule "zbv" microbatches 1 stages_per_rank 2 activation tensor<2x3x4xf32>{{$}}
dist.pipeline @zb on @pmesh axis "pp" schedule "zbv" microbatches 1 stages_per_rank 2 activation tensor<2x3x4xf32>
// CHECK: dist.pair @pp_0_1 on @pmesh axis "pp" coords = [0, 1]{{$}}
dist.pair @pp_0_1 on @pmesh axis "pp" coords = [0, 1]
// CHECK: dist.pair @pp_3_0 on @pmesh axis "pp" coords = [3, 0]{{$}}
dist.pair @pp_3_0 on @pmesh axis "pp" coords = [3, 0]

// CHECK-LABEL: func.func @stages
func.func @stages(%w: tensor<8x8xf32, #dist.layout<@pmesh, [{"dp"}, {}]>>)
    attributes {dist.train_step, dist.pipeline = @pipe} {
  // CHECK: %[[X:.*]] = dist.recv on @pp_0_1 from 0 tag "F s0 mb0" : tensor<16x8xbf16>{{$}}
  %x = dist.recv on @pp_0_1 from 0 tag "F s0 mb0" : tensor<16x8xbf16>
  // CHECK: %[[Y:.*]] = dist.compute forward "layers.1"(%{{.*}}, %[[X]]) stage 1 flops = 1.000000e+06 : tensor<8x8xf32, #dist.layout<@pmesh, [{"dp"}, {}]>>, tensor<16x8xbf16> -> tensor<16x8xbf16>{{$}}
  %y = dist.compute forward "layers.1" (%w, %x) stage 1 flops = 1.0e+06 : tensor<8x8xf32, #dist.layout<@pmesh, [{"dp"}, {}]>>, tensor<16x8xbf16> -> tensor<16x8xbf16>
  // CHECK: dist.send %[[Y]] on @pp_0_1 to 1 tag "F s1 mb0" : tensor<16x8xbf16>{{$}}
  dist.send %y on @pp_0_1 to 1 tag "F s1 mb0" : tensor<16x8xbf16>
  // CHECK: %[[D:.*]] = dist.recv on @pp_0_1 from 1 tag "B s2 mb0" : tensor<16x8xbf16>{{$}}
  %d = dist.recv on @pp_0_1 from 1 tag "B s2 mb0" : tensor<16x8xbf16>
  // CHECK: %[[G:.*]]:2 = dist.compute backward "layers.1"(%{{.*}}, %[[X]], %[[D]]) stage 1 : {{.*}} -> tensor<8x8xf32, #dist.layout<@pmesh, [{}, {}], partial(avg) = {"dp"}>>, tensor<16x8xbf16>{{$}}
  %g, %gx = dist.compute backward "layers.1" (%w, %x, %d) stage 1 : tensor<8x8xf32, #dist.layout<@pmesh, [{"dp"}, {}]>>, tensor<16x8xbf16>, tensor<16x8xbf16> -> tensor<8x8xf32, #dist.layout<@pmesh, [{}, {}], partial(avg) = {"dp"}>>, tensor<16x8xbf16>
  // CHECK: %[[I:.*]] = dist.compute backward_input "layers.1"(%[[X]], %{{.*}}, %[[D]]) stage 1 : {{.*}} -> tensor<16x8xbf16>{{$}}
  %i = dist.compute backward_input "layers.1" (%x, %w, %d) stage 1 : tensor<16x8xbf16>, tensor<8x8xf32, #dist.layout<@pmesh, [{"dp"}, {}]>>, tensor<16x8xbf16> -> tensor<16x8xbf16>
  // CHECK: dist.compute backward_weight "layers.1"(%{{.*}}, %[[G]]#0) stage 1 : {{.*}} -> tensor<8x8xf32, #dist.layout<@pmesh, [{}, {}], partial(avg) = {"dp"}>>{{$}}
  %gw = dist.compute backward_weight "layers.1" (%w, %g) stage 1 : tensor<8x8xf32, #dist.layout<@pmesh, [{"dp"}, {}]>>, tensor<8x8xf32, #dist.layout<@pmesh, [{}, {}], partial(avg) = {"dp"}>> -> tensor<8x8xf32, #dist.layout<@pmesh, [{}, {}], partial(avg) = {"dp"}>>
  // CHECK: dist.send %[[G]]#1 on @pp_0_1 to 0 tag "B s1 mb0" : tensor<16x8xbf16>{{$}}
  dist.send %gx on @pp_0_1 to 0 tag "B s1 mb0" : tensor<16x8xbf16>
  return
}
