//===- Plan.h - Versioned per-rank execution plans ------------------------===//
//
// A plan is what one rank executes for one training step: the mesh and its
// rank, the communicators it creates, the buffers it allocates, and a program
// of instructions on named streams with explicit dependencies. Plans are
// stored as versioned JSON (docs/plan-format.md); readPlan() validates
// everything a single plan can check on its own and names the JSON pointer of
// the offending value, writePlan() is its exact inverse.
//
// Plain C++20 on MeshplanCore and MeshplanSupport (its tokenizer reads plans;
// nlohmann/json writes them). Plans are untrusted input and this library may
// be linked into -fno-exceptions code, so nothing here throws or catches:
// failures are Error values.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_PLAN_H
#define MESHPLAN_PLAN_PLAN_H

#include "meshplan/Core/GradNorm.h"
#include "meshplan/Core/Layout.h"
#include "meshplan/Core/LrSchedule.h"
#include "meshplan/Core/Mesh.h"
#include "meshplan/Core/Result.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::plan {

/// The "format" string of a plan document and the version this build
/// reads and writes.
inline constexpr std::string_view kPlanFormat = "meshplan.plan";
inline constexpr int kPlanVersion = 2;

//===----------------------------------------------------------------------===//
// Enumerations (closed sets; JSON spellings in the name tables)
//===----------------------------------------------------------------------===//

enum class DType {
  Float32,
  BFloat16,
  Float16,
  Float8E4M3,
  Float8E5M2,
  Float64,
  Int8,
  UInt8,
  Int32,
  Int64
};
std::string_view dtypeName(DType dtype);
std::optional<DType> parseDType(std::string_view name);
int64_t dtypeBytes(DType dtype);

enum class BufferKind {
  ParamShard,
  Gathered,
  Gradient,
  OptimizerState,
  Activation,
  Scratch
};
std::string_view bufferKindName(BufferKind kind);
std::optional<BufferKind> parseBufferKind(std::string_view name);

enum class OpKind {
  // Collectives (need "comm", "dtype", "count").
  AllGather,
  ReduceScatter,
  AllReduce,
  AllToAll,
  Permute,
  Broadcast,
  // Point to point (pipeline stages): on a communicator of exactly two
  // members, the k-th send of one member pairs with the k-th recv of the
  // other. Also need "comm", "dtype", "count", and "peer".
  Send,
  Recv,
  // Local instructions.
  Fp8Amax,
  Fp8Cast,
  Cast,
  Sum,
  Accumulate,
  Compute,
  OptimizerUpdate,
  Free,
  Wait,
  // Global gradient-norm clipping (docs/plan-format.md): the local part of
  // the norm of the gradients this rank counts, then (after the all_reduce
  // of its int64 buffer) the scale of every gradient by the clip
  // coefficient.
  GradNorm,
  ClipGradients
};
std::string_view opKindName(OpKind op);
std::optional<OpKind> parseOpKind(std::string_view name);
/// Instructions on a communicator (they need "comm", "dtype", "count"):
/// the collectives and the point-to-point send and recv.
bool isCollective(OpKind op);
bool isPointToPoint(OpKind op);
/// reduce_scatter and all_reduce carry a "reduce" op.
bool isReduction(OpKind op);

//===----------------------------------------------------------------------===//
// The plan
//===----------------------------------------------------------------------===//

struct Communicator {
  std::string id;
  /// Members in key order: ranks[k] has key k.
  std::vector<int64_t> ranks;
  int64_t color = 0;
  int64_t key = 0; ///< this rank's key (its index in `ranks`)
  /// Root-mesh axis refs the group varies along, major to minor ("dp",
  /// "tp:(2)2"); empty for a group not derived from axes.
  std::vector<std::string> axes;
  std::optional<std::string> view; ///< view expression it came from
  bool faultTolerant = false;

  bool operator==(const Communicator &) const = default;
};

/// Where a float8 tensor's tensorwise scale comes from: element `index` of
/// the (replicated, MAX-reduced) amax buffer `amax`; scale = max_finite /
/// max(amax, 1e-12), rounded down to a power of two when `powerOf2`
/// (docs/semantics.md, "Float8 all-gather").
struct Fp8Scale {
  std::string amax;
  int64_t index = 0;
  bool powerOf2 = false;

  bool operator==(const Fp8Scale &) const = default;
};

struct Buffer {
  std::string id;
  BufferKind kind = BufferKind::Scratch;
  DType dtype = DType::Float32;
  std::vector<int64_t> globalShape;
  std::vector<int64_t> localShape;
  std::vector<int64_t> offset;
  /// The core layout over the root mesh (formatLayout), e.g. "[{tp,dp},{}]".
  /// `offset`/`local_shape` are this rank's box under it; the runtime asks
  /// core for the other members' boxes when it packs a collective.
  std::string layout;
  /// The model tensor (parameter) whose value, gradient or state this buffer
  /// holds, e.g. "layers.0.attention.wq.weight"; empty for others (amaxes).
  std::string tensor;
  /// param_shard only: the parameter's index in the model (stable across
  /// layouts; keys stochastic rounding and checkpoints).
  std::optional<int64_t> tensorId;
  /// float8 buffers only: the scale their values are multiplied by.
  std::optional<Fp8Scale> scale;

  bool operator==(const Buffer &) const = default;
};

