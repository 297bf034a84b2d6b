dist.mesh @world ["ddp" = 2, "fsdp" = 2, "abcd" = 2]
dist.comm @amax on @world axes {"fsdp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">


func.func @step(%amax: tensor<1xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>>,
                %w: tensor<18x8xf8E4M3FN>) -> tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd"}, {}]>> {
  %0 = dist.all_reduce %amax max over {"fsdp"} : tensor<1xf32, #dist.layout<@world, [{}], partial(max) = {"fsdp"}>> -> tensor<1xf32, #dist.layout<@world, [{}]>>
  %1 = dist.annotate %w : tensor<18x8xf8E4M3FN> -> tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>>
  %2 = dist.all_gather %1 dim 0 over {"fsdp"} : tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd", "fsdp"}, {}]>> -> tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd"}, {}]>>
  return %2 : tensor<18x8xf8E4M3FN, #dist.layout<@world, [{"abcd"}, {}]>>
}
