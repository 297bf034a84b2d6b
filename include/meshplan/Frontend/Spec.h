//===- Spec.h - The parallelism spec: what layout the user wants ----------===//
//
// A spec states *what* parallelism to use for one model: an N-D device mesh
// with named axes, which axes replicate and which shard the parameters (data
// parallel: DDP / FSDP / HSDP), which axis splits which modules (tensor
// parallel, by module-name pattern), which axes are left to other uses
// (extra axes), which axis runs a pipeline of model stages (pipeline
// parallel), and the numerics (mixed precision, float8 all-gather, the
// optimizer, gradient accumulation). The planner derives *how* from it.
//
// Reading a spec has two stages, so that errors come as early as possible:
//   parseSpec    the document alone: JSON syntax, keys, types, values, the
//                mesh, and how the sections use its axes;
//   resolveSpec  against the model: tensor-parallel patterns match modules of
//                the right kind and sizes divide heads and weight dims; float8
//                selects linear modules only; the pipeline's stages cut the
//                model into contiguous runs of whole blocks.
// Every error starts with the JSON pointer of the offending value (or "line
// L, column C" for malformed JSON) and says what was expected; see
// docs/spec.md for the format and docs/spec.schema.json for its schema.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_FRONTEND_SPEC_H
#define MESHPLAN_FRONTEND_SPEC_H

#include "meshplan/Core/GradNorm.h"
#include "meshplan/Core/LrSchedule.h"
#include "meshplan/Core/Mesh.h"
#include "meshplan/Core/PipelineSchedule.h"
#include "meshplan/Core/Result.h"
#include "meshplan/Frontend/Model.h"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::frontend {

/// torch's ParallelStyles: ColwiseParallel shards a linear's output features
/// (weight dim 0) or an embedding's features (dim 1); RowwiseParallel a
/// linear's input features (dim 1) or an embedding's vocabulary (dim 0);
/// SequenceParallel keeps a norm's weight replicated and shards its
/// activations along the sequence.
enum class TPStyle { Colwise, Rowwise, SequenceParallel };
inline constexpr std::array<std::string_view, 3> kTPStyleNames = {
    "colwise", "rowwise", "sequence_parallel"};
std::string_view tpStyleName(TPStyle style);

enum class Float8Scaling { Tensorwise };
inline constexpr std::array<std::string_view, 1> kFloat8ScalingNames = {
    "tensorwise"};

enum class OptimizerKind { AdamW };
inline constexpr std::array<std::string_view, 1> kOptimizerNames = {"adamw"};

/// Dtypes each dtype-valued key accepts.
inline constexpr std::array<std::string_view, 3> kComputeDTypeNames = {
    "float32", "bfloat16", "float16"};
inline constexpr std::array<std::string_view, 2> kOptimizerDTypeNames = {
    "float32", "bfloat16"};

struct MeshSpec {
  std::vector<MeshAxis> axes; ///< `managed` set from "managed_axes"
  std::optional<std::vector<int64_t>> deviceOrder;
};

/// When a unit's gathered parameters are freed after its forward (and
/// gathered again for its backward), as torchtitan's
/// `reshard_after_forward` policy: "default" reshards every unit except the
/// last one in forward order (torchtitan's [norm, output] unit, whose
/// backward follows its forward at once), "always" every unit, "never" none.
/// The root unit (what no other unit holds) is never resharded, as FSDP2
/// keeps the root's parameters. The JSON booleans true / false read as
/// "always" / "never".
enum class ReshardPolicy { Default, Always, Never };
inline constexpr std::array<std::string_view, 3> kReshardPolicyNames = {
    "default", "always", "never"};
std::string_view reshardPolicyName(ReshardPolicy policy);

/// How parameters are grouped into FSDP units ("data_parallel.units").
enum class UnitGrouping {
  /// torchtitan's apply_fsdp: tok_embeddings, each transformer block,
  /// [norm, output] together, the root for what is left.
  Torchtitan,
  /// Each top-level module, and each child of a top-level container of
  /// containers ("layers.3").
  PerModule,
  /// DataParallelSpec::unitPatterns.
  Explicit,
};
inline constexpr std::array<std::string_view, 2> kUnitGroupingNames = {
    "torchtitan", "per_module"};

struct DataParallelSpec {
  std::vector<std::string> replicateAxes; ///< DDP / HSDP replicas
  std::vector<std::string> shardAxes;     ///< FSDP: one level over them all
  ReshardPolicy reshardAfterForward = ReshardPolicy::Default;
  UnitGrouping units = UnitGrouping::Torchtitan;
  /// Explicit units: the patterns of each unit, in the spec's order.
  std::vector<std::vector<std::string>> unitPatterns;
};

struct TPRule {
  std::string pattern;
  TPStyle style = TPStyle::Colwise;
};

