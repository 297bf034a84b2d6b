dist.mesh @m ["dp" = 2]
func.func @conflict(%a: tensor<8x4xf32> {dist.layout = #dist.layout<@m, [{"dp"}, {}]>},
                    %b: tensor<8x4xf32> {dist.layout = #dist.layout<@m, [{}, {"dp"}]>}) -> tensor<8x4xf32> {
  %0 = arith.addf %a, %b : tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
