dist.mesh @m ["dp" = 2]
func.func @unconstrained(%a: tensor<8xf32> {dist.layout = #dist.layout<@m, [{"dp"}]>}) -> tensor<8xf32> {
  %c = arith.constant dense<1.0> : tensor<4xf32>
  return %a : tensor<8xf32>
}
