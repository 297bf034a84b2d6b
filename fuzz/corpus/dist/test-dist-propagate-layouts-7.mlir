dist.mesh @m ["tp" = 2]
func.func @reshape_minor_split(%x: tensor<8x4xf32> {dist.layout = #dist.layout<@m, [{}, {"tp"}]>}) -> tensor<32xf32> {
  %0 = dist.reshape %x : tensor<8x4xf32> -> tensor<32xf32>
  return %0 : tensor<32xf32>
}
