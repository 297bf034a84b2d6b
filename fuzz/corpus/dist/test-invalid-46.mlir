func.func @f(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) {
  %0 = dist.matmul %a, %b : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  return
}
