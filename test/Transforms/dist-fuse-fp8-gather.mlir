// RUN: %meshplan-opt %s --dist-propagate-layouts --dist-lower-redistribute --dist-fuse-fp8-gather -split-input-file | FileCheck %s
// RUN: %meshplan-opt %s --dist-propagate-layouts --dist-lower-redistribute --dist-fuse-fp8-gather --dist-materialize-comms -split-input-file | FileCheck %s --check-prefix=COMMS
// The pass is idempotent: a second run changes nothing.
// RUN: %meshplan-opt %s --dist-propagate-layouts --dist-lower-redistribute --dist-fuse-fp8-gather --dist-fuse-fp8-gather -split-input-file | FileCheck %s

// FSDP x TP on (dp, tp) = (2, 2): two colwise float8 weights stored
// [{tp, dp}, {}] (FSDP2 shards the TP shard over dp), gathered over dp to the
// TP split. Their amax covers the whole weight: one fp8_amax over both
// stored shards, partial over {tp, dp}, one MAX all-reduce over exactly
// {tp, dp}. The embedding and the norm are not float8 and keep their
// bfloat16 cast and gather.
dist.mesh @mesh ["dp" = 2, "tp" = 2]
// CHECK-LABEL: func.func @fsdp_tp
// CHECK-NEXT:  %[[AMAX:.*]] = dist.fp8_amax %arg1, %arg2 : tensor<32x32xf32, #dist.layout<@mesh, [{"tp", "dp"}, {}]>>, tensor<32x32xf32, #dist.layout<@mesh, [{"tp", "dp"}, {}]>> -> tensor<2xf32, #dist.layout<@mesh, [{}], partial(max) = {"dp", "tp"}>>
// CHECK-NEXT:  %[[R:.*]] = dist.all_reduce %[[AMAX]] max over {"dp", "tp"} : tensor<2xf32, #dist.layout<@mesh, [{}], partial(max) = {"dp", "tp"}>> -> tensor<2xf32, #dist.layout<@mesh, [{}]>>
// CHECK-NEXT:  %[[E:.*]] = arith.truncf %arg0 :
// CHECK-NEXT:  %[[EG:.*]] = dist.all_gather %[[E]] dim 0 over {"dp"} : tensor<64x32xbf16, #dist.layout<@mesh, [{"dp"}, {}]>> -> tensor<64x32xbf16, #dist.layout<@mesh, [{}, {}]>>
// CHECK-NEXT:  dist.compute forward "tok_embeddings"(%[[EG]]) flops = {{.*}} : tensor<64x32xbf16, #dist.layout<@mesh, [{}, {}]>>{{$}}
// CHECK-NEXT:  %[[Q8:.*]] = dist.fp8_cast %arg1 scale %[[R]][0] power_of_2 : tensor<32x32xf32, #dist.layout<@mesh, [{"tp", "dp"}, {}]>>, tensor<2xf32, #dist.layout<@mesh, [{}]>> -> tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp", "dp"}, {}]>>
// CHECK-NEXT:  %[[QG:.*]] = dist.all_gather %[[Q8]] dim 0 over {"dp"} : tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp", "dp"}, {}]>> -> tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp"}, {}]>>
// CHECK-NEXT:  %[[K8:.*]] = dist.fp8_cast %arg2 scale %[[R]][1] power_of_2 : tensor<32x32xf32, #dist.layout<@mesh, [{"tp", "dp"}, {}]>>, tensor<2xf32, #dist.layout<@mesh, [{}]>> -> tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp", "dp"}, {}]>>
// CHECK-NEXT:  %[[KG:.*]] = dist.all_gather %[[K8]] dim 0 over {"dp"} : tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp", "dp"}, {}]>> -> tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp"}, {}]>>
// CHECK-NEXT:  %[[N:.*]] = arith.truncf %arg3 :
// CHECK-NEXT:  %[[NG:.*]] = dist.all_gather %[[N]] dim 0 over {"dp"} : tensor<32xbf16, #dist.layout<@mesh, [{"dp"}]>> -> tensor<32xbf16, #dist.layout<@mesh, [{}]>>
// The scale is passed once per compute, after the weights.
// CHECK-NEXT:  dist.compute forward "layers.0"(%[[QG]], %[[KG]], %[[NG]], %[[R]]) flops = {{.*}} : tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp"}, {}]>>, tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp"}, {}]>>, tensor<32xbf16, #dist.layout<@mesh, [{}]>>, tensor<2xf32, #dist.layout<@mesh, [{}]>>{{$}}
// CHECK-NEXT:  %[[G:.*]]:3 = dist.compute backward "layers.0"(%[[QG]], %[[KG]], %[[NG]], %[[R]]) flops = {{.*}} -> tensor<32x32xf32, #dist.layout<@mesh, [{"tp"}, {}], partial(avg) = {"dp"}>>, tensor<32x32xf32, #dist.layout<@mesh, [{"tp"}, {}], partial(avg) = {"dp"}>>, tensor<32xf32, #dist.layout<@mesh, [{}], partial(avg) = {"dp"}>>{{$}}
// CHECK-NEXT:  dist.optimizer_step %arg1, %[[G]]#0
// CHECK-NEXT:  dist.optimizer_step %arg2, %[[G]]#1
// CHECK-NEXT:  dist.optimizer_step %arg3, %[[G]]#2
// CHECK-NEXT:  %[[GE:.*]] = dist.compute backward "tok_embeddings"(%[[EG]]) flops = {{.*}} : tensor<64x32xbf16, #dist.layout<@mesh, [{}, {}]>> -> tensor<64x32xf32
// CHECK-NEXT:  dist.optimizer_step %arg0, %[[GE]]
// CHECK-NEXT:  return
// COMMS-LABEL: dist.mesh @mesh
// COMMS-DAG:   dist.comm @comm_mesh_dp on @mesh axes {"dp"}
// COMMS-DAG:   dist.comm @comm_mesh_dp_tp on @mesh axes {"dp", "tp"}
// COMMS-LABEL: func.func @fsdp_tp
// COMMS:       dist.all_reduce %{{.*}} max over {"dp", "tp"} comm = @comm_mesh_dp_tp
// COMMS-COUNT-3: dist.all_gather %{{.*}} comm = @comm_mesh_dp
func.func @fsdp_tp(
    %w0: tensor<64x32xf32, #dist.layout<@mesh, [ {"dp"}, {} ]>> {dist.param = "tok_embeddings.weight"},
    %w1: tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> {dist.param = "layers.0.attention.wq.weight", dist.float8},
    %w2: tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> {dist.param = "layers.0.attention.wk.weight", dist.float8},
    %w3: tensor<32xf32, #dist.layout<@mesh, [ {"dp"} ]>> {dist.param = "layers.0.attention_norm.weight"})
    attributes {dist.train_step, dist.reshard_after_forward = true,
                dist.gradient_accumulation_steps = 1 : i64,
                dist.float8 = {power_of_2 = true}} {
  %c0 = arith.truncf %w0 : tensor<64x32xf32, #dist.layout<@mesh, [ {"dp"}, {} ]>> to tensor<64x32xbf16, #dist.layout<@mesh, [ {"dp"}, {} ]>>
  %g0 = dist.redistribute %c0 : tensor<64x32xbf16, #dist.layout<@mesh, [ {"dp"}, {} ]>> -> tensor<64x32xbf16, #dist.layout<@mesh, [ {}, {} ]>>
  dist.compute forward "tok_embeddings" (%g0) flops = 1.0e6 : tensor<64x32xbf16, #dist.layout<@mesh, [ {}, {} ]>>
  %c1 = arith.truncf %w1 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> to tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>
  %g1 = dist.redistribute %c1 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> -> tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>
  %c2 = arith.truncf %w2 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> to tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>
  %g2 = dist.redistribute %c2 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> -> tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>
  %c3 = arith.truncf %w3 : tensor<32xf32, #dist.layout<@mesh, [ {"dp"} ]>> to tensor<32xbf16, #dist.layout<@mesh, [ {"dp"} ]>>
  %g3 = dist.redistribute %c3 : tensor<32xbf16, #dist.layout<@mesh, [ {"dp"} ]>> -> tensor<32xbf16, #dist.layout<@mesh, [ {} ]>>
  dist.compute forward "layers.0" (%g1, %g2, %g3) flops = 2.0e6 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32xbf16, #dist.layout<@mesh, [ {} ]>>
  %d1, %d2, %d3 = dist.compute backward "layers.0" (%g1, %g2, %g3) flops = 4.0e6 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32xbf16, #dist.layout<@mesh, [ {} ]>> -> tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>, tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>, tensor<32xf32, #dist.layout<@mesh, [ {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w1, %d1 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>, tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w2, %d2 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>, tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w3, %d3 : tensor<32xf32, #dist.layout<@mesh, [ {"dp"} ]>>, tensor<32xf32, #dist.layout<@mesh, [ {} ], partial(avg) = {"dp"}>>
  %d0 = dist.compute backward "tok_embeddings" (%g0) flops = 2.0e6 : tensor<64x32xbf16, #dist.layout<@mesh, [ {}, {} ]>> -> tensor<64x32xf32, #dist.layout<@mesh, [ {}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w0, %d0 : tensor<64x32xf32, #dist.layout<@mesh, [ {"dp"}, {} ]>>, tensor<64x32xf32, #dist.layout<@mesh, [ {}, {} ], partial(avg) = {"dp"}>>
  return
}

// -----

// The 3-D mesh (ddp, fsdp, abcd) = (2, 2, 2) with HSDP (replicate over ddp,
// shard over fsdp) and abcd an extra axis: the stored weights are split by
// fsdp only, so the amax is partial over {"fsdp"} and reduced over exactly
// {"fsdp"}: not ddp or abcd (their shards are identical copies), not the
// world. The reduction's group is a view of the root mesh; no
// submesh-of-submesh is needed, and the gathers share its comm.
// Without power_of_2 the casts carry no power_of_2.
dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
// CHECK-LABEL: func.func @hsdp_extra
// CHECK-NEXT:  %[[AMAX:.*]] = dist.fp8_amax %arg0, %arg1 : tensor<16x8xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<8x16xf32, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<2xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>>
// CHECK-NEXT:  %[[R:.*]] = dist.all_reduce %[[AMAX]] max over {"fsdp"} : tensor<2xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>> -> tensor<2xf32, #dist.layout<@world, [{}]>>
// CHECK-NOT:   power_of_2
// CHECK-NEXT:  %[[A8:.*]] = dist.fp8_cast %arg0 scale %[[R]][0] : tensor<16x8xf32, {{.*}} -> tensor<16x8xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>
// CHECK-NEXT:  %[[AG:.*]] = dist.all_gather %[[A8]] dim 0 over {"fsdp"} : tensor<16x8xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<16x8xf8E4M3FN, #dist.layout<@world, [{}, {}]>>
// CHECK-NEXT:  %[[B8:.*]] = dist.fp8_cast %arg1 scale %[[R]][1] : tensor<8x16xf32, {{.*}} -> tensor<8x16xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>
// CHECK-NEXT:  %[[BG:.*]] = dist.all_gather %[[B8]] dim 0 over {"fsdp"} : tensor<8x16xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<8x16xf8E4M3FN, #dist.layout<@world, [{}, {}]>>
// CHECK-NEXT:  %[[N:.*]] = arith.truncf %arg2 :
// CHECK-NEXT:  %[[NG:.*]] = dist.all_gather %[[N]] dim 0 over {"fsdp"} : tensor<8xbf16,
// CHECK-NEXT:  dist.compute forward "layers.0"(%[[AG]], %[[BG]], %[[NG]], %[[R]]) :
// CHECK-NEXT:  dist.compute backward "layers.0"(%[[AG]], %[[BG]], %[[NG]], %[[R]]) :
// CHECK-NOT:   power_of_2
// CHECK:       return
// COMMS-LABEL: dist.mesh @world
// COMMS-NEXT:  dist.comm @comm_world_fsdp on @world axes {"fsdp"}
// COMMS-NOT:   dist.comm
// COMMS-LABEL: func.func @hsdp_extra
// COMMS:       dist.all_reduce %{{.*}} max over {"fsdp"} comm = @comm_world_fsdp
// COMMS-COUNT-3: dist.all_gather %{{.*}} over {"fsdp"} comm = @comm_world_fsdp
func.func @hsdp_extra(
    %a: tensor<16x8xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>> {dist.param = "layers.0.w1.weight", dist.float8},
    %b: tensor<8x16xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>> {dist.param = "layers.0.w2.weight", dist.float8},
    %n: tensor<8xf32, #dist.layout<@world, [ {"fsdp"} ]>> {dist.param = "layers.0.norm.weight"})
    attributes {dist.train_step, dist.float8 = {power_of_2 = false}} {
  %ca = arith.truncf %a : tensor<16x8xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>> to tensor<16x8xbf16, #dist.layout<@world, [ {"fsdp"}, {} ]>>
  %ga = dist.redistribute %ca : tensor<16x8xbf16, #dist.layout<@world, [ {"fsdp"}, {} ]>> -> tensor<16x8xbf16, #dist.layout<@world, [ {}, {} ]>>
  %cb = arith.truncf %b : tensor<8x16xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>> to tensor<8x16xbf16, #dist.layout<@world, [ {"fsdp"}, {} ]>>
  %gb = dist.redistribute %cb : tensor<8x16xbf16, #dist.layout<@world, [ {"fsdp"}, {} ]>> -> tensor<8x16xbf16, #dist.layout<@world, [ {}, {} ]>>
  %cn = arith.truncf %n : tensor<8xf32, #dist.layout<@world, [ {"fsdp"} ]>> to tensor<8xbf16, #dist.layout<@world, [ {"fsdp"} ]>>
  %gn = dist.redistribute %cn : tensor<8xbf16, #dist.layout<@world, [ {"fsdp"} ]>> -> tensor<8xbf16, #dist.layout<@world, [ {} ]>>
  dist.compute forward "layers.0" (%ga, %gb, %gn) : tensor<16x8xbf16, #dist.layout<@world, [ {}, {} ]>>, tensor<8x16xbf16, #dist.layout<@world, [ {}, {} ]>>, tensor<8xbf16, #dist.layout<@world, [ {} ]>>
  %da, %db, %dn = dist.compute backward "layers.0" (%ga, %gb, %gn) : tensor<16x8xbf16, #dist.layout<@world, [ {}, {} ]>>, tensor<8x16xbf16, #dist.layout<@world, [ {}, {} ]>>, tensor<8xbf16, #dist.layout<@world, [ {} ]>> -> tensor<16x8xf32, #dist.layout<@world, [ {}, {} ], partial(avg) = {"ddp", "fsdp"}>>, tensor<8x16xf32, #dist.layout<@world, [ {}, {} ], partial(avg) = {"ddp", "fsdp"}>>, tensor<8xf32, #dist.layout<@world, [ {} ], partial(avg) = {"ddp", "fsdp"}>>
  dist.optimizer_step %a, %da : tensor<16x8xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>>, tensor<16x8xf32, #dist.layout<@world, [ {}, {} ], partial(avg) = {"ddp", "fsdp"}>>
  dist.optimizer_step %b, %db : tensor<8x16xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>>, tensor<8x16xf32, #dist.layout<@world, [ {}, {} ], partial(avg) = {"ddp", "fsdp"}>>
  dist.optimizer_step %n, %dn : tensor<8xf32, #dist.layout<@world, [ {"fsdp"} ]>>, tensor<8xf32, #dist.layout<@world, [ {} ], partial(avg) = {"ddp", "fsdp"}>>
  return
}

// -----

// The imported step of test/Transforms/Inputs/train-step.mlir: a colwise wq
// stored [{tp, dp}, {}] and a rowwise wo stored [{dp}, {tp}]. Both are split
// over all four ranks, in different orders; a MAX reduction does not care
// about member order, so they share one amax and one all-reduce over the
// axes in mesh order, and the compute reading both gets the one scale tensor.
dist.mesh @mesh ["dp" = 2, "tp" = 2]
// CHECK-LABEL: func.func @colwise_rowwise
// CHECK-NEXT:  %[[A:.*]] = dist.fp8_amax %arg1, %arg2 : {{.*}} -> tensor<2xf32, #dist.layout<@mesh, [{}], partial(max) = {"dp", "tp"}>>
// CHECK-NEXT:  %[[R:.*]] = dist.all_reduce %[[A]] max over {"dp", "tp"} :
// CHECK-NEXT:  %[[Q8:.*]] = dist.fp8_cast %arg1 scale %[[R]][0] power_of_2 :
// CHECK-NEXT:  %[[QG:.*]] = dist.all_gather %[[Q8]] dim 0 over {"dp"} : tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp", "dp"}, {}]>> -> tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"tp"}, {}]>>
// CHECK-NEXT:  %[[O8:.*]] = dist.fp8_cast %arg2 scale %[[R]][1] power_of_2 :
// CHECK-NEXT:  %[[OG:.*]] = dist.all_gather %[[O8]] dim 0 over {"dp"} : tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{"dp"}, {"tp"}]>> -> tensor<32x32xf8E4M3FN, #dist.layout<@mesh, [{}, {"tp"}]>>
// CHECK-NEXT:  dist.compute forward "layers.0"(%[[QG]], %[[OG]], %[[R]]) :
// CHECK-NEXT:  dist.compute backward "layers.0"(%[[QG]], %[[OG]], %[[R]]) :
// COMMS-LABEL: func.func @colwise_rowwise
// COMMS:       dist.all_reduce %{{.*}} max over {"dp", "tp"} comm = @comm_mesh_dp_tp
func.func @colwise_rowwise(
    %w0: tensor<64x32xf32, #dist.layout<@mesh, [ {"dp"}, {} ]>> {dist.param = "tok_embeddings.weight"},
    %w1: tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> {dist.param = "layers.0.attention.wq.weight", dist.float8},
    %w2: tensor<32x32xf32, #dist.layout<@mesh, [ {"dp"}, {"tp"} ]>> {dist.param = "layers.0.attention.wo.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %c1 = arith.truncf %w1 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> to tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>
  %g1 = dist.redistribute %c1 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> -> tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>
  %c2 = arith.truncf %w2 : tensor<32x32xf32, #dist.layout<@mesh, [ {"dp"}, {"tp"} ]>> to tensor<32x32xbf16, #dist.layout<@mesh, [ {"dp"}, {"tp"} ]>>
  %g2 = dist.redistribute %c2 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"dp"}, {"tp"} ]>> -> tensor<32x32xbf16, #dist.layout<@mesh, [ {}, {"tp"} ]>>
  dist.compute forward "layers.0" (%g1, %g2) : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32x32xbf16, #dist.layout<@mesh, [ {}, {"tp"} ]>>
  %d1, %d2 = dist.compute backward "layers.0" (%g1, %g2) : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32x32xbf16, #dist.layout<@mesh, [ {}, {"tp"} ]>> -> tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>, tensor<32x32xf32, #dist.layout<@mesh, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w1, %d1 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>, tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w2, %d2 : tensor<32x32xf32, #dist.layout<@mesh, [ {"dp"}, {"tp"} ]>>, tensor<32x32xf32, #dist.layout<@mesh, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  return
}

