dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @backward(%x: tensor<8x4xf32>, %s: tensor<8xf32> {dist.layout = #dist.layout<@m, [{"dp"}]>}) -> tensor<8xf32> {
  %0 = arith.negf %x : tensor<8x4xf32>
  %1 = dist.reduce_sum %0 dims = [1] : tensor<8x4xf32> -> tensor<8xf32>
  %2 = arith.addf %1, %s : tensor<8xf32>
  return %2 : tensor<8xf32>
}
