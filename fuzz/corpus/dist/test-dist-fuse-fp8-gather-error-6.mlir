dist.mesh @m ["dp" = 2]
func.func @arg_attr_not_unit(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8 = true})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  return
}
