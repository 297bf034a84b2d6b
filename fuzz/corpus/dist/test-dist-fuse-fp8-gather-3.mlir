dist.mesh @m4 ["dp" = 4]
func.func @uneven(
    %a: tensor<5x16xf32, #dist.layout<@m4, [ {"dp"}, {} ]>> {dist.param = "a.weight", dist.float8},
    %b: tensor<2x16xf32, #dist.layout<@m4, [ {"dp"}, {} ]>> {dist.param = "b.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %ca = arith.truncf %a : tensor<5x16xf32, #dist.layout<@m4, [ {"dp"}, {} ]>> to tensor<5x16xbf16, #dist.layout<@m4, [ {"dp"}, {} ]>>
  %ga = dist.redistribute %ca : tensor<5x16xbf16, #dist.layout<@m4, [ {"dp"}, {} ]>> -> tensor<5x16xbf16, #dist.layout<@m4, [ {}, {} ]>>
  %cb = arith.truncf %b : tensor<2x16xf32, #dist.layout<@m4, [ {"dp"}, {} ]>> to tensor<2x16xbf16, #dist.layout<@m4, [ {"dp"}, {} ]>>
  %gb = dist.redistribute %cb : tensor<2x16xbf16, #dist.layout<@m4, [ {"dp"}, {} ]>> -> tensor<2x16xbf16, #dist.layout<@m4, [ {}, {} ]>>
  dist.compute forward "layers.0" (%ga, %gb) : tensor<5x16xbf16, #dist.layout<@m4, [ {}, {} ]>>, tensor<2x16xbf16, #dist.layout<@m4, [ {}, {} ]>>
  return
}
