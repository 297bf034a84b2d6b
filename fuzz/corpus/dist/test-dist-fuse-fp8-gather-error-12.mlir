dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @reduction_in_chain(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %c = arith.truncf %w : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> to tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
  %g = dist.all_gather %c dim 0 over {"dp"} : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<8xbf16, #dist.layout<@m, [{}]>>
  %p = dist.mark_partial %g sum over {"tp"} : tensor<8xbf16, #dist.layout<@m, [{}]>> -> tensor<8xbf16, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>
  dist.compute forward "l" (%p) : tensor<8xbf16, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>
  return
}
