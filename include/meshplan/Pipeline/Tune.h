//===- Tune.h - Searching parallel layouts that fit the device -----------===//
//
// `meshplan tune`: given a model, a world size and a device, find the spec
// that trains fastest under the cost model while fitting the device.
//
// The search space (docs/tune.md): every factorization world = dp_replicate
// x dp_shard x cp x tp with tp dividing the node (ranks per node) and the
// model's heads, cp a power of two up to maxContextParallel; per mesh,
// reshard_after_forward ("default" or "never"), float8 all-gather (off/on),
// gradient accumulation (1, 2, 4 or 8 microbatches; "every_microbatch" or
// "last_microbatch"), and activation checkpointing (none, selective, full).
// The global batch is fixed (tokensPerStep), so every candidate does the
// same work: tokens per rank per microbatch = tokensPerStep / (dp_replicate
// x dp_shard x accumulation steps), split over cp inside the trainer.
//
// Two stages, both rank-independent:
//   1. screen: a closed-form estimate of every candidate's peak memory and
//      step time from the resolved spec (no compile); candidates predicted
//      not to fit, with a margin, are dropped;
//   2. confirm: the `confirm` best screened candidates are compiled for
//      real (pipeline::compile, one rank's plan, plan::simulate), and
//      ranked by the cost model's step time plus the trainer's tensor- and
//      context-parallel collectives (which run inside compute callbacks,
//      where the plan's timeline does not see them; docs/tune.md gives the
//      formula); those whose estimated peak exceeds the capacity are
//      dropped.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PIPELINE_TUNE_H
#define MESHPLAN_PIPELINE_TUNE_H

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
  /// Candidates compiled in stage 2 (the best screened first); 0: all of
  /// those the screen keeps.
  size_t confirm = 8;
  /// Called as stage 2 compiles candidates: (done, total).
  std::function<void(size_t, size_t)> progress;
};

struct TuneCandidate {
  int64_t replicate = 1, shard = 1, cp = 1, tp = 1;
  bool reshardAfterForward = true; ///< "default" (else "never")
  bool float8AllGather = false;
  int64_t accumulationSteps = 1;
  frontend::AccumulationReduce reduce =
      frontend::AccumulationReduce::EveryMicrobatch;
  frontend::ActivationCheckpointing checkpointing =
      frontend::ActivationCheckpointing::None;
  /// The spec, as `meshplan plan --spec` accepts it.
  std::string specJson;

  /// Stage 1.
  double screenStepSeconds = 0;
  int64_t screenPeakBytes = 0;
  /// Stage 2 (when `compiled`): the plan's estimated peak and the step time
  /// ranked by (cost model + trainer collectives).
  bool compiled = false;
  int64_t peakBytes = 0;
  double planStepSeconds = 0;    ///< plan::simulate's step
  double trainerCommSeconds = 0; ///< TP/CP collectives inside callbacks
  double stepSeconds = 0;        ///< their sum: what the ranking uses
  double exposedCommSeconds = 0;
  bool fits = false;

  /// "dp_replicate=2 dp_shard=64 tp=8 ..." for tables and messages.
  std::string describe() const;
};

struct TuneResult {
  /// Confirmed candidates that fit, fastest first.
  std::vector<TuneCandidate> ranked;
  /// Confirmed candidates over capacity.
  std::vector<TuneCandidate> overCapacity;
  size_t enumerated = 0; ///< candidates in the search space
  size_t infeasible = 0; ///< refused by the spec (e.g. TP vs heads)
  size_t screenedOut = 0;
  size_t compiled = 0;
  int64_t capacityBytes = 0;
};

/// Runs the search. Errors: a bad model or world size, or no candidate
/// fitting the device (the message names the smallest peak found).
Result<TuneResult> tune(const TuneOptions &options);

/// The spec JSON of one candidate (torchtitan's Llama TP plan, bf16
/// compute, fp32 reduction, AdamW).
std::string tuneSpecJson(const TuneOptions &options, const TuneCandidate &c);

} // namespace meshplan::pipeline

#endif // MESHPLAN_PIPELINE_TUNE_H
