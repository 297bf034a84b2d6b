// RUN: %meshplan-opt %s --dist-propagate-layouts -split-input-file -verify-diagnostics

dist.mesh @m ["dp" = 2]
func.func @unconstrained(%a: tensor<8xf32> {dist.layout = #dist.layout<@m, [{"dp"}]>}) -> tensor<8xf32> {
  // expected-error @+1 {{'arith.constant' op result has no layout and none could be inferred (no layout rule relates it to a laid-out value); annotate it}}
  %c = arith.constant dense<1.0> : tensor<4xf32>
  return %a : tensor<8xf32>
}

// -----

dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
// expected-error @+1 {{uses meshes @m and @n in one function; propagation needs one mesh per function}}
func.func @two_meshes(%a: tensor<8xf32> {dist.layout = #dist.layout<@m, [{"dp"}]>},
                      %b: tensor<8xf32> {dist.layout = #dist.layout<@n, [{"dp"}]>}) {
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{argument 0: layout has 2 dims but the tensor has 1}}
func.func @rank(%a: tensor<8xf32> {dist.layout = #dist.layout<@m, [{"dp"}, {}]>}) {
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{argument 0: dist.layout must be a #dist.layout}}
func.func @not_a_layout(%a: tensor<8xf32> {dist.layout = "dp"}) {
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{argument 0: dist.layout needs a ranked tensor without an encoding}}
func.func @not_a_tensor(%a: f32 {dist.layout = #dist.layout<@m, [{"dp"}]>}) {
  return
}
