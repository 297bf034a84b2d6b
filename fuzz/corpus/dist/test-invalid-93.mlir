dist.mesh @m ["dp" = 2, "tp" = 2] managed = ["dp"]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp", "tp"}>>) {
  %0 = dist.all_reduce %a sum fault_tolerant over {"tp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp", "tp"}>> -> tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>
  return
}
