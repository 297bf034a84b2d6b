dist.mesh @m ["dp" = 2, "tp" = 2]
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
