func.func @f(%a: tensor<8xf32>) {
  %0 = dist.compute forward "l" (%a) : tensor<8xf32> -> tensor<8xf32>
  return
}
