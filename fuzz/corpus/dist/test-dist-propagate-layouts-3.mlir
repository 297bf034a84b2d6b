dist.mesh @m ["tp" = 2]
func.func @mlp(%x: tensor<4x8xf32> {dist.layout = #dist.layout<@m, [{}, {}]>},
               %w1: tensor<8x16xf32> {dist.layout = #dist.layout<@m, [{}, {"tp"}]>},
               %w2: tensor<16x8xf32> {dist.layout = #dist.layout<@m, [{"tp"}, {}]>}) -> tensor<4x8xf32> {
  %h = dist.matmul %x, %w1 : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %y = dist.matmul %h, %w2 : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
  %z = arith.mulf %y, %y : tensor<4x8xf32>
  return %z : tensor<4x8xf32>
}
