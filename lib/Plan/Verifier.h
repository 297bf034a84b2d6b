//===- Verifier.h - The cross-rank verifier's shared state (internal) ----===//
//
// Verify.cpp's Verifier, split by what it checks: Verify.cpp runs the checks
// in order (run, the mesh); VerifyCollectives.cpp matches collectives and
// transfers across ranks and finds deadlocks (stream cycles, the
// simulation); VerifyFacts.cpp checks what the step computes from the
// plans' PlanFacts (operands, buffers, parameters, reductions,
// microbatches, compute order, ownership, lifetimes); VerifyDataflow.cpp
// checks that collectives' layouts fit their ops (core's applyStep) and
// that each gradient accumulates each microbatch once. Internal to
// lib/Plan.
//
//===----------------------------------------------------------------------===//

#ifndef MESHPLAN_LIB_PLAN_VERIFIER_H
#define MESHPLAN_LIB_PLAN_VERIFIER_H

#include "meshplan/Plan/Verify.h"

#include "meshplan/Core/Text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

namespace meshplan::plan::verifier {

inline std::string quote(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

/// "[0,1,2,3]", shortened to "[0,1,2,...,4095] (4096 ranks)" when long.
inline std::string rankList(const std::vector<int64_t> &ranks) {
  if (ranks.size() <= 16)
    return "[" + joinInts(ranks) + "]";
  std::vector<int64_t> head(ranks.begin(), ranks.begin() + 8);
  return "[" + joinInts(head) + ",...," + std::to_string(ranks.back()) + "] (" +
         std::to_string(ranks.size()) + " ranks)";
}

inline std::string meshText(const PlanMesh &m) {
  std::string s;
  for (const MeshAxis &a : m.axes)
    s += (s.empty() ? "" : ",") + a.name + "=" + std::to_string(a.size) +
         (a.managed ? "(managed)" : "");
  if (m.deviceOrder)
    s += " order [" + joinInts(*m.deviceOrder) + "]";
  return s;
}

/// Per-rank index structures shared by all checks.
struct RankInfo {
  const Plan *plan = nullptr;
  int64_t base = 0; ///< global index of instruction 0
  /// Resolved deps (CSR).
  std::vector<int32_t> depStart, deps;
  std::vector<int32_t> streamPrev; ///< previous instruction on the stream
  std::vector<int32_t> stream;     ///< the stream's index in plan.streams
  /// send / recv: the previous send or recv on the same communicator, which
  /// must complete first (the runtime runs a communicator's operations one
  /// at a time, in program order); -1 otherwise.
  std::vector<int32_t> transferPrev;
  std::vector<int32_t> localComm; ///< collectives: local comm index, else -1
  std::vector<int32_t> instance;  ///< collectives: position in its sequence
  std::vector<std::vector<int32_t>> seqs; ///< per local comm: collectives
  std::vector<int32_t> globalComm;        ///< local comm -> global comm
  /// send / recv: the global index of the instruction it pairs with.
  std::vector<int64_t> partner;
  std::unordered_map<std::string_view, int32_t> commIds; ///< id -> local
};

/// One rank's "runs before" graph as successor lists (CSR): instruction
/// i's successors are out[outStart[i] .. outStart[i+1]) (the next
/// instruction on its stream, then the instructions that dep on it), and
/// indeg[i] counts its predecessors. Buffers are reused across calls.
struct Successors {
  std::vector<int32_t> outStart, out, indeg, fill;
  void build(const RankInfo &ri, int32_t n);
};

struct GlobalComm {
  const Communicator *def = nullptr;
  int64_t definer = -1;
  std::vector<int32_t> memberPlan;  ///< member key -> plan index
  std::vector<int32_t> memberLocal; ///< member key -> local comm index
};

inline std::string where(const Plan &p, int64_t index) {
  return "/program/" + std::to_string(index) + " " + quote(p.program[index].id);
}

inline std::string ordinal(int64_t k) { return "#" + std::to_string(k + 1); }

/// Hands out the positions of `order` to the threads of Verifier::perRank
/// and keeps the failure found at each.
class RankQueue {
public:
  explicit RankQueue(size_t n) : found(n) {}
  /// The next position to check; false when none is left, or none before
  /// the first failure found so far.
  bool next(size_t &k) {
    k = counter.fetch_add(1);
    return k < found.size() && k < firstBad.load();
  }
  void fail(size_t k, VerifyFailure f) {
    found[k] = std::move(f);
    size_t seen = firstBad.load();
    while (k < seen && !firstBad.compare_exchange_weak(seen, k)) {
    }
  }
  std::optional<VerifyFailure> first() {
    size_t k = firstBad.load();
    return k < found.size() ? std::move(found[k]) : std::nullopt;
  }

private:
  std::vector<std::optional<VerifyFailure>> found;
  std::atomic<size_t> counter{0}, firstBad{SIZE_MAX};
};

class Verifier {
public:
  Verifier(const std::vector<Plan> &plans, const PlanSetFacts &facts)
      : plans(plans), facts(facts) {}

  Result<VerifyResult> run();

private:
  Result<void> indexRanks();
  std::optional<VerifyFailure> checkMeshes();
  std::optional<VerifyFailure> buildCommunicators();
  std::optional<VerifyFailure> checkSequences();
  std::optional<VerifyFailure> matchPointToPoint();
  std::optional<VerifyFailure> checkStreamCycles();
  std::optional<VerifyFailure> simulate();
  /// The simulation's state over every rank's instructions (global index:
  /// RankInfo::base + i): predecessors not yet done, 0 waiting / 1 issued /
  /// 2 done, successor lists (CSR), and each instruction's plan.
  struct RunGraph {
    std::vector<int32_t> pending, planOf;
    std::vector<uint8_t> state;
    std::vector<int64_t> outStart, out;
  };
  void buildRunGraph(RunGraph &g) const;
  /// Runs every instruction that can run; returns how many completed.
  int64_t runSimulation(RunGraph &g) const;
  /// The wait cycle among the instructions that could not run.
  VerifyFailure deadlockReport(const RunGraph &g) const;
  // (d): what the step computes (docs/plan-format.md).
  std::optional<VerifyFailure> checkFacts();
  std::optional<VerifyFailure> checkOperands();
  std::optional<VerifyFailure> checkTransferOperands();
  std::optional<VerifyFailure> checkBuffers();
  std::optional<VerifyFailure> checkParameters();
  std::optional<VerifyFailure> checkParameterPieces();
  std::optional<VerifyFailure> checkParameterUpdates();
  /// checkParameterUpdates' state across ranks: per tensor (string index +
  /// 1) the first (plan, optimizer_update) that updates a piece of it; per
  /// buffer of the current plan, the update that updates it (-1: none).
  struct UpdateState {
    std::vector<std::pair<int32_t, int64_t>> recordOf;
    std::vector<int32_t> updatedBy;
  };
  std::optional<VerifyFailure> checkUpdateGroup(int32_t p, int64_t i, int32_t k,
                                                UpdateState &state);
  std::optional<VerifyFailure> compareUpdateRoles(int32_t p, int64_t i,
                                                  int32_t k, int32_t q,
                                                  int64_t qi) const;
  VerifyFailure optimizerDifference(int32_t p, int64_t i, int32_t tensor,
                                    int32_t q, int64_t qi) const;
  std::optional<VerifyFailure> checkReductions();
  std::optional<VerifyFailure> checkMicrobatches();
  std::optional<VerifyFailure> checkComputeOrder();
  std::optional<VerifyFailure> checkOwnership();
  std::optional<VerifyFailure> checkLifetimes();
  std::optional<VerifyFailure> checkLayoutFit();
  /// Runs `body` on several threads when the set is large (each thread's
  /// call has its own scratch; checks of one rank are independent of the
  /// others'): it takes positions of `order` from the queue and reports a
  /// rank's failure to it. Returns the failure of the first rank in order.
  std::optional<VerifyFailure>
  perRank(const std::function<void(RankQueue &)> &body) const;
  std::optional<VerifyFailure> checkAccumulation();
  std::string lostMicrobatch(int32_t p, int64_t at, int32_t grad,
                             int64_t missing) const;
  /// Why a collective's output b is not what its op makes of input a over
  /// `axes` (core's applyStep); empty when it is.
  std::string layoutFit(OpKind op, std::optional<ReduceOp> reduce,
                        const AxisRefList &axes, const BufferFacts &a,
                        const BufferFacts &b);

  // Facts of plan p (a plan index).
  const PlanFacts &factsOf(int32_t p) const { return facts.plans[p]; }
  const BufferFacts &bufferOf(int32_t p, int32_t local) const {
    return facts.buffers[facts.plans[p].buffers[local]];
  }
  std::string_view text(int32_t s) const {
    return s < 0 ? std::string_view() : std::string_view(facts.strings[s]);
  }
  /// `/program/3 "ag.w" ("all-gather w")`: where() with the label.
  std::string whereLabeled(int32_t p, int64_t i) const;
  /// `"w.full" (gathered bfloat16 [8,4] of "layers.0.weight", layout
  /// "[{}, {}]")`.
  std::string describeBuffer(const BufferFacts &b) const;
  /// The first field two buffer descriptions differ in, for both sides:
  /// {"tensor \"a\"", "tensor \"b\""}; empty when equal.
  std::pair<std::string, std::string>
  bufferDifference(const BufferFacts &a, const BufferFacts &b) const;
  VerifyFailure failureAt(FailureKind kind, int32_t p, int64_t i) const;
  /// The layout a buffer names, parsed once per distinct text.
  const Layout *layoutOf(int32_t text);
  /// A communicator's axes as core refs, parsed once per communicator.
  const AxisRefList *refsOf(int32_t globalComm);

  const std::vector<Plan> &plans;
  const PlanSetFacts &facts;
  std::shared_ptr<const Mesh> sharedMesh;
  std::unordered_map<int32_t, std::optional<Layout>> layouts;
  std::unordered_map<int32_t, std::optional<AxisRefList>> commRefs;
  std::optional<Mesh> mesh;
  std::vector<int32_t> planOfPosition; ///< mesh position -> plan index
  std::vector<int32_t> order;          ///< plan indices by rank id
  std::vector<RankInfo> info;          ///< per plan index
  std::vector<GlobalComm> comms;
  int64_t totalInstructions = 0, totalCollectives = 0;
  /// The step's microbatch count (checkMicrobatches; 0: no compute).
  int64_t stepMicrobatches = 0;
};

} // namespace meshplan::plan::verifier

#endif // MESHPLAN_LIB_PLAN_VERIFIER_H
