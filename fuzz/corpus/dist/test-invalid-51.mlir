func.func @f(%a: tensor<4x8xf32>) {
  %0 = dist.reduce_sum %a dims = [1] : tensor<4x8xf32> -> tensor<8xf32>
  return
}