struct TensorParallelSpec {
  std::string axis;
  std::vector<TPRule> plan;
};

struct MixedPrecisionSpec {
  DType paramDtype = DType::Float32;  ///< compute / all-gather dtype
  DType reduceDtype = DType::Float32; ///< gradient reduction dtype
};

struct Float8Spec {
  bool enabled = true;
  bool allGather = false; ///< all-gather FSDP shards as float8
  /// Patterns selecting the modules to convert; empty: every linear module.
  std::vector<std::string> modules;
  /// Patterns of modules to keep in high precision (torchtitan's
  /// filter_fqns).
  std::vector<std::string> exclude;
  Float8Scaling scaling = Float8Scaling::Tensorwise;
  bool powerOf2Scales = false;
};

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::AdamW;
  double lr = 8e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weightDecay = 0.1;
  /// dtype of the parameters the optimizer updates (the master weights).
  DType paramDtype = DType::Float32;
  /// Round fp32 updates to bf16 stochastically (needs bfloat16 params).
  bool stochasticRounding = false;
  uint64_t seed = 0;
  /// "lr_schedule": torchtitan's lr_scheduler. `schedule.totalSteps` is
  /// the spec's "total_steps" when given (totalStepsGiven), else the
  /// caller's SpecOptions::totalSteps (the trainer's --steps).
  std::optional<LrSchedule> schedule;
  bool totalStepsGiven = false;
  /// "max_norm": clip the global gradient norm to this (> 0, finite).
  std::optional<double> maxNorm;
  GradNormType normType = GradNormType::L2; ///< "norm_type": 2 or "inf"
  /// "no_decay": patterns of parameters updated without weight decay.
  std::vector<std::string> noDecay;
};

/// When gradient accumulation reduces the gradients
/// ("gradient_accumulation.reduce"): FSDP2's default reduce-scatters after
/// every microbatch's backward and accumulates into the sharded gradient;
/// "last_microbatch" (FSDP2's set_requires_gradient_sync(False) until the
/// last one) keeps every unsharded gradient alive across microbatches and
/// reduces once.
enum class AccumulationReduce { EveryMicrobatch, LastMicrobatch };
inline constexpr std::array<std::string_view, 2> kAccumulationReduceNames = {
    "every_microbatch", "last_microbatch"};
std::string_view accumulationReduceName(AccumulationReduce mode);

/// Activation checkpointing ("activation_checkpointing"), as torchtitan's
/// `activation_checkpoint.mode`: it changes only the activation memory the
/// cost model estimates (and the recomputation it charges), not the plan's
/// collectives.
enum class ActivationCheckpointing { None, Full, Selective };
inline constexpr std::array<std::string_view, 3> kActivationCheckpointingNames =
    {"none", "full", "selective"};
std::string_view activationCheckpointingName(ActivationCheckpointing mode);

/// How the model is cut into pipeline stages ("pipeline_parallel.split").
enum class PipelineSplit {
  /// Balanced by parameter count, the embedding on the first stage and the
  /// final norm and output on the last (docs/spec.md).
  Auto,
  /// torchtitan's generate_llm_fqn_per_model_part with its default weights.
  Torchtitan,
  /// PipelineParallelSpec::stageModules.
  Explicit,
};
inline constexpr std::array<std::string_view, 2> kPipelineSplitNames = {
    "auto", "torchtitan"};
std::string_view pipelineSplitName(PipelineSplit split);

/// "pipeline_parallel.stages_per_rank" when the spec leaves it out.
int64_t defaultStagesPerRank(PipelineScheduleKind schedule);

/// "pipeline_parallel": the document's values, checked against the mesh and
/// core's schedule rules by parseSpec; the split is checked against the
/// model by resolveSpec (ResolvedPipeline).
struct PipelineParallelSpec {
  std::string axis;
  PipelineScheduleKind schedule = PipelineScheduleKind::OneFOneB;
  int64_t microbatches = 1;
  /// As written, or the schedule's default: 1 for the single-stage
  /// schedules (gpipe, 1f1b), 2 for the multi-stage ones
  /// (interleaved_1f1b, zbv), as torchtitan's pipeline_llm.
  int64_t stagesPerRank = 1;
  bool stagesPerRankGiven = false;
  PipelineSplit split = PipelineSplit::Auto;
  /// Explicit split: the module names of each stage, in the spec's order.
  std::vector<std::vector<std::string>> stageModules;
};

/// "batch": the global batch a spec was made for (`meshplan tune -o`
/// writes the one it tuned for). It states the work, not the layout: the
/// planner's cost model charges each data-parallel rank's microbatch
/// (batchPerMicrobatch), and `plan`/`explain` use it unless a flag gives
/// the work (docs/spec.md, "batch").
struct BatchSpec {
  int64_t globalTokens = 0;   ///< tokens per optimizer step, whole job
  int64_t sequenceLength = 0; ///< tokens per sequence
};

