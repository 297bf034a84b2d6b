dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @partial(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) -> (tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{}]>>) {
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  %1 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return %0, %1 : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{}]>>
}
