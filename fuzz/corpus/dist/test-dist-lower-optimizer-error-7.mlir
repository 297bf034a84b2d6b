dist.mesh @m ["dp" = 2]
func.func @kind_not_a_string(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                             %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = 1 : i64, lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}
