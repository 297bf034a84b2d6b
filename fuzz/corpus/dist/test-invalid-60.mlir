dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  %0 = dist.compute backward "l" (%a) : tensor<8xf32, #dist.layout<@m, [{}]>> -> tensor<8xf32, #dist.layout<@m, [{}, {}], partial(sum) = {"dp"}>>
  return
}
