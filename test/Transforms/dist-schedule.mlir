// RUN: %meshplan-opt %s --dist-schedule -split-input-file | FileCheck %s
// A scheduled step schedules to itself (frees and schedule attributes are
// recomputed, re-gathers already made are not made again).
// RUN: %meshplan-opt %s --dist-schedule --dist-schedule -split-input-file | FileCheck %s

// Three units on (dp, tp) = (2, 2), FSDP over dp, lowered through
// dist-materialize-comms: truncf + all_gather per parameter, reduce_scatter
// after each backward, adamw at the end.
//
// - Prefetch: layers.0's gathers go before the tok_embeddings forward,
//   layers.1's before layers.0's (waiting for tok_embeddings, two back).
// - Reshard after forward: backward re-gathers layers.0 and tok_embeddings
//   (copies of the chains, before the previous backward); layers.1's
//   backward directly follows its forward and keeps its gathers.
// - A unit's all_gathers (a matrix and a norm weight) are one bucket, and
//   so are a backward's reduce_scatters; tok_embeddings' single ones are not.
// - Frees right after every last use, waiting for readers on comm streams.
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
// CHECK-LABEL: func.func @step
// CHECK-NEXT: %[[C0:.*]] = arith.truncf %arg0 {dist.id = 0 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G0:.*]] = dist.all_gather %[[C0]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 1 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C0]] {dist.after = array<i64: 1>, dist.id = 2 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C1:.*]] = arith.truncf %arg1 {dist.id = 3 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C2:.*]] = arith.truncf %arg2 {dist.id = 4 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G1:.*]] = dist.all_gather %[[C1]] dim 0 over {"dp"} comm = @comm_m_dp {dist.bucket = 0 : i64, dist.id = 5 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C1]] {dist.after = array<i64: 5>, dist.id = 6 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G2:.*]] = dist.all_gather %[[C2]] dim 0 over {"dp"} comm = @comm_m_dp {dist.bucket = 0 : i64, dist.id = 7 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C2]] {dist.after = array<i64: 7>, dist.id = 8 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "tok_embeddings"(%[[G0]]) {dist.id = 9 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G0]] {dist.id = 10 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C3:.*]] = arith.truncf %arg3 {dist.after = array<i64: 9>, dist.id = 11 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C4:.*]] = arith.truncf %arg4 {dist.after = array<i64: 9>, dist.id = 12 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G3:.*]] = dist.all_gather %[[C3]] dim 0 over {"dp"} comm = @comm_m_dp {dist.bucket = 1 : i64, dist.id = 13 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C3]] {dist.after = array<i64: 13>, dist.id = 14 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G4:.*]] = dist.all_gather %[[C4]] dim 0 over {"dp"} comm = @comm_m_dp {dist.bucket = 1 : i64, dist.id = 15 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C4]] {dist.after = array<i64: 15>, dist.id = 16 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "layers.0"(%[[G1]], %[[G2]]) {dist.id = 17 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G1]], %[[G2]] {dist.id = 18 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "layers.1"(%[[G3]], %[[G4]]) {dist.id = 19 : i64, dist.stream = "compute"}
// Re-gather of layers.0, prefetched under the layers.1 backward.
// CHECK-NEXT: %[[RC1:.*]] = arith.truncf %arg1 {dist.after = array<i64: 19>, dist.id = 20 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RC2:.*]] = arith.truncf %arg2 {dist.after = array<i64: 19>, dist.id = 21 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RG1:.*]] = dist.all_gather %[[RC1]] dim 0 over {"dp"} comm = @comm_m_dp {dist.bucket = 2 : i64, dist.id = 22 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[RC1]] {dist.after = array<i64: 22>, dist.id = 23 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RG2:.*]] = dist.all_gather %[[RC2]] dim 0 over {"dp"} comm = @comm_m_dp {dist.bucket = 2 : i64, dist.id = 24 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[RC2]] {dist.after = array<i64: 24>, dist.id = 25 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[D3:.*]]:2 = dist.compute backward "layers.1"(%[[G3]], %[[G4]]) {dist.id = 26 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G3]], %[[G4]] {dist.id = 27 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R3:.*]] = dist.reduce_scatter %[[D3]]#0 dim 0 avg over {"dp"} comm = @comm_m_dp {dist.bucket = 3 : i64, dist.id = 28 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D3]]#0 {dist.after = array<i64: 28>, dist.id = 29 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R4:.*]] = dist.reduce_scatter %[[D3]]#1 dim 0 avg over {"dp"} comm = @comm_m_dp {dist.bucket = 3 : i64, dist.id = 30 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D3]]#1 {dist.after = array<i64: 30>, dist.id = 31 : i64, dist.stream = "compute"}
// Re-gather of tok_embeddings, under the layers.0 backward.
// CHECK-NEXT: %[[RC0:.*]] = arith.truncf %arg0 {dist.after = array<i64: 26>, dist.id = 32 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RG0:.*]] = dist.all_gather %[[RC0]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 33 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[RC0]] {dist.after = array<i64: 33>, dist.id = 34 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[D1:.*]]:2 = dist.compute backward "layers.0"(%[[RG1]], %[[RG2]]) {dist.id = 35 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[RG1]], %[[RG2]] {dist.id = 36 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R1:.*]] = dist.reduce_scatter %[[D1]]#0 dim 0 avg over {"dp"} comm = @comm_m_dp {dist.bucket = 4 : i64, dist.id = 37 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D1]]#0 {dist.after = array<i64: 37>, dist.id = 38 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R2:.*]] = dist.reduce_scatter %[[D1]]#1 dim 0 avg over {"dp"} comm = @comm_m_dp {dist.bucket = 4 : i64, dist.id = 39 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D1]]#1 {dist.after = array<i64: 39>, dist.id = 40 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[D0:.*]] = dist.compute backward "tok_embeddings"(%[[RG0]]) {dist.id = 41 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[RG0]] {dist.id = 42 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R0:.*]] = dist.reduce_scatter %[[D0]] dim 0 avg over {"dp"} comm = @comm_m_dp {dist.id = 43 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D0]] {dist.after = array<i64: 43>, dist.id = 44 : i64, dist.stream = "compute"}
// adamw's results (new parameters and state) are never freed.
// CHECK-NEXT: dist.adamw %arg0, %[[R0]], %arg5, %arg6 {{{.*}}dist.id = 45 : i64, dist.stream = "compute"
// CHECK-NEXT: dist.free %[[R0]] {dist.id = 46 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.adamw %arg1, %[[R1]], %arg7, %arg8 {{{.*}}dist.id = 47 : i64
// CHECK-NEXT: dist.free %[[R1]] {dist.id = 48 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.adamw %arg2, %[[R2]], %arg9, %arg10 {{{.*}}dist.id = 49 : i64
// CHECK-NEXT: dist.free %[[R2]] {dist.id = 50 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.adamw %arg3, %[[R3]], %arg11, %arg12 {{{.*}}dist.id = 51 : i64
// CHECK-NEXT: dist.free %[[R3]] {dist.id = 52 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.adamw %arg4, %[[R4]], %arg13, %arg14 {{{.*}}dist.id = 53 : i64
// CHECK-NEXT: dist.free %[[R4]] {dist.id = 54 : i64, dist.stream = "compute"}
// CHECK-NEXT: return
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

