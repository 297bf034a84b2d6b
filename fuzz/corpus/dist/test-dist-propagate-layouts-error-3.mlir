dist.mesh @m ["dp" = 2]
func.func @not_a_layout(%a: tensor<8xf32> {dist.layout = "dp"}) {
  return
}
