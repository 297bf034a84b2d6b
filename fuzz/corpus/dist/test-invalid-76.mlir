func.func @f(%a: tensor<8xbf16>, %b: tensor<8xi8>) {
  %0 = dist.fp8_amax %a, %b : tensor<8xbf16>, tensor<8xi8> -> tensor<2xf32>
  return
}
