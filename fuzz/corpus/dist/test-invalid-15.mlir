dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32>) {
  %0 = dist.annotate %a : tensor<8xf32> -> tensor<8xf16, #dist.layout<@m, [{"dp"}]>>
  return
}
