dist.mesh @m ["dp" = 2, "tp" = 4]
func.func @view_dtype(%x: tensor<8x256xf32> {dist.layout = #dist.layout<@m, [{"dp"}, {"tp"}]>}) -> tensor<8x512xbf16> {
  %0 = dist.bitcast %x : tensor<8x256xf32> -> tensor<8x512xbf16>
  return %0 : tensor<8x512xbf16>
}
