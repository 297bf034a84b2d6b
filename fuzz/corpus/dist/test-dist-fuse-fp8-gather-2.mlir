dist.mesh @mesh ["dp" = 2, "tp" = 2]
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