// -----

// Uneven and empty shards need nothing special in IR: a 5x16 weight over 4
// ranks (shards of 2, 2, 1, 0 rows) and a 2x16 weight whose dim 0 is smaller
// than the shard group (ranks 2 and 3 hold nothing; their local amax is 0).
dist.mesh @m4 ["dp" = 4]
// CHECK-LABEL: func.func @uneven
// CHECK-NEXT:  %[[AMAX:.*]] = dist.fp8_amax %arg0, %arg1 : tensor<5x16xf32, #dist.layout<@m4, [{"dp"}, {}]>>, tensor<2x16xf32, #dist.layout<@m4, [{"dp"}, {}]>> -> tensor<2xf32, #dist.layout<@m4, [{}], partial(max) = {"dp"}>>
// CHECK-NEXT:  %[[R:.*]] = dist.all_reduce %[[AMAX]] max over {"dp"} :
// CHECK-NEXT:  %[[A8:.*]] = dist.fp8_cast %arg0 scale %[[R]][0] power_of_2 : {{.*}} -> tensor<5x16xf8E4M3FN, #dist.layout<@m4, [{"dp"}, {}]>>
// CHECK-NEXT:  %[[AG:.*]] = dist.all_gather %[[A8]] dim 0 over {"dp"} : {{.*}} -> tensor<5x16xf8E4M3FN, #dist.layout<@m4, [{}, {}]>>
// CHECK-NEXT:  %[[B8:.*]] = dist.fp8_cast %arg1 scale %[[R]][1] power_of_2 : {{.*}} -> tensor<2x16xf8E4M3FN, #dist.layout<@m4, [{"dp"}, {}]>>
// CHECK-NEXT:  %[[BG:.*]] = dist.all_gather %[[B8]] dim 0 over {"dp"} : {{.*}} -> tensor<2x16xf8E4M3FN, #dist.layout<@m4, [{}, {}]>>
// CHECK-NEXT:  dist.compute forward "layers.0"(%[[AG]], %[[BG]], %[[R]]) :
// COMMS-LABEL: func.func @uneven
// COMMS:       dist.all_reduce %{{.*}} max over {"dp"} comm = @comm_m4_dp
// COMMS-COUNT-2: dist.all_gather %{{.*}} comm = @comm_m4_dp
func.func @uneven(
    %a: tensor<5x16xf32, #dist.layout<@m4, [ {"dp"}, {} ]>> {dist.param = "a.weight", dist.float8},
    %b: tensor<2x16xf32, #dist.layout<@m4, [ {"dp"}, {} ]>> {dist.param = "b.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %ca = arith.truncf %a : tensor<5x16xf32, #dist.layout<@m4, [ {"dp"}, {} ]>> to tensor<5x16xbf16, #dist.layout<@m4, [ {"dp"}, {} ]>>
  %ga = dist.redistribute %ca : tensor<5x16xbf16, #dist.layout<@m4, [ {"dp"}, {} ]>> -> tensor<5x16xbf16, #dist.layout<@m4, [ {}, {} ]>>
  %cb = arith.truncf %b : tensor<2x16xf32, #dist.layout<@m4, [ {"dp"}, {} ]>> to tensor<2x16xbf16, #dist.layout<@m4, [ {"dp"}, {} ]>>
  %gb = dist.redistribute %cb : tensor<2x16xbf16, #dist.layout<@m4, [ {"dp"}, {} ]>> -> tensor<2x16xbf16, #dist.layout<@m4, [ {}, {} ]>>
  dist.compute forward "layers.0" (%ga, %gb) : tensor<5x16xbf16, #dist.layout<@m4, [ {}, {} ]>>, tensor<2x16xbf16, #dist.layout<@m4, [ {}, {} ]>>
  return
}

