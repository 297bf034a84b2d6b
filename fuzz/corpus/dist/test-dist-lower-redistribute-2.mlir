dist.mesh @m ["dp" = 4, "tp" = 2]
func.func @fsdp_tp_unshard(%w: tensor<15x5xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>>) -> tensor<15x5xbf16, #dist.layout<@m, [{"tp"}, {}]>> {
  %0 = dist.redistribute %w : tensor<15x5xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>> -> tensor<15x5xbf16, #dist.layout<@m, [{"tp"}, {}]>>
  return %0 : tensor<15x5xbf16, #dist.layout<@m, [{"tp"}, {}]>>
}
