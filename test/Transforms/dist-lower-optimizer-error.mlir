// Every diagnostic of dist-lower-optimizer, one case per split.
// RUN: %meshplan-opt %s --dist-lower-optimizer -split-input-file -verify-diagnostics

// A gradient split on dim 1 while the parameter is split on dim 0 over the
// same axis: reaching the stored shard would move data (an all_to_all), not
// reduce it.
dist.mesh @m ["dp" = 2]
func.func @all_to_all(%w: tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>> {dist.param = "w"},
                      %g: tensor<8x4xf32, #dist.layout<@m, [ {}, {"dp"} ]>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  // expected-error @+1 {{'dist.optimizer_step' op the update of "w" would need an all_to_all over {"dp"}; a per-shard optimizer needs the gradient reducible into the parameter's layout}}
  dist.optimizer_step %w, %g : tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>>, tensor<8x4xf32, #dist.layout<@m, [ {}, {"dp"} ]>>
  return
}

// -----

// A gradient split by tp where the parameter is not: the tp shards would
// have to be gathered.
dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @all_gather(%w: tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>> {dist.param = "layers.0.w"},
                      %g: tensor<8x4xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  // expected-error @+1 {{'dist.optimizer_step' op the update of "layers.0.w" would need an all_gather over {"tp"}; a per-shard optimizer}}
  dist.optimizer_step %w, %g : tensor<8x4xf32, #dist.layout<@m, [ {"dp"}, {} ]>>, tensor<8x4xf32, #dist.layout<@m, [ {}, {"tp"} ], partial(avg) = {"dp"}>>
  return
}

// -----

// The parameter operand must be the stored argument itself.
dist.mesh @m ["dp" = 2]
func.func @computed_param(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                          %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  %p = arith.negf %w : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>
  // expected-error @+1 {{'dist.optimizer_step' op parameter operand must be an argument of the function with a dist.param name}}
  dist.optimizer_step %p, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

// An argument without a dist.param name is not a parameter.
dist.mesh @m ["dp" = 2]
func.func @unnamed_param(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>,
                         %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  // expected-error @+1 {{'dist.optimizer_step' op parameter operand must be an argument of the function with a dist.param name}}
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op has dist.optimizer_step ops but no dist.optimizer dictionary}}
func.func @no_optimizer(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                        %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer must be a dictionary, not "adamw"}}
func.func @not_a_dictionary(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                            %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step, dist.optimizer = "adamw"} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer has no "kind"}}
func.func @no_kind(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                   %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer "kind" must be a string, not 1 : i64}}
func.func @kind_not_a_string(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                             %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = 1 : i64, lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer kind "sgd" is not supported (only "adamw")}}
func.func @unknown_kind(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                        %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "sgd", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer has no "eps" (f64)}}
func.func @missing_key(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                       %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer "lr" must be an f64, not 1.000000e-03 : f32}}
func.func @f32_lr(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                  %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f32, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer "beta2" = 1 is out of range [0, 1)}}
func.func @beta_out_of_range(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                             %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 1.0 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer "eps" = 0 is out of range (0, inf)}}
func.func @eps_zero(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                    %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 0.0 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer "stochastic_rounding" must be a bool, not 1 : i64}}
func.func @sr_not_bool(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                       %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = 1 : i64, seed = 0 : i64}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.optimizer "seed" must be an i64, not 7 : i32}}
func.func @seed_i32(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                    %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 7 : i32}} {
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

// Stochastic rounding rounds to bfloat16: an f32 parameter cannot use it.
dist.mesh @m ["dp" = 2]
func.func @sr_f32(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                  %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = true, seed = 0 : i64}} {
  // expected-error @+1 {{'dist.optimizer_step' op stochastic rounding rounds the update to bfloat16, but "w" is 'f32'}}
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @twice(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                 %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  // expected-note @+1 {{first update here}}
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  // expected-error @+1 {{'dist.optimizer_step' op updates "w" a second time}}
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @no_layout(%w: tensor<8xf32> {dist.param = "w"},
                     %g: tensor<8xf32>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  // The rank-local form (no layouts at all) cannot be lowered.
  // expected-error @+1 {{'dist.optimizer_step' op parameter "w" has no layout; run dist-propagate-layouts first}}
  dist.optimizer_step %w, %g : tensor<8xf32>, tensor<8xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @grad_no_layout(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                          %g: tensor<8xf32>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  // A layout on one of the two only is the verifier's error.
  // expected-error @+1 {{'dist.optimizer_step' op operand #1 has no layout but an earlier value has one; use layouts on every value (global form) or on none (rank-local form)}}
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @not_a_train_step(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                            %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>) {
  // expected-error @+1 {{'dist.optimizer_step' op is outside a dist.train_step function; the hyper-parameters come from its dist.optimizer}}
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
  return
}

// -----

// Updates must sit in the function's body, where the step's end is.
dist.mesh @m ["dp" = 2]
func.func @nested(%w: tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>> {dist.param = "w"},
                  %g: tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>)
    attributes {dist.train_step,
                dist.optimizer = {kind = "adamw", lr = 1.0e-3 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                                  eps = 1.0e-8 : f64, weight_decay = 0.0 : f64,
                                  stochastic_rounding = false, seed = 0 : i64}} {
  %t = tensor.generate {
  ^bb0(%i: index):
    // expected-error @+1 {{'dist.optimizer_step' op updating "w" must be at the top level of the dist.train_step function}}
    dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [ {"dp"} ]>>, tensor<8xf32, #dist.layout<@m, [ {} ], partial(avg) = {"dp"}>>
    %z = arith.constant 0.0 : f32
    tensor.yield %z : f32
  } : tensor<2xf32>
  return
}
