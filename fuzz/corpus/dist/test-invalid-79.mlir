dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>) {
  %0 = dist.fp8_amax %a : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<1xf32, #dist.layout<@m, [{"dp"}]>>
  return
}
