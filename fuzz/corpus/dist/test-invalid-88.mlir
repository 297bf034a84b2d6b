func.func @f(%w: tensor<8xbf16>, %a: tensor<?xf32>) {
  %0 = dist.fp8_cast %w scale %a[-1] : tensor<8xbf16>, tensor<?xf32> -> tensor<8xf8E4M3FN>
  return
}
