dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"tp"}]>>) {
  dist.compute forward "l" (%a) : tensor<8xf32, #dist.layout<@m, [{"tp"}]>>
  return
}
