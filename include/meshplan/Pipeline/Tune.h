//===- Tune.h - Searching parallel layouts that fit the device -----------===//
//
// `meshplan tune`: given a model, a world size and a device, find the spec
// that trains fastest under the cost model while fitting the device.
//
// The search space (docs/tune.md): every factorization world = pp x
// dp_replicate x dp_shard x cp x tp with tp dividing the node (ranks per
// node) and the model's heads, cp a power of two up to maxContextParallel,
// pp up to maxPipelineParallel with every stage holding at least one block;
// per mesh, float8 all-gather (off/on) and activation checkpointing (none,
// selective, full); without a pipeline, reshard_after_forward ("default" or
// "never") and gradient accumulation (1, 2, 4 or 8 microbatches;
// "every_microbatch" or "last_microbatch"); with one (pp > 1), the schedule
// (gpipe, 1f1b, interleaved_1f1b with two stages per rank, zbv) and its
// microbatches (p, 2p, 4p, 8p, or one sequence each; those that cut a
// data-parallel rank's sequences evenly, at most maxPipelineMicrobatches,
// and that the schedule accepts). The global batch is fixed
// (tokensPerStep), so every candidate does the same work: tokens per rank
// per microbatch = tokensPerStep / (dp_replicate x dp_shard x microbatches),
// split over cp inside the trainer.
//
// Two stages, both rank-independent:
//   1. screen: a closed-form estimate of every candidate's peak memory and
//      step time from the resolved spec (no compile); under a pipeline, per
//      pp coordinate (its stages' parameters, its in-flight activations
//      from core's schedule simulation), the slowest coordinate's compute
//      stretched by the schedule's bubble, plus the point-to-point
//      transfers of the fill and drain; candidates predicted not to fit
//      (the worst coordinate), with a margin, are dropped;
//   2. confirm: the `confirm` best screened candidates are compiled for
//      real (pipeline::compile, one rank's plan, plan::simulate; under a
//      pipeline one template per pp coordinate and the plans of one
//      pipeline laid out together by plan::simulateTogether, as `meshplan
//      explain` does), and ranked by the cost model's step time plus the
//      trainer's tensor- and context-parallel collectives (which run inside
//      compute callbacks, where the plan's timeline does not see them;
//      docs/tune.md gives the formula); those whose estimated peak (the
//      largest over the pp coordinates) exceeds the capacity are dropped.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PIPELINE_TUNE_H
#define MESHPLAN_PIPELINE_TUNE_H

#include "meshplan/Core/PipelineSchedule.h"
#include "meshplan/Frontend/Spec.h"
#include "meshplan/Plan/CostModel.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace meshplan::pipeline {

struct TuneOptions {
  /// A preset name or a model JSON path (as a spec's "model"; relative
  /// paths resolve against `baseDir`).
  std::string model;
  std::string baseDir = ".";
  int64_t world = 0;
  /// Device and machine figures; the capacity is memoryCapacityBytes().
  plan::CostModel cost;
  /// Tokens per optimizer step over the whole job (the global batch); 0:
  /// one sequence per rank, world x sequenceLength (torchtitan's llama3
  /// configs: local batch 1 x seq 8192 per data-parallel rank of a mesh
  /// without TP).
  int64_t tokensPerStep = 0;
  int64_t sequenceLength = 8192;
  int64_t maxContextParallel = 8;
  /// Microbatch counts tried: the powers of two up to this.
  int64_t maxAccumulationSteps = 8;
  /// Pipeline-parallel degrees tried: 0 searches pp = 1 and every pp > 1
  /// up to maxPipelineParallel that divides the world and leaves each stage
  /// a block; 1 forbids pipelines; N > 1 tries only pp = N.
  int64_t pipelineParallel = 0;
  int64_t maxPipelineParallel = 16;
  /// The most pipeline microbatches tried (a pp coordinate's program, and
  /// its compile, grows with them).
  int64_t maxPipelineMicrobatches = 64;
  /// Candidates compiled in stage 2 (the best screened first); 0: all of
  /// those the screen keeps.
  size_t confirm = 8;
  /// Called as stage 2 compiles candidates: (done, total).
  std::function<void(size_t, size_t)> progress;
};