// -----

// dist.reshard_after_forward = false: no re-gathers; each forward gather
// stays alive until its unit's backward, where it is freed. Values the step
// returns are not freed.
!s = tensor<32x32xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!sb = tensor<32x32xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!g = tensor<32x32xbf16, #dist.layout<@m, [{"tp"}, {}]>>
!d = tensor<32x32xf32, #dist.layout<@m, [{"tp"}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2, "tp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
// CHECK-LABEL: func.func @keep
// CHECK-NEXT: %[[C0:.*]] = arith.truncf %arg0 {dist.id = 0 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G0:.*]] = dist.all_gather %[[C0]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 1 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C0]] {dist.after = array<i64: 1>, dist.id = 2 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C1:.*]] = arith.truncf %arg1 {dist.id = 3 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G1:.*]] = dist.all_gather %[[C1]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 4 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C1]] {dist.after = array<i64: 4>, dist.id = 5 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "tok_embeddings"(%[[G0]]) {dist.id = 6 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C2:.*]] = arith.truncf %arg2 {dist.after = array<i64: 6>, dist.id = 7 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G2:.*]] = dist.all_gather %[[C2]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 8 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C2]] {dist.after = array<i64: 8>, dist.id = 9 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "layers.0"(%[[G1]]) {dist.id = 10 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "layers.1"(%[[G2]]) {dist.id = 11 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[D2:.*]] = dist.compute backward "layers.1"(%[[G2]]) {dist.id = 12 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G2]] {dist.id = 13 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R2:.*]] = dist.reduce_scatter %[[D2]] dim 0 avg over {"dp"} comm = @comm_m_dp {dist.id = 14 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D2]] {dist.after = array<i64: 14>, dist.id = 15 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[D1:.*]] = dist.compute backward "layers.0"(%[[G1]]) {dist.id = 16 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G1]] {dist.id = 17 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R1:.*]] = dist.reduce_scatter %[[D1]] dim 0 avg over {"dp"} comm = @comm_m_dp {dist.id = 18 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D1]] {dist.after = array<i64: 18>, dist.id = 19 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[D0:.*]] = dist.compute backward "tok_embeddings"(%[[G0]]) {dist.id = 20 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G0]] {dist.id = 21 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R0:.*]] = dist.reduce_scatter %[[D0]] dim 0 avg over {"dp"} comm = @comm_m_dp {dist.id = 22 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D0]] {dist.after = array<i64: 22>, dist.id = 23 : i64, dist.stream = "compute"}
// CHECK-NEXT: return %[[R0]], %[[R1]], %[[R2]]
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

