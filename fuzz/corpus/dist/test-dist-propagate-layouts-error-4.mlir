dist.mesh @m ["dp" = 2]
func.func @not_a_tensor(%a: f32 {dist.layout = #dist.layout<@m, [{"dp"}]>}) {
  return
}