struct TuneCandidate {
  int64_t pp = 1, replicate = 1, shard = 1, cp = 1, tp = 1;
  /// "default" (else "never"); under a pipeline "never" (torchtitan's:
  /// the plans gather a stage's parameters once per step whatever it says).
  bool reshardAfterForward = true;
  bool float8AllGather = false;
  /// Without a pipeline: gradient accumulation steps. With one (pp > 1):
  /// 1, and the pipeline's microbatches are `microbatches`.
  int64_t accumulationSteps = 1;
  /// The pipeline (pp > 1): schedule, microbatches m, stages per rank v.
  PipelineScheduleKind schedule = PipelineScheduleKind::OneFOneB;
  int64_t microbatches = 1;
  int64_t stagesPerRank = 1;
  frontend::AccumulationReduce reduce =
      frontend::AccumulationReduce::EveryMicrobatch;
  frontend::ActivationCheckpointing checkpointing =
      frontend::ActivationCheckpointing::None;
  /// The spec, as `meshplan plan --spec` accepts it.
  std::string specJson;

  /// Stage 1.
  double screenStepSeconds = 0;
  int64_t screenPeakBytes = 0;
  /// Under a pipeline: the bubble of core's schedule simulation under the
  /// textbook costs (F = 1, B = 2 = I + W; simulatePipelineSchedule), which
  /// the screen and the trainer-collective term use; 0 without one.
  double bubbleFraction = 0;
  /// Stage 2 (when `compiled`): the plan's estimated peak and the step time
  /// ranked by (cost model + trainer collectives). Under a pipeline: the
  /// largest peak over the pp coordinates, the pipeline's step laid out
  /// together (the slowest coordinate's, bubble included), the largest
  /// exposed communication, the slowest coordinate's trainer collectives.
  bool compiled = false;
  int64_t peakBytes = 0;
  double planStepSeconds = 0;    ///< plan::simulate's step
  double trainerCommSeconds = 0; ///< TP/CP collectives inside callbacks
  double stepSeconds = 0;        ///< their sum: what the ranking uses
  double exposedCommSeconds = 0;
  bool fits = false;

  /// "dp_replicate=2 dp_shard=64 tp=8 ..." for tables and messages; under a
  /// pipeline starting "pp=8 1f1b/m16 ...".
  std::string describe() const;
};

struct TuneResult {
  /// Confirmed candidates that fit, fastest first.
  std::vector<TuneCandidate> ranked;
  /// Confirmed candidates over capacity.
  std::vector<TuneCandidate> overCapacity;
  size_t enumerated = 0; ///< candidates in the search space
  size_t pipelined = 0;  ///< of which with a pipeline (pp > 1)
  size_t infeasible = 0; ///< refused by the spec (e.g. TP vs heads)
  size_t screenedOut = 0;
  size_t compiled = 0;
  int64_t capacityBytes = 0;
};

/// Runs the search. Errors: a bad model or world size, or no candidate
/// fitting the device (the message names the smallest peak found).
Result<TuneResult> tune(const TuneOptions &options);

/// The spec JSON of one candidate (torchtitan's Llama TP plan, bf16
/// compute, fp32 reduction, AdamW; under a pipeline the mesh pp x
/// dp_replicate x dp_shard x cp x tp, torchtitan's order, and the split
/// "auto"; the batch tuned for in "batch").
std::string tuneSpecJson(const TuneOptions &options, const TuneCandidate &c);

/// The global batch tuned for: tokensPerStep, or its default.
int64_t globalTokensOf(const TuneOptions &options);

} // namespace meshplan::pipeline

#endif // MESHPLAN_PIPELINE_TUNE_H
