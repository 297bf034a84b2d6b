dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
dist.mesh @ft ["dp_replicate" = 3, "dp_shard" = 4] managed = ["dp_replicate"]
dist.mesh @perm ["dp" = 2, "tp" = 2] order = [3, 2, 1, 0]
dist.mesh @sub ["x" = 8]

dist.comm @comm_fsdp on @world axes {"fsdp"}
dist.comm @comm_dp on @ft axes {"dp_replicate", "dp_shard"}
dist.comm @comm_sub on @sub axes {"x":(2)4}
dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
dist.comm @dp on @ft axes {"dp_replicate", "dp_shard"} view = #dist.view<"slice(dp_replicate,dp_shard).flatten(dp_replicate,dp_shard as dp)">

func.func @layouts(
    %a: tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>,
    %b: tensor<5xf32, #dist.layout<@ft, [{("dp_replicate", "dp_shard")}]>>,
    %c: tensor<8xf32, #dist.layout<@sub, [{"x":(1)2}], partial(max) = {"x":(2)4}>>,
    %d: tensor<8xf32, #dist.layout<@world, [{}], partial(sum) = {"ddp"}>>) {
  return
}

func.func @model(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>) {
  %0 = dist.matmul %x, %w : tensor<4x8xf32>, tensor<8x16xf32> -> tensor<4x16xf32>
  %1 = dist.bitcast %0 : tensor<4x16xf32> -> tensor<4x32xbf16>
  %2 = dist.reduce_sum %1 dims = [1] : tensor<4x32xbf16> -> tensor<4xbf16>
  %3 = dist.reshape %0 : tensor<4x16xf32> -> tensor<64xf32>
  return
}

func.func @steps(%arg0: tensor<16x8xf32>) {
  %0 = dist.annotate %arg0 : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
  %1 = dist.all_gather %0 dim 0 over {"fsdp"} comm = @comm_fsdp : tensor<16x8xf32, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{"abcd"}, {}]>>
  %2 = dist.all_to_all %1 dim 0 to 1 over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{"abcd"}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>>
  %3 = dist.local_slice %2 dim 0 over {"ddp", "fsdp"} : tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>> -> tensor<16x8xf32, #dist.layout<@world, [{("ddp", "fsdp")}, {"abcd"}]>>
  %4 = dist.permute %3 dim 0 to {"fsdp", "ddp"} over {"ddp", "fsdp"} : tensor<16x8xf32, #dist.layout<@world, [{("ddp", "fsdp")}, {"abcd"}]>> -> tensor<16x8xf32, #dist.layout<@world, [{"fsdp", "ddp"}, {"abcd"}]>>
  %5 = dist.annotate %arg0 : tensor<16x8xf32> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  %6 = dist.mark_partial %5 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>>
  %7 = dist.reduce_scatter %6 dim 1 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {"abcd"}]>>
  %8 = dist.all_reduce %6 sum over {"abcd"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}], partial(sum) = {"abcd"}>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  %9 = dist.broadcast %8 root 1 over {"ddp"} : tensor<16x8xf32, #dist.layout<@world, [{}, {}]>> -> tensor<16x8xf32, #dist.layout<@world, [{}, {}]>>
  return
}

