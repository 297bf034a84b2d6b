dist.mesh @m ["r" = 2, "s" = 2]
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
