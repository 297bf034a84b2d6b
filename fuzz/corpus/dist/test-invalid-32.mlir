dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  %0 = dist.mark_partial %a max over {"tp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{}], partial(max) = {"dp", "tp"}>>
  return
}
