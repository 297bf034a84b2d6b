dist.mesh @m ["r" = 2, "s" = 2]
func.func @uneven_flat(%a: tensor<5xf32, #dist.layout<@m, [{("r", "s")}]>>) -> tensor<5xf32, #dist.layout<@m, [{"r", "s"}]>> {
  %0 = dist.redistribute %a : tensor<5xf32, #dist.layout<@m, [{("r", "s")}]>> -> tensor<5xf32, #dist.layout<@m, [{"r", "s"}]>>
  return %0 : tensor<5xf32, #dist.layout<@m, [{"r", "s"}]>>
}
