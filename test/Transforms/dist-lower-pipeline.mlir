// dist-lower-pipeline: one pp rank's stages, per (stage, microbatch), in the
// order core's buildPipelineSchedule gives (docs/pipeline.md), with sends and
// receives between neighbouring stages on other ranks.
// RUN: %meshplan-opt %s -split-input-file --dist-lower-pipeline=pp-rank=0 | FileCheck %s --check-prefix=R0
// RUN: %meshplan-opt %s -split-input-file --dist-lower-pipeline=pp-rank=1 | FileCheck %s --check-prefix=R1
// The lowered step goes through the rest of the planner's passes:
// RUN: %meshplan-opt %s -split-input-file --dist-lower-pipeline=pp-rank=1 --dist-propagate-layouts --dist-lower-redistribute --dist-lower-optimizer --dist-materialize-comms --dist-schedule | FileCheck %s --check-prefix=CHAIN
//
// Every rank's action order against docs/pipeline.md's worked example
// (p = 4, m = 8; v = 2 for interleaved_1f1b and zbv). 1f1b with its sends
// and receives:
// RUN: for r in 0 1 2 3; do %meshplan-opt %S/Inputs/pipeline-4-stages.mlir --dist-lower-pipeline=pp-rank=$r | grep -o 'dist.action = "[^"]*"' | cut -d'"' -f2 | tr '\n' ' '; echo; done | FileCheck %s --check-prefix=ONEF1B
// Compute order only (the compute actions' texts, one per action):
// RUN: for r in 0 1 2 3; do sed 's/"1f1b"/"gpipe"/' %S/Inputs/pipeline-4-stages.mlir | %meshplan-opt --dist-lower-pipeline=pp-rank=$r | grep -o 'dist.action = "[0-9]*[FBIW][0-9]*"' | cut -d'"' -f2 | tr '\n' ' '; echo; done | FileCheck %s --check-prefix=GPIPE
// RUN: for r in 0 1 2 3; do %meshplan-opt %S/Inputs/pipeline-8-stages.mlir --dist-lower-pipeline=pp-rank=$r | grep -o 'dist.action = "[0-9]*[FBIW][0-9]*"' | cut -d'"' -f2 | tr '\n' ' '; echo; done | FileCheck %s --check-prefix=INTERLEAVED
// RUN: for r in 0 1 2 3; do sed 's/"interleaved_1f1b"/"zbv"/' %S/Inputs/pipeline-8-stages.mlir | %meshplan-opt --dist-lower-pipeline=pp-rank=$r | grep -o 'dist.action = "[0-9]*[FBIW][0-9]*"' | cut -d'"' -f2 | tr '\n' ' '; echo; done | FileCheck %s --check-prefix=ZBV

// ONEF1B:      {{^}}0F0 0SEND_F0 0F1 0SEND_F1 0F2 0SEND_F2 0F3 0SEND_F3 0RECV_B0 0B0 0F4 0SEND_F4 0RECV_B1 0B1 0F5 0SEND_F5 0RECV_B2 0B2 0F6 0SEND_F6 0RECV_B3 0B3 0F7 0SEND_F7 0RECV_B4 0B4 0RECV_B5 0B5 0RECV_B6 0B6 0RECV_B7 0B7 {{$}}
// ONEF1B-NEXT: {{^}}1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 1RECV_F2 1F2 1SEND_F2 1RECV_B0 1RECV_F3 1B0 1SEND_B0 1F3 1SEND_F3 1RECV_B1 1RECV_F4 1B1 1SEND_B1 1F4 1SEND_F4 1RECV_B2 1RECV_F5 1B2 1SEND_B2 1F5 1SEND_F5 1RECV_B3 1RECV_F6 1B3 1SEND_B3 1F6 1SEND_F6 1RECV_B4 1RECV_F7 1B4 1SEND_B4 1F7 1SEND_F7 1RECV_B5 1B5 1SEND_B5 1RECV_B6 1B6 1SEND_B6 1RECV_B7 1B7 1SEND_B7 {{$}}
// ONEF1B-NEXT: {{^}}2RECV_F0 2F0 2SEND_F0 2RECV_F1 2F1 2SEND_F1 2RECV_B0 2RECV_F2 2B0 2SEND_B0 2F2 2SEND_F2 2RECV_B1 2RECV_F3 2B1 2SEND_B1 2F3 2SEND_F3 2RECV_B2 2RECV_F4 2B2 2SEND_B2 2F4 2SEND_F4 2RECV_B3 2RECV_F5 2B3 2SEND_B3 2F5 2SEND_F5 2RECV_B4 2RECV_F6 2B4 2SEND_B4 2F6 2SEND_F6 2RECV_B5 2RECV_F7 2B5 2SEND_B5 2F7 2SEND_F7 2RECV_B6 2B6 2SEND_B6 2RECV_B7 2B7 2SEND_B7 {{$}}
// ONEF1B-NEXT: {{^}}3RECV_F0 3F0 3RECV_F1 3B0 3SEND_B0 3F1 3RECV_F2 3B1 3SEND_B1 3F2 3RECV_F3 3B2 3SEND_B2 3F3 3RECV_F4 3B3 3SEND_B3 3F4 3RECV_F5 3B4 3SEND_B4 3F5 3RECV_F6 3B5 3SEND_B5 3F6 3RECV_F7 3B6 3SEND_B6 3F7 3B7 3SEND_B7 {{$}}

