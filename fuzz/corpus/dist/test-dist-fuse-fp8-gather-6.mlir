dist.mesh @m ["dp" = 2]
func.func @no_float8(%w: tensor<8x8xf32, #dist.layout<@m, [ {"dp"}, {} ]>> {dist.param = "l.weight"})
    attributes {dist.train_step} {
  %c = arith.truncf %w : tensor<8x8xf32, #dist.layout<@m, [ {"dp"}, {} ]>> to tensor<8x8xbf16, #dist.layout<@m, [ {"dp"}, {} ]>>
  %g = dist.redistribute %c : tensor<8x8xbf16, #dist.layout<@m, [ {"dp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m, [ {}, {} ]>>
  dist.compute forward "l" (%g) : tensor<8x8xbf16, #dist.layout<@m, [ {}, {} ]>>
  return
}
