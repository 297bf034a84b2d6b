func.func @f(%a: tensor<4x8xf32>) {
  %0 = dist.reduce_sum %a dims = [2] : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}
