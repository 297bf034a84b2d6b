// dist-lower-pipeline's errors: a template it cannot expand, and bad options.
// RUN: %meshplan-opt %s -split-input-file -verify-diagnostics --dist-lower-pipeline=pp-rank=0
// RUN: not %meshplan-opt %S/Inputs/pipeline-4-stages.mlir --dist-lower-pipeline 2>&1 | FileCheck %s --check-prefix=NORANK
// RUN: not %meshplan-opt %S/Inputs/pipeline-4-stages.mlir --dist-lower-pipeline=pp-rank=4 2>&1 | FileCheck %s --check-prefix=RANGE
// NORANK: error: 'func.func' op dist-lower-pipeline needs pp-rank=N with 0 <= N < 4 (the size of axis "pp"), got -1
// RANGE: error: 'func.func' op dist-lower-pipeline needs pp-rank=N with 0 <= N < 4 (the size of axis "pp"), got 4

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'func.func' op dist.pipeline refers to @m, which is not a dist.pipeline}}
func.func @step() attributes {dist.train_step, dist.pipeline = @m} {
  return
}

// -----

// expected-error @+1 {{'func.func' op dist.pipeline must name a dist.pipeline symbol}}
func.func @step() attributes {dist.train_step, dist.pipeline = "pipe"} {
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "gpipe" microbatches 2 stages_per_rank 1 activation tensor<4xf32>
func.func @step(%w: tensor<8xf32>) attributes {dist.train_step, dist.pipeline = @pipe} {
  // expected-error @+1 {{'dist.compute' op has no stage, but its function names pipeline @pipe}}
  dist.compute forward "a" (%w) : tensor<8xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "gpipe" microbatches 2 stages_per_rank 1 activation tensor<4xf32>
func.func @step(%w: tensor<8xf32>) attributes {dist.train_step, dist.pipeline = @pipe} {
  // Stage 3 would sit on pp rank 1; rank 0 reports it all the same.
  // expected-error @+1 {{'dist.compute' op stage 3 is outside the pipeline's 2 stages}}
  dist.compute forward "a" (%w) stage 3 : tensor<8xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "gpipe" microbatches 2 stages_per_rank 1 activation tensor<4xf32>
func.func @step(%w: tensor<8xf32>) attributes {dist.train_step, dist.pipeline = @pipe} {
  %g = dist.compute backward "b" (%w) stage 1 : tensor<8xf32> -> tensor<8xf32>
  // expected-error @+1 {{'dist.compute' op reads a value of stage 1's compute; stages exchange activations only through dist-lower-pipeline}}
  dist.compute forward "a" (%w, %g) stage 0 : tensor<8xf32>, tensor<8xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "gpipe" microbatches 2 stages_per_rank 1 activation tensor<4xf32>
func.func @step(%w: tensor<8xf32>) attributes {dist.train_step, dist.pipeline = @pipe} {
  %g = dist.compute backward "a" (%w) stage 0 : tensor<8xf32> -> tensor<8xf32>
  // expected-error @+1 {{'dist.compute' op reads a value computed from a compute's result; the template is one microbatch whose computes read only parameters and their gathers}}
  dist.compute forward "a" (%w, %g) stage 0 : tensor<8xf32>, tensor<8xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "gpipe" microbatches 2 stages_per_rank 1 activation tensor<4xf32>
func.func @step(%w: tensor<8xf32>) attributes {dist.train_step, dist.pipeline = @pipe} {
  // expected-error @+1 {{'dist.compute' op already has a microbatch; the template is one microbatch}}
  dist.compute forward "a" (%w) stage 0 {dist.microbatch = 1 : i64} : tensor<8xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "gpipe" microbatches 2 stages_per_rank 1 activation tensor<4xf32>
func.func @step(%w: tensor<8xf32>) attributes {dist.train_step, dist.pipeline = @pipe} {
  // expected-error @+1 {{'dist.compute' op already produces an activation; dist-lower-pipeline adds the stage's activations}}
  %a = dist.compute forward "a" (%w) stage 0 : tensor<8xf32> -> tensor<4xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "zbv" microbatches 2 stages_per_rank 2 activation tensor<4xf32>
func.func @step(%w: tensor<8xf32>) attributes {dist.train_step, dist.pipeline = @pipe} {
  // expected-error @+1 {{'dist.compute' op is already split (backward_weight); the template has forward and backward only}}
  %g = dist.compute backward_weight "a" (%w) stage 0 : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pipeline @pipe on @m axis "pp" schedule "gpipe" microbatches 2 stages_per_rank 1 activation tensor<4xf32>
// expected-error @+1 {{'func.func' op stage 0 (on pp rank 0) has no backward compute}}
func.func @step(%w: tensor<8xf32>) attributes {dist.train_step, dist.pipeline = @pipe} {
  dist.compute forward "a" (%w) stage 0 : tensor<8xf32>
  return
}
