dist.mesh @m ["dp" = 2]
func.func @no_function_attr(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step} {
  return
}
