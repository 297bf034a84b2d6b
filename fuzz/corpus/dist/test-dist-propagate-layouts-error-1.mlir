dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @two_meshes(%a: tensor<8xf32> {dist.layout = #dist.layout<@m, [{"dp"}]>},
                      %b: tensor<8xf32> {dist.layout = #dist.layout<@n, [{"dp"}]>}) {
  return
}
