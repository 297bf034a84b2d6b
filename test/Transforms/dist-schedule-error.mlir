// RUN: %meshplan-opt %s --dist-schedule -split-input-file -verify-diagnostics -allow-unregistered-dialect

// The schedule needs every collective's communicator.
!s = tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
!g = tensor<8x4xf32, #dist.layout<@m, [{}, {}]>>
dist.mesh @m ["dp" = 2]
func.func @no_comm(%w: !s {dist.param = "a.weight"}) attributes {dist.train_step} {
  // expected-error @+1 {{'dist.all_gather' op has no communicator; run dist-materialize-comms first}}
  %g = dist.all_gather %w dim 0 over {"dp"} : !s -> !g
  dist.compute forward "a" (%g) : !g
  return
}

// -----

!s = tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
!g = tensor<8x4xf32, #dist.layout<@m, [{}, {}]>>
dist.mesh @m ["dp" = 2]
func.func @redistribute(%w: !s {dist.param = "a.weight"}) attributes {dist.train_step} {
  // expected-error @+1 {{'dist.redistribute' op cannot be scheduled; run dist-lower-redistribute first}}
  %g = dist.redistribute %w : !s -> !g
  dist.compute forward "a" (%g) : !g
  return
}

// -----

!s = tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
!d = tensor<8x4xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2]
func.func @optimizer_step(%w: !s {dist.param = "a.weight"}) attributes {dist.train_step} {
  dist.compute forward "a" (%w) : !s
  %d = dist.compute backward "a" (%w) : !s -> !d
  // expected-error @+1 {{'dist.optimizer_step' op cannot be scheduled; run dist-lower-optimizer first}}
  dist.optimizer_step %w, %d : !s, !d
  return
}

// -----

// Microbatch 1's backward of "a" has no forward of microbatch 1 before it.
!s = tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
!d = tensor<8x4xf32, #dist.layout<@m, [{}, {}], partial(avg) = {"dp"}>>
dist.mesh @m ["dp" = 2]
func.func @backward_first(%w: !s {dist.param = "a.weight"}) attributes {dist.train_step} {
  dist.compute forward "a" (%w) {dist.microbatch = 0 : i64} : !s
  %d0 = dist.compute backward "a" (%w) {dist.microbatch = 0 : i64} : !s -> !d
  // expected-error @+1 {{'dist.compute' op is the backward of "a" (microbatch 1) but no forward of it comes before}}
  %d1 = dist.compute backward "a" (%w, %d0) {dist.microbatch = 1 : i64} : !s, !d -> !d
  dist.compute forward "a" (%w) {dist.microbatch = 1 : i64} : !s
  return
}

// -----

dist.mesh @m ["dp" = 2]
// expected-error @+1 {{'func.func' op dist.reshard_after_forward must be a bool, not 1 : i64}}
func.func @flag(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) attributes {dist.train_step, dist.reshard_after_forward = 1 : i64} {
  dist.compute forward "a" (%w) : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

// expected-error @+1 {{'func.func' op a dist.train_step function must have one block}}
func.func @blocks() attributes {dist.train_step} {
  "test.br"()[^next] : () -> ()
^next:
  return
}
