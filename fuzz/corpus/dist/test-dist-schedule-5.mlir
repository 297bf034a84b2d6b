!s = tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
!g = tensor<8xf32, #dist.layout<@m, [{}]>>
dist.mesh @m ["dp" = 2]
func.func @not_a_step(%w: !s) {
  %g = dist.all_gather %w dim 0 over {"dp"} : !s -> !g
  dist.compute forward "a" (%g) : !g
  return
}
