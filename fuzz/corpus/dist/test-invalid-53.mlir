dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  %0 = dist.all_reduce %a mean over {"dp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
