!s = tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
!d = tensor<8x4xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2]
func.func @optimizer_step(%w: !s {dist.param = "a.weight"}) attributes {dist.train_step} {
  dist.compute forward "a" (%w) : !s
  %d = dist.compute backward "a" (%w) : !s -> !d
  dist.optimizer_step %w, %d : !s, !d
  return
}
