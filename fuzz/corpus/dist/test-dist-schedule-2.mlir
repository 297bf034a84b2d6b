!s0 = tensor<64x32xf32, #dist.layout<@m, [{"dp"}, {}]>>
!s0b = tensor<64x32xbf16, #dist.layout<@m, [{"dp"}, {}]>>
!g0 = tensor<64x32xbf16, #dist.layout<@m, [{}, {}]>>
!d0 = tensor<64x32xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
!sq = tensor<32x32xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!sq8 = tensor<32x32xf8E4M3FN, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!gq8 = tensor<32x32xf8E4M3FN, #dist.layout<@m, [{"tp"}, {}]>>
!dq = tensor<32x32xf32, #dist.layout<@m, [{"tp"}, {}], partial(avg) = {"dp"}>>
!sn = tensor<32xf32, #dist.layout<@m, [{"dp"}]>>
!snb = tensor<32xbf16, #dist.layout<@m, [{"dp"}]>>
!gn = tensor<32xbf16, #dist.layout<@m, [{}]>>
!dn = tensor<32xf32, #dist.layout<@m, [{}], partial(avg) = {"dp"}>>
!ap = tensor<2xf32, #dist.layout<@m, [{}], partial(max) = {"tp", "dp"}>>
!a = tensor<2xf32, #dist.layout<@m, [{}]>>
dist.mesh @m ["dp" = 2, "tp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
dist.comm @comm_m_tp_dp on @m axes {"tp", "dp"}
func.func @fp8(%w0: !s0 {dist.param = "tok_embeddings.weight"},
               %w1: !sq {dist.param = "layers.0.attention.wq.weight", dist.float8},
               %w2: !sn {dist.param = "layers.0.attention_norm.weight"},
               %w3: !sq {dist.param = "layers.1.attention.wq.weight", dist.float8},
               %w4: !sn {dist.param = "layers.1.attention_norm.weight"})
    -> (!s0, !sq, !sn, !sq, !sn)
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %amax = dist.fp8_amax %w1, %w3 : !sq, !sq -> !ap
  %ar = dist.all_reduce %amax max over {"tp", "dp"} comm = @comm_m_tp_dp : !ap -> !a
  %c0 = arith.truncf %w0 : !s0 to !s0b
  %g0 = dist.all_gather %c0 dim 0 over {"dp"} comm = @comm_m_dp : !s0b -> !g0
  dist.compute forward "tok_embeddings" (%g0) : !g0
  %q1 = dist.fp8_cast %w1 scale %ar[0] power_of_2 : !sq, !a -> !sq8
  %g1 = dist.all_gather %q1 dim 0 over {"dp"} comm = @comm_m_dp : !sq8 -> !gq8
  %c2 = arith.truncf %w2 : !sn to !snb
  %g2 = dist.all_gather %c2 dim 0 over {"dp"} comm = @comm_m_dp : !snb -> !gn
  dist.compute forward "layers.0" (%g1, %g2, %ar) : !gq8, !gn, !a
  %q3 = dist.fp8_cast %w3 scale %ar[1] power_of_2 : !sq, !a -> !sq8
  %g3 = dist.all_gather %q3 dim 0 over {"dp"} comm = @comm_m_dp : !sq8 -> !gq8
  %c4 = arith.truncf %w4 : !sn to !snb
  %g4 = dist.all_gather %c4 dim 0 over {"dp"} comm = @comm_m_dp : !snb -> !gn
  dist.compute forward "layers.1" (%g3, %g4, %ar) : !gq8, !gn, !a
  %d3, %d4 = dist.compute backward "layers.1" (%g3, %g4, %ar) : !gq8, !gn, !a -> !dq, !dn
  %r3 = dist.reduce_scatter %d3 dim 0 avg over {"dp"} comm = @comm_m_dp : !dq -> !sq
  %r4 = dist.reduce_scatter %d4 dim 0 avg over {"dp"} comm = @comm_m_dp : !dn -> !sn
  %d1, %d2 = dist.compute backward "layers.0" (%g1, %g2, %ar) : !gq8, !gn, !a -> !dq, !dn
  %r1 = dist.reduce_scatter %d1 dim 0 avg over {"dp"} comm = @comm_m_dp : !dq -> !sq
  %r2 = dist.reduce_scatter %d2 dim 0 avg over {"dp"} comm = @comm_m_dp : !dn -> !sn
  %d0 = dist.compute backward "tok_embeddings" (%g0) : !g0 -> !d0
  %r0 = dist.reduce_scatter %d0 dim 0 avg over {"dp"} comm = @comm_m_dp : !d0 -> !s0
  return %r0, %r1, %r2, %r3, %r4 : !s0, !sq, !sn, !sq, !sn
}