// -----

// Float8 all-gather (after dist-fuse-fp8-gather): one amax and its MAX
// all-reduce at the top (on the gather stream), each float8 weight cast
// before its 1-byte gather, and the reduced amax appended to the computes.
// The re-gather for the layers.0 backward copies the cast and the gather,
// reusing the reduced amax; the amax all-reduce is never copied. float8 and
// bfloat16 gathers are not bucketed together.
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
// CHECK-LABEL: func.func @fp8
// CHECK-NEXT: %[[AMAX:.*]] = dist.fp8_amax %arg1, %arg3 {dist.id = 0 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[AR:.*]] = dist.all_reduce %[[AMAX]] max over {"tp", "dp"} comm = @comm_m_tp_dp {dist.id = 1 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[AMAX]] {dist.after = array<i64: 1>, dist.id = 2 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C0:.*]] = arith.truncf %arg0 {dist.id = 3 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G0:.*]] = dist.all_gather %[[C0]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 4 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C0]] {dist.after = array<i64: 4>, dist.id = 5 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[Q1:.*]] = dist.fp8_cast %arg1 scale %[[AR]][0] power_of_2 {dist.id = 6 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C2:.*]] = arith.truncf %arg2 {dist.id = 7 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G1:.*]] = dist.all_gather %[[Q1]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 8 : i64, dist.stream = "comm.ag"} : tensor<32x32xf8E4M3FN
// CHECK-NEXT: dist.free %[[Q1]] {dist.after = array<i64: 8>, dist.id = 9 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G2:.*]] = dist.all_gather %[[C2]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 10 : i64, dist.stream = "comm.ag"} : tensor<32xbf16
// CHECK-NEXT: dist.free %[[C2]] {dist.after = array<i64: 10>, dist.id = 11 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "tok_embeddings"(%[[G0]]) {dist.id = 12 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G0]] {dist.id = 13 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[Q3:.*]] = dist.fp8_cast %arg3 scale %[[AR]][1] power_of_2 {dist.after = array<i64: 12>, dist.id = 14 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[C4:.*]] = arith.truncf %arg4 {dist.after = array<i64: 12>, dist.id = 15 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G3:.*]] = dist.all_gather %[[Q3]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 16 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[Q3]] {dist.after = array<i64: 16>, dist.id = 17 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[G4:.*]] = dist.all_gather %[[C4]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 18 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[C4]] {dist.after = array<i64: 18>, dist.id = 19 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "layers.0"(%[[G1]], %[[G2]], %[[AR]]) {dist.id = 20 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G1]], %[[G2]] {dist.id = 21 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.compute forward "layers.1"(%[[G3]], %[[G4]], %[[AR]]) {dist.id = 22 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RQ1:.*]] = dist.fp8_cast %arg1 scale %[[AR]][0] power_of_2 {dist.after = array<i64: 22>, dist.id = 23 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RC2:.*]] = arith.truncf %arg2 {dist.after = array<i64: 22>, dist.id = 24 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RG1:.*]] = dist.all_gather %[[RQ1]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 25 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[RQ1]] {dist.after = array<i64: 25>, dist.id = 26 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RG2:.*]] = dist.all_gather %[[RC2]] dim 0 over {"dp"} comm = @comm_m_dp {dist.id = 27 : i64, dist.stream = "comm.ag"}
// CHECK-NEXT: dist.free %[[RC2]] {dist.after = array<i64: 27>, dist.id = 28 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[D3:.*]]:2 = dist.compute backward "layers.1"(%[[G3]], %[[G4]], %[[AR]]) {dist.id = 29 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G3]], %[[G4]] {dist.id = 30 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.reduce_scatter %[[D3]]#0 {{.*}}{dist.bucket = 0 : i64, dist.id = 31 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D3]]#0
// CHECK-NEXT: dist.reduce_scatter %[[D3]]#1 {{.*}}{dist.bucket = 0 : i64, dist.id = 33 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[D3]]#1
// CHECK-NEXT: %[[RC0:.*]] = arith.truncf %arg0 {dist.after = array<i64: 29>, dist.id = 35 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[RG0:.*]] = dist.all_gather %[[RC0]]
// CHECK-NEXT: dist.free %[[RC0]]
// The last reader of the reduced amax frees it.
// CHECK-NEXT: %[[D1:.*]]:2 = dist.compute backward "layers.0"(%[[RG1]], %[[RG2]], %[[AR]]) {dist.id = 38 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[AR]], %[[RG1]], %[[RG2]] {dist.id = 39 : i64, dist.stream = "compute"}
// CHECK-NOT: dist.fp8_cast
// CHECK-NOT: dist.all_reduce
// CHECK: dist.compute backward "tok_embeddings"(%[[RG0]]) {dist.id = 44 : i64, dist.stream = "compute"}
// CHECK: return
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

