dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>>) {
  %0 = dist.permute %a dim 0 to {"dp"} over {"dp", "tp"} : tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>
  return
}
