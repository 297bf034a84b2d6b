// Round trip: every op and attribute prints in the form it parses.
// RUN: %meshplan-opt %s | %meshplan-opt | FileCheck %s
// RUN: %meshplan-opt %s --verify-roundtrip -o /dev/null

// CHECK-LABEL: dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
// CHECK: dist.mesh @ft ["dp_replicate" = 3, "dp_shard" = 4] managed = ["dp_replicate"]
dist.mesh @ft ["dp_replicate" = 3, "dp_shard" = 4] managed = ["dp_replicate"]
// CHECK: dist.mesh @perm ["dp" = 2, "tp" = 2] order = [3, 2, 1, 0]
dist.mesh @perm ["dp" = 2, "tp" = 2] order = [3, 2, 1, 0]
// CHECK: dist.mesh @sub ["x" = 8]
dist.mesh @sub ["x" = 8]

// CHECK: dist.comm @comm_fsdp on @world axes {"fsdp"}
dist.comm @comm_fsdp on @world axes {"fsdp"}
// CHECK: dist.comm @comm_dp on @ft axes {"dp_replicate", "dp_shard"}
dist.comm @comm_dp on @ft axes {"dp_replicate", "dp_shard"}
// CHECK: dist.comm @comm_sub on @sub axes {"x":(2)4}
dist.comm @comm_sub on @sub axes {"x":(2)4}
// CHECK: dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
// CHECK: dist.comm @dp on @ft axes {"dp_replicate", "dp_shard"} view = #dist.view<"slice(dp_replicate,dp_shard).flatten(dp_replicate,dp_shard as dp)">
dist.comm @dp on @ft axes {"dp_replicate", "dp_shard"} view = #dist.view<"slice(dp_replicate,dp_shard).flatten(dp_replicate,dp_shard as dp)">

// CHECK-LABEL: func.func @layouts
// CHECK-SAME: tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
// CHECK-SAME: tensor<5xf32, #dist.layout<@ft, [{("dp_replicate", "dp_shard")}]>>
// CHECK-SAME: tensor<8xf32, #dist.layout<@sub, [{"x":(1)2}], partial(max) = {"x":(2)4}>>
// CHECK-SAME: tensor<8xf32, #dist.layout<@world, [{}], partial(sum) = {"ddp"}>>
func.func @layouts(
    %a: tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>,
    %b: tensor<5xf32, #dist.layout<@ft, [{("dp_replicate", "dp_shard")}]>>,
    %c: tensor<8xf32, #dist.layout<@sub, [{"x":(1)2}], partial(max) = {"x":(2)4}>>,
    %d: tensor<8xf32, #dist.layout<@world, [{}], partial(sum) = {"ddp"}>>) {
  return
}

// CHECK-LABEL: func.func @model
func.func @model(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>) {
  // CHECK: dist.matmul %{{.*}}, %{{.*}} : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %0 = dist.matmul %x, %w : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: dist.bitcast %{{.*}} : tensor<4x16xf32> -> tensor<4x32xbf16>
  %1 = dist.bitcast %0 : tensor<4x16xf32> -> tensor<4x32xbf16>
  // CHECK: dist.reduce_sum %{{.*}} dims = [1] : tensor<4x32xbf16> -> tensor<4xbf16>
  %2 = dist.reduce_sum %1 dims = [1] : tensor<4x32xbf16> -> tensor<4xbf16>
  // CHECK: dist.reshape %{{.*}} : tensor<4x16xf32> -> tensor<64xf32>
  %3 = dist.reshape %0 : tensor<4x16xf32> -> tensor<64xf32>
  return
}

// CHECK-LABEL: func.func @steps
func.func @steps(%arg0: tensor<16x8xf32>) {
  // CHECK: dist.annotate %{{.*}} : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
  %0 = dist.annotate %arg0 : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
  // CHECK: dist.all_gather %{{.*}} dim 0 over {"fsdp"} comm = @comm_fsdp
  %1 = dist.all_gather %0 dim 0 over {"fsdp"} comm = @comm_fsdp : tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{"abcd"}, {}]>>
  // CHECK: dist.all_to_all %{{.*}} dim 0 to 1 over {"abcd"}
  %2 = dist.all_to_all %1 dim 0 to 1 over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{"abcd"}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>>
  // CHECK: dist.local_slice %{{.*}} dim 0 over {"ddp", "fsdp"}
  %3 = dist.local_slice %2 dim 0 over {"ddp", "fsdp"} : tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>> -> tensor<16x8xf32, #dist.layout<@world, [{("ddp", "fsdp")}, {"abcd"}]>>
  // CHECK: dist.permute %{{.*}} dim 0 to {"fsdp", "ddp"} over {"ddp", "fsdp"}
  %4 = dist.permute %3 dim 0 to {"fsdp", "ddp"} over {"ddp", "fsdp"} : tensor<16x8xf32, #dist.layout<@world, [{("ddp", "fsdp")}, {"abcd"}]>> -> tensor<16x8xf32, #dist.layout<@world, [{"fsdp", "ddp"}, {"abcd"}]>>
  // CHECK: dist.mark_partial %{{.*}} sum over {"abcd"}
  %5 = dist.annotate %arg0 : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  %6 = dist.mark_partial %5 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>>
  // CHECK: dist.reduce_scatter %{{.*}} dim 1 sum over {"abcd"}
  %7 = dist.reduce_scatter %6 dim 1 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>>
  // CHECK: dist.all_reduce %{{.*}} sum over {"abcd"}
  %8 = dist.all_reduce %6 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  // CHECK: dist.broadcast %{{.*}} root 1 over {"ddp"}
  %9 = dist.broadcast %8 root 1 over {"ddp"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  return
}