// -----

// Gradient accumulation, two microbatches; import gathers each parameter
// once, for every compute. Backward of microbatch 1 reads microbatch 0's
// gradients (shared, never re-gathered), which are freed after it; only
// the last gradients are reduce-scattered.
//
// With reshard after forward, every compute reads a fresh gather except
// where the compute right before it read the same one: layers.0's backward
// after its forward, and tok_embeddings between the microbatches (its
// backward of microbatch 0, then its forward of microbatch 1).
!s = tensor<32x32xf32, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!sb = tensor<32x32xbf16, #dist.layout<@m, [{"tp", "dp"}, {}]>>
!g = tensor<32x32xbf16, #dist.layout<@m, [{"tp"}, {}]>>
!d = tensor<32x32xf32, #dist.layout<@m, [{"tp"}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2, "tp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
// CHECK-LABEL: func.func @accum
// CHECK-NEXT: %[[C0:.*]] = arith.truncf %arg0 {dist.id = 0 : i64
// CHECK-NEXT: %[[G0:.*]] = dist.all_gather %[[C0]] {{.*}}{dist.id = 1 : i64
// CHECK-NEXT: dist.free %[[C0]] {dist.after = array<i64: 1>, dist.id = 2 : i64
// CHECK-NEXT: %[[C1:.*]] = arith.truncf %arg1 {dist.id = 3 : i64
// CHECK-NEXT: %[[G1:.*]] = dist.all_gather %[[C1]] {{.*}}{dist.id = 4 : i64
// CHECK-NEXT: dist.free %[[C1]] {dist.after = array<i64: 4>, dist.id = 5 : i64
// CHECK-NEXT: dist.compute forward "tok_embeddings"(%[[G0]]) {dist.id = 6 : i64, dist.microbatch = 0 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[G0]] {dist.id = 7 : i64
// CHECK-NEXT: dist.compute forward "layers.0"(%[[G1]]) {dist.id = 8 : i64, dist.microbatch = 0 : i64
// CHECK-NEXT: %[[RC0:.*]] = arith.truncf %arg0 {dist.after = array<i64: 8>, dist.id = 9 : i64
// CHECK-NEXT: %[[RG0:.*]] = dist.all_gather %[[RC0]] {{.*}}{dist.id = 10 : i64
// CHECK-NEXT: dist.free %[[RC0]] {dist.after = array<i64: 10>, dist.id = 11 : i64
// CHECK-NEXT: %[[A1:.*]] = dist.compute backward "layers.0"(%[[G1]]) {dist.id = 12 : i64, dist.microbatch = 0 : i64
// CHECK-NEXT: dist.free %[[G1]] {dist.id = 13 : i64
// CHECK-NEXT: %[[A0:.*]] = dist.compute backward "tok_embeddings"(%[[RG0]]) {dist.id = 14 : i64, dist.microbatch = 0 : i64
// Microbatch 1 re-gathers layers.0 under the tok_embeddings backward.
// CHECK-NEXT: %[[MC1:.*]] = arith.truncf %arg1 {dist.after = array<i64: 14>, dist.id = 15 : i64
// CHECK-NEXT: %[[MG1:.*]] = dist.all_gather %[[MC1]] {{.*}}{dist.id = 16 : i64
// CHECK-NEXT: dist.free %[[MC1]] {dist.after = array<i64: 16>, dist.id = 17 : i64
// CHECK-NEXT: dist.compute forward "tok_embeddings"(%[[RG0]]) {dist.id = 18 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: dist.free %[[RG0]] {dist.id = 19 : i64
// CHECK-NEXT: dist.compute forward "layers.0"(%[[MG1]]) {dist.id = 20 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: %[[MC0:.*]] = arith.truncf %arg0 {dist.after = array<i64: 20>, dist.id = 21 : i64
// CHECK-NEXT: %[[MG0:.*]] = dist.all_gather %[[MC0]] {{.*}}{dist.id = 22 : i64
// CHECK-NEXT: dist.free %[[MC0]] {dist.after = array<i64: 22>, dist.id = 23 : i64
// CHECK-NEXT: %[[B1:.*]] = dist.compute backward "layers.0"(%[[MG1]], %[[A1]]) {dist.id = 24 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: dist.free %[[A1]], %[[MG1]] {dist.id = 25 : i64
// CHECK-NEXT: %[[R1:.*]] = dist.reduce_scatter %[[B1]] {{.*}}{dist.id = 26 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[B1]] {dist.after = array<i64: 26>, dist.id = 27 : i64
// CHECK-NEXT: %[[B0:.*]] = dist.compute backward "tok_embeddings"(%[[MG0]], %[[A0]]) {dist.id = 28 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: dist.free %[[A0]], %[[MG0]] {dist.id = 29 : i64
// CHECK-NEXT: %[[R0:.*]] = dist.reduce_scatter %[[B0]] {{.*}}{dist.id = 30 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[B0]] {dist.after = array<i64: 30>, dist.id = 31 : i64
// CHECK-NEXT: return %[[R0]], %[[R1]]
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

