dist.mesh @m ["dp" = 4] managed = ["dp"]
func.func @ddp(%w: tensor<8x8xf32, #dist.layout<@m, [ {}, {} ]>> {dist.param = "w"})
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  %d = dist.compute backward "w" (%w) : tensor<8x8xf32, #dist.layout<@m, [ {}, {} ]>> -> tensor<8x8xf32, #dist.layout<@m, [ {}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w, %d : tensor<8x8xf32, #dist.layout<@m, [ {}, {} ]>>, tensor<8x8xf32, #dist.layout<@m, [ {}, {} ], partial(avg) = {"dp"}>>
  return
}
