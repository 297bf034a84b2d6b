// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=0 | FileCheck %s --check-prefix=RANK0
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=5 | FileCheck %s --check-prefix=RANK5
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=7 | FileCheck %s --check-prefix=RANK7

// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=0 | FileCheck %s --check-prefix=ALL0
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=1 | FileCheck %s --check-prefix=ALL1
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=2 | FileCheck %s --check-prefix=ALL2
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=3 | FileCheck %s --check-prefix=ALL3
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=4 | FileCheck %s --check-prefix=ALL4
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=5 | FileCheck %s --check-prefix=ALL5
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=6 | FileCheck %s --check-prefix=ALL6
// RUN: %meshplan-opt %s --dist-materialize-comms --dist-specialize-rank=rank=7 | FileCheck %s --check-prefix=ALL7

// (ddp, fsdp, abcd) = (2, 2, 2): the fsdp groups are [0,2] [1,3] [4,6] [5,7].
// The comm comes from a submesh of a submesh; every rank gets its group.
dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
// ALL0: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [0, 2]
// ALL1: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [1, 3]
// ALL2: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [0, 2]
// ALL3: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [1, 3]
// ALL4: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [4, 6]
// ALL5: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [5, 7]
// ALL6: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [4, 6]
// ALL7: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [5, 7]

// RANK0: module attributes {dist.rank = 0 : i64}
// RANK0: dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)"> {color = 0 : i64, key = 0 : i64}
// RANK5: dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)"> {color = 5 : i64, key = 0 : i64}
// RANK7: dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)"> {color = 5 : i64, key = 1 : i64}

// RANK0-LABEL: func.func @step
// RANK0-SAME: (%{{.*}}: tensor<1xf32>, %{{.*}}: tensor<5x8xf8E4M3FN>) -> tensor<9x8xf8E4M3FN>
// RANK7-LABEL: func.func @step
// RANK7-SAME: (%{{.*}}: tensor<1xf32>, %{{.*}}: tensor<4x8xf8E4M3FN>) -> tensor<9x8xf8E4M3FN>
func.func @step(%amax: tensor<1xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>>,
                %w: tensor<18x8xf8E4M3FN>) -> tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd"}, {}]>> {
  // RANK0: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [0, 2] : tensor<1xf32> -> tensor<1xf32>
  // RANK5: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [5, 7] : tensor<1xf32> -> tensor<1xf32>
  // RANK7: dist.all_reduce %{{.*}} max over {"fsdp"} comm = @amax group = [5, 7] : tensor<1xf32> -> tensor<1xf32>
  %0 = dist.all_reduce %amax max over {"fsdp"} : tensor<1xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>> -> tensor<1xf32, #dist.layout<@world, [{}]>>
  // 18 rows split by abcd then fsdp: 9 -> 5 + 4.
  %1 = dist.annotate %w : tensor<18x8xf8E4M3FN> -> tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
  // RANK0: dist.all_gather %{{.*}} dim 0 over {"fsdp"} comm = @amax group = [0, 2] : tensor<5x8xf8E4M3FN> -> tensor<9x8xf8E4M3FN>
  // RANK7: dist.all_gather %{{.*}} dim 0 over {"fsdp"} comm = @amax group = [5, 7] : tensor<4x8xf8E4M3FN> -> tensor<9x8xf8E4M3FN>
  %2 = dist.all_gather %1 dim 0 over {"fsdp"} : tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>> -> tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd"}, {}]>>
  return %2 : tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd"}, {}]>>
}
