dist.mesh @m ["r" = 2, "s" = 2] managed = ["r"]
func.func @f(%a: tensor<8xf32>) {
  %0 = dist.annotate %a : tensor<8xf32> -> tensor<8xf32, #dist.layout<@m, [{"r"}]>>
  return
}
