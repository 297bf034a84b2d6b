dist.mesh @mesh ["dp" = 2, "tp" = 2]
func.func @fsdp_tp(
    %w0: tensor<64x32xf32, #dist.layout<@mesh, [ {"dp"}, {} ]>> {dist.param = "tok_embeddings.weight"},
    %w1: tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> {dist.param = "layers.0.attention.wq.weight", dist.float8},
    %w2: tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> {dist.param = "layers.0.attention.wk.weight", dist.float8},
    %w3: tensor<32xf32, #dist.layout<@mesh, [ {"dp"} ]>> {dist.param = "layers.0.attention_norm.weight"})
    attributes {dist.train_step, dist.reshard_after_forward = true,
                dist.gradient_accumulation_steps = 1 : i64,
                dist.float8 = {power_of_2 = true}} {
  %c0 = arith.truncf %w0 : tensor<64x32xf32, #dist.layout<@mesh, [ {"dp"}, {} ]>> to tensor<64x32xbf16, #dist.layout<@mesh, [ {"dp"}, {} ]>>
  %g0 = dist.redistribute %c0 : tensor<64x32xbf16, #dist.layout<@mesh, [ {"dp"}, {} ]>> -> tensor<64x32xbf16, #dist.layout<@mesh, [ {}, {} ]>>
  dist.compute forward "tok_embeddings" (%g0) flops = 1.0e6 : tensor<64x32xbf16, #dist.layout<@mesh, [ {}, {} ]>>
  %c1 = arith.truncf %w1 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> to tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>
  %g1 = dist.redistribute %c1 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> -> tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>
  %c2 = arith.truncf %w2 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> to tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>
  %g2 = dist.redistribute %c2 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>> -> tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>
  %c3 = arith.truncf %w3 : tensor<32xf32, #dist.layout<@mesh, [ {"dp"} ]>> to tensor<32xbf16, #dist.layout<@mesh, [ {"dp"} ]>>
  %g3 = dist.redistribute %c3 : tensor<32xbf16, #dist.layout<@mesh, [ {"dp"} ]>> -> tensor<32xbf16, #dist.layout<@mesh, [ {} ]>>
  dist.compute forward "layers.0" (%g1, %g2, %g3) flops = 2.0e6 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32xbf16, #dist.layout<@mesh, [ {} ]>>
  %d1, %d2, %d3 = dist.compute backward "layers.0" (%g1, %g2, %g3) flops = 4.0e6 : tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32x32xbf16, #dist.layout<@mesh, [ {"tp"}, {} ]>>, tensor<32xbf16, #dist.layout<@mesh, [ {} ]>> -> tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>, tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>, tensor<32xf32, #dist.layout<@mesh, [ {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w1, %d1 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>, tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w2, %d2 : tensor<32x32xf32, #dist.layout<@mesh, [ {"tp", "dp"}, {} ]>>, tensor<32x32xf32, #dist.layout<@mesh, [ {"tp"}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w3, %d3 : tensor<32xf32, #dist.layout<@mesh, [ {"dp"} ]>>, tensor<32xf32, #dist.layout<@mesh, [ {} ], partial(avg) = {"dp"}>>
  %d0 = dist.compute backward "tok_embeddings" (%g0) flops = 2.0e6 : tensor<64x32xbf16, #dist.layout<@mesh, [ {}, {} ]>> -> tensor<64x32xf32, #dist.layout<@mesh, [ {}, {} ], partial(avg) = {"dp"}>>
  dist.optimizer_step %w0, %d0 : tensor<64x32xf32, #dist.layout<@mesh, [ {"dp"}, {} ]>>, tensor<64x32xf32, #dist.layout<@mesh, [ {}, {} ], partial(avg) = {"dp"}>>
  return
}