// GPIPE:      {{^}}0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F7 0B0 0B1 0B2 0B3 0B4 0B5 0B6 0B7 {{$}}
// GPIPE-NEXT: {{^}}1F0 1F1 1F2 1F3 1F4 1F5 1F6 1F7 1B0 1B1 1B2 1B3 1B4 1B5 1B6 1B7 {{$}}
// GPIPE-NEXT: {{^}}2F0 2F1 2F2 2F3 2F4 2F5 2F6 2F7 2B0 2B1 2B2 2B3 2B4 2B5 2B6 2B7 {{$}}
// GPIPE-NEXT: {{^}}3F0 3F1 3F2 3F3 3F4 3F5 3F6 3F7 3B0 3B1 3B2 3B3 3B4 3B5 3B6 3B7 {{$}}

// INTERLEAVED:      {{^}}0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 0F6 4B0 0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 0B2 0B3 4B4 4B5 4B6 4B7 0B4 0B5 0B6 0B7 {{$}}
// INTERLEAVED-NEXT: {{^}}1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 1F4 5B0 1F5 5B1 1F6 5B2 1F7 5B3 5F4 1B0 5F5 1B1 5F6 1B2 5F7 1B3 5B4 5B5 5B6 5B7 1B4 1B5 1B6 1B7 {{$}}
// INTERLEAVED-NEXT: {{^}}2F0 2F1 2F2 2F3 6F0 6F1 6F2 6B0 6F3 6B1 2F4 6B2 2F5 6B3 2F6 2B0 2F7 2B1 6F4 2B2 6F5 2B3 6F6 6B4 6F7 6B5 6B6 6B7 2B4 2B5 2B6 2B7 {{$}}
// INTERLEAVED-NEXT: {{^}}3F0 3F1 3F2 3F3 7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 3F4 3B0 3F5 3B1 3F6 3B2 3F7 3B3 7F4 7B4 7F5 7B5 7F6 7B6 7F7 7B7 3B4 3B5 3B6 3B7 {{$}}

// ZBV:      {{^}}0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 7I3 7W3 0F7 0I0 0W0 7F4 7I4 7W4 0I1 0W1 7F5 7I5 7W5 0I2 0W2 7F6 7I6 7W6 0I3 0W3 7F7 7I7 7W7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7 {{$}}
// ZBV-NEXT: {{^}}1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 6I2 6W2 1F6 1I0 1W0 6F4 6I3 6W3 1F7 1I1 1W1 6F5 6I4 6W4 1I2 1W2 6F6 6I5 6W5 1I3 1W3 6F7 6I6 6W6 1I4 6I7 1I5 1W4 1I6 1W5 1I7 1W6 6W7 1W7 {{$}}
// ZBV-NEXT: {{^}}2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 5I1 5W1 2F5 2I0 2W0 5F4 5I2 5W2 2F6 2I1 2W1 5F5 5I3 5W3 2F7 2I2 2W2 5F6 5I4 5W4 2I3 2W3 5F7 5I5 5W5 2I4 5I6 2I5 5I7 2I6 2W4 2I7 2W5 5W6 5W7 2W6 2W7 {{$}}
// ZBV-NEXT: {{^}}3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 4I0 4W0 3F4 3I0 3W0 4F4 4I1 4W1 3F5 3I1 3W1 4F5 4I2 4W2 3F6 3I2 3W2 4F6 4I3 4W3 3F7 3I3 3W3 4F7 4I4 4W4 3I4 4I5 3I5 4I6 3I6 4I7 3I7 3W4 4W5 4W6 4W7 3W5 3W6 3W7 {{$}}