struct Instruction {
  std::string id;
  std::string stream;
  OpKind op = OpKind::Compute;
  std::string comm;           ///< collectives only
  std::optional<DType> dtype; ///< collectives and fp8 ops
  int64_t count = 0;          ///< collectives: elements (see plan-format.md)
  std::optional<ReduceOp> reduce; ///< reductions only
  int64_t root = 0;               ///< broadcast: the root's key
  int64_t peer = 0; ///< send / recv: the other member's key in `comm`
  /// send / recv: what is transferred ("F s1 mb3": the activation of stage
  /// 1's forward of microbatch 3). A send and the recv it pairs with carry
  /// the same tag, so the verifier proves that each message reaches the
  /// instruction meant for it, not just one of the right size.
  std::string tag;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<std::string> deps;
  std::string label;
  /// compute only: the trainer callback to call (phase "forward" or
  /// "backward", or zbv's split backward "backward_input" then
  /// "backward_weight"; the FSDP unit, the microbatch).
  std::string phase;
  std::string unit;
  int64_t microbatch = 0;

  bool operator==(const Instruction &) const = default;
};

struct Estimates {
  /// Bytes by category (buffer kinds, "total", ...); sorted by key.
  std::map<std::string, int64_t> peakMemoryBytes;
  /// Bytes this rank sends per step, by communicator id.
  std::map<std::string, int64_t> bytesPerStepPerComm;

  bool operator==(const Estimates &) const = default;
};

/// The optimizer every optimizer_update of the plan runs (AdamW, as
/// torch.optim.AdamW; with stochasticRounding the parameters are bfloat16 and
/// each update is rounded with bits keyed by (seed, step, tensor id, global
/// element index)).
struct OptimizerConfig {
  std::string name = "adamw";
  /// The base rate; with `schedule`, step s runs lr * lrFactor(schedule, s).
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.01;
  bool stochasticRounding = false;
  int64_t seed = 0;
  /// torchtitan's lr_scheduler; absent: the rate is `lr` at every step.
  std::optional<LrSchedule> schedule;
  /// Global gradient-norm clipping (the plan's grad_norm and clip_grad
  /// instructions run it); absent: no clipping.
  std::optional<double> maxNorm;
  GradNormType normType = GradNormType::L2;
  /// Parameters (`tensor` names) updated with weight decay 0: sorted,
  /// unique. The others use `weightDecay`.
  std::vector<std::string> noDecay;

  /// The weight decay the parameter `tensor` is updated with.
  double weightDecayOf(std::string_view tensor) const;
  /// The rate of optimizer step `step` (1-based).
  double lrAt(int64_t step) const;

  bool operator==(const OptimizerConfig &) const = default;
};

struct PlanMesh {
  std::vector<MeshAxis> axes;
  std::optional<std::vector<int64_t>> deviceOrder;
  /// The axis whose coordinates hold different pipeline stages
  /// (pipeline_parallel.axis): a tensor lives on one coordinate of it, so a
  /// layout that does not name it does not replicate over it.
  std::optional<std::string> pipelineAxis;

  bool operator==(const PlanMesh &o) const;
};

struct Plan {
  int version = kPlanVersion;
  PlanMesh mesh;
  int64_t rank = 0;
  std::vector<Communicator> communicators;
  std::vector<Buffer> buffers;
  std::vector<std::string> streams;
  std::vector<Instruction> program;
  /// Required when the program has an optimizer_update.
  std::optional<OptimizerConfig> optimizer;
  std::optional<Estimates> estimates;

  bool operator==(const Plan &) const = default;

  /// Index lookups (linear; readers and the verifier build their own maps).
  const Communicator *findCommunicator(std::string_view id) const;
};

/// Checks everything one plan can check alone (see plan-format.md). Errors
/// are "<JSON pointer>: <message>", e.g. "/program/17/comm: unknown
/// communicator \"c9\"".
Result<void> validatePlan(const Plan &plan);

/// Parses and validates a plan document. Errors as validatePlan, or "line L,
/// column C: ..." for malformed JSON.
Result<Plan> parsePlan(std::string_view text);
/// Reads a plan file; errors are prefixed with the file name as given.
Result<Plan> readPlanFile(const std::string &path);

/// Serializes a plan (parsePlan(writePlan(p)) == p; writePlan(parsePlan(t))
/// reproduces t when t was written by writePlan). The layout puts each
/// communicator, buffer and instruction on one line.
std::string writePlan(const Plan &plan);

/// The communicator split of `rank` over root-mesh axis refs written as
/// strings ("dp", "tp:(2)2"): (ordered group, color, key), from core. With
/// live members, over the live coordinates of managed axes only (a
/// fault-tolerant communicator of a later epoch).
struct DerivedGroup {
  std::vector<int64_t> ranks;
  int64_t color = 0;
  int64_t key = 0;
};
Result<DerivedGroup> deriveGroup(const Mesh &mesh,
                                 const std::vector<std::string> &axes,
                                 int64_t rank,
                                 const LiveMembers *live = nullptr);
/// Parses "dp" or "dp:(2)4" against a mesh.
Result<AxisRef> parseAxisRefText(const Mesh &mesh, std::string_view text);

/// Reads a whole file (<= 1 GiB); the error names the path and the reason.
Result<std::string> readTextFile(const std::string &path);

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_PLAN_H
