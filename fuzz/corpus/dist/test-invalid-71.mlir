func.func @f(%p: tensor<8xf32>) {
  %0:3 = dist.adamw %p, %p, %p, %p {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, stochastic_rounding, seed = 0, tensor_id = 0} : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  return
}
