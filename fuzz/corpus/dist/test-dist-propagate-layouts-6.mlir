dist.mesh @m ["dp" = 2]
func.func @reshape(%x: tensor<8x4xf32> {dist.layout = #dist.layout<@m, [{"dp"}, {}]>}) -> tensor<4x8xf32> {
  %0 = dist.reshape %x : tensor<8x4xf32> -> tensor<32xf32>
  %1 = dist.reshape %0 : tensor<32xf32> -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
