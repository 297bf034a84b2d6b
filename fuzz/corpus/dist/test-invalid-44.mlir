dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
dist.comm @c on @n axes {"dp"}
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  %0 = dist.all_gather %a dim 0 over {"dp"} comm = @c : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
