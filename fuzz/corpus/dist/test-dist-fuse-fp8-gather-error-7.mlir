dist.mesh @m ["dp" = 2]
func.func @not_float(%w: tensor<8xi32, #dist.layout<@m, [{"dp"}]>> {dist.param = "ids", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  return
}
