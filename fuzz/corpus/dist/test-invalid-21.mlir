dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@n, [{"dp"}]>>
  return
}
