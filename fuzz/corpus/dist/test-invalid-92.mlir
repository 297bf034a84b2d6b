func.func @f(%a: tensor<8xf32>) {
  dist.free %a : tensor<8xf32>
  dist.compute forward "l" (%a) : tensor<8xf32>
  return
}
