dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  %0 = dist.all_reduce %a sum over {} : tensor<8xf32, #dist.layout<@m, [{}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
