dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @orders(%a: tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>>,
                  %b: tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>) {
  %0 = dist.all_gather %a dim 0 over {"dp", "tp"} : tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  %1 = dist.all_gather %b dim 0 over {"tp", "dp"} : tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
