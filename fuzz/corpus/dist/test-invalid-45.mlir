dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  %0 = dist.broadcast %a root -1 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
