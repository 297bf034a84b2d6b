dist.mesh @m ["dp" = 4]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
