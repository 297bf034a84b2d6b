func.func @f(%a: tensor<8xf32, #dist.layout<@nowhere, [{"dp"}]>>) {
  dist.compute forward "l" (%a) : tensor<8xf32, #dist.layout<@nowhere, [{"dp"}]>>
  return
}
