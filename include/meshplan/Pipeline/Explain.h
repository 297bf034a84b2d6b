//===- Explain.h - What one rank's plan does, as data ---------------------===//
//
// `meshplan explain` describes one rank of a planned spec: the model, the
// mesh and the roles of its axes, the rank's communicators, its collectives
// per step with the bytes it sends, the FSDP units, its peak memory against
// the device's capacity, what float8 all-gather saves, under a pipeline the
// ranks of its pipeline laid out together, and the step under the cost
// model. explain() computes these facts once, as plain data (numbers,
// names, lists), so that the CLI's text and the Python binding's objects
// cannot disagree; the CLI only formats them, and explanationJson() is the
// same data as JSON (`meshplan explain --json`).
//
// layOutPipeline() is the joint layout of one pipeline's ranks that both
// `explain` and `trace` show (plan::simulateTogether).
//
// Errors are values. A rank outside the mesh is "rank R is not in the mesh
// (ranks 0..N-1)"; a rank's plan that instantiation refuses (an input limit
// such as a group of more than 2^20 listed members, docs/limits.md) is "the
// plan of rank R: ..."; anything else is a planner bug, reported as
// "internal error: ...".
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PIPELINE_EXPLAIN_H
#define MESHPLAN_PIPELINE_EXPLAIN_H

#include "meshplan/Core/LrSchedule.h"
#include "meshplan/Core/Mesh.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/CostModel.h"
#include "meshplan/Plan/Trace.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshplan::pipeline {

/// The ranks that run one pipeline with `rank`, by pp coordinate: its mesh
/// coordinates with each pp coordinate in turn. `planned` must have a
/// pipeline and `rank` must be in its mesh.
std::vector<int64_t> pipelinePeers(const PlannedSpec &planned, int64_t rank);

/// The plans of the ranks that run one pipeline with a rank, laid out
/// together under a cost model: a recv ends no earlier than its send on the
/// peer's plan, so waiting for an upstream stage is idle time.
struct PipelineLayout {
  std::vector<int64_t> ranks; ///< pipelinePeers: by pp coordinate
  std::vector<plan::Plan> plans;
  std::vector<plan::Schedule> schedules;
};
/// Errors: as explain's; a spec without a pipeline is an internal error.
Result<PipelineLayout> layOutPipeline(const PlannedSpec &planned, int64_t rank,
                                      const plan::CostModel &cost);

/// Everything `meshplan explain` states about one rank. Bytes are bytes,
/// times seconds, fractions in [0, 1]; dtypes, policies and kinds are the
/// spec's and the plan format's spellings.
struct Explanation {
  int64_t rank = 0;

  // The model and its FSDP units.
  std::string modelName;
  int64_t parameterCount = 0; ///< elements of every parameter
  int64_t tensorCount = 0;    ///< parameter tensors
  int64_t unitCount = 0;      ///< FSDP units
  /// How the units were formed: "torchtitan", "per_module" or "explicit"
  /// (the spec's data_parallel.units patterns).
  std::string unitGrouping;

  // The mesh.
  std::string mesh; ///< Mesh::str(): "ddp=2,fsdp=2,abcd=2"
  std::vector<MeshAxis> meshAxes;
  int64_t worldSize = 0;

  // The roles of the axes and the numerics.
  std::vector<std::string> replicateAxes, shardAxes, extraAxes;
  std::optional<std::string> tensorAxis; ///< absent without TP
  std::string reshardAfterForward;       ///< "always", "default", ...
  std::string paramDtype;   ///< the optimizer's (stored parameters)
  std::string computeDtype; ///< mixed_precision.param_dtype
  std::string reduceDtype;  ///< mixed_precision.reduce_dtype

  /// The rank's communicators, in the plan's order.
  struct Communicator {
    std::string id;
    std::vector<std::string> axes; ///< root-mesh axis refs it varies along
    std::vector<int64_t> ranks;    ///< every member, in key order
    int64_t color = 0;
    int64_t key = 0;
    bool faultTolerant = false;
  };
  std::vector<Communicator> communicators;

