func.func @f(%a: tensor<8xf32>) {
  %0, %1 = dist.compute backward "l" (%a) : tensor<8xf32> -> tensor<8xf32>, tensor<8xf32>
  return
}
