func.func @f(%a: tensor<8xf32>) {
  dist.free %a : tensor<8xf32>
  %0 = tensor.generate {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %x = tensor.extract %a[%c0] : tensor<8xf32>
    tensor.yield %x : f32
  } : tensor<4xf32>
  return
}
