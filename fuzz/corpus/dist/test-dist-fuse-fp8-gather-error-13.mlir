dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @stored_partial(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}], partial(sum) = {"tp"}>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %g = dist.all_gather %w dim 0 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"dp"}], partial(sum) = {"tp"}>> -> tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>
  dist.compute forward "l" (%g) : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>
  return
}
