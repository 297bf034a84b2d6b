!s = tensor<32x32xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!sb = tensor<32x32xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!g = tensor<32x32xbf16, #dist.layout<@m, [{"tp"}, {}]>>
!d = tensor<32x32xf32, #dist.layout<@m, [{"tp"}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2, "tp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
func.func @accum(%w0: !s {dist.param = "tok_embeddings.weight"},
                 %w1: !s {dist.param = "layers.0.attention.wq.weight"}) -> (!s, !s)
    attributes {dist.train_step, dist.gradient_accumulation_steps = 2 : i64} {
  %c0 = arith.truncf %w0 : !s to !sb
  %g0 = dist.all_gather %c0 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "tok_embeddings" (%g0) {dist.microbatch = 0 : i64} : !g
  %c1 = arith.truncf %w1 : !s to !sb
  %g1 = dist.all_gather %c1 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "layers.0" (%g1) {dist.microbatch = 0 : i64} : !g
  %a1 = dist.compute backward "layers.0" (%g1) {dist.microbatch = 0 : i64} : !g -> !d
  %a0 = dist.compute backward "tok_embeddings" (%g0) {dist.microbatch = 0 : i64} : !g -> !d
  dist.compute forward "tok_embeddings" (%g0) {dist.microbatch = 1 : i64} : !g
  dist.compute forward "layers.0" (%g1) {dist.microbatch = 1 : i64} : !g
  %b1 = dist.compute backward "layers.0" (%g1, %a1) {dist.microbatch = 1 : i64} : !g, !d -> !d
  %r1 = dist.reduce_scatter %b1 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  %b0 = dist.compute backward "tok_embeddings" (%g0, %a0) {dist.microbatch = 1 : i64} : !g, !d -> !d
  %r0 = dist.reduce_scatter %b0 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  return %r0, %r1 : !s, !s
}

func.func @accum_keep(%w0: !s {dist.param = "tok_embeddings.weight"},
                 %w1: !s {dist.param = "layers.0.attention.wq.weight"}) -> (!s, !s)
    attributes {dist.train_step, dist.gradient_accumulation_steps = 2 : i64, dist.reshard_after_forward = false} {
  %c0 = arith.truncf %w0 : !s to !sb
  %g0 = dist.all_gather %c0 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "tok_embeddings" (%g0) {dist.microbatch = 0 : i64} : !g
  %c1 = arith.truncf %w1 : !s to !sb
  %g1 = dist.all_gather %c1 dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  dist.compute forward "layers.0" (%g1) {dist.microbatch = 0 : i64} : !g
  %a1 = dist.compute backward "layers.0" (%g1) {dist.microbatch = 0 : i64} : !g -> !d
  %a0 = dist.compute backward "tok_embeddings" (%g0) {dist.microbatch = 0 : i64} : !g -> !d
  dist.compute forward "tok_embeddings" (%g0) {dist.microbatch = 1 : i64} : !g
  dist.compute forward "layers.0" (%g1) {dist.microbatch = 1 : i64} : !g
  %b1 = dist.compute backward "layers.0" (%g1, %a1) {dist.microbatch = 1 : i64} : !g, !d -> !d
  %r1 = dist.reduce_scatter %b1 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  %b0 = dist.compute backward "tok_embeddings" (%g0, %a0) {dist.microbatch = 1 : i64} : !g, !d -> !d
  %r0 = dist.reduce_scatter %b0 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  return %r0, %r1 : !s, !s
}
