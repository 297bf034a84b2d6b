//===- Trainer.h - What meshplan-train's runs share -----------------------===//
//
// The pieces both runs of meshplan-train use: the distributed one (the
// runtime executes the plan; callbacks run the model, Train.cpp) and the
// single-process reference (the whole global batch in one process,
// Reference.cpp). Sharing them is what makes the comparison meaningful:
// the same flags, model configuration, initial values, data slices and
// float8/bf16 emulation.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_TRAINER_H
#define MESHPLAN_TRAINER_TRAINER_H

#include "Data.h"
#include "model/Llama.h"

#include "meshplan/Frontend/Spec.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Plan/Template.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshplan::trainer {

struct TrainFlags {
  std::string spec;
  std::string model; ///< replaces the spec's "model" when set
  std::string data;  ///< text file or directory; default: the repo's docs/
  int64_t steps = 100;
  int64_t batch = 4;   ///< sequences per data-parallel rank and microbatch
  int64_t seqLen = 64; ///< tokens per sequence
  uint64_t seed = 0;   ///< initial weights and data order
  bool reference = false;
  /// --reference without TP: the model's TP-split sums in one sgemm (the
  /// ranks' fp32 additions in another order).
  bool plainReference = false;
  /// Replace the model's gradients by a deterministic function of (tensor,
  /// global index, step): the reduced gradient is then the same in every
  /// layout, which isolates the optimizer (stochastic rounding).
  bool syntheticGrads = false;
  /// Stop after this step, keep the shards in memory, continue in a fresh
  /// session (-1: no).
  int64_t resumeAfter = -1;
  std::string saveParams; ///< directory for the final parameters
  /// A checkpoint to start from (any layout of the same model): the run
  /// continues at its step + 1.
  std::string loadCheckpoint;
  /// Where to save a checkpoint after the last step.
  std::string saveCheckpoint;
  /// Also save it after every step divisible by this (0: only at the end):
  /// a job stopped mid-run resumes from the last one with
  /// --load-checkpoint.
  int64_t checkpointEvery = 0;
  int64_t logEvery = 1;
  /// Measure this machine's collective latency and bandwidth at start and
  /// print the plan's cost model with them beside the measured step.
  bool costModel = false;
  /// Run the plan through the device executor on the host device
  /// (docs/cuda.md, "Executor on devices"); the model stays on the CPU.
  bool hostDevice = false;
  /// --device cuda: the plan and the model on this rank's GPU (docs/cuda.md,
  /// "The trainer on a GPU").
  bool cuda = false;
  /// On a device (--device cuda, --host-device): time every instruction on
  /// the device as well (SessionOptions::deviceTiming) and print the
  /// executor's host time per instruction beside the device time it
  /// launched.
  bool deviceTiming = false;
  /// --trace DIR --trace-steps A:B: record what steps A..B did, per
  /// instruction, into DIR/rank<R>.json (SessionOptions::trace;
  /// `meshplan trace --merge DIR` shows them). Default steps: 2..6 (the
  /// first step creates the communicators), within --steps.
  std::string traceDir;
  std::optional<std::pair<int64_t, int64_t>> traceSteps;
  /// --dtype-cast, --optimizer-state keep|reset: how --load-checkpoint
  /// loads (ckpt::LoadOptions).
  bool dtypeCast = false;
  std::string optimizerState = "keep";
  /// --metrics FILE: one JSON line per step (Metrics.h).
  std::string metrics;
};

/// The mesh axes by their role in the spec.
struct AxisRoles {
  std::vector<std::string> replicate, shard, extra; ///< data-parallel, in order
  std::string tp;                                   ///< "" without TP
  std::string pp; ///< the pipeline_parallel axis, "" without one
  int64_t replicas = 1, shards = 1, extras = 1; ///< products of sizes
  int64_t dataParallel() const { return replicas * shards * extras; }
};

/// A spec loaded and planned in-process.
/// The spec planned (pipeline::planSpec: the templates, as `meshplan plan
/// --all` plans them, every pp coordinate's under a pipeline) and what the
/// trainer derives from it.
struct Planned : pipeline::PlannedSpec {
  LlamaConfig config;
  AxisRoles roles;
  ModelOptions modelOptions;
  int64_t microbatches = 1;
};

