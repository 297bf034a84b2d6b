dist.mesh @m ["tp" = 4]
func.func @view_dtype_uneven(%x: tensor<6xf32> {dist.layout = #dist.layout<@m, [{"tp"}]>}) -> tensor<12xbf16> {
  %0 = dist.bitcast %x : tensor<6xf32> -> tensor<12xbf16>
  return %0 : tensor<12xbf16>
}
