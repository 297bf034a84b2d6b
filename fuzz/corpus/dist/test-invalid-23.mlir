dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>) {
  %0 = dist.all_gather %a dim 0 over {"tp"} : tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}
