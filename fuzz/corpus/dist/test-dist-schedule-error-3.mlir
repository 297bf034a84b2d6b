!s = tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
!d = tensor<8x4xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2]
func.func @backward_first(%w: !s {dist.param = "a.weight"}) attributes {dist.train_step} {
  dist.compute forward "a" (%w) {dist.microbatch = 0 : i64} : !s
  %d0 = dist.compute backward "a" (%w) {dist.microbatch = 0 : i64} : !s -> !d
  %d1 = dist.compute backward "a" (%w, %d0) {dist.microbatch = 1 : i64} : !s, !d -> !d
  dist.compute forward "a" (%w) {dist.microbatch = 1 : i64} : !s
  return
}