// -----

// Only gathered float8 weights take part. On (dp, tp) = (1, 2), %s is stored
// [{dp}, {}] with dp of size 1 (its stored shard is the whole weight: the
// redistribute only relabels it) and %t is TP-only, stored as computed; %g
// is TP-sharded but computed replicated, so it is gathered over tp and is
// the only operand of the amax. What else reads a weight that is never
// gathered does not matter (%t's negf).
dist.mesh @m12 ["dp" = 1, "tp" = 2]
// CHECK-LABEL: func.func @not_gathered
// CHECK-NEXT:  %[[AMAX:.*]] = dist.fp8_amax %arg2 : {{.*}} -> tensor<1xf32, #dist.layout<@m12, [{}], partial(max) = {"tp"}>>
// CHECK-NEXT:  %[[R:.*]] = dist.all_reduce %[[AMAX]] max over {"tp"} :
// CHECK-NEXT:  %[[S:.*]] = arith.truncf %arg0 : tensor<8x8xf32, #dist.layout<@m12, [{"dp"}, {}]>> to tensor<8x8xbf16, #dist.layout<@m12, [{"dp"}, {}]>>
// CHECK-NEXT:  %[[SR:.*]] = dist.redistribute %[[S]] : tensor<8x8xbf16, #dist.layout<@m12, [{"dp"}, {}]>> -> tensor<8x8xbf16, #dist.layout<@m12, [{}, {}]>>
// CHECK-NEXT:  %[[T:.*]] = arith.truncf %arg1 : tensor<8x8xf32, #dist.layout<@m12, [{"tp"}, {}]>> to tensor<8x8xbf16, #dist.layout<@m12, [{"tp"}, {}]>>
// CHECK-NEXT:  arith.negf %[[T]] : tensor<8x8xbf16, #dist.layout<@m12, [{"tp"}, {}]>>
// CHECK-NEXT:  %[[G8:.*]] = dist.fp8_cast %arg2 scale %[[R]][0] power_of_2 : {{.*}} -> tensor<8x8xf8E4M3FN, #dist.layout<@m12, [{"tp"}, {}]>>
// CHECK-NEXT:  %[[GG:.*]] = dist.all_gather %[[G8]] dim 0 over {"tp"} : {{.*}} -> tensor<8x8xf8E4M3FN, #dist.layout<@m12, [{}, {}]>>
// CHECK-NEXT:  dist.compute forward "layers.0"(%[[SR]], %[[T]], %[[GG]], %[[R]]) : tensor<8x8xbf16, #dist.layout<@m12, [{}, {}]>>, tensor<8x8xbf16, #dist.layout<@m12, [{"tp"}, {}]>>, tensor<8x8xf8E4M3FN
func.func @not_gathered(
    %s: tensor<8x8xf32, #dist.layout<@m12, [ {"dp"}, {} ]>> {dist.param = "s.weight", dist.float8},
    %t: tensor<8x8xf32, #dist.layout<@m12, [ {"tp"}, {} ]>> {dist.param = "t.weight", dist.float8},
    %g: tensor<8x8xf32, #dist.layout<@m12, [ {"tp"}, {} ]>> {dist.param = "g.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %cs = arith.truncf %s : tensor<8x8xf32, #dist.layout<@m12, [ {"dp"}, {} ]>> to tensor<8x8xbf16, #dist.layout<@m12, [ {"dp"}, {} ]>>
  %gs = dist.redistribute %cs : tensor<8x8xbf16, #dist.layout<@m12, [ {"dp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m12, [ {}, {} ]>>
  %ct = arith.truncf %t : tensor<8x8xf32, #dist.layout<@m12, [ {"tp"}, {} ]>> to tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>
  %nt = arith.negf %ct : tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>
  %gt = dist.redistribute %ct : tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>
  %cg = arith.truncf %g : tensor<8x8xf32, #dist.layout<@m12, [ {"tp"}, {} ]>> to tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>
  %gg = dist.redistribute %cg : tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m12, [ {}, {} ]>>
  dist.compute forward "layers.0" (%gs, %gt, %gg) : tensor<8x8xbf16, #dist.layout<@m12, [ {}, {} ]>>, tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>, tensor<8x8xbf16, #dist.layout<@m12, [ {}, {} ]>>
  return
}

