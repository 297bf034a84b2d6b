dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
dist.comm @fsdp_group on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">
func.func @fp8(%amax: tensor<1xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>>,
               %w: tensor<16x8xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>>) {
  %0 = dist.all_reduce %amax max over {"fsdp"} : tensor<1xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>> -> tensor<1xf32, #dist.layout<@world, [{}]>>
  %1 = dist.all_gather %w dim 0 over {"fsdp"} : tensor<16x8xf8E4M3FN, #dist.layout<@world, [{"fsdp"}, {}]>> -> tensor<16x8xf8E4M3FN, #dist.layout<@world, [{}, {}]>>
  return
}
