!s = tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
!sb = tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
!g = tensor<8xbf16, #dist.layout<@m, [{}]>>
!d = tensor<8xbf16, #dist.layout<@m, [{}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
func.func @widen(%w0: !s {dist.param = "a.weight"}, %w1: !s {dist.param = "b.weight"},
                 %m0: !s {dist.state = "a.weight.exp_avg"}, %v0: !s {dist.state = "a.weight.exp_avg_sq"},
                 %m1: !s {dist.state = "b.weight.exp_avg"}, %v1: !s {dist.state = "b.weight.exp_avg_sq"})
    attributes {dist.train_step} {
  %c0 = arith.truncf %w0 : !s to !sb
  %g0 = dist.all_gather %c0 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "a" (%g0) : !g
  %c1 = arith.truncf %w1 : !s to !sb
  %g1 = dist.all_gather %c1 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "b" (%g1) : !g
  %d1 = dist.compute backward "b" (%g1) : !g -> !d
  %d0 = dist.compute backward "a" (%g0) : !g -> !d
  %r1 = dist.reduce_scatter %d1 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !sb
  %r0 = dist.reduce_scatter %d0 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !sb
  %f1 = arith.extf %r1 : !sb to !s
  %f0 = arith.extf %r0 : !sb to !s
  %p1, %pm1, %pv1 = dist.adamw %w1, %f1, %m1, %v1 {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, seed = 0, tensor_id = 1} : !s, !s, !s, !s
  %p0, %pm0, %pv0 = dist.adamw %w0, %f0, %m0, %v0 {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, seed = 0, tensor_id = 0} : !s, !s, !s, !s
  return
}
