func.func @f(%p: tensor<8xbf16>, %m: tensor<8xf32>, %v: tensor<8xbf16>) {
  %0:3 = dist.adamw %p, %p, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xbf16>, tensor<8xbf16>, tensor<8xf32>, tensor<8xbf16>
  return
}
