dist.mesh @m ["dp" = 2]
func.func @unnamed(%v: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>,
                   %w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.float8})
    attributes {dist.train_step} {
  return
}
