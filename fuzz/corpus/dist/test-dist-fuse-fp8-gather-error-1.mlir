dist.mesh @m ["dp" = 2]
func.func @not_a_step(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.float8 = {power_of_2 = true}} {
  return
}
