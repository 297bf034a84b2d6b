func.func @f(%w: tensor<8xf32>) {
  %0 = dist.compute backward "l" (%w) : tensor<8xf32> -> tensor<3x3xi8>
  return
}
