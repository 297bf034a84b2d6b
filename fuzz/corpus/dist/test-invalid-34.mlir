dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  %0 = dist.all_gather %a dim 0 over {"dp"} comm = @c : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
