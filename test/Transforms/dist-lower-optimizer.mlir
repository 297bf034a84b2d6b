// RUN: %meshplan-opt %s --dist-propagate-layouts --dist-lower-redistribute --dist-lower-optimizer -split-input-file | FileCheck %s
// RUN: %meshplan-opt %s --dist-propagate-layouts --dist-lower-redistribute --dist-lower-optimizer --dist-materialize-comms -split-input-file | FileCheck %s --check-prefix=COMMS

// FSDP over dp: each gradient is reduce-scattered (avg) over dp into the
// stored shard right after the backward that produces it (gradients of one
// backward in the order of their optimizer_steps, here b before a); the
// updates run at the end of the step, in the same order, with the hyper-parameters of dist.optimizer. tensor_id is
// the index among the dist.param arguments (the batch argument does not
// count), not the order of the updates.
dist.mesh @m ["dp" = 2]
// CHECK-LABEL: func.func @fsdp
// CHECK-SAME: %[[BATCH:[a-z0-9]+]]: tensor<4x8xbf16, #dist.layout<@m, [{"dp"}, {}]>>,
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "a.weight"},
// CHECK-SAME: %[[B:[a-z0-9]+]]: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "b.weight"},
// CHECK-SAME: %[[AM:[a-z0-9]+]]: tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.state = "a.weight.exp_avg"},
// CHECK-SAME: %[[AV:[a-z0-9]+]]: tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.state = "a.weight.exp_avg_sq"},
// CHECK-SAME: %[[BM:[a-z0-9]+]]: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.state = "b.weight.exp_avg"},
// CHECK-SAME: %[[BV:[a-z0-9]+]]: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.state = "b.weight.exp_avg_sq"})
// CHECK: %[[D:.*]]:2 = dist.compute backward "ab"
// CHECK-NEXT: %[[RB:.*]] = dist.reduce_scatter %[[D]]#1 dim 0 avg over {"dp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(avg) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
// CHECK-NEXT: %[[RA:.*]] = dist.reduce_scatter %[[D]]#0 dim 0 avg over {"dp"} : tensor<8x4xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>> -> tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
// CHECK-NEXT: dist.compute forward "after"
// CHECK-NEXT: dist.adamw %[[B]], %[[RB]], %[[BM]], %[[BV]] {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, lr = 3.000000e-04 : f64, seed = 7 : i64, tensor_id = 1 : i64, weight_decay = 1.000000e-01 : f64} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
// CHECK-NEXT: dist.adamw %[[A]], %[[RA]], %[[AM]], %[[AV]] {{{.*}} tensor_id = 0 : i64{{.*}}} : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
// CHECK-NEXT: return
// CHECK-NOT: dist.optimizer_step
// CHECK-NOT: dist.all_gather
func.func @fsdp(
    %x: tensor<4x8xbf16, #dist.layout<@m, [ {"dp"}, {} ]>>,
    %a: tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>> {dist.param = "a.weight"},
    %b: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "b.weight"})
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 3.0e-4 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.1 : f64,
                                  stochastic_rounding = false, seed = 7 : i64}} {
  %ga = dist.redistribute %a : tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>> -> tensor<8x4xf32, #dist.layout<@m, [ {}, {} ]>>
  %gb = dist.redistribute %b : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> -> tensor<8xf32, #dist.layout<@m, [ {} ]>>
  dist.compute forward "ab" (%x, %ga, %gb) : tensor<4x8xbf16, #dist.layout<@m, [ {"dp"}, {} ]>>, tensor<8x4xf32, #dist.layout<@m, [ {}, {} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ]>>
  %da, %db = dist.compute backward "ab" (%ga, %gb) : tensor<8x4xf32, #dist.layout<@m, [ {}, {} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ]>> -> tensor<8x4xf32, #dist.layout<@m, [ {}, {} ], partial(avg) = {"dp"}>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %b, %db : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  dist.compute forward "after" (%x) : tensor<4x8xbf16, #dist.layout<@m, [ {"dp"}, {} ]>>
  dist.optimizer_step %a, %da : tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>>, tensor<8x4xf32, #dist.layout<@m, [ {}, {} ], partial(avg) = {"dp"}>>
  return
}

