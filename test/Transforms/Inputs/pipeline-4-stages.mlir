// A one-microbatch template of 4 stages, one unit and one parameter each,
// for dist-lower-pipeline (tests replace the schedule with sed).
dist.mesh @m ["pp" = 4, "dp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "1f1b" microbatches 8 stages_per_rank 1 activation tensor<4x8xbf16>
func.func @train_step(
    %w0: tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "w0"},
    %w1: tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "w1"},
    %w2: tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "w2"},
    %w3: tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> {dist.param = "w3"})
    attributes {dist.train_step, dist.pipeline = @pipe} {
  %g0 = dist.redistribute %w0 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  dist.compute forward "layers.0" (%g0) stage 0 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  %g1 = dist.redistribute %w1 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  dist.compute forward "layers.1" (%g1) stage 1 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  %g2 = dist.redistribute %w2 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  dist.compute forward "layers.2" (%g2) stage 2 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  %g3 = dist.redistribute %w3 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  dist.compute forward "layers.3" (%g3) stage 3 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>>
  %d3 = dist.compute backward "layers.3" (%g3) stage 3 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  dist.optimizer_step %w3, %d3 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  %d2 = dist.compute backward "layers.2" (%g2) stage 2 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  dist.optimizer_step %w2, %d2 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  %d1 = dist.compute backward "layers.1" (%g1) stage 1 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  dist.optimizer_step %w1, %d1 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  %d0 = dist.compute backward "layers.0" (%g0) stage 0 : tensor<8x8xf32, #dist.layout<@m, [{}, {}]>> -> tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  dist.optimizer_step %w0, %d0 : tensor<8x8xf32, #dist.layout<@m, [{"dp"}, {}]>>, tensor<8x8xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
  return
}
