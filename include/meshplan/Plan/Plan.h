//===- Plan.h - Versioned per-rank execution plans ------------------------===//
//
// A plan is what one rank executes for one training step: the mesh and its
// rank, the communicators it creates, the buffers it allocates, and a program
// of instructions on named streams with explicit dependencies. Plans are
// stored as versioned JSON (docs/plan-format.md); readPlan() validates
// everything a single plan can check on its own and names the JSON pointer of
// the offending value, writePlan() is its exact inverse.
//
// Plain C++20 on MeshplanCore and nlohmann/json. Plans are untrusted input and
// this library may be linked into -fno-exceptions code, so nothing here
// throws or catches: failures are Error values.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_PLAN_H
#define MESHPLAN_PLAN_PLAN_H

#include "meshplan/Core/Layout.h"
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
inline constexpr int kPlanVersion = 1;

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
  // Local instructions.
  Fp8Amax,
  Fp8Cast,
  Cast,
  Sum,
  Compute,
  OptimizerUpdate,
  Free,
  Wait
};
std::string_view opKindName(OpKind op);
std::optional<OpKind> parseOpKind(std::string_view name);
bool isCollective(OpKind op);
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

struct Buffer {
  std::string id;
  BufferKind kind = BufferKind::Scratch;
  DType dtype = DType::Float32;
  std::vector<int64_t> globalShape;
  std::vector<int64_t> localShape;
  std::vector<int64_t> offset;

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
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<std::string> deps;
  std::string label;

  bool operator==(const Instruction &) const = default;
};

struct Estimates {
  /// Bytes by category (buffer kinds, "total", ...); sorted by key.
  std::map<std::string, int64_t> peakMemoryBytes;
  /// Bytes this rank sends per step, by communicator id.
  std::map<std::string, int64_t> bytesPerStepPerComm;

  bool operator==(const Estimates &) const = default;
};

struct PlanMesh {
  std::vector<MeshAxis> axes;
  std::optional<std::vector<int64_t>> deviceOrder;

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
/// strings ("dp", "tp:(2)2"): (ordered group, color, key), from core.
struct DerivedGroup {
  std::vector<int64_t> ranks;
  int64_t color = 0;
  int64_t key = 0;
};
Result<DerivedGroup> deriveGroup(const Mesh &mesh,
                                 const std::vector<std::string> &axes,
                                 int64_t rank);
/// Parses "dp" or "dp:(2)4" against a mesh.
Result<AxisRef> parseAxisRefText(const Mesh &mesh, std::string_view text);

/// Reads a whole file (<= 1 GiB); the error names the path and the reason.
Result<std::string> readTextFile(const std::string &path);

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_PLAN_H
