func.func @f(%a: tensor<4x8x2xf32>, %b: tensor<8x2xf32>) {
  %0 = dist.matmul %a, %b : tensor<4x8x2xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  return
}
