dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @reorder(%a: tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>>) -> tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>> {
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>
  return %0 : tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>
}
