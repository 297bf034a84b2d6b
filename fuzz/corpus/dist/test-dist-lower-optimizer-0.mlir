dist.mesh @m ["dp" = 2]
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
