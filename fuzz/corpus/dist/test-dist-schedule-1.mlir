!s = tensor<32x32xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!sb = tensor<32x32xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!g = tensor<32x32xbf16, #dist.layout<@m, [{"tp"}, {}]>>
!d = tensor<32x32xf32, #dist.layout<@m, [{"tp"}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2, "tp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
func.func @keep(%w0: !s {dist.param = "tok_embeddings.weight"},
                %w1: !s {dist.param = "layers.0.attention.wq.weight"},
                %w2: !s {dist.param = "layers.1.attention.wq.weight"}) -> (!s, !s, !s)
    attributes {dist.train_step, dist.reshard_after_forward = false} {
  %c0 = arith.truncf %w0 : !s to !sb
  %g0 = dist.all_gather %c0 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "tok_embeddings" (%g0) : !g
  %c1 = arith.truncf %w1 : !s to !sb
  %g1 = dist.all_gather %c1 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "layers.0" (%g1) : !g
  %c2 = arith.truncf %w2 : !s to !sb
  %g2 = dist.all_gather %c2 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "layers.1" (%g2) : !g
  %d2 = dist.compute backward "layers.1" (%g2) : !g -> !d
  %r2 = dist.reduce_scatter %d2 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  %d1 = dist.compute backward "layers.0" (%g1) : !g -> !d
  %r1 = dist.reduce_scatter %d1 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  %d0 = dist.compute backward "tok_embeddings" (%g0) : !g -> !d
  %r0 = dist.reduce_scatter %d0 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  return %r0, %r1, %r2 : !s, !s, !s
}
