dist.mesh @m ["dp" = 2]
func.func @f(%p: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %g: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %m: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %v: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  %0:3 = dist.adamw %p, %g, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
