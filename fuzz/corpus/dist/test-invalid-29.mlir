dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>) {
  %0 = dist.all_to_all %a dim 0 to 0 over {"dp"} : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
  return
}