// -----

// Parameters stored in the compute dtype have no mixed-precision cast: the
// float8 cast reads the block argument and feeds the gather. Planned layout
// ops other than all_gather carry float8 too (an all_to_all to a
// column split after the gather). With gradient accumulation every forward
// and backward of every microbatch gets the scale, after the accumulated
// gradients backward j > 0 reads.
dist.mesh @m ["dp" = 2, "tp" = 2]
// CHECK-LABEL: func.func @no_cast
// CHECK-NEXT:  %[[AMAX:.*]] = dist.fp8_amax %arg0 : tensor<8x8xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>> -> tensor<1xf32, #dist.layout<@m, [{}], partial(max) = {"dp", "tp"}>>
// CHECK-NEXT:  %[[R:.*]] = dist.all_reduce %[[AMAX]] max over {"dp", "tp"} :
// CHECK-NEXT:  %[[W8:.*]] = dist.fp8_cast %arg0 scale %[[R]][0] power_of_2 : tensor<8x8xbf16, {{.*}} -> tensor<8x8xf8E4M3FN, #dist.layout<@m, [{"tp", "dp"}, {}]>>
// CHECK-NEXT:  %[[WG:.*]] = dist.all_gather %[[W8]] dim 0 over {"dp"} : {{.*}} -> tensor<8x8xf8E4M3FN, #dist.layout<@m, [{"tp"}, {}]>>
// CHECK-NEXT:  %[[WC:.*]] = dist.all_to_all %[[WG]] dim 0 to 1 over {"tp"} : tensor<8x8xf8E4M3FN, #dist.layout<@m, [{"tp"}, {}]>> -> tensor<8x8xf8E4M3FN, #dist.layout<@m, [{}, {"tp"}]>>
// CHECK-NEXT:  dist.compute forward "l"(%[[WC]], %[[R]]) {dist.microbatch = 0 : i64} :
// CHECK-NEXT:  %[[G0:.*]] = dist.compute backward "l"(%[[WC]], %[[R]]) {dist.microbatch = 0 : i64} :
// CHECK-NEXT:  dist.compute forward "l"(%[[WC]], %[[R]]) {dist.microbatch = 1 : i64} :
// CHECK-NEXT:  %[[G1:.*]] = dist.compute backward "l"(%[[WC]], %[[G0]], %[[R]]) {dist.microbatch = 1 : i64} :
// CHECK-NEXT:  dist.optimizer_step %arg0, %[[G1]]
func.func @no_cast(%w: tensor<8x8xbf16, #dist.layout<@m, [ {"tp", "dp"}, {} ]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.gradient_accumulation_steps = 2 : i64,
                dist.float8 = {power_of_2 = true}} {
  %g = dist.redistribute %w : tensor<8x8xbf16, #dist.layout<@m, [ {"tp", "dp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>>
  dist.compute forward "l" (%g) {dist.microbatch = 0 : i64} : tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>>
  %d0 = dist.compute backward "l" (%g) {dist.microbatch = 0 : i64} : tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>> -> tensor<8x8xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  dist.compute forward "l" (%g) {dist.microbatch = 1 : i64} : tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>>
  %d1 = dist.compute backward "l" (%g, %d0) {dist.microbatch = 1 : i64} : tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>>, tensor<8x8xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>> -> tensor<8x8xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w, %d1 : tensor<8x8xbf16, #dist.layout<@m, [ {"tp", "dp"}, {} ]>>, tensor<8x8xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  return
}