func.func @train_step(
    %wq: tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>,
    %wk: tensor<64x64xbf16, #dist.layout<@world, [{}, {"fsdp"}]>>,
    %wv: tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>,
    %gathered: tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>,
    %m: tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>,
    %v: tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>,
    %w32: tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>) {
  dist.compute forward "layers.0" (%gathered, %wv) flops = 2.4e+09 : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>
  dist.compute forward "layers.1" (%gathered) : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>
  dist.compute forward "loss" () flops = 1.0e+06
  dist.compute forward "noop" ()
  %g0, %g1 = dist.compute backward "layers.0" (%gathered, %wv) flops = 4.8e+09 : tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<64x64xbf16, #dist.layout<@world, [{}, {}], partial(sum) = {"ddp", "fsdp"}>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}], partial(sum) = {"ddp"}>>
  dist.compute backward "loss" ()
  dist.optimizer_step %w32, %g0 : tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {}], partial(sum) = {"ddp", "fsdp"}>>
  %p, %m2, %v2 = dist.adamw %wq, %wq, %m, %v {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, stochastic_rounding, seed = 7, tensor_id = 3} : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>
  %p3, %m3, %v3 = dist.adamw %w32, %w32, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 4} : tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf32, #dist.layout<@world, [{"fsdp"}, {}]>>
  %a = dist.fp8_amax %wq, %wk, %wv : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<3xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>>
  %r = dist.all_reduce %a max over {"fsdp"} : tensor<3xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>> -> tensor<3xf32, #dist.layout<@world, [{}]>>
  %q = dist.fp8_cast %wq scale %r[0] power_of_2 : tensor<64x64xbf16, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<3xf32, #dist.layout<@world, [{}]>> -> tensor<64x64xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>
  %q2 = dist.fp8_cast %wk scale %r[1] : tensor<64x64xbf16, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<3xf32, #dist.layout<@world, [{}]>> -> tensor<64x64xf8E5M2, #dist.layout<@world, [{}, {"fsdp"}]>>
  dist.free %q, %q2, %gathered : tensor<64x64xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>, tensor<64x64xf8E5M2, #dist.layout<@world, [{}, {"fsdp"}]>>, tensor<64x64xbf16, #dist.layout<@world, [{}, {}]>>
  return
}

func.func @fp8_amax_axes(
    %a: tensor<64x64xbf16, #dist.layout<@world, [{"ddp", "fsdp"}, {}]>>,
    %b: tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {"ddp"}]>>) {
  %0 = dist.fp8_amax %a, %b : tensor<64x64xbf16, #dist.layout<@world, [{"ddp", "fsdp"}, {}]>>, tensor<64x32xbf16, #dist.layout<@world, [{"fsdp"}, {"ddp"}]>> -> tensor<2xf32, #dist.layout<@world, [{}], partial(max) = {"ddp", "fsdp"}>>
  return
}

func.func @fault_tolerant(
    %g: tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}], partial(sum) = {"dp_replicate"}>>,
    %l: tensor<2xf32>) {
  %0 = dist.all_reduce %g sum fault_tolerant over {"dp_replicate"} : tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}], partial(sum) = {"dp_replicate"}>> -> tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}]>>
  %1 = dist.all_reduce %l avg fault_tolerant over {"dp_replicate"} group = [1, 5, 9] : tensor<2xf32> -> tensor<2xf32>
  return
}

func.func @train_step_rank_local(%x: tensor<32x64xbf16>, %y: tensor<64x32xbf16>,
    %w: tensor<32x64xf32>, %m: tensor<32x64xf32>, %v: tensor<32x64xf32>) {
  dist.compute forward "layers.0" (%x, %y) flops = 2.4e+09 : tensor<32x64xbf16>, tensor<64x32xbf16>
  %gx, %gy = dist.compute backward "layers.0" (%x, %y) : tensor<32x64xbf16>, tensor<64x32xbf16> -> tensor<32x64xbf16>, tensor<64x32xbf16>
  dist.optimizer_step %w, %gx : tensor<32x64xf32>, tensor<32x64xbf16>
  %p, %m2, %v2 = dist.adamw %x, %gx, %m, %v {lr = 3.0e-4, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8, weight_decay = 0.1, stochastic_rounding, seed = 7, tensor_id = 3} : tensor<32x64xbf16>, tensor<32x64xbf16>, tensor<32x64xf32>, tensor<32x64xf32>
  %p3, %m3, %v3 = dist.adamw %w, %w, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 5} : tensor<32x64xf32>, tensor<32x64xf32>, tensor<32x64xf32>, tensor<32x64xf32>
  %a = dist.fp8_amax %x, %y : tensor<32x64xbf16>, tensor<64x32xbf16> -> tensor<2xf32>
  %r = dist.all_reduce %a max over {"ddp", "fsdp"} group = [0, 2, 4, 6] : tensor<2xf32> -> tensor<2xf32>
  %q = dist.fp8_cast %x scale %r[0] power_of_2 : tensor<32x64xbf16>, tensor<2xf32> -> tensor<32x64xf8E4M3FN>
  %q2 = dist.fp8_cast %y scale %r[1] : tensor<64x32xbf16>, tensor<2xf32> -> tensor<64x32xf8E5M2>
  dist.free %q, %q2, %gy : tensor<32x64xf8E4M3FN>, tensor<64x32xf8E5M2>, tensor<64x32xbf16>
  return
}
