func.func @f(%a: tensor<4x8xf32>) {
  %0 = dist.bitcast %a : tensor<4x8xf32> -> tensor<4x8xbf16>
  return
}
