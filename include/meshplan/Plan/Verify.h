//===- Verify.h - Static cross-rank verification of plan sets -------------===//
//
// Checks a complete set of per-rank plans (one per mesh rank) without running
// anything:
//   (a) every communicator is defined identically by all of its members, and
//       all members issue the same sequence of collectives on it (op, dtype,
//       count, reduce op, broadcast root);
//   (c) no rank has a wait cycle among its own instructions (stream order
//       plus deps, across streams);
//   (b) the ranks' programs run together to completion: streams run in
//       order, an instruction starts when its deps are done, each rank issues
//       its collectives on one communicator in program order, and a
//       collective completes when every member has issued it;
//   (d) every rank computes the same training step (docs/plan-format.md,
//       "What the step computes"): the members of a collective exchange the
//       same tensor in the same layout, a send delivers the buffer its recv
//       expects; every piece of a parameter has one tensor id, shape and
//       dtype and is updated once per rank, by the same optimizer record,
//       from its own gradient, reduced over exactly the axes its layout
//       leaves partial; every unit runs each microbatch once per phase,
//       and ranks that make the same callbacks make them in one order; an
//       instruction writes only what its op and phase may write; a buffer
//       is read only when written and not freed, and its accesses run in
//       program order (happens-before through stream order and deps).
// The checks run in that order and the first failing one is reported, with
// the rank, the instruction (JSON pointer, id and, in (d), label) and the
// communicator or tensor.
//
// Cost: O(total instructions + total deps + total collective memberships +
// total operands); nothing is quadratic in the number of ranks.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_VERIFY_H
#define MESHPLAN_PLAN_VERIFY_H

#include "meshplan/Plan/Plan.h"
#include "meshplan/Plan/PlanFacts.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace meshplan::plan {

enum class FailureKind {
  MeshMismatch, ///< plans disagree on the mesh
  CommMismatch, ///< a communicator defined differently by two ranks
  CommMissing,  ///< a member does not define a communicator
  Divergence,   ///< collective sequences differ on a communicator
  StreamCycle,  ///< wait cycle within one rank
  Deadlock,     ///< the ranks' programs cannot all finish
  /// The members of a collective (or a send and its recv) name different
  /// tensors, layouts or buffers for its operands.
  OperandMismatch,
  /// A parameter is described, updated or optimized differently by two
  /// ranks, or not exactly once on one.
  ParameterMismatch,
  /// A gradient reduction does not reduce exactly the partial axes of its
  /// input, or the optimizer reads a gradient still partial.
  Reduction,
  /// A unit's callback runs a microbatch twice, or not at all.
  Microbatch,
  /// An instruction writes a buffer its op and phase may not write.
  Ownership,
  /// An instruction reads a buffer after its free.
  Lifetime,
  /// A collective's output layout is not what its op makes of its input's
  /// (core's applyStep).
  LayoutFit,
  /// A gradient the optimizer reads holds a microbatch twice, or misses
  /// one.
  Accumulation
};
std::string_view failureKindName(FailureKind kind);

struct VerifyFailure {
  FailureKind kind = FailureKind::Divergence;
  int64_t rank = -1;       ///< the rank blamed
  int64_t index = -1;      ///< its instruction's index in "program" (or -1)
  std::string instruction; ///< that instruction's id (or "")
  std::string comm;        ///< the communicator involved (or "")
  std::string tensor;      ///< the tensor involved (or "")
  int64_t otherRank = -1;  ///< the rank compared against (or -1)
  /// The full report; the first line stands alone, a deadlock adds one line
  /// per step of the wait cycle.
  std::string message;
};

struct VerifyStats {
  int64_t ranks = 0;
  int64_t communicators = 0; ///< distinct communicators (by id)
  int64_t collectives = 0;   ///< collective instructions, summed over ranks
  int64_t instructions = 0;  ///< instructions, summed over ranks
};

struct VerifyResult {
  VerifyStats stats;
  std::optional<VerifyFailure> failure;
  bool ok() const { return !failure; }
};

/// What the members of a communicator must agree on for each collective they
/// issue on it (check (a)): op, dtype, count, reduce op and a broadcast's
/// root. The runtime compares the same fields across a communicator's
/// members when it creates the communicator (docs/runtime.md, "Plans the
/// verifier would reject"), so that the two never disagree on what matches.
bool sameCollective(const Instruction &a, const Instruction &b);
/// "all_gather bf16 count=4096" (and reduce=, root=, tag= where they apply).
std::string describeCollective(const Instruction &in);
/// The first field in which two collectives differ, as "count 1024" for `a`
/// and "count 2048" for `b`; empty when sameCollective.
std::pair<std::string, std::string>
firstCollectiveDifference(const Instruction &a, const Instruction &b);

/// Verifies a plan set. An Error means the set itself is unusable (empty,
/// two plans for one rank, a mesh rank without a plan); a verification
/// failure is reported in the result. Plans must each pass validatePlan and
/// be full (buffers, operands, callbacks and optimizer present): (d) reads
/// them through factsOf(plans).
Result<VerifyResult> verifyPlans(const std::vector<Plan> &plans);
/// The same with the facts of the full plans given apart (`facts.plans`
/// parallel to `plans`), so that `plans` may be verification-only copies.
Result<VerifyResult> verifyPlans(const std::vector<Plan> &plans,
                                 const PlanSetFacts &facts);

/// A plan set as `meshplan verify` holds it: verification-only plans
/// (verificationCopy) and the facts of the full plans they came from.
struct PlanSet {
  std::vector<Plan> plans;
  PlanSetFacts facts;
};

/// What verifyPlans reads of a plan without its facts: the mesh, rank,
/// communicators and streams, and the instructions without buffer lists,
/// labels and callbacks.
Plan verificationCopy(const Plan &full);

/// What readPlanDirectory keeps of each plan, once read and validated.
enum class PlanDetail {
  Full,
  /// What verifyPlans reads (as PreparedTemplate::instantiate's
  /// verificationOnly): no buffers, buffer lists, labels, callbacks,
  /// optimizer or estimates. The 1,024 plans of an 8B model take 270 MiB
  /// instead of 1.7 GiB, and reading them 40% less CPU time
  /// (docs/performance.md, section B). What `meshplan verify` reads.
  VerificationOnly
};

/// Reads the plans of a directory (layout in docs/plan-format.md: rankN.json
/// files, optionally listed by index.json), in parallel on up to `threads`
/// threads (0: hardware concurrency); each plan is validated in full
/// whatever `detail` keeps of it. Errors name the file by its path:
/// "DIR/rank3.json: /program/17/comm: unknown communicator \"c9\"" (the
/// first bad file in rank order). Implemented in PlanDirectory.cpp.
Result<std::vector<Plan>>
readPlanDirectory(const std::string &dir, unsigned threads = 0,
                  PlanDetail detail = PlanDetail::Full);
/// readPlanDirectory with PlanDetail::VerificationOnly, plus the facts of
/// the full plans, recorded by each reading thread as it reads: what
/// `meshplan verify DIR` verifies. `progress(done, total)`, when set, is
/// called after each file read, one call at a time, `done` increasing.
Result<PlanSet> readPlanSet(
    const std::string &dir, unsigned threads = 0,
    const std::function<void(int64_t done, int64_t total)> &progress = nullptr);

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_VERIFY_H
