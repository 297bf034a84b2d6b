// RUN: %meshplan-opt %s --dist-fuse-fp8-gather -split-input-file -verify-diagnostics

// The inputs are what dist-lower-redistribute leaves (gathers explicit).

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op parameter "l.weight" is marked dist.float8 but the function has no dist.float8 attribute (its scale settings)}}
func.func @no_function_attr(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step} {
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op has dist.float8 but is not a dist.train_step function}}
func.func @not_a_step(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.float8 = {power_of_2 = true}} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.float8 must be a dictionary {power_of_2 = true|false}}}
func.func @not_a_dictionary() attributes {dist.train_step, dist.float8 = true} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.float8 needs power_of_2 = true|false}}
func.func @no_power_of_2() attributes {dist.train_step, dist.float8 = {}} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.float8 needs power_of_2 = true|false}}
func.func @power_of_2_not_bool() attributes {dist.train_step, dist.float8 = {power_of_2 = 1 : i64}} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.float8 has an unknown key "power_of_two" (expected {power_of_2 = true|false})}}
func.func @unknown_key() attributes {dist.train_step, dist.float8 = {power_of_2 = true, power_of_two = true}} {
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op parameter "l.weight": dist.float8 is a unit attribute}}
func.func @arg_attr_not_unit(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8 = true})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op float8 parameter "ids" is not a floating-point tensor}}
func.func @not_float(%w: tensor<8xi32, #dist.layout<@m, [{"dp"}]>> {dist.param = "ids", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  return
}

// -----

// Without dist.param the parameter is named by its position.
dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op parameter #1 is marked dist.float8 but the function has no dist.float8 attribute}}
func.func @unnamed(%v: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>,
                   %w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.float8})
    attributes {dist.train_step} {
  return
}

// -----

// A non-layout op between the cast and the gather would see float8 data.
dist.mesh @m ["dp" = 2]
func.func @op_between_cast_and_gather(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %c = arith.truncf %w : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> to tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
  // expected-error @+1 {{'arith.mulf' op reads float8 parameter "l.weight" after its cast; only its mixed-precision cast, the layout ops of its all-gather and dist.compute may (the gathered weight becomes float8)}}
  %s = arith.mulf %c, %c : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
  %g = dist.all_gather %c dim 0 over {"dp"} : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<8xbf16, #dist.layout<@m, [{}]>>
  dist.compute forward "l" (%g) : tensor<8xbf16, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @gathered_used_by_other_op(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %c = arith.truncf %w : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> to tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
  %g = dist.all_gather %c dim 0 over {"dp"} : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<8xbf16, #dist.layout<@m, [{}]>>
  // expected-error @+1 {{'arith.negf' op reads float8 parameter "l.weight" on its way to the computes;}}
  %n = arith.negf %g : tensor<8xbf16, #dist.layout<@m, [{}]>>
  dist.compute forward "l" (%g) : tensor<8xbf16, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @stored_shard_used_by_other_op(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  // expected-error @+1 {{'arith.negf' op reads float8 parameter "l.weight" as its stored shard;}}
  %n = arith.negf %w : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  %c = arith.truncf %w : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> to tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
  %g = dist.all_gather %c dim 0 over {"dp"} : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<8xbf16, #dist.layout<@m, [{}]>>
  dist.compute forward "l" (%g) : tensor<8xbf16, #dist.layout<@m, [{}]>>
  return
}

// -----

// Float8 data cannot be reduced: a reducing step in the chain is an error.
dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @reduction_in_chain(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %c = arith.truncf %w : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> to tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>
  %g = dist.all_gather %c dim 0 over {"dp"} : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<8xbf16, #dist.layout<@m, [{}]>>
  // expected-error @+1 {{'dist.mark_partial' op reads float8 parameter "l.weight" on its way to the computes;}}
  %p = dist.mark_partial %g sum over {"tp"} : tensor<8xbf16, #dist.layout<@m, [{}]>> -> tensor<8xbf16, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>
  dist.compute forward "l" (%p) : tensor<8xbf16, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
// expected-error @+1 {{'func.func' op float8 parameter "l.weight" is stored partial; its amax is undefined}}
func.func @stored_partial(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}], partial(sum) = {"tp"}>> {dist.param = "l.weight", dist.float8})
    attributes {dist.train_step, dist.float8 = {power_of_2 = true}} {
  %g = dist.all_gather %w dim 0 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"dp"}], partial(sum) = {"tp"}>> -> tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>
  dist.compute forward "l" (%g) : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>
  return
}