// -----

// Without dist.float8 on the function (and no float8 parameter) nothing
// changes: the bfloat16 cast and gather stay.
dist.mesh @m ["dp" = 2]
// CHECK-LABEL: func.func @no_float8
// CHECK-NOT:   dist.fp8
// CHECK:       %[[C:.*]] = arith.truncf %arg0
// CHECK-NEXT:  %[[G:.*]] = dist.all_gather %[[C]] dim 0 over {"dp"} : tensor<8x8xbf16, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x8xbf16, #dist.layout<@m, [{}, {}]>>
// CHECK-NEXT:  dist.compute forward "l"(%[[G]]) : tensor<8x8xbf16, #dist.layout<@m, [{}, {}]>>{{$}}
// CHECK-NOT:   dist.fp8
func.func @no_float8(%w: tensor<8x8xf32, #dist.layout<@m, [ {"dp"}, {} ]>> {dist.param = "l.weight"})
    attributes {dist.train_step} {
  %c = arith.truncf %w : tensor<8x8xf32, #dist.layout<@m, [ {"dp"}, {} ]>> to tensor<8x8xbf16, #dist.layout<@m, [ {"dp"}, {} ]>>
  %g = dist.redistribute %c : tensor<8x8xbf16, #dist.layout<@m, [ {"dp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m, [ {}, {} ]>>
  dist.compute forward "l" (%g) : tensor<8x8xbf16, #dist.layout<@m, [ {}, {} ]>>
  return
}

// -----

// A declaration has no body to rewrite.
dist.mesh @m ["dp" = 2]
// CHECK-LABEL: func.func private @declaration
// CHECK-NOT:   dist.fp8
func.func private @declaration(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}}
