module {
  dist.mesh @mesh ["dp" = 2, "tp" = 2]
  func.func @train_step(%arg0: tensor<32x16xf32, #dist.layout<@mesh, [{"tp", "dp"}, {}]>> {dist.param = "a.weight"}, %arg1: tensor<16x32xf32, #dist.layout<@mesh, [{"dp"}, {"tp"}]>> {dist.param = "b.weight"}) attributes {dist.gradient_accumulation_steps = 1 : i64, dist.optimizer = {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, kind = "adamw", lr = 8.000000e-04 : f64, seed = 0 : i64, stochastic_rounding = false, weight_decay = 1.000000e-01 : f64}, dist.reshard_after_forward = true, dist.train_step, dist.trainer_axes = ["tp"]} {
    %0 = dist.redistribute %arg0 : tensor<32x16xf32, #dist.layout<@mesh, [{"tp", "dp"}, {}]>> -> tensor<32x16xf32, #dist.layout<@mesh, [{"tp"}, {}]>>
    %1 = dist.redistribute %arg1 : tensor<16x32xf32, #dist.layout<@mesh, [{"dp"}, {"tp"}]>> -> tensor<16x32xf32, #dist.layout<@mesh, [{}, {"tp"}]>>
    dist.compute forward "root"(%0, %1) flops = 0x4160000000000000 {dist.reshard_after_forward = false} : tensor<32x16xf32, #dist.layout<@mesh, [{"tp"}, {}]>>, tensor<16x32xf32, #dist.layout<@mesh, [{}, {"tp"}]>>
    %2:2 = dist.compute backward "root"(%0, %1) flops = 0x4170000000000000 : tensor<32x16xf32, #dist.layout<@mesh, [{"tp"}, {}]>>, tensor<16x32xf32, #dist.layout<@mesh, [{}, {"tp"}]>> -> tensor<32x16xf32, #dist.layout<@mesh, [{"tp"}, {}], partial(avg) = {"dp"}>>, tensor<16x32xf32, #dist.layout<@mesh, [{}, {"tp"}], partial(avg) = {"dp"}>>
    dist.optimizer_step %arg0, %2#0 : tensor<32x16xf32, #dist.layout<@mesh, [{"tp", "dp"}, {}]>>, tensor<32x16xf32, #dist.layout<@mesh, [{"tp"}, {}], partial(avg) = {"dp"}>>
    dist.optimizer_step %arg1, %2#1 : tensor<16x32xf32, #dist.layout<@mesh, [{"dp"}, {"tp"}]>>, tensor<16x32xf32, #dist.layout<@mesh, [{}, {"tp"}], partial(avg) = {"dp"}>>
    return
  }
}