struct Spec {
  std::string description;
  /// A preset name or a path to a model JSON file (relative to the spec).
  std::string model;
  std::optional<int64_t> worldSize;
  MeshSpec mesh;
  DataParallelSpec dataParallel;
  std::optional<TensorParallelSpec> tensorParallel;
  std::vector<std::string> extraAxes;
  std::optional<PipelineParallelSpec> pipelineParallel; ///< absent: no PP
  MixedPrecisionSpec mixedPrecision;
  std::optional<Float8Spec> float8; ///< absent: no float8
  OptimizerSpec optimizer;
  int64_t gradientAccumulationSteps = 1;
  AccumulationReduce accumulationReduce = AccumulationReduce::EveryMicrobatch;
  ActivationCheckpointing activationCheckpointing =
      ActivationCheckpointing::None;
  std::optional<BatchSpec> batch; ///< absent: the spec states no batch
};

/// The batch split over the ranks that read different data (the product of
/// the data_parallel axes' sizes: replicate and shard; extra axes such as a
/// context-parallel one split sequences, not the batch) and the
/// microbatches of a step (the pipeline's, else gradient accumulation's).
struct MicrobatchShape {
  int64_t dataParallelRanks = 1;
  int64_t microbatches = 1;
  /// Tokens one data-parallel rank processes per microbatch:
  /// globalTokens / (dataParallelRanks x microbatches).
  int64_t tokensPerRank = 0;
};

/// How `globalTokens` split for `spec` (whose mesh and sections are
/// checked). An error (unlocated; the caller names the key or flag) when
/// they do not split into whole sequences of `sequenceLength` tokens per
/// data-parallel rank and microbatch.
Result<MicrobatchShape> batchPerMicrobatch(const Spec &spec,
                                           int64_t globalTokens,
                                           int64_t sequenceLength);

/// The work a caller asks the cost model to charge per microbatch (`meshplan
/// plan`'s and `explain`'s flags, meshplan.plan's keywords). Each unset
/// value falls back to the spec's "batch", else to 8192.
struct WorkRequest {
  std::optional<int64_t> tokensPerRank;     ///< per dp rank per microbatch
  std::optional<int64_t> globalBatchTokens; ///< per optimizer step, whole job
  std::optional<int64_t> sequenceLength;
  /// How the caller spells each input, so that its errors name it.
  std::string tokensPerRankName = "tokens_per_rank";
  std::string globalBatchTokensName = "global_batch_tokens";
  std::string sequenceLengthName = "seq_len";
};

/// What the cost model charges per microbatch.
struct MicrobatchWork {
  int64_t tokensPerRank = 0; ///< per data-parallel rank, before CP splits
  int64_t sequenceLength = 0;
};

/// The one rule for the work per microbatch: the request's tokens per rank,
/// else its global batch split by batchPerMicrobatch, else the spec's
/// "batch" split the same way, else 8192 tokens; the sequence length from
/// the request, else the spec's batch, else 8192. An error starts with the
/// name of the input at fault (a value under 1, both token counts given, a
/// batch that does not split into whole sequences).
Result<MicrobatchWork> microbatchWork(const Spec &spec,
                                      const WorkRequest &request);

struct SpecOptions {
  /// The world size the job runs with (e.g. from the command line); the mesh
  /// must have exactly this many devices. Checked as well as "world_size".
  std::optional<int64_t> worldSize;
  /// A model given by the caller (the torch driver describes a torch module)
  /// in place of the one the spec's "model" member names; "model" is then
  /// not read, and may name anything.
  std::shared_ptr<const Model> model;
  /// The run's optimizer steps (the trainer's --steps): the learning-rate
  /// schedule's length when the spec gives no "total_steps".
  std::optional<int64_t> totalSteps;
};

/// Parses a spec document and checks everything that does not need the
/// model (see file comment).
Result<Spec> parseSpec(std::string_view jsonText,
                       const SpecOptions &options = {});

/// The checks parseSpec makes across sections (the world size against the
/// mesh, the axes' roles, the pipeline's schedule rules, float8 all-gather
/// and dtype combinations, the learning-rate schedule, which it completes
/// with options.totalSteps), for a spec built in code rather than read from
/// a document (tune's candidates); errors are located as in a document
/// that writes gradient accumulation as an object.
Result<void> checkSpec(Spec &spec, const SpecOptions &options = {});

/// The core mesh of a parsed spec.
Result<Mesh> buildMesh(const MeshSpec &mesh);

/// What the spec does to one module.
struct ModuleAssignment {
  std::optional<TPStyle> tpStyle;
  int tpRule = -1; ///< index into tensor_parallel.plan
  bool float8 = false;
};

