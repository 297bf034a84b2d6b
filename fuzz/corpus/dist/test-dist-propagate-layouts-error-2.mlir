dist.mesh @m ["dp" = 2]
func.func @rank(%a: tensor<8xf32> {dist.layout = #dist.layout<@m, [{"dp"}, {}]>}) {
  return
}
