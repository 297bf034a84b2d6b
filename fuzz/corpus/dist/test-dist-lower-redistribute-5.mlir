dist.mesh @m ["dp" = 2]
func.func @identity(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return %0 : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
}