// 1f1b, p = 2, m = 2: each rank keeps its stage's parameter, its gather and
// its optimizer step; activations cross on the pair of pp coordinates 0 and
// 1; later backwards read the gradient accumulated so far, and the optimizer
// step reads the last one.
dist.mesh @m ["pp" = 2, "dp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "1f1b" microbatches 2 stages_per_rank 1 activation tensor<4x8xbf16>
func.func @train_step(%w0: tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "w0"},
                      %w1: tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "w1"})
    attributes {dist.train_step, dist.pipeline = @pipe,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.0, stochastic_rounding = false, seed = 0 : i64}} {
  %g0 = dist.redistribute %w0 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  dist.compute forward "a" (%g0) stage 0 flops = 4.0 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  %g1 = dist.redistribute %w1 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  dist.compute forward "b" (%g1) stage 1 flops = 4.0 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  %d1 = dist.compute backward "b" (%g1) stage 1 flops = 8.0 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  dist.optimizer_step %w1, %d1 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  %d0 = dist.compute backward "a" (%g0) stage 0 flops = 8.0 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  dist.optimizer_step %w0, %d0 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  return
}

// R0-LABEL: dist.pipeline @pipe
// R0-NEXT:  dist.pair @pp_0_1 on @m axis "pp" coords = [0, 1]
// R0-LABEL: func.func @train_step
// R0-SAME:  (%[[W:.*]]: tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "w0", dist.tensor_id = 0 : i64})
// R0-SAME:  dist.pp_axis = "pp", dist.pp_rank = 0
// R0-NEXT:  %[[G:.*]] = dist.redistribute %[[W]]
// R0-NEXT:  %[[A0:.*]] = dist.compute forward "a"(%[[G]]) stage 0 flops = 4.000000e+00 {dist.action = "0F0", dist.microbatch = 0 : i64} : {{.*}} -> tensor<4x8xbf16>
// R0-NEXT:  dist.send %[[A0]] on @pp_0_1 to 1 tag "F s0 mb0" {dist.action = "0SEND_F0", dist.microbatch = 0 : i64} : tensor<4x8xbf16>
// R0-NEXT:  %[[A1:.*]] = dist.compute forward "a"(%[[G]]) stage 0 {{.*}}"0F1"
// R0-NEXT:  dist.send %[[A1]] on @pp_0_1 to 1 tag "F s0 mb1" {{.*}}"0SEND_F1"
// R0-NEXT:  %[[D0:.*]] = dist.recv on @pp_0_1 from 1 tag "B s1 mb0" {dist.action = "0RECV_B0", dist.microbatch = 0 : i64} : tensor<4x8xbf16>
// R0-NEXT:  %[[B0:.*]] = dist.compute backward "a"(%[[G]], %[[D0]]) stage 0 flops = 8.000000e+00 {{.*}}"0B0"
// R0-NEXT:  %[[D1:.*]] = dist.recv on @pp_0_1 from 1 tag "B s1 mb1" {{.*}}"0RECV_B1"
// R0-NEXT:  %[[B1:.*]] = dist.compute backward "a"(%[[G]], %[[B0]], %[[D1]]) stage 0 {{.*}}"0B1"
// R0-NEXT:  dist.optimizer_step %[[W]], %[[B1]]
// R0-NEXT:  return

// R1-LABEL: func.func @train_step
// R1-SAME:  (%[[W:.*]]: tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "w1", dist.tensor_id = 1 : i64})
// R1-NEXT:  %[[G:.*]] = dist.redistribute %[[W]]
// R1-NEXT:  %[[X0:.*]] = dist.recv on @pp_0_1 from 0 tag "F s0 mb0" {{.*}}"1RECV_F0"
// R1-NEXT:  dist.compute forward "b"(%[[G]], %[[X0]]) stage 1 {{.*}}"1F0"{{.*}} : {{.*}}, tensor<4x8xbf16>{{$}}
// R1-NEXT:  %[[X1:.*]] = dist.recv on @pp_0_1 from 0 tag "F s0 mb1" {{.*}}"1RECV_F1"
// R1-NEXT:  %[[B0:.*]]:2 = dist.compute backward "b"(%[[G]], %[[X0]]) stage 1 {{.*}}"1B0"{{.*}} -> tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>, tensor<4x8xbf16>
// R1-NEXT:  dist.send %[[B0]]#1 on @pp_0_1 to 0 tag "B s1 mb0" {{.*}}"1SEND_B0"
// R1-NEXT:  dist.compute forward "b"(%[[G]], %[[X1]]) stage 1 {{.*}}"1F1"
// R1-NEXT:  %[[B1:.*]]:2 = dist.compute backward "b"(%[[G]], %[[X1]], %[[B0]]#0) stage 1 {{.*}}"1B1"
// R1-NEXT:  dist.send %[[B1]]#1 on @pp_0_1 to 0 tag "B s1 mb1" {{.*}}"1SEND_B1"
// R1-NEXT:  dist.optimizer_step %[[W]], %[[B1]]#0
// R1-NEXT:  return