// Without reshard after forward, backward keeps the forward's gathers; a
// new microbatch's forward still gathers again (what FSDP2 does after
// backward), except tok_embeddings, whose microbatch-0 backward runs just
// before.
// CHECK-LABEL: func.func @accum_keep
// CHECK-NEXT: %[[C0:.*]] = arith.truncf %arg0 {dist.id = 0 : i64
// CHECK-NEXT: %[[G0:.*]] = dist.all_gather %[[C0]]
// CHECK-NEXT: dist.free %[[C0]]
// CHECK-NEXT: %[[C1:.*]] = arith.truncf %arg1 {dist.id = 3 : i64
// CHECK-NEXT: %[[G1:.*]] = dist.all_gather %[[C1]]
// CHECK-NEXT: dist.free %[[C1]]
// CHECK-NEXT: dist.compute forward "tok_embeddings"(%[[G0]]) {dist.id = 6 : i64, dist.microbatch = 0 : i64
// CHECK-NEXT: dist.compute forward "layers.0"(%[[G1]]) {dist.id = 7 : i64, dist.microbatch = 0 : i64
// CHECK-NEXT: %[[A1:.*]] = dist.compute backward "layers.0"(%[[G1]]) {dist.id = 8 : i64, dist.microbatch = 0 : i64
// CHECK-NEXT: dist.free %[[G1]] {dist.id = 9 : i64
// CHECK-NEXT: %[[A0:.*]] = dist.compute backward "tok_embeddings"(%[[G0]]) {dist.id = 10 : i64, dist.microbatch = 0 : i64
// CHECK-NEXT: %[[MC1:.*]] = arith.truncf %arg1 {dist.after = array<i64: 10>, dist.id = 11 : i64
// CHECK-NEXT: %[[MG1:.*]] = dist.all_gather %[[MC1]]
// CHECK-NEXT: dist.free %[[MC1]]
// CHECK-NEXT: dist.compute forward "tok_embeddings"(%[[G0]]) {dist.id = 14 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: dist.compute forward "layers.0"(%[[MG1]]) {dist.id = 15 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: %[[B1:.*]] = dist.compute backward "layers.0"(%[[MG1]], %[[A1]]) {dist.id = 16 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: dist.free %[[A1]], %[[MG1]] {dist.id = 17 : i64
// CHECK-NEXT: dist.reduce_scatter %[[B1]]
// CHECK-NEXT: dist.free %[[B1]]
// CHECK-NEXT: %[[B0:.*]] = dist.compute backward "tok_embeddings"(%[[G0]], %[[A0]]) {dist.id = 20 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: dist.free %[[G0]], %[[A0]] {dist.id = 21 : i64
// CHECK-NEXT: dist.reduce_scatter %[[B0]]
// CHECK-NEXT: dist.free %[[B0]] {dist.after = array<i64: 22>, dist.id = 23 : i64
// CHECK-NEXT: return
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

