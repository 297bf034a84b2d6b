// Every error of the verifiers of dist's discardable attributes
// (DistBase.td `discardableAttrs`, lib/Dialect/Dist/IR/DiscardableAttrs.cpp),
// one case per split. (The float8 and optimizer dictionaries' errors are in
// test/Transforms/dist-fuse-fp8-gather-error.mlir and
// dist-lower-optimizer-error.mlir; dist.layout's in
// dist-propagate-layouts-error.mlir; dist.pipeline's and
// dist.reshard_after_forward's on a function in dist-lower-pipeline-error.mlir
// and dist-schedule-error.mlir.)
// RUN: %meshplan-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'func.func' op has an unknown attribute dist.train_stepp (docs/dialect.md lists the dist attributes)}}
func.func @typo() attributes {dist.train_stepp} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.train_step must be a unit attribute, not true}}
func.func @train_step_not_unit() attributes {dist.train_step = true} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.gradient_accumulation_steps must be an i64 >= 1, not 0 : i64}}
func.func @no_microbatches() attributes {dist.train_step, dist.gradient_accumulation_steps = 0 : i64} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.gradient_accumulation_steps must be an i64 >= 1, not 2 : i32}}
func.func @steps_i32() attributes {dist.train_step, dist.gradient_accumulation_steps = 2 : i32} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.trainer_axes must be an array of mesh axis names, not ["tp", 1]}}
func.func @trainer_axes() attributes {dist.train_step, dist.trainer_axes = ["tp", 1]} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.trainer_axes must be an array of mesh axis names, not "tp"}}
func.func @trainer_axes_not_array() attributes {dist.train_step, dist.trainer_axes = "tp"} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.pp_rank must be an i64 >= 0, not -1 : i64}}
func.func @pp_rank() attributes {dist.train_step, dist.pp_rank = -1 : i64} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.pp_axis must be a non-empty string, not ""}}
func.func @pp_axis() attributes {dist.train_step, dist.pp_axis = ""} {
  return
}

// -----

// expected-error @+1 {{'builtin.module' op dist.rank must be an i64 >= 0, not "0"}}
module attributes {dist.rank = "0"} {
}

// -----

dist.mesh @m ["dp" = 2]
func.func @microbatch(%x: tensor<4xf32>) {
  // expected-error @+1 {{'dist.compute' op dist.microbatch must be an i64 >= 0, not -1 : i64}}
  dist.compute forward "l" (%x) {dist.microbatch = -1 : i64} : tensor<4xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @action(%x: tensor<4xf32>) {
  // expected-error @+1 {{'dist.compute' op dist.action must be a non-empty string, not 3 : i64}}
  dist.compute forward "l" (%x) {dist.action = 3} : tensor<4xf32>
  return
}

// -----

func.func @accumulate(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'arith.addf' op dist.accumulate must be a unit attribute, not false}}
  %s = arith.addf %a, %a {dist.accumulate = false} : tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

dist.mesh @m ["dp" = 2]
func.func @reshard_on_backward(%x: tensor<4xf32>) {
  // expected-error @+1 {{'dist.compute' op dist.reshard_after_forward must be a bool on a forward compute, not true}}
  dist.compute backward "l" (%x) {dist.reshard_after_forward = true} : tensor<4xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @reshard_not_bool(%x: tensor<4xf32>) {
  // expected-error @+1 {{'dist.compute' op dist.reshard_after_forward must be a bool on a forward compute, not 1 : i64}}
  dist.compute forward "l" (%x) {dist.reshard_after_forward = 1} : tensor<4xf32>
  return
}

// -----

func.func @id(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'arith.addf' op dist.id must be an i64 >= 0, not -3 : i64}}
  %s = arith.addf %a, %a {dist.id = -3, dist.stream = "compute"} : tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

func.func @stream(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'arith.addf' op dist.stream must be one of "compute", "comm.ag", "comm.rs", "p2p", not "comm.xx"}}
  %s = arith.addf %a, %a {dist.id = 0, dist.stream = "comm.xx"} : tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

func.func @after(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'arith.addf' op dist.after must be an array<i64> of ids >= 0, not array<i64: 1, -2>}}
  %s = arith.addf %a, %a {dist.after = array<i64: 1, -2>} : tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

func.func @after_not_dense(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'arith.addf' op dist.after must be an array<i64> of ids >= 0, not [1]}}
  %s = arith.addf %a, %a {dist.after = [1]} : tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

func.func @bucket(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'arith.addf' op dist.bucket must be an i64 >= 0, not 1.000000e+00 : f32}}
  %s = arith.addf %a, %a {dist.bucket = 1.0 : f32} : tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

// expected-error @+1 {{'func.func' op dist.param is an attribute of function arguments}}
func.func @param_on_op() attributes {dist.param = "w"} {
  return
}

// -----

// expected-error @+1 {{'func.func' op argument 0: dist.param must be a non-empty string, not ""}}
func.func @param_empty(%w: tensor<4xf32> {dist.param = ""}) {
  return
}

// -----

// expected-error @+1 {{'func.func' op argument 1: dist.state must be a non-empty string, not 0 : i64}}
func.func @state(%w: tensor<4xf32> {dist.param = "w"}, %m: tensor<4xf32> {dist.state = 0}) {
  return
}

// -----

// expected-error @+1 {{'func.func' op argument 0: dist.tensor_id must be an i64 >= 0, not -1 : i64}}
func.func @tensor_id(%w: tensor<4xf32> {dist.param = "w", dist.tensor_id = -1}) {
  return
}

// -----

// expected-error @+1 {{'func.func' op parameter #0: dist.float8 is a unit attribute}}
func.func @float8_mark(%w: tensor<4xf32> {dist.float8 = 1}) {
  return
}

// -----

// expected-error @+1 {{'func.func' op argument 0: dist.microbatch is not an attribute of function arguments}}
func.func @op_attr_on_arg(%w: tensor<4xf32> {dist.microbatch = 0}) {
  return
}

// -----

// expected-error @+1 {{'func.func' op result 0: dist.param is not an attribute of function results}}
func.func @on_result(%w: tensor<4xf32>) -> (tensor<4xf32> {dist.param = "w"}) {
  return %w : tensor<4xf32>
}