  /// The collectives of one step, summed per (communicator, op, dtype), in
  /// that order (ascending).
  struct CollectiveSummary {
    std::string communicator;
    std::string op;    ///< "all_gather", "reduce_scatter", ...
    std::string dtype; ///< the dtype on the wire
    int64_t calls = 0;
    int64_t elements = 0; ///< summed counts
    int64_t bytes = 0;    ///< bytes this rank sends (ring algorithms)
  };
  std::vector<CollectiveSummary> collectives;
  int64_t collectiveBytes = 0; ///< the sum of collectives' bytes

  /// One FSDP unit, in forward order, as this rank gathers it per step.
  struct Unit {
    std::string name;
    int64_t elements = 0;      ///< its parameters' elements (unsharded)
    int64_t gatheredBytes = 0; ///< brought in by its all-gathers
    int64_t allGathers = 0;
    bool reshardAfterForward = true; ///< else kept from forward to backward
    bool root = false;
    std::vector<std::string> params; ///< parameter names
  };
  std::vector<Unit> units;
  int64_t unitAllGathers = 0; ///< the sum of units' allGathers
  /// What torchtitan's [norm, output] unit saves: the all-gathers of the
  /// same spec with per-module units (norm and output apart). Only for a
  /// torchtitan grouping with a norm+output unit and no pipeline.
  struct PerModuleComparison {
    int64_t allGathers = 0;
    /// Whether norm+output stays gathered from its forward into its
    /// backward (the reshard policy), the other half of what it saves.
    bool normOutputKeptGathered = false;
  };
  std::optional<PerModuleComparison> perModule;

  /// Peak memory by kind (plan buffer kinds and "activation"), by kind
  /// name; the total apart.
  struct MemoryKind {
    std::string kind;
    int64_t bytes = 0;
  };
  std::vector<MemoryKind> peakMemory;
  std::optional<int64_t> peakMemoryTotal; ///< absent without estimates

  /// What the trainer's activation estimate (docs/memory.md) assumed;
  /// absent when no module keeps activations.
  struct Activations {
    int64_t tokensPerRank = 0; ///< per microbatch, after context parallelism
    /// Tokens per data-parallel rank per microbatch, before the split.
    int64_t tokensPerDataParallelRank = 0;
    std::string contextAxis; ///< "" without context parallelism
    int64_t contextSize = 1;
    int64_t blocks = 0;                  ///< transformer blocks
    std::string dtype;                   ///< the compute dtype
    std::string activationCheckpointing; ///< "none", "selective", "full"
  };
  std::optional<Activations> activations;

  /// The device's memory against the peak (docs/memory.md).
  struct Capacity {
    std::string device; ///< the cost model's preset name
    int64_t deviceMemoryBytes = 0;
    int64_t reservedBytes = 0;
    int64_t capacityBytes = 0; ///< deviceMemoryBytes less reservedBytes
    int64_t peakBytes = 0;     ///< peakMemoryTotal, 0 without it
    bool fits = true;          ///< peakBytes <= capacityBytes
    /// capacityBytes - peakBytes: negative when over capacity.
    int64_t headroomBytes = 0;
  };
  Capacity capacity;

  /// What float8 all-gather saves; absent unless the spec enables float8.
  struct Float8 {
    bool allGather = false; ///< the spec's float8.all_gather
    int64_t allGathers = 0; ///< all-gathers in a float8 dtype
    int64_t bytes = 0;      ///< what they send
    /// What they would send in the compute dtype.
    int64_t bytesInComputeDtype = 0;
  };
  std::optional<Float8> float8;

  /// The optimizer step (docs/trainer.md, "The optimizer step"): the rate
  /// schedule, the weight-decay groups and the gradient clipping as this
  /// rank runs them.
  struct OptimizerStep {
    double lr = 0; ///< the base rate
    std::optional<LrSchedule> schedule;
    /// (step, rate) at the first step, the last warmup step, the first and
    /// middle decay steps and the last step (those in the run, ascending).
    std::vector<std::pair<int64_t, double>> lrSamples;
    double weightDecay = 0;
    std::vector<std::string> noDecay; ///< this rank's parameters without
    std::optional<double> maxNorm;    ///< absent: no clipping
    std::string normType;             ///< "2" or "inf"
    /// The refs the partial norms are reduced over (core's gradNormAxes),
    /// and this rank's group along them ([] and [rank] for none).
    std::vector<std::string> normAxes;
    std::vector<int64_t> normRanks;
    int64_t gradients = 0;      ///< the gradients this rank clips
    int64_t countedTensors = 0; ///< of which it counts in the norm
    int64_t countedElements = 0;
  };
  std::optional<OptimizerStep> optimizer;