// -----

// Gradients reduced in bf16 and widened to f32 for the updates (what
// dist-lower-optimizer emits for a bf16 reduce dtype): each reduction goes
// right after its backward, on comm.rs; the widening casts stay with the
// updates at the end, so that no backward waits on the compute stream for a
// reduction. The bf16 shard is freed after its cast, the f32 one after its
// update.
// CHECK-LABEL: func.func @widen
// CHECK:      %[[D1:.*]] = dist.compute backward "b"
// CHECK-NEXT: dist.free
// CHECK-NEXT: %[[R1:.*]] = dist.reduce_scatter %[[D1]] {{.*}}dist.stream = "comm.rs"
// CHECK-NEXT: dist.free %[[D1]]
// CHECK-NEXT: %[[D0:.*]] = dist.compute backward "a"
// CHECK-NEXT: dist.free
// CHECK-NEXT: %[[R0:.*]] = dist.reduce_scatter %[[D0]] {{.*}}dist.stream = "comm.rs"
// CHECK-NEXT: dist.free %[[D0]]
// CHECK-NEXT: %[[F1:.*]] = arith.extf %[[R1]] {dist.id = 20 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[R1]]
// CHECK-NEXT: %[[F0:.*]] = arith.extf %[[R0]] {dist.id = 22 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[R0]]
// CHECK-NEXT: dist.adamw %arg1, %[[F1]], %arg4, %arg5
// CHECK-NEXT: dist.free %[[F1]]
// CHECK-NEXT: dist.adamw %arg0, %[[F0]], %arg2, %arg3
// CHECK-NEXT: dist.free %[[F0]]
// CHECK-NEXT: return
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

// -----

// Only dist.train_step functions are scheduled.
!s = tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
!g = tensor<8xf32, #dist.layout<@m, [{}]>>
dist.mesh @m ["dp" = 2]
// CHECK-LABEL: func.func @not_a_step
// CHECK-NEXT: dist.all_gather %arg0 dim 0 over {"dp"} :
// CHECK-NEXT: dist.compute forward "a"(%{{.*}}) :
// CHECK-NEXT: return
func.func @not_a_step(%w: !s) {
  %g = dist.all_gather %w dim 0 over {"dp"} : !s -> !g
  dist.compute forward "a" (%g) : !g
  return
}

