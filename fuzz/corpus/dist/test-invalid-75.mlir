func.func @f(%a: tensor<8xbf16>, %b: tensor<8xbf16>) {
  %0 = dist.fp8_amax %a, %b : tensor<8xbf16>, tensor<8xbf16> -> tensor<1xf32>
  return
}
