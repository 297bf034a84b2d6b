dist.mesh @m ["dp" = 2]
func.func @flag(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) attributes {dist.train_step, dist.reshard_after_forward = 1 : i64} {
  dist.compute forward "a" (%w) : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}