// -----

// FSDP x TP: the colwise weight is stored {"tp", "dp"} on dim 0 and computed
// on {"tp"}; its gradient is reduce-scattered over dp on dim 0, keeping the
// tp split. The rowwise weight keeps tp on dim 1. No gather after backward.
dist.mesh @m ["dp" = 2, "tp" = 2]
// CHECK-LABEL: func.func @fsdp_tp
// CHECK-SAME: {dist.state = "wq.exp_avg"}
// CHECK: dist.compute backward "layer"
// CHECK-NOT: dist.all_gather
// CHECK: dist.reduce_scatter %{{.*}} dim 0 avg over {"dp"} : tensor<16x8xf32, #dist.layout<@m, [{"tp"}, {}], partial(avg) = {"dp"}>> -> tensor<16x8xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>
// CHECK-NEXT: dist.reduce_scatter %{{.*}} dim 0 avg over {"dp"} : tensor<8x16xf32, #dist.layout<@m, [{}, {"tp"}], partial(avg) = {"dp"}>> -> tensor<8x16xf32, #dist.layout<@m, [{"dp"}, {"tp"}]>>
// CHECK-NOT: dist.all_gather
// CHECK: dist.adamw {{.*}} : tensor<16x8xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>, tensor<16x8xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>, tensor<16x8xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>, tensor<16x8xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>
// CHECK-NEXT: dist.adamw {{.*}} : tensor<8x16xf32, #dist.layout<@m, [{"dp"}, {"tp"}]>>, tensor<8x16xf32, #dist.layout<@m, [{"dp"}, {"tp"}]>>, tensor<8x16xf32, #dist.layout<@m, [{"dp"}, {"tp"}]>>, tensor<8x16xf32, #dist.layout<@m, [{"dp"}, {"tp"}]>>
// CHECK-NEXT: return
func.func @fsdp_tp(
    %wq: tensor<16x8xf32, #dist.layout<@m, [ {"tp", "dp"}, {} ]>> {dist.param = "wq"},
    %wo: tensor<8x16xf32, #dist.layout<@m, [ {"dp"}, {"tp"} ]>> {dist.param = "wo"})
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 3.0e-4 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.1 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  %gq = dist.redistribute %wq : tensor<16x8xf32, #dist.layout<@m, [ {"tp", "dp"}, {} ]>> -> tensor<16x8xf32, #dist.layout<@m, [ {"tp"}, {} ]>>
  %go = dist.redistribute %wo : tensor<8x16xf32, #dist.layout<@m, [ {"dp"}, {"tp"} ]>> -> tensor<8x16xf32, #dist.layout<@m, [ {}, {"tp"} ]>>
  dist.compute forward "layer" (%gq, %go) : tensor<16x8xf32, #dist.layout<@m, [ {"tp"}, {} ]>>, tensor<8x16xf32, #dist.layout<@m, [ {}, {"tp"} ]>>
  %dq, %do = dist.compute backward "layer" (%gq, %go) : tensor<16x8xf32, #dist.layout<@m, [ {"tp"}, {} ]>>, tensor<8x16xf32, #dist.layout<@m, [ {}, {"tp"} ]>> -> tensor<16x8xf32, #dist.layout<@m, [ {"tp"}, {} ], partial(avg) = {"dp"}>>, tensor<8x16xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %wq, %dq : tensor<16x8xf32, #dist.layout<@m, [ {"tp", "dp"}, {} ]>>, tensor<16x8xf32, #dist.layout<@m, [ {"tp"}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %wo, %do : tensor<8x16xf32, #dist.layout<@m, [ {"dp"}, {"tp"} ]>>, tensor<8x16xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  return
}

// -----

