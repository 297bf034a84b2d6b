//===- Template.h - One rank-independent program, one plan per rank -------===//
//
// The compiler produces ONE program for the whole mesh: communicators named by
// the root-mesh axes they vary along, buffers with a layout instead of a box,
// and instructions whose counts are the same on every rank (padded shapes).
// A ProgramTemplate holds that program; PreparedTemplate validates it once,
// resolves every name to an index and parses every axis ref once, so that
// instantiating the plan of one rank only asks core O(axes) questions per
// communicator (groupOf, splitKeyOf) and per buffer (shardOf) and copies the
// program. Nothing in the per-rank path depends on the world size except the
// member lists of the communicators themselves (and the mesh's device order,
// which every plan carries).
//
// Plain C++20; no exceptions (see Plan.h).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_TEMPLATE_H
#define MESHPLAN_PLAN_TEMPLATE_H

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/MeshView.h"
#include "meshplan/Plan/Plan.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshplan::plan {

/// Two coordinates of one axis (a pipeline's neighbouring pp ranks): each
/// rank at one of them pairs with the rank at the other, all other
/// coordinates equal; the member at coords[k] has key k. A template with
/// a pair serves only ranks at those coordinates (one template per pp
/// coordinate).
struct PairTemplate {
  std::string axis;
  int64_t coords[2] = {0, 1};

  bool operator==(const PairTemplate &) const = default;
};

/// A communicator of the whole mesh: every rank gets its own group along
/// `axes`, or its pair.
struct CommTemplate {
  std::string id;
  /// Root-mesh axis ref texts ("dp", "tp:(2)2"), major to minor; non-empty
  /// unless `pair` is set (then empty).
  std::vector<std::string> axes;
  std::optional<std::string> view;
  bool faultTolerant = false;
  /// Last, so that {id, axes, view, faultTolerant} still initializes.
  std::optional<PairTemplate> pair;
};

/// A buffer of the whole mesh: every rank gets the box `layout` gives it.
struct BufferTemplate {
  std::string id;
  BufferKind kind = BufferKind::Scratch;
  DType dtype = DType::Float32;
  std::vector<int64_t> globalShape;
  /// Core layout over the root mesh view (one entry per dim of globalShape;
  /// empty dims are replicated).
  Layout layout;
  /// Live for the whole step (parameter shards, optimizer state); it may not
  /// be freed.
  bool persistent = false;
  /// As Buffer::tensor, Buffer::tensorId and Buffer::scale.
  std::string tensor;
  std::optional<int64_t> tensorId;
  std::optional<Fp8Scale> scale;
};

/// The trainer's activation memory around one FSDP unit's compute, per
/// microbatch (CostModel.h, docs/memory.md): what the unit's forward keeps
/// until its backward, and what is alive only while it runs forward or
/// backward (the logits at the loss; a recomputed block).
struct UnitActivation {
  int64_t saved = 0;
  int64_t forwardTransient = 0;
  int64_t backwardTransient = 0;

  bool operator==(const UnitActivation &) const = default;
};

struct ProgramTemplate {
  PlanMesh mesh;
  std::vector<CommTemplate> comms;
  std::vector<BufferTemplate> buffers;
  std::vector<std::string> streams;
  /// The program of every rank; counts are rank independent (padded).
  /// Collectives name a CommTemplate id in `comm`.
  std::vector<Instruction> program;
  std::optional<OptimizerConfig> optimizer;
  /// With a grad_norm instruction: the root-mesh refs its all_reduce runs
  /// over (core's gradNormAxes). The template's grad_norm lists every
  /// gradient; instantiate keeps those the rank counts (core's
  /// countsInGradNorm), so each plan shows exactly what its rank adds.
  std::vector<std::string> gradNormAxes;
  /// Parallel to `program` (or empty: all 0): estimated FLOPs of compute and
  /// optimizer_update instructions, 0 for others; read by the cost model.
  std::vector<double> flops;
  /// Activation memory by unit (the `unit` of compute instructions). Empty:
  /// no activation estimate (no "activation" peak). A unit missing from a
  /// non-empty map has none.
  std::map<std::string, UnitActivation> activations;
};

