dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%w: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, %a: tensor<1xf32, #dist.layout<@n, [{}]>>) {
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, tensor<1xf32, #dist.layout<@n, [{}]>> -> tensor<8xf8E4M3FN, #dist.layout<@m, [{"dp"}]>>
  return
}
