// RUN: %meshplan-opt %s --dist-propagate-layouts --split-input-file | FileCheck %s
// RUN: %meshplan-opt %s --dist-propagate-layouts --dist-lower-redistribute --split-input-file | FileCheck %s --check-prefix=LOWERED

// Motivating failure 2: a bf16 stochastic-rounding AdamW update, written with
// bitcasts and integer ops, on an FSDP-sharded parameter. Every value takes
// the parameter's layout; nothing is gathered. The packed parameter storage
// (bf16 pairs viewed as fp32, DTensor's failing view(dtype)) stays local too.
dist.mesh @world ["dp" = 4, "tp" = 2]
// CHECK-LABEL: func.func @sr_adamw
// CHECK-SAME: (%{{.*}}: tensor<1024x256xbf16, #dist.layout<@world, [{"dp"}, {"tp"}]>>, %{{.*}}: tensor<1024x256xf32, #dist.layout<@world, [{"dp"}, {"tp"}]>>, %{{.*}}: tensor<1024x256xf32, #dist.layout<@world, [{"dp"}, {"tp"}]>>, %{{.*}}: tensor<1024x256xi32, #dist.layout<@world, [{"dp"}, {"tp"}]>>)
// CHECK-SAME: -> tensor<1024x128xf32, #dist.layout<@world, [{"dp"}, {"tp"}]>>
// CHECK-NOT: dist.redistribute
// CHECK: arith.bitcast %{{.*}} : tensor<1024x256xf32, #dist.layout<@world, [{"dp"}, {"tp"}]>> to tensor<1024x256xi32, #dist.layout<@world, [{"dp"}, {"tp"}]>>
// CHECK: arith.select %{{.*}} : tensor<1024x256xi1, #dist.layout<@world, [{"dp"}, {"tp"}]>>, tensor<1024x256xi32, #dist.layout<@world, [{"dp"}, {"tp"}]>>
// CHECK: arith.truncf %{{.*}} : tensor<1024x256xf32, #dist.layout<@world, [{"dp"}, {"tp"}]>> to tensor<1024x256xbf16, #dist.layout<@world, [{"dp"}, {"tp"}]>>
// CHECK: dist.bitcast %{{.*}} : tensor<1024x256xbf16, #dist.layout<@world, [{"dp"}, {"tp"}]>> -> tensor<1024x128xf32, #dist.layout<@world, [{"dp"}, {"tp"}]>>
// LOWERED-LABEL: func.func @sr_adamw
// LOWERED-NOT: {{dist\.(all_gather|all_reduce|reduce_scatter|all_to_all|permute|redistribute|broadcast)}}
// LOWERED: return
func.func @sr_adamw(%p: tensor<1024x256xbf16> {dist.layout = #dist.layout<@world, [{"dp"}, {"tp"}]>},
                    %g: tensor<1024x256xf32>, %m: tensor<1024x256xf32>,
                    %rand: tensor<1024x256xi32>) -> tensor<1024x128xf32> {
  %beta = arith.constant dense<0.9> : tensor<1024x256xf32>
  %lr = arith.constant dense<1.0e-3> : tensor<1024x256xf32>
  %low_mask = arith.constant dense<65535> : tensor<1024x256xi32>
  %high_mask = arith.constant dense<-65536> : tensor<1024x256xi32>
  %one_ulp = arith.constant dense<65536> : tensor<1024x256xi32>
  %pf = arith.extf %p : tensor<1024x256xbf16> to tensor<1024x256xf32>
  %m1 = arith.mulf %m, %beta : tensor<1024x256xf32>
  %m2 = arith.addf %m1, %g : tensor<1024x256xf32>
  %step = arith.mulf %m2, %lr : tensor<1024x256xf32>
  %new = arith.subf %pf, %step : tensor<1024x256xf32>
  // Stochastic rounding to bf16 on the fp32 bits.
  %bits = arith.bitcast %new : tensor<1024x256xf32> to tensor<1024x256xi32>
  %low = arith.andi %bits, %low_mask : tensor<1024x256xi32>
  %high = arith.andi %bits, %high_mask : tensor<1024x256xi32>
  %up = arith.addi %high, %one_ulp : tensor<1024x256xi32>
  %round_up = arith.cmpi ult, %rand, %low : tensor<1024x256xi32>
  %rounded = arith.select %round_up, %up, %high : tensor<1024x256xi1>, tensor<1024x256xi32>
  %f = arith.bitcast %rounded : tensor<1024x256xi32> to tensor<1024x256xf32>
  %out = arith.truncf %f : tensor<1024x256xf32> to tensor<1024x256xbf16>
  %packed = dist.bitcast %out : tensor<1024x256xbf16> -> tensor<1024x128xf32>
  return %packed : tensor<1024x128xf32>
}

// -----

// view(dtype) on the last dim: fp32 x 256 as bf16 x 512 stays local when the
// last dim splits evenly.
dist.mesh @m ["dp" = 2, "tp" = 4]
// CHECK-LABEL: func.func @view_dtype
// CHECK-NOT: dist.redistribute
// CHECK: dist.bitcast %{{.*}} : tensor<8x256xf32, #dist.layout<@m, [{"dp"}, {"tp"}]>> -> tensor<8x512xbf16, #dist.layout<@m, [{"dp"}, {"tp"}]>>
func.func @view_dtype(%x: tensor<8x256xf32> {dist.layout = #dist.layout<@m, [{"dp"}, {"tp"}]>}) -> tensor<8x512xbf16> {
  %0 = dist.bitcast %x : tensor<8x256xf32> -> tensor<8x512xbf16>
  return %0 : tensor<8x512xbf16>
}

// -----

// An uneven last dim (6 fp32 on 4 ranks) would cut elements apart: it is
// made whole first.
dist.mesh @m ["tp" = 4]
// CHECK-LABEL: func.func @view_dtype_uneven
// CHECK: %[[R:.*]] = dist.redistribute %{{.*}} : tensor<6xf32, #dist.layout<@m, [{"tp"}]>> -> tensor<6xf32, #dist.layout<@m, [{}]>>
// CHECK: dist.bitcast %[[R]] : tensor<6xf32, #dist.layout<@m, [{}]>> -> tensor<12xbf16, #dist.layout<@m, [{}]>>
func.func @view_dtype_uneven(%x: tensor<6xf32> {dist.layout = #dist.layout<@m, [{"tp"}]>}) -> tensor<12xbf16> {
  %0 = dist.bitcast %x : tensor<6xf32> -> tensor<12xbf16>
  return %0 : tensor<12xbf16>
}

// -----

// Tensor parallel: a column-wise weight gives an output split on N; feeding
// it to a row-wise weight gives a partial sum, which an elementwise op
// reduces first.
dist.mesh @m ["tp" = 2]
// CHECK-LABEL: func.func @mlp
// CHECK: %[[H:.*]] = dist.matmul %{{.*}}, %{{.*}} : tensor<4x8xf32, #dist.layout<@m, [{}, {}]>>, tensor<8x16xf32, #dist.layout<@m, [{}, {"tp"}]>> -> tensor<4x16xf32, #dist.layout<@m, [{}, {"tp"}]>>
// CHECK: %[[Y:.*]] = dist.matmul %[[H]], %{{.*}} : tensor<4x16xf32, #dist.layout<@m, [{}, {"tp"}]>>, tensor<16x8xf32, #dist.layout<@m, [{"tp"}, {}]>> -> tensor<4x8xf32, #dist.layout<@m, [{}, {}], partial(sum) = {"tp"}>>
// CHECK: %[[R:.*]] = dist.redistribute %[[Y]] : tensor<4x8xf32, #dist.layout<@m, [{}, {}], partial(sum) = {"tp"}>> -> tensor<4x8xf32, #dist.layout<@m, [{}, {}]>>
// CHECK: arith.mulf %[[R]], %[[R]]
// LOWERED-LABEL: func.func @mlp
// LOWERED: dist.all_reduce %{{.*}} sum over {"tp"}
func.func @mlp(%x: tensor<4x8xf32> {dist.layout = #dist.layout<@m, [{}, {}]>},
               %w1: tensor<8x16xf32> {dist.layout = #dist.layout<@m, [{}, {"tp"}]>},
               %w2: tensor<16x8xf32> {dist.layout = #dist.layout<@m, [{"tp"}, {}]>}) -> tensor<4x8xf32> {
  %h = dist.matmul %x, %w1 : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %y = dist.matmul %h, %w2 : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
  %z = arith.mulf %y, %y : tensor<4x8xf32>
  return %z : tensor<4x8xf32>
}

// -----

// Backward: a reduction's known result layout decides its operand's.
dist.mesh @m ["dp" = 2, "tp" = 2]
// CHECK-LABEL: func.func @backward
// CHECK-SAME: %{{.*}}: tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
// CHECK: arith.negf %{{.*}} : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
// CHECK: dist.reduce_sum %{{.*}} dims = [1] : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
func.func @backward(%x: tensor<8x4xf32>, %s: tensor<8xf32> {dist.layout = #dist.layout<@m, [{"dp"}]>}) -> tensor<8xf32> {
  %0 = arith.negf %x : tensor<8x4xf32>
  %1 = dist.reduce_sum %0 dims = [1] : tensor<8x4xf32> -> tensor<8xf32>
  %2 = arith.addf %1, %s : tensor<8xf32>
  return %2 : tensor<8xf32>
}

// -----

// Producer and consumer disagree: the consumer's operand is redistributed.
dist.mesh @m ["dp" = 2]
// CHECK-LABEL: func.func @conflict
// CHECK: %[[R:.*]] = dist.redistribute %{{.*}} : tensor<8x4xf32, #dist.layout<@m, [{}, {"dp"}]>> -> tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
// CHECK: arith.addf %{{.*}}, %[[R]] : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
func.func @conflict(%a: tensor<8x4xf32> {dist.layout = #dist.layout<@m, [{"dp"}, {}]>},
                    %b: tensor<8x4xf32> {dist.layout = #dist.layout<@m, [{}, {"dp"}]>}) -> tensor<8x4xf32> {
  %0 = arith.addf %a, %b : tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// reshape: merging [8, 4] -> [32] keeps dim 0's split (each rank keeps whole
// rows); splitting [32] -> [4, 8] gives it to the new major dim.
dist.mesh @m ["dp" = 2]
// CHECK-LABEL: func.func @reshape
// CHECK-NOT: dist.redistribute
// CHECK: dist.reshape %{{.*}} : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<32xf32, #dist.layout<@m, [{"dp"}]>>
// CHECK: dist.reshape %{{.*}} : tensor<32xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<4x8xf32, #dist.layout<@m, [{"dp"}, {}]>>
func.func @reshape(%x: tensor<8x4xf32> {dist.layout = #dist.layout<@m, [{"dp"}, {}]>}) -> tensor<4x8xf32> {
  %0 = dist.reshape %x : tensor<8x4xf32> -> tensor<32xf32>
  %1 = dist.reshape %0 : tensor<32xf32> -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// -----

// A merge whose minor dim is split cannot keep whole rows: unsplit first.
dist.mesh @m ["tp" = 2]
// CHECK-LABEL: func.func @reshape_minor_split
// CHECK: %[[R:.*]] = dist.redistribute %{{.*}} : tensor<8x4xf32, #dist.layout<@m, [{}, {"tp"}]>> -> tensor<8x4xf32, #dist.layout<@m, [{}, {}]>>
// CHECK: dist.reshape %[[R]] : tensor<8x4xf32, #dist.layout<@m, [{}, {}]>> -> tensor<32xf32, #dist.layout<@m, [{}]>>
func.func @reshape_minor_split(%x: tensor<8x4xf32> {dist.layout = #dist.layout<@m, [{}, {"tp"}]>}) -> tensor<32xf32> {
  %0 = dist.reshape %x : tensor<8x4xf32> -> tensor<32xf32>
  return %0 : tensor<32xf32>
}

// -----

// Addition is linear: two partial sums with the same splits add to a partial
// sum (and two partial averages to a partial average) with no reduction
// first; a product of partial sums is not the partial sum of products, so
// mulf reduces first.
dist.mesh @m ["tp" = 2]
// CHECK-LABEL: func.func @linear
// CHECK: %[[A:.*]] = arith.addf %{{.*}}, %{{.*}} : tensor<4x8xf32, #dist.layout<@m, [{}, {}], partial(sum) = {"tp"}>>
// CHECK-NOT: dist.redistribute %[[A]]
// CHECK: %[[S:.*]] = arith.subf %[[A]], %{{.*}} : tensor<4x8xf32, #dist.layout<@m, [{}, {}], partial(sum) = {"tp"}>>
// CHECK: %[[R:.*]] = dist.redistribute %[[S]] : {{.*}} partial(sum) = {"tp"}>> -> tensor<4x8xf32, #dist.layout<@m, [{}, {}]>>
// CHECK: arith.mulf %[[R]], %[[R]]
func.func @linear(%x: tensor<4x8xf32> {dist.layout = #dist.layout<@m, [{}, {}], partial(sum) = {"tp"}>},
                  %y: tensor<4x8xf32> {dist.layout = #dist.layout<@m, [{}, {}], partial(sum) = {"tp"}>}) -> tensor<4x8xf32> {
  %a = arith.addf %x, %y : tensor<4x8xf32>
  %s = arith.subf %a, %y : tensor<4x8xf32>
  %m = arith.mulf %s, %s : tensor<4x8xf32>
  return %m : tensor<4x8xf32>
}