// HSDP with a managed (torchft) replicate axis r: reduce-scatter over the
// shard axis s, then the avg all-reduce over r, which is fault_tolerant. The
// parameters are bf16 with stochastic rounding: the SR update runs on the
// stored bf16 shard, with fp32 state and the fp32 reduced gradient.
dist.mesh @ft ["r" = 3, "s" = 4] managed = ["r"]
// CHECK-LABEL: func.func @hsdp_managed
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<16x8xbf16, #dist.layout<@ft, [{"s"}, {}]>> {dist.param = "w"}
// CHECK-SAME: %[[M:[a-z0-9]+]]: tensor<16x8xf32, #dist.layout<@ft, [{"s"}, {}]>> {dist.state = "w.exp_avg"}
// CHECK-SAME: %[[V:[a-z0-9]+]]: tensor<16x8xf32, #dist.layout<@ft, [{"s"}, {}]>> {dist.state = "w.exp_avg_sq"}
// CHECK: %[[D:.*]] = dist.compute backward "w"
// CHECK-NEXT: %[[RS:.*]] = dist.reduce_scatter %[[D]] dim 0 avg over {"s"} : tensor<16x8xf32, #dist.layout<@ft, [{}, {}], partial(avg) = {"r", "s"}>> -> tensor<16x8xf32, #dist.layout<@ft, [{"s"}, {}], partial(avg) = {"r"}>>
// CHECK-NEXT: %[[AR:.*]] = dist.all_reduce %[[RS]] avg fault_tolerant over {"r"} : tensor<16x8xf32, #dist.layout<@ft, [{"s"}, {}], partial(avg) = {"r"}>> -> tensor<16x8xf32, #dist.layout<@ft, [{"s"}, {}]>>
// CHECK-NOT: dist.all_gather
// CHECK: dist.adamw %[[W]], %[[AR]], %[[M]], %[[V]] {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, seed = 42 : i64, stochastic_rounding, tensor_id = 0 : i64, weight_decay = 0.000000e+00 : f64} : tensor<16x8xbf16, #dist.layout<@ft, [{"s"}, {}]>>, tensor<16x8xf32, #dist.layout<@ft, [{"s"}, {}]>>, tensor<16x8xf32, #dist.layout<@ft, [{"s"}, {}]>>, tensor<16x8xf32, #dist.layout<@ft, [{"s"}, {}]>>
// CHECK-NEXT: return
// The same after dist-materialize-comms: the shard-axis reduce-scatter and
// the fault-tolerant replica all-reduce run on their own communicators.
// COMMS: dist.comm @comm_ft_r on @ft axes {"r"}
// COMMS: dist.comm @comm_ft_s on @ft axes {"s"}
// COMMS-LABEL: func.func @hsdp_managed
// COMMS: dist.reduce_scatter %{{.*}} dim 0 avg over {"s"} comm = @comm_ft_s
// COMMS-NEXT: dist.all_reduce %{{.*}} avg fault_tolerant over {"r"} comm = @comm_ft_r
// COMMS: dist.adamw
func.func @hsdp_managed(%w: tensor<16x8xbf16, #dist.layout<@ft, [ {"s"}, {} ]>> {dist.param = "w"})
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = true, seed = 42 : i64}} {
  %g = dist.redistribute %w : tensor<16x8xbf16, #dist.layout<@ft, [ {"s"}, {} ]>> -> tensor<16x8xbf16, #dist.layout<@ft, [ {}, {} ]>>
  dist.compute forward "w" (%g) : tensor<16x8xbf16, #dist.layout<@ft, [ {}, {} ]>>
  %d = dist.compute backward "w" (%g) : tensor<16x8xbf16, #dist.layout<@ft, [ {}, {} ]>> -> tensor<16x8xf32, #dist.layout<@ft, [ {}, {} ], partial(avg) = {"r", "s"}>>
  dist.optimizer_step %w, %d : tensor<16x8xbf16, #dist.layout<@ft, [ {"s"}, {} ]>>, tensor<16x8xf32, #dist.layout<@ft, [ {}, {} ], partial(avg) = {"r", "s"}>>
  return
}

// -----

