dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @no_cast(%w: tensor<8x8xbf16, #dist.layout<@m, [ {"tp", "dp"}, {} ]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.gradient_accumulation_steps = 2 : i64,
                dist.float8 = {power_of_2 = true}} {
  %g = dist.redistribute %w : tensor<8x8xbf16, #dist.layout<@m, [ {"tp", "dp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>>
  dist.compute forward "l" (%g) {dist.microbatch = 0 : i64} : tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>>
  %d0 = dist.compute backward "l" (%g) {dist.microbatch = 0 : i64} : tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>> -> tensor<8x8xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  dist.compute forward "l" (%g) {dist.microbatch = 1 : i64} : tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>>
  %d1 = dist.compute backward "l" (%g, %d0) {dist.microbatch = 1 : i64} : tensor<8x8xbf16, #dist.layout<@m, [ {}, {"tp"} ]>>, tensor<8x8xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>> -> tensor<8x8xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w, %d1 : tensor<8x8xbf16, #dist.layout<@m, [ {"tp", "dp"}, {} ]>>, tensor<8x8xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  return
}
