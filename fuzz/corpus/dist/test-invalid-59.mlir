dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %b: tensor<8xf32, #dist.layout<@n, [{"dp"}]>>) {
  dist.compute forward "l" (%a, %b) : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@n, [{"dp"}]>>
  return
}
