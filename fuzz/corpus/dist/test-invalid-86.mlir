func.func @f(%w: tensor<8xbf16>, %a: tensor<1xbf16>) {
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16>, tensor<1xbf16> -> tensor<8xf8E5M2>
  return
}
