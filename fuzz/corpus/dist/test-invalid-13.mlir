dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  %0 = dist.annotate %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"tp"}]>>
  return
}
