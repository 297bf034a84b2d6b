dist.mesh @m ["dp" = 4]
func.func @f(%a: tensor<8xf32>) {
  %b = arith.addf %a, %a : tensor<8xf32>
  %0 = dist.annotate %b : tensor<8xf32> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}
