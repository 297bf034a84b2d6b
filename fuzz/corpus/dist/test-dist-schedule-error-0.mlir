!s = tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
!g = tensor<8x4xf32, #dist.layout<@m, [{}, {}]>>
dist.mesh @m ["dp" = 2]
func.func @no_comm(%w: !s {dist.param = "a.weight"}) attributes {dist.train_step} {
  %g = dist.all_gather %w dim 0 over {"dp"} : !s -> !g
  dist.compute forward "a" (%g) : !g
  return
}