/// A validated ProgramTemplate with everything rank-independent precomputed.
/// Immutable once prepared: instantiate() may be called concurrently.
class PreparedTemplate {
public:
  /// Validates the template: the mesh (as Mesh::create); stream, communicator,
  /// buffer and instruction ids non-empty and unique; communicator axes parse
  /// (parseAxisRefText) and are compatible; buffer shapes are valid and
  /// layouts verify against the root mesh view (verifyLayout); instructions
  /// name known streams, communicators, buffers and deps, and carry the
  /// fields their op needs (as validatePlan); no persistent buffer is freed;
  /// `flops` is empty or parallel to the program, finite and >= 0. Errors
  /// name the item: "communicator \"dp\": axis \"x\" is not in the mesh
  /// (axes: dp, tp)", "instruction \"fwd\": inputs: unknown buffer \"w2\"".
  static Result<PreparedTemplate> prepare(ProgramTemplate t);

  /// The plan of `rank` (an id of the mesh). Communicators come from core's
  /// groupOf/splitKeyOf over the template's axes (nominal members: managed
  /// axes count fully), buffers from core's shardOf; a communicator whose
  /// group is just this rank is still emitted. With `withEstimates`, fills
  /// peak_memory_bytes (see below) and bytes_per_step_per_comm (bytesSent of
  /// CostModel.h, summed per communicator; every communicator is listed).
  ///
  /// Peak memory: a walk over the program in order. Persistent buffers are
  /// live throughout. A non-persistent buffer becomes live at the first
  /// instruction that names it (inputs or outputs) and dies after a `free`
  /// that lists it in inputs; a later instruction naming it makes it live
  /// again (FSDP re-gathers into the same buffer for backward); a `free` of a
  /// buffer that is not live releases nothing. A buffer occupies
  /// product(local_shape) * dtype bytes. Each buffer kind present in the
  /// template gets the largest live bytes of that kind at any instruction;
  /// "total" is the largest sum over all kinds.
  ///
  /// Activations (when `activations` is non-empty: kind "activation", in
  /// the same walk): a forward compute of unit u adds u's saved bytes,
  /// which its backward compute of the same microbatch releases after it
  /// runs; forward and backward transients are live during that compute
  /// only. Microbatches follow one another, so one microbatch's activations
  /// are live at a time.
  ///
  /// With `verificationOnly`, the plan holds just what verifyPlans reads
  /// (communicators, streams, instructions without buffer lists and labels;
  /// no buffers, no estimates): a whole mesh of plans fits in memory.
  Result<Plan> instantiate(int64_t rank, bool withEstimates = true,
                           bool verificationOnly = false) const;

  const ProgramTemplate &get() const { return tmpl; }
  const Mesh &mesh() const { return *meshPtr; }
  const View &rootView() const { return *root; }
  /// `get().flops`, or zeros when the template gave none; parallel to the
  /// program of every instantiated plan.
  const std::vector<double> &flops() const { return flopsOrZero; }
  /// Every rank id of the mesh, ascending.
  std::vector<int64_t> ranks() const;

private:
  PreparedTemplate() = default;
  /// prepare()'s steps (Template.cpp).
  friend class TemplatePreparer;

  struct BufferEvent {
    int32_t position; ///< instruction index
    int32_t buffer;   ///< index into tmpl.buffers
    bool birth;       ///< live from `position` on, else dead after it
  };

  ProgramTemplate tmpl;
  std::shared_ptr<const Mesh> meshPtr;
  std::optional<View> root;
  std::vector<AxisRefList> commRefs; ///< parsed CommTemplate::axes
  AxisRefList gradNormRefs;          ///< parsed ProgramTemplate::gradNormAxes
  std::map<std::string, size_t, std::less<>> bufferIndex; ///< id -> index
  std::optional<int> pipelineAxis; ///< the mesh's pipeline axis, if any
  std::vector<int> pairAxis;       ///< per comm: the pair's axis index, or -1
  std::vector<std::string> layoutTexts; ///< formatLayout of each buffer
  std::vector<double> flopsOrZero;
  /// Liveness of non-persistent buffers, ordered by position (births before
  /// deaths at one position).
  std::vector<BufferEvent> events;
  /// Buffer kinds present, as indices into the "peak" categories.
  std::vector<BufferKind> kindsPresent;
  /// Activation changes at compute instructions, ordered by position:
  /// `enter` bytes are added at `position` (counted in its peak), `leave`
  /// bytes removed after it.
  struct ActivationEvent {
    int32_t position;
    int64_t enter;
    int64_t leave;
  };
  std::vector<ActivationEvent> activationEvents;
  bool hasActivations = false;
  /// bytes_per_step_per_comm: rank independent.
  std::map<std::string, int64_t> commBytes;
};

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_TEMPLATE_H
