func.func @f(%w: tensor<8xi32>, %a: tensor<1xf32>) {
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xi32>, tensor<1xf32> -> tensor<8xf8E4M3FN>
  return
}