/// What the spec does to one parameter.
struct ParamAssignment {
  std::string name; ///< full name: "layers.0.attention.wq.weight"
  int module = -1;  ///< index into ResolvedSpec::modules
  std::vector<int64_t> shape;
  DType dtype = DType::Float32;
  int tpDim = -1; ///< dim split over the TP axis; -1 if none
  bool float8 = false;
  /// Selected by optimizer.no_decay: updated with weight decay 0.
  bool noDecay = false;
};

/// One FSDP unit: parameters gathered together and run by one forward and
/// one backward callback.
struct UnitAssignment {
  /// The callback's unit name: a module path ("tok_embeddings", "layers.3"),
  /// paths joined by "+" ("norm+output"), "root", or for explicit units the
  /// unit's patterns joined by "+".
  std::string name;
  std::vector<int> params; ///< indices into ResolvedSpec::params, ascending
  /// Freed after forward and gathered again for backward.
  bool reshardAfterForward = true;
  bool root = false; ///< torchtitan's root unit: what no other unit holds
};

/// One pipeline stage: a contiguous run, in forward order, of the model's
/// pieces (a top-level module, or one block of a top-level container of
/// blocks: "tok_embeddings", "layers.3", "norm").
struct PipelineStageAssignment {
  std::vector<std::string> modules; ///< the pieces, forward order
  std::vector<int> params; ///< indices into ResolvedSpec::params, ascending
  std::vector<std::string> paramNames; ///< their full names, same order
  int64_t numParameters = 0;           ///< parameter elements
  int64_t rank = 0; ///< the pp coordinate holding it (core's rankOfStage)
};

/// "pipeline_parallel" resolved: everything the planner needs, every rule
/// checked by core (checkPipelineScheduleConfig) or against the model.
struct ResolvedPipeline {
  std::string axis;
  int axisIndex = -1; ///< index of the pp axis in the mesh
  /// The schedule, pp size (config.ranks), microbatches, stages per rank.
  PipelineScheduleConfig config;
  StagePlacement placement = StagePlacement::Loop; ///< core's placementOf
  PipelineSplit split = PipelineSplit::Auto;
  /// By stage index; config.ranks * config.stagesPerRank of them.
  std::vector<PipelineStageAssignment> stages;
  /// Per pp coordinate, its stages in increasing order (core's
  /// stagesOfRank).
  std::vector<std::vector<int64_t>> stagesOfRank;
  /// Parallel to ResolvedSpec::params: the stage holding each parameter.
  std::vector<int> stageOfParam;

  int64_t numStages() const { return static_cast<int64_t>(stages.size()); }
};

/// A spec checked against its model.
struct ResolvedSpec {
  Spec spec;
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Mesh> mesh;
  std::vector<ModuleEntry> modules;          ///< forward order
  std::vector<ModuleAssignment> assignments; ///< parallel to modules
  std::vector<ParamAssignment> params;       ///< forward order
  /// FSDP units, in forward order of their first parameter; every parameter
  /// is in exactly one.
  std::vector<UnitAssignment> units;
  /// Pipeline parallelism; absent without "pipeline_parallel". Every FSDP
  /// unit but the root lies within one stage (the root is each stage's own,
  /// holding that stage's share, as torchtitan shards each model part).
  std::optional<ResolvedPipeline> pipeline;
};

/// Checks a parsed spec against its model (see file comment).
Result<ResolvedSpec> resolveSpec(Spec spec, std::shared_ptr<const Model> model);

/// A rank's place among the data-parallel ranks: the ranks that read
/// different data (the replicate, then shard, then extra axes, row-major over
/// their coordinates). The ranks of one TP group or of one pipeline share an
/// index.
struct DataParallelRank {
  int64_t index = 0; ///< in [0, size)
  int64_t size = 1;  ///< the number of data-parallel ranks
};
Result<DataParallelRank> dataParallelRankOf(const ResolvedSpec &spec,
                                            int64_t rank);

/// The model a spec names: a preset, or a model file whose path is relative
/// to `baseDir`. Errors about the name start with "/model"; errors inside a
/// model file start with that file's path.
Result<std::shared_ptr<const Model>> loadSpecModel(const Spec &spec,
                                                   const std::string &baseDir);

/// parseSpec + loadSpecModel + resolveSpec.
Result<ResolvedSpec> loadSpec(std::string_view jsonText,
                              const std::string &baseDir,
                              const SpecOptions &options = {});
/// Reads a spec file and loads it (model paths are relative to the file);
/// errors are prefixed with the file's path.
Result<ResolvedSpec> loadSpecFile(const std::string &path,
                                  const SpecOptions &options = {});

} // namespace meshplan::frontend

#endif // MESHPLAN_FRONTEND_SPEC_H
