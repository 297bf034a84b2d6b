dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @shard_to_shard(%a: tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>) -> tensor<8x4xf32, #dist.layout<@m, [{}, {"dp"}]>> {
  %0 = dist.redistribute %a : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x4xf32, #dist.layout<@m, [{}, {"dp"}]>>
  return %0 : tensor<8x4xf32, #dist.layout<@m, [{}, {"dp"}]>>
}