// HSDP whose replicate axis is not managed: the same reductions, and the
// all-reduce is not fault_tolerant. The gradient is reduced in bf16 (the
// reduce dtype) and widened to f32 for the update (AdamW reads a float32
// gradient), after the reductions and before the update.
dist.mesh @m ["r" = 2, "s" = 2]
// CHECK-LABEL: func.func @hsdp_static
// CHECK: dist.reduce_scatter %{{.*}} dim 0 avg over {"s"} : tensor<8xbf16, #dist.layout<@m, [{}], partial(avg) = {"r", "s"}>> -> tensor<8xbf16, #dist.layout<@m, [{"s"}], partial(avg) = {"r"}>>
// CHECK-NEXT: %[[AR:.*]] = dist.all_reduce %{{.*}} avg over {"r"} :
// CHECK-NOT: fault_tolerant
// CHECK: %[[F32:.*]] = arith.extf %[[AR]] : tensor<8xbf16, #dist.layout<@m, [{"s"}]>> to tensor<8xf32, #dist.layout<@m, [{"s"}]>>
// CHECK-NEXT: dist.adamw %{{.*}}, %[[F32]], %{{.*}}, %{{.*}} {{{.*}}} : tensor<8xf32, #dist.layout<@m, [{"s"}]>>, tensor<8xf32, #dist.layout<@m, [{"s"}]>>, tensor<8xf32, #dist.layout<@m, [{"s"}]>>, tensor<8xf32, #dist.layout<@m, [{"s"}]>>
func.func @hsdp_static(%w: tensor<8xf32, #dist.layout<@m, [ {"s"} ]>> {dist.param = "w"})
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  %g = dist.redistribute %w : tensor<8xf32, #dist.layout<@m, [ {"s"} ]>> -> tensor<8xf32, #dist.layout<@m, [ {} ]>>
  %d = dist.compute backward "w" (%g) : tensor<8xf32, #dist.layout<@m, [ {} ]>> -> tensor<8xbf16, #dist.layout<@m, [ {} ], partial(avg) = {"r", "s"}>>
  dist.optimizer_step %w, %d : tensor<8xf32, #dist.layout<@m, [ {"s"} ]>>, tensor<8xbf16, #dist.layout<@m, [ {} ], partial(avg) = {"r", "s"}>>
  return
}

// -----

// Pure DDP (no shard axis): the parameter is replicated, so the gradient is
// only all-reduced. A managed DDP axis makes it fault_tolerant.
dist.mesh @m ["dp" = 4] managed = ["dp"]
// CHECK-LABEL: func.func @ddp
// CHECK-NOT: dist.reduce_scatter
// CHECK: %[[AR:.*]] = dist.all_reduce %{{.*}} avg fault_tolerant over {"dp"} : tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
// CHECK-NOT: dist.reduce_scatter
// CHECK: dist.adamw %{{.*}}, %[[AR]], {{.*}} : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
// COMMS-LABEL: func.func @ddp
// COMMS: dist.all_reduce %{{.*}} avg fault_tolerant over {"dp"} comm = @comm_m_dp
func.func @ddp(%w: tensor<8x8xf32, #dist.layout<@m, [ {}, {} ]>> {dist.param = "w"})
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  %d = dist.compute backward "w" (%w) : tensor<8x8xf32, #dist.layout<@m, [ {}, {} ]>> -> tensor<8x8xf32, #dist.layout<@m, [ {}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w, %d : tensor<8x8xf32, #dist.layout<@m, [ {}, {} ]>>, tensor<8x8xf32, #dist.layout<@m, [ {}, {} ], partial(avg) = {"dp"}>>
  return
}

// -----

// A gradient already in the stored layout needs no collective: the update
// reads it directly. A dist.param argument without an optimizer_step (frozen)
// gets no state, and a function without dist.train_step is left alone.
dist.mesh @m ["dp" = 2]
// CHECK-LABEL: func.func @already_reduced
// CHECK-SAME: {dist.param = "frozen"}
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "w"}
// CHECK-SAME: %[[G:[a-z0-9]+]]: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>,
// CHECK-SAME: {dist.state = "w.exp_avg"}
// CHECK-SAME: {dist.state = "w.exp_avg_sq"})
// CHECK-NOT: dist.state
// CHECK-NEXT: dist.adamw %[[W]], %[[G]], {{.*}}tensor_id = 1 : i64
// CHECK-NEXT: return
func.func @already_reduced(
    %f: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "frozen"},
    %w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
    %g: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>
  return
}
// CHECK-LABEL: func.func @not_a_step
// CHECK-SAME: (%{{[a-z0-9]+}}: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "w"})
// CHECK-NEXT: return
func.func @not_a_step(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"}) {
  return
}
