!s0 = tensor<64x32xf32, #dist.layout<@m, [{"dp"}, {}]>>
!s0b = tensor<64x32xbf16, #dist.layout<@m, [{"dp"}, {}]>>
!g0 = tensor<64x32xbf16, #dist.layout<@m, [{}, {}]>>
!d0 = tensor<64x32xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
!sq = tensor<32x32xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!sqb = tensor<32x32xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!gq = tensor<32x32xbf16, #dist.layout<@m, [{"tp"}, {}]>>
!dq = tensor<32x32xf32, #dist.layout<@m, [{"tp"}, {}], partial(avg) = {"dp"}>>
!sn = tensor<32xf32, #dist.layout<@m, [{"dp"}]>>
!snb = tensor<32xbf16, #dist.layout<@m, [{"dp"}]>>
!gn = tensor<32xbf16, #dist.layout<@m, [{}]>>
!dn = tensor<32xf32, #dist.layout<@m, [{}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2, "tp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
func.func @step(%w0: !s0 {dist.param = "tok_embeddings.weight"},
                %w1: !sq {dist.param = "layers.0.attention.wq.weight"},
                %w2: !sn {dist.param = "layers.0.attention_norm.weight"},
                %w3: !sq {dist.param = "layers.1.attention.wq.weight"},
                %w4: !sn {dist.param = "layers.1.attention_norm.weight"},
                %m0: !s0 {dist.state = "tok_embeddings.weight.exp_avg"},
                %v0: !s0 {dist.state = "tok_embeddings.weight.exp_avg_sq"},
                %m1: !sq {dist.state = "layers.0.attention.wq.weight.exp_avg"},
                %v1: !sq {dist.state = "layers.0.attention.wq.weight.exp_avg_sq"},
                %m2: !sn {dist.state = "layers.0.attention_norm.weight.exp_avg"},
                %v2: !sn {dist.state = "layers.0.attention_norm.weight.exp_avg_sq"},
                %m3: !sq {dist.state = "layers.1.attention.wq.weight.exp_avg"},
                %v3: !sq {dist.state = "layers.1.attention.wq.weight.exp_avg_sq"},
                %m4: !sn {dist.state = "layers.1.attention_norm.weight.exp_avg"},
                %v4: !sn {dist.state = "layers.1.attention_norm.weight.exp_avg_sq"})
    attributes {dist.train_step, dist.reshard_after_forward = true} {
  %c0 = arith.truncf %w0 : !s0 to !s0b
  %g0 = dist.all_gather %c0 dim 0 over {"dp"} comm = @comm_m_dp : !s0b -> !g0
  dist.compute forward "tok_embeddings" (%g0) : !g0
  %c1 = arith.truncf %w1 : !sq to !sqb
  %g1 = dist.all_gather %c1 dim 0 over {"dp"} comm = @comm_m_dp : !sqb -> !gq
  %c2 = arith.truncf %w2 : !sn to !snb
  %g2 = dist.all_gather %c2 dim 0 over {"dp"} comm = @comm_m_dp : !snb -> !gn
  dist.compute forward "layers.0" (%g1, %g2) : !gq, !gn
  %c3 = arith.truncf %w3 : !sq to !sqb
  %g3 = dist.all_gather %c3 dim 0 over {"dp"} comm = @comm_m_dp : !sqb -> !gq
  %c4 = arith.truncf %w4 : !sn to !snb
  %g4 = dist.all_gather %c4 dim 0 over {"dp"} comm = @comm_m_dp : !snb -> !gn
  dist.compute forward "layers.1" (%g3, %g4) : !gq, !gn
  %d3, %d4 = dist.compute backward "layers.1" (%g3, %g4) : !gq, !gn -> !dq, !dn
  %r3 = dist.reduce_scatter %d3 dim 0 avg over {"dp"} comm = @comm_m_dp : !dq -> !sq
  %r4 = dist.reduce_scatter %d4 dim 0 avg over {"dp"} comm = @comm_m_dp : !dn -> !sn
  %d1, %d2 = dist.compute backward "layers.0" (%g1, %g2) : !gq, !gn -> !dq, !dn
  %r1 = dist.reduce_scatter %d1 dim 0 avg over {"dp"} comm = @comm_m_dp : !dq -> !sq
  %r2 = dist.reduce_scatter %d2 dim 0 avg over {"dp"} comm = @comm_m_dp : !dn -> !sn
  %d0 = dist.compute backward "tok_embeddings" (%g0) : !g0 -> !d0
  %r0 = dist.reduce_scatter %d0 dim 0 avg over {"dp"} comm = @comm_m_dp : !d0 -> !s0
  %p0, %pm0, %pv0 = dist.adamw %w0, %r0, %m0, %v0 {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, seed = 0, tensor_id = 0} : !s0, !s0, !s0, !s0
  %p1, %pm1, %pv1 = dist.adamw %w1, %r1, %m1, %v1 {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, seed = 0, tensor_id = 1} : !sq, !sq, !sq, !sq
  %p2, %pm2, %pv2 = dist.adamw %w2, %r2, %m2, %v2 {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, seed = 0, tensor_id = 2} : !sn, !sn, !sn, !sn
  %p3, %pm3, %pv3 = dist.adamw %w3, %r3, %m3, %v3 {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, seed = 0, tensor_id = 3} : !sq, !sq, !sq, !sq
  %p4, %pm4, %pv4 = dist.adamw %w4, %r4, %m4, %v4 {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, seed = 0, tensor_id = 4} : !sn, !sn, !sn, !sn
  return
}
