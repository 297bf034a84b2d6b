func.func @f(%a: tensor<4x8xf32>) {
  %0 = dist.reshape %a : tensor<4x8xf32> -> tensor<30xf32>
  return
}
