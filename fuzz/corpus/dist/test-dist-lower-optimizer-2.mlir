dist.mesh @ft ["r" = 3, "s" = 4] managed = ["r"]
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
