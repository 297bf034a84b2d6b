dist.mesh @m ["dp" = 2]
func.func @f(%w: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>, %g: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>, tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>
  return
}
