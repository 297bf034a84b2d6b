dist.mesh @ft ["dp_replicate" = 3, "dp_shard" = 4] managed = ["dp_replicate"]
func.func @managed_flatten(%g: tensor<8xf32, #dist.layout<@ft, [{}], partial(avg) = {"dp_replicate", "dp_shard"}>>,
                           %h: tensor<8xf32, #dist.layout<@ft, [{}], partial(avg) = {"dp_replicate", "dp_shard"}>>,
                           %r: tensor<8xf32, #dist.layout<@ft, [{}]>>) {
  %0 = dist.all_reduce %g avg over {"dp_replicate", "dp_shard"} : tensor<8xf32, #dist.layout<@ft, [{}], partial(avg) = {"dp_replicate", "dp_shard"}>> -> tensor<8xf32, #dist.layout<@ft, [{}]>>
  %1 = dist.all_reduce %h avg over {"dp_replicate", "dp_shard":(1)2, "dp_shard":(2)2} : tensor<8xf32, #dist.layout<@ft, [{}], partial(avg) = {"dp_replicate", "dp_shard"}>> -> tensor<8xf32, #dist.layout<@ft, [{}]>>
  %2 = dist.local_slice %r dim 0 over {"dp_shard"} : tensor<8xf32, #dist.layout<@ft, [{}]>> -> tensor<8xf32, #dist.layout<@ft, [{"dp_shard"}]>>
  return
}
