// Every discardable dist attribute in a form its verifier accepts; each
// prints as it parses.
// RUN: %meshplan-opt %s | %meshplan-opt | FileCheck %s
// RUN: %meshplan-opt %s --verify-roundtrip -o /dev/null

// CHECK: module attributes {dist.rank = 3 : i64}
module attributes {dist.rank = 3 : i64} {
dist.mesh @m ["pp" = 2, "dp" = 2, "tp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "1f1b" microbatches 2 stages_per_rank 1 activation tensor<4xf32>

// CHECK-LABEL: func.func @step
// CHECK-SAME: {dist.float8, dist.param = "w", dist.tensor_id = 4 : i64}
// CHECK-SAME: {dist.state = "w.exp_avg"}
// CHECK-SAME: {dist.layout = #dist.layout<@m, [{"dp"}]>}
// CHECK-SAME: dist.float8 = {power_of_2 = true}
// CHECK-SAME: dist.gradient_accumulation_steps = 2 : i64
// CHECK-SAME: dist.optimizer = {beta1 = {{.*}}, kind = "adamw", {{.*}}, weight_decay = 1.000000e-01 : f64}
// CHECK-SAME: dist.pipeline = @pipe
// CHECK-SAME: dist.pp_axis = "pp", dist.pp_rank = 1 : i64
// CHECK-SAME: dist.reshard_after_forward = false
// CHECK-SAME: dist.train_step
// CHECK-SAME: dist.trainer_axes = ["tp"]
func.func @step(%w: tensor<4xf32> {dist.param = "w", dist.float8, dist.tensor_id = 4 : i64},
                %m: tensor<4xf32> {dist.state = "w.exp_avg"},
                %x: tensor<4xf32> {dist.layout = #dist.layout<@m, [{"dp"}]>})
    attributes {dist.train_step, dist.pipeline = @pipe, dist.reshard_after_forward = false,
                dist.gradient_accumulation_steps = 2 : i64,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64,
                                  beta2 = 0.95 : f64, eps = 1.0e-8 : f64,
                                  weight_decay = 0.1 : f64, stochastic_rounding = false,
                                  seed = 7 : i64},
                dist.trainer_axes = ["tp"], dist.float8 = {power_of_2 = true},
                dist.pp_rank = 1 : i64, dist.pp_axis = "pp"} {
  // CHECK: dist.compute forward "l"(%{{.*}}) stage 1 {dist.action = "1F0", dist.id = 0 : i64, dist.microbatch = 0 : i64, dist.reshard_after_forward = true, dist.stream = "compute"}
  dist.compute forward "l" (%w) stage 1 {dist.microbatch = 0 : i64, dist.action = "1F0", dist.reshard_after_forward = true, dist.id = 0 : i64, dist.stream = "compute"} : tensor<4xf32>
  // CHECK: arith.addf %{{.*}}, %{{.*}} {dist.accumulate, dist.after = array<i64: 0>, dist.bucket = 0 : i64, dist.id = 1 : i64, dist.stream = "comm.rs"}
  %s = arith.addf %m, %m {dist.accumulate, dist.id = 1 : i64, dist.stream = "comm.rs", dist.after = array<i64: 0>, dist.bucket = 0 : i64} : tensor<4xf32>
  return
}
}