  /// Under pipeline_parallel: the ranks of this rank's pipeline laid out
  /// together (layOutPipeline).
  struct PipelineStage {
    int64_t coordinate = 0; ///< pp coordinate
    int64_t rank = 0;
    std::vector<int64_t> stages;
    int64_t parameters = 0; ///< elements of its stages' parameters
    int64_t peakMemoryBytes = 0;
    int64_t activationBytes = 0;
    double computeBusySeconds = 0;
    double stepSeconds = 0;
    /// The compute stream idle over the pipeline's step (the slowest
    /// rank's: every rank's step ends with it).
    double idleFraction = 0;
  };
  struct Pipeline {
    std::string schedule; ///< "1f1b", "gpipe", "interleaved_1f1b", "zbv"
    std::string axis;
    int64_t size = 0; ///< pp degree
    int64_t microbatches = 0;
    int64_t stagesPerRank = 0;
    int64_t stageCount = 0;
    int64_t coordinate = 0; ///< this rank's pp coordinate
    std::vector<PipelineStage> ranks;
    /// idleFraction averaged over the ranks (exposed communication
    /// included).
    double bubbleFraction = 0;
    std::string textbookFormula; ///< "(p-1)/(m+p-1)", ...
    double textbookBubbleFraction = 0;
  };
  std::optional<Pipeline> pipeline;

  /// The step under the cost model (docs/plan-format.md, "Cost model and
  /// trace"): the rank's own plan, or under a pipeline the pipeline's step
  /// with this rank's exposed communication. Absent when the rank's plan
  /// could not be laid out.
  struct Step {
    double seconds = 0;
    double exposedCommunicationSeconds = 0;
    int64_t tokensPerRank = 0; ///< per microbatch
  };
  std::optional<Step> step;
};

/// Explains `rank` of `planned`, under `cost`
/// (the device, its capacity and the machine's figures). Compiles the spec
/// once more with per-module units for Explanation::perModule.
Result<Explanation> explain(const PlannedSpec &planned, int64_t rank,
                            const plan::CostModel &cost);

/// The explanation as a JSON object with snake_case keys (nlohmann::json
/// sorts them): rank; model {name, parameters, tensors, units, unit_grouping};
/// mesh {text, axes [{name, size, managed}], world_size}; roles
/// {replicate_axes, shard_axes, tensor_axis (null without TP), extra_axes,
/// reshard_after_forward, param_dtype, compute_dtype, reduce_dtype};
/// communicators [{id, axes, ranks, color, key, fault_tolerant}];
/// collectives {rows [{communicator, op, dtype, calls, elements, bytes}],
/// total_bytes}; fsdp_units {units [{name, elements, gathered_bytes,
/// all_gathers, reshard_after_forward, root, params}], all_gathers,
/// per_module (null or {all_gathers, norm_output_kept_gathered})}; memory
/// {peak_by_kind {kind: bytes}, peak_total_bytes (null without estimates),
/// activations (null or {tokens_per_rank, tokens_per_data_parallel_rank,
/// context_axis, context_size, blocks, dtype, activation_checkpointing}),
/// capacity {device, device_memory_bytes, reserved_bytes, capacity_bytes,
/// peak_bytes, fits, headroom_bytes}}; float8 (null or {all_gather,
/// all_gathers, bytes, bytes_in_compute_dtype}); pipeline (null or
/// {schedule, axis, size, microbatches, stages_per_rank, stage_count,
/// coordinate, ranks [{coordinate, rank, stages, parameters,
/// peak_memory_bytes, activation_bytes, compute_busy_seconds, step_seconds,
/// idle_fraction}], bubble_fraction, textbook_formula,
/// textbook_bubble_fraction}); step (null or {seconds,
/// exposed_communication_seconds, tokens_per_rank}).
nlohmann::json explanationJson(const Explanation &explanation);

} // namespace meshplan::pipeline

#endif // MESHPLAN_PIPELINE_EXPLAIN_H
