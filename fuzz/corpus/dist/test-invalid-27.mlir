dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  %0 = dist.reduce_scatter %a dim 0 max over {"dp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}
