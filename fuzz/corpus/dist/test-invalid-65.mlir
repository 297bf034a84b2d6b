dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %g: tensor<8xf32, #dist.layout<@n, [{}], partial(sum) = {"dp"}>>) {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@n, [{}], partial(sum) = {"dp"}>>
  return
}
