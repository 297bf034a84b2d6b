dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
func.func @hsdp_extra(
    %a: tensor<16x8xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>> {dist.param = "layers.0.w1.weight", dist.float8},
    %b: tensor<8x16xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>> {dist.param = "layers.0.w2.weight", dist.float8},
    %n: tensor<8xf32, #dist.layout<@world, [ {"fsdp"} ]>> {dist.param = "layers.0.norm.weight"})
    attributes {dist.train_step, dist.float8 = {power_of_2 = false}} {
  %ca = arith.truncf %a : tensor<16x8xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>> to tensor<16x8xbf16, #dist.layout<@world, [ {"fsdp"}, {} ]>>
  %ga = dist.redistribute %ca : tensor<16x8xbf16, #dist.layout<@world, [ {"fsdp"}, {} ]>> -> tensor<16x8xbf16, #dist.layout<@world, [ {}, {} ]>>
  %cb = arith.truncf %b : tensor<8x16xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>> to tensor<8x16xbf16, #dist.layout<@world, [ {"fsdp"}, {} ]>>
  %gb = dist.redistribute %cb : tensor<8x16xbf16, #dist.layout<@world, [ {"fsdp"}, {} ]>> -> tensor<8x16xbf16, #dist.layout<@world, [ {}, {} ]>>
  %cn = arith.truncf %n : tensor<8xf32, #dist.layout<@world, [ {"fsdp"} ]>> to tensor<8xbf16, #dist.layout<@world, [ {"fsdp"} ]>>
  %gn = dist.redistribute %cn : tensor<8xbf16, #dist.layout<@world, [ {"fsdp"} ]>> -> tensor<8xbf16, #dist.layout<@world, [ {} ]>>
  dist.compute forward "layers.0" (%ga, %gb, %gn) : tensor<16x8xbf16, #dist.layout<@world, [ {}, {} ]>>, tensor<8x16xbf16, #dist.layout<@world, [ {}, {} ]>>, tensor<8xbf16, #dist.layout<@world, [ {} ]>>
  %da, %db, %dn = dist.compute backward "layers.0" (%ga, %gb, %gn) : tensor<16x8xbf16, #dist.layout<@world, [ {}, {} ]>>, tensor<8x16xbf16, #dist.layout<@world, [ {}, {} ]>>, tensor<8xbf16, #dist.layout<@world, [ {} ]>> -> tensor<16x8xf32, #dist.layout<@world, [ {}, {} ], partial(avg) = {"ddp", "fsdp"}>>, tensor<8x16xf32, #dist.layout<@world, [ {}, {} ], partial(avg) = {"ddp", "fsdp"}>>, tensor<8xf32, #dist.layout<@world, [ {} ], partial(avg) = {"ddp", "fsdp"}>>
  dist.optimizer_step %a, %da : tensor<16x8xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>>, tensor<16x8xf32, #dist.layout<@world, [ {}, {} ], partial(avg) = {"ddp", "fsdp"}>>
  dist.optimizer_step %b, %db : tensor<8x16xf32, #dist.layout<@world, [ {"fsdp"}, {} ]>>, tensor<8x16xf32, #dist.layout<@world, [ {}, {} ], partial(avg) = {"ddp", "fsdp"}>>
  dist.optimizer_step %n, %dn : tensor<8xf32, #dist.layout<@world, [ {"fsdp"} ]>>, tensor<8xf32, #dist.layout<@world, [ {} ], partial(avg) = {"ddp", "fsdp"}>>
  return
}
