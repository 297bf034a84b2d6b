func.func @f(%w: tensor<8xbf16>, %a: tensor<1xf32>) {
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16>, tensor<1xf32> -> tensor<4xf8E4M3FN>
  return
}