// -----

// "reduce": "every_microbatch": each microbatch's reduce_scatter follows its
// backward on comm.rs, and the in-place accumulation into microbatch 0's
// reduced shard (arith.addf {dist.accumulate}) joins it there, so the next
// forward never waits for a reduction. The accumulator (the addf's first
// operand) is never freed: its buffer is the sum's; the addend is.
!s = tensor<64x32xf32, #dist.layout<@m, [{"dp"}, {}]>>
!g = tensor<64x32xf32, #dist.layout<@m, [{}, {}]>>
!d = tensor<64x32xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
// CHECK-LABEL: func.func @accumulate
// CHECK:      %[[D0:.*]] = dist.compute backward "u"(%{{.*}}) {dist.id = 2 : i64, dist.microbatch = 0 : i64, dist.stream = "compute"}
// CHECK-NEXT: %[[R0:.*]] = dist.reduce_scatter %[[D0]] {{.*}}dist.stream = "comm.rs"
// CHECK-NEXT: dist.free %[[D0]] {dist.after = array<i64: 3>
// CHECK:      %[[D1:.*]] = dist.compute backward "u"(%{{.*}}) {dist.id = 6 : i64, dist.microbatch = 1 : i64
// CHECK-NEXT: %[[R1:.*]] = dist.reduce_scatter %[[D1]] {{.*}}dist.stream = "comm.rs"
// CHECK-NEXT: dist.free %[[D1]]
// CHECK-NEXT: %[[A1:.*]] = arith.addf %[[R0]], %[[R1]] {dist.accumulate, dist.id = 9 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[R1]] {dist.after = array<i64: 9>
// CHECK-NOT:  dist.free %[[R0]]
// CHECK:      %[[R2:.*]] = dist.reduce_scatter
// CHECK-NOT:  dist.free %[[A1]]
// CHECK:      %[[A2:.*]] = arith.addf %[[A1]], %[[R2]] {dist.accumulate, dist.id = 16 : i64, dist.stream = "comm.rs"}
// CHECK-NEXT: dist.free %[[R2]]
// CHECK-NEXT: %[[S:.*]] = arith.addf %[[A2]], %arg0 {dist.id = 18 : i64, dist.stream = "compute"}
// CHECK-NEXT: dist.free %[[A2]]
func.func @accumulate(%w: !s {dist.param = "w"}) -> !s
    attributes {dist.train_step, dist.reshard_after_forward = false} {
  %g = dist.all_gather %w dim 0 over {"dp"} comm = @comm_m_dp : !s -> !g
  dist.compute forward "u" (%g) {dist.microbatch = 0 : i64} : !g
  %d0 = dist.compute backward "u" (%g) {dist.microbatch = 0 : i64} : !g -> !d
  %r0 = dist.reduce_scatter %d0 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  dist.compute forward "u" (%g) {dist.microbatch = 1 : i64} : !g
  %d1 = dist.compute backward "u" (%g) {dist.microbatch = 1 : i64} : !g -> !d
  %r1 = dist.reduce_scatter %d1 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  %a1 = arith.addf %r0, %r1 {dist.accumulate} : !s
  dist.compute forward "u" (%g) {dist.microbatch = 2 : i64} : !g
  %d2 = dist.compute backward "u" (%g) {dist.microbatch = 2 : i64} : !g -> !d
  %r2 = dist.reduce_scatter %d2 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  %a2 = arith.addf %a1, %r2 {dist.accumulate} : !s
  %sum = arith.addf %a2, %w : !s
  return %sum : !s
}

// -----