// Transfers run on their own stream ("p2p"), in program order; activations are
// freed after their last reader (the send, or the backward that reads the
// received activation).
// CHAIN-LABEL: func.func @train_step
// CHAIN:       %[[X0:.*]] = dist.recv on @pp_0_1 from 0 tag "F s0 mb0" {{{.*}}dist.stream = "p2p"}
// CHAIN:       %[[G:.*]] = dist.all_gather
// CHAIN:       dist.compute forward "b"(%[[G]], %[[X0]])
// CHAIN:       %[[B0:.*]]:2 = dist.compute backward "b"(%[[G]], %[[X0]])
// CHAIN-NEXT:  dist.free %[[X0]]
// CHAIN-NEXT:  dist.send %[[B0]]#1 on @pp_0_1 to 0 tag "B s1 mb0" {{{.*}}dist.stream = "p2p"}
// CHAIN-NEXT:  dist.free %[[B0]]#1
// CHAIN:       %[[B1:.*]]:2 = dist.compute backward "b"
// CHAIN:       dist.reduce_scatter %[[B1]]#0
// CHAIN:       dist.send %[[B1]]#1 on @pp_0_1 to 0 tag "B s1 mb1"
// CHAIN:       dist.adamw

// -----

// zbv, p = 2, m = 1: rank 1 holds stages 1 and 2 (the turn of the V), which
// hand over activation and gradient without a transfer; stage 1 has two
// units: the first forward reads the received activation, the last produces
// the stage's output, the first backward (I) reads the output gradient and
// the last produces the input activation's gradient. I and W each carry half
// the backward's flops.
dist.mesh @m ["pp" = 2]
!w = tensor<8xf32, #dist.layout<@m, [{}]>>
dist.pipeline @pipe on @m axis "pp" schedule "zbv" microbatches 1 stages_per_rank 2 activation tensor<4x8xbf16>
func.func @train_step(%w0: !w {dist.param = "w0"}, %w1a: !w {dist.param = "w1a"},
                      %w1b: !w {dist.param = "w1b"}, %w2: !w {dist.param = "w2"},
                      %w3: !w {dist.param = "w3"})
    attributes {dist.train_step, dist.pipeline = @pipe,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.0, stochastic_rounding = false, seed = 0 : i64}} {
  dist.compute forward "l0" (%w0) stage 0 : !w
  dist.compute forward "l1a" (%w1a) stage 1 : !w
  dist.compute forward "l1b" (%w1b) stage 1 : !w
  dist.compute forward "l2" (%w2) stage 2 : !w
  dist.compute forward "l3" (%w3) stage 3 : !w
  %d3 = dist.compute backward "l3" (%w3) stage 3 flops = 4.0 : !w -> !w
  %d2 = dist.compute backward "l2" (%w2) stage 2 flops = 4.0 : !w -> !w
  %d1b = dist.compute backward "l1b" (%w1b) stage 1 flops = 4.0 : !w -> !w
  %d1a = dist.compute backward "l1a" (%w1a) stage 1 flops = 4.0 : !w -> !w
  %d0 = dist.compute backward "l0" (%w0) stage 0 flops = 4.0 : !w -> !w
  dist.optimizer_step %w0, %d0 : !w, !w
  dist.optimizer_step %w1a, %d1a : !w, !w
  dist.optimizer_step %w1b, %d1b : !w, !w
  dist.optimizer_step %w2, %d2 : !w, !w
  dist.optimizer_step %w3, %d3 : !w, !w
  return
}

