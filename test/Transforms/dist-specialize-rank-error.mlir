// RUN: %meshplan-opt %s --dist-specialize-rank=rank=3 -split-input-file -verify-diagnostics

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op rank 3 is not in the mesh (ranks 0..1)}}
  %0 = dist.all_gather %a dim 0 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 4]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.redistribute' op has no rank-local form; run dist-lower-redistribute first}}
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 4]
func.func @f(%a: tensor<8xf32>) {
  %b = arith.addf %a, %a : tensor<8xf32>
  // expected-error @+1 {{'dist.annotate' op has no rank-local form unless it annotates a function argument used only here}}
  %0 = dist.annotate %b : tensor<8xf32> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

// A group of 2^31 members would take 16 GiB to list (issue 12): refused
// before anything is allocated, at the op that needs it.
dist.mesh @m ["dp" = 2147483648]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op the group over [dp] has 2147483648 members; groups that are listed member by member have at most 2^20 (docs/limits.md)}}
  %0 = dist.all_gather %a dim 0 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}
