dist.mesh @m12 ["dp" = 1, "tp" = 2]
func.func @not_gathered(
    %s: tensor<8x8xf32, #dist.layout<@m12, [ {"dp"}, {} ]>> {dist.param = "s.weight", dist.float8},
    %t: tensor<8x8xf32, #dist.layout<@m12, [ {"tp"}, {} ]>> {dist.param = "t.weight", dist.float8},
    %g: tensor<8x8xf32, #dist.layout<@m12, [ {"tp"}, {} ]>> {dist.param = "g.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %cs = arith.truncf %s : tensor<8x8xf32, #dist.layout<@m12, [ {"dp"}, {} ]>> to tensor<8x8xbf16, #dist.layout<@m12, [ {"dp"}, {} ]>>
  %gs = dist.redistribute %cs : tensor<8x8xbf16, #dist.layout<@m12, [ {"dp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m12, [ {}, {} ]>>
  %ct = arith.truncf %t : tensor<8x8xf32, #dist.layout<@m12, [ {"tp"}, {} ]>> to tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>
  %nt = arith.negf %ct : tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>
  %gt = dist.redistribute %ct : tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>
  %cg = arith.truncf %g : tensor<8x8xf32, #dist.layout<@m12, [ {"tp"}, {} ]>> to tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>
  %gg = dist.redistribute %cg : tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>> -> tensor<8x8xbf16, #dist.layout<@m12, [ {}, {} ]>>
  dist.compute forward "layers.0" (%gs, %gt, %gg) : tensor<8x8xbf16, #dist.layout<@m12, [ {}, {} ]>>, tensor<8x8xbf16, #dist.layout<@m12, [ {"tp"}, {} ]>>, tensor<8x8xbf16, #dist.layout<@m12, [ {}, {} ]>>
  return
}