// One pp rank's program (after dist-lower-pipeline, `dist.pp_rank`): its
// stages gather once per step, as torchtitan's FSDP under pipelining; no
// compute gets a re-gather, whatever the reshard policy. Transfers run on
// a stream of their own ("p2p"; the compute reading a received activation
// depends on its recv), and a received activation is freed after its last
// reader.
!s = tensor<32x32xf32, #dist.layout<@m, [{"dp"}, {}]>>
!sb = tensor<32x32xbf16, #dist.layout<@m, [{"dp"}, {}]>>
!g = tensor<32x32xbf16, #dist.layout<@m, [{}, {}]>>
!d = tensor<32x32xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
!a = tensor<4x32xbf16>
dist.mesh @m ["pp" = 2, "dp" = 2]
dist.comm @comm_m_dp on @m axes {"dp"}
dist.pair @pp_0_1 on @m axis "pp" coords = [0, 1]
// CHECK-LABEL: func.func @pipelined
// CHECK-NEXT: %[[X0:.*]] = dist.recv {{.*}}tag "F s0 mb0" {dist.id = 0 : i64, dist.stream = "p2p"}
// CHECK-NEXT: %[[C:.*]] = arith.truncf %arg0 {dist.id = 1 : i64
// CHECK-NEXT: %[[G:.*]] = dist.all_gather %[[C]] {{.*}}{dist.id = 2 : i64
// CHECK-NEXT: dist.free %[[C]]
// CHECK-NEXT: dist.compute forward "layers.1"(%[[G]], %[[X0]]) stage 1 {dist.id = 4 : i64
// CHECK-NEXT: %[[X1:.*]] = dist.recv {{.*}}tag "F s0 mb1" {dist.id = 5 : i64, dist.stream = "p2p"}
// CHECK-NEXT: %[[B0:.*]]:2 = dist.compute backward "layers.1"(%[[G]], %[[X0]]) stage 1 {dist.id = 6 : i64
// CHECK-NEXT: dist.free %[[X0]] {dist.id = 7 : i64
// CHECK-NEXT: dist.send %[[B0]]#1 {{.*}}tag "B s1 mb0" {dist.id = 8 : i64, dist.stream = "p2p"}
// CHECK-NEXT: dist.free %[[B0]]#1 {dist.after = array<i64: 8>, dist.id = 9 : i64
// CHECK-NEXT: dist.compute forward "layers.1"(%[[G]], %[[X1]]) stage 1 {dist.id = 10 : i64
// CHECK-NEXT: %[[B1:.*]]:2 = dist.compute backward "layers.1"(%[[G]], %[[X1]], %[[B0]]#0) stage 1 {dist.id = 11 : i64
// CHECK-NEXT: dist.free %[[G]], %[[X1]], %[[B0]]#0 {dist.id = 12 : i64
// CHECK-NOT:  dist.all_gather
// CHECK:      dist.send %[[B1]]#1 {{.*}}tag "B s1 mb1"
func.func @pipelined(%w: !s {dist.param = "layers.1.w"}) -> !s
    attributes {dist.train_step, dist.pp_rank = 1 : i64} {
  %c = arith.truncf %w : !s to !sb
  %g = dist.all_gather %c dim 0 over {"dp"} comm = @comm_m_dp : !sb -> !g
  %x0 = dist.recv on @pp_0_1 from 0 tag "F s0 mb0" : !a
  dist.compute forward "layers.1" (%g, %x0) stage 1 {dist.microbatch = 0 : i64} : !g, !a
  %x1 = dist.recv on @pp_0_1 from 0 tag "F s0 mb1" : !a
  %b0, %gx0 = dist.compute backward "layers.1" (%g, %x0) stage 1 {dist.microbatch = 0 : i64} : !g, !a -> !d, !a
  dist.send %gx0 on @pp_0_1 to 0 tag "B s1 mb0" : !a
  dist.compute forward "layers.1" (%g, %x1) stage 1 {dist.microbatch = 1 : i64} : !g, !a
  %b1, %gx1 = dist.compute backward "layers.1" (%g, %x1, %b0) stage 1 {dist.microbatch = 1 : i64} : !g, !a, !d -> !d, !a
  %r = dist.reduce_scatter %b1 dim 0 avg over {"dp"} comm = @comm_m_dp : !d -> !s
  dist.send %gx1 on @pp_0_1 to 0 tag "B s1 mb1" : !a
  return %r : !s
}
