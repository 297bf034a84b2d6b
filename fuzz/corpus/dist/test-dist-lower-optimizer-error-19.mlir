dist.mesh @m ["dp" = 2]
func.func @not_a_train_step(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                            %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>) {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}
