!s = tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
!g = tensor<8x4xf32, #dist.layout<@m, [{}, {}]>>
dist.mesh @m ["dp" = 2]
func.func @redistribute(%w: !s {dist.param = "a.weight"}) attributes {dist.train_step} {
  %g = dist.redistribute %w : !s -> !g
  dist.compute forward "a" (%g) : !g
  return
}
