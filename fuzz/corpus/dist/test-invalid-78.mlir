dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, %b: tensor<8xbf16, #dist.layout<@m, [{"tp"}]>>) {
  %0 = dist.fp8_amax %a, %b : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, tensor<8xbf16, #dist.layout<@m, [{"tp"}]>> -> tensor<2xf32, #dist.layout<@m, [{}], partial(max) = {"dp"}>>
  return
}