/// MESHPLAN_TEST_NAN_GRAD_STEP (0 when unset): the step whose embedding
/// gradient the trainer and the reference poison with a NaN.
int64_t nanGradStepForTests();

/// Loads the spec (with --model), checks that meshplan-train can train it
/// (the Llama 3 architecture, torchtitan's TP plan, every mesh axis with a
/// role) and runs the planner.
Result<Planned> planSpec(const TrainFlags &flags, int64_t tokensPerMicrobatch);

/// The rank's index among the data-parallel ranks: its coordinates on the
/// replicate, then shard, then extra axes, row-major.
Result<int64_t> dataParallelIndex(const Planned &planned, int64_t rank);

/// The plans of `rank` and, under a pipeline, of the ranks that differ from
/// it only in the pp coordinate (the same data-parallel and TP coordinates:
/// together they hold every stage), `rank`'s first.
Result<std::vector<plan::Plan>> stagePlansOf(const Planned &planned,
                                             int64_t rank);

/// The buffer each parameter's compute callbacks read (gathered, or the
/// shard itself), by tensor name, over the plans given.
std::map<std::string, const plan::Buffer *>
computeInputs(const std::vector<plan::Plan> &plans);
/// This rank's share of the TP-split dimensions, from the boxes of what the
/// callbacks of its plans (stagePlansOf) read: whole heads, every layer
/// split alike, the embedding and the output split alike. (The plan's boxes
/// come from core; nothing here re-derives a split.)
Result<TpShard> tpShardOf(const std::vector<plan::Plan> &plans,
                          const LlamaConfig &config);

/// Initial value of element `g` of a parameter (torchtitan's Llama init:
/// embedding N(0, 1), output N(0, dim^-1/2), linears N(0, 0.02) with wo, w2
/// and w3 scaled by 1/sqrt(2 (layer + 1)), norms 1; normals truncated at two
/// standard deviations), a pure function of (seed, name, g).
float initialValue(uint64_t seed, const std::string &tensor, int64_t g,
                   const std::vector<int64_t> &shape);

/// --synthetic-grads: a small dyadic number, exact in any sum the plans do.
float syntheticGrad(const std::string &tensor, int64_t g, int64_t step);

/// Where a parameter sits in the model.
struct ParamSite {
  enum Segment { Embedding, Block, FinalNorm, Output } segment;
  int64_t layer = -1;
  std::string leaf; ///< in a block: "attention.wq", "ffn_norm", ...
};
Result<ParamSite> siteOf(const std::string &tensor);

/// Layer `layer`'s nine weights (or gradients), by tensor name: `get` maps
/// "layers.<layer>.attention.wq.weight" etc. to a buffer.
BlockWeights
blockWeights(int64_t layer,
             const std::function<const float *(const std::string &)> &get);
BlockGrads blockGrads(int64_t layer,
                      const std::function<float *(const std::string &)> &get);

/// What the compute callbacks see of a parameter whose plan casts `dtype`
/// (bf16; float8 with the whole tensor's amax scale): values applied to a
/// whole fp32 master tensor, in place.
void emulateCast(std::vector<float> &values, plan::DType seen,
                 const std::optional<plan::Fp8Scale> &scale);

/// Parameter dumps: DIR/rank<R>.bin, each a list of boxes of fp32 values.
struct DumpBox {
  std::string tensor;
  bool bf16 = false;
  std::vector<int64_t> globalShape, offset, localShape;
  std::vector<float> values;
};
Result<void> writeDump(const std::string &dir, int64_t rank,
                       const std::vector<DumpBox> &boxes);
/// meshplan-train --compare A B: assembles both dumps into whole tensors
/// (checking that every element is covered and replicas agree) and prints
/// the largest relative difference per tensor. Returns the exit code: 0
/// when every difference is <= rtol.
int compareDumps(const std::string &a, const std::string &b, double rtol);

/// The single-process reference run (Reference.cpp).
int runReference(const TrainFlags &flags, const Planned &planned,
                 const TextData &data);

[[noreturn]] void fatal(const std::string &message);

} // namespace meshplan::trainer

#endif // MESHPLAN_TRAINER_TRAINER_H