// R0-LABEL: dist.pipeline @pipe
// R0-NEXT:  dist.pair @pp_0_1 on @m axis "pp" coords = [0, 1]
// R0-NEXT:  func.func @train_step
// R0-SAME:  %{{.*}}: tensor<8xf32, #dist.layout<@m, [{}]>> {dist.param = "w0", dist.tensor_id = 0 : i64}, %{{.*}}: tensor<8xf32, #dist.layout<@m, [{}]>> {dist.param = "w3", dist.tensor_id = 4 : i64})
// R0:       dist.compute forward "l0"
// R0:       dist.compute forward "l3"
// R0:       return

// R1-LABEL: dist.pipeline @pipe
// R1-NEXT:  dist.pair @pp_0_1
// R1-NOT:   dist.pair
// R1-LABEL: func.func @train_step
// R1-SAME:  (%[[W1A:.*]]: tensor<8xf32, #dist.layout<@m, [{}]>> {dist.param = "w1a", dist.tensor_id = 1 : i64}, %[[W1B:.*]]: tensor<8xf32, #dist.layout<@m, [{}]>> {dist.param = "w1b", dist.tensor_id = 2 : i64}, %[[W2:.*]]: tensor<8xf32, #dist.layout<@m, [{}]>> {dist.param = "w2", dist.tensor_id = 3 : i64})
// R1-NEXT:  %[[X:.*]] = dist.recv on @pp_0_1 from 0 tag "F s0 mb0" {{.*}}"1RECV_F0"
// R1-NEXT:  dist.compute forward "l1a"(%[[W1A]], %[[X]]) stage 1 {{.*}}"1F0"{{.*}} : tensor<8xf32, #dist.layout<@m, [{}]>>, tensor<4x8xbf16>{{$}}
// R1-NEXT:  %[[Y1:.*]] = dist.compute forward "l1b"(%[[W1B]]) stage 1 {{.*}}"1F0"{{.*}} -> tensor<4x8xbf16>
// R1-NEXT:  %[[Y2:.*]] = dist.compute forward "l2"(%[[W2]], %[[Y1]]) stage 2 {{.*}}"2F0"{{.*}} -> tensor<4x8xbf16>
// R1-NEXT:  dist.send %[[Y2]] on @pp_0_1 to 0 tag "F s2 mb0" {{.*}}"2SEND_F0"
// R1-NEXT:  %[[D3:.*]] = dist.recv on @pp_0_1 from 0 tag "B s3 mb0" {{.*}}"2RECV_B0"
// R1-NEXT:  %[[I2:.*]] = dist.compute backward_input "l2"(%[[Y1]], %[[W2]], %[[D3]]) stage 2 flops = 2.000000e+00 {{.*}}"2I0"{{.*}} -> tensor<4x8xbf16>
// R1-NEXT:  %[[G2:.*]] = dist.compute backward_weight "l2"(%[[W2]]) stage 2 flops = 2.000000e+00 {{.*}}"2W0"
// R1-NEXT:  dist.compute backward_input "l1b"(%[[W1B]], %[[I2]]) stage 1 {{.*}}"1I0"{{.*}} : tensor<8xf32, #dist.layout<@m, [{}]>>, tensor<4x8xbf16>{{$}}
// R1-NEXT:  %[[I1:.*]] = dist.compute backward_input "l1a"(%[[X]], %[[W1A]]) stage 1 {{.*}}"1I0"{{.*}} -> tensor<4x8xbf16>
// R1-NEXT:  dist.send %[[I1]] on @pp_0_1 to 0 tag "B s1 mb0" {{.*}}"1SEND_B0"
// R1-NEXT:  %[[G1B:.*]] = dist.compute backward_weight "l1b"(%[[W1B]]) stage 1 {{.*}}"1W0"
// R1-NEXT:  %[[G1A:.*]] = dist.compute backward_weight "l1a"(%[[W1A]]) stage 1 {{.*}}"1W0"
// R1-NEXT:  dist.optimizer_step %[[W1A]], %[[G1A]]
// R1-NEXT:  dist.optimizer_step %[[W1B]], %[[G1B]]
// R1-NEXT:  dist.optimizer_step %[[W2]], %[[G2]]
// R1-NEXT:  return

// CHAIN-LABEL: func.func @train_step
// CHAIN:       dist.compute backward_input "l2"
// CHAIN:       dist.compute backward_weight "l2"
// CHAIN:       dist.send {{.*}} tag "B s1 mb0"
// CHAIN-COUNT-3: dist.adamw
