dist.mesh @m ["dp" = 2]
func.func @op_between_cast_and_gather(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %c = arith.truncf %w : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> to tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
  %s = arith.mulf %c, %c : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
  %g = dist.all_gather %c dim 0 over {"dp"} : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<8xbf16, #dist.layout<@m, [{}]>>
  dist.compute forward "l" (%g) : tensor<8xbf16, #dist.layout<@m, [{}]>>
  return
}
