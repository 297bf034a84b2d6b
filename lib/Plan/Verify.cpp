//===- Verify.cpp - Cross-rank verification of plan sets ------------------===//
//
// verifyPlans (Verify.h): the checks in order (Verifier::run), the mesh and
// the ranks indexed; the checks themselves are in VerifyCollectives.cpp
// (matching, deadlock) and VerifyFacts.cpp (what the step computes).
//
//===----------------------------------------------------------------------===//

#include "Verifier.h"

#include "Parallel.h"

#include <thread>

namespace meshplan::plan {

std::string_view failureKindName(FailureKind kind) {
  switch (kind) {
  case FailureKind::MeshMismatch:
    return "mesh mismatch";
  case FailureKind::CommMismatch:
    return "communicator mismatch";
  case FailureKind::CommMissing:
    return "communicator missing";
  case FailureKind::Divergence:
    return "divergence";
  case FailureKind::StreamCycle:
    return "stream cycle";
  case FailureKind::Deadlock:
    return "deadlock";
  case FailureKind::OperandMismatch:
    return "operand mismatch";
  case FailureKind::ParameterMismatch:
    return "parameter mismatch";
  case FailureKind::Reduction:
    return "gradient reduction";
  case FailureKind::Microbatch:
    return "microbatch";
  case FailureKind::Ownership:
    return "ownership";
  case FailureKind::Lifetime:
    return "buffer lifetime";
  case FailureKind::LayoutFit:
    return "layout fit";
  case FailureKind::Accumulation:
    return "gradient accumulation";
  }
  return "failure";
}

bool sameCollective(const Instruction &a, const Instruction &b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count &&
         a.reduce == b.reduce &&
         (a.op != OpKind::Broadcast || a.root == b.root);
}

std::string describeCollective(const Instruction &in) {
  std::string s(opKindName(in.op));
  if (in.dtype)
    s += " " + std::string(dtypeName(*in.dtype));
  s += " count=" + std::to_string(in.count);
  if (in.reduce)
    s += " reduce=" + std::string(reduceOpName(*in.reduce));
  if (in.op == OpKind::Broadcast)
    s += " root=" + std::to_string(in.root);
  if (isPointToPoint(in.op))
    s += " tag=\"" + in.tag + "\"";
  return s;
}

std::pair<std::string, std::string>
firstCollectiveDifference(const Instruction &a, const Instruction &b) {
  auto dtype = [](const std::optional<DType> &d) {
    return "dtype " + (d ? std::string(dtypeName(*d)) : std::string("none"));
  };
  auto reduce = [](const std::optional<ReduceOp> &r) {
    return "reduce " +
           (r ? std::string(reduceOpName(*r)) : std::string("none"));
  };
  if (a.op != b.op)
    return {"op " + std::string(opKindName(a.op)),
            "op " + std::string(opKindName(b.op))};
  if (a.dtype != b.dtype)
    return {dtype(a.dtype), dtype(b.dtype)};
  if (a.count != b.count)
    return {"count " + std::to_string(a.count),
            "count " + std::to_string(b.count)};
  if (a.reduce != b.reduce)
    return {reduce(a.reduce), reduce(b.reduce)};
  if (a.op == OpKind::Broadcast && a.root != b.root)
    return {"root " + std::to_string(a.root), "root " + std::to_string(b.root)};
  return {};
}

namespace verifier {

void Successors::build(const RankInfo &ri, int32_t n) {
  outStart.assign(n + 1, 0);
  indeg.assign(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    if (ri.streamPrev[i] >= 0)
      ++outStart[ri.streamPrev[i] + 1];
    for (int32_t e = ri.depStart[i]; e < ri.depStart[i + 1]; ++e)
      ++outStart[ri.deps[e] + 1];
  }
  for (int32_t i = 0; i < n; ++i)
    outStart[i + 1] += outStart[i];
  out.resize(outStart[n]);
  fill.assign(outStart.begin(), outStart.end() - 1);
  for (int32_t i = 0; i < n; ++i) {
    if (ri.streamPrev[i] >= 0) {
      out[fill[ri.streamPrev[i]]++] = i;
      ++indeg[i];
    }
    for (int32_t e = ri.depStart[i]; e < ri.depStart[i + 1]; ++e) {
      out[fill[ri.deps[e]]++] = i;
      ++indeg[i];
    }
  }
}

std::optional<VerifyFailure>
Verifier::perRank(const std::function<void(RankQueue &)> &body) const {
  RankQueue queue(order.size());
  // Threads pay off from a few dozen ranks on (a thread per 32 ranks, at
  // most 8 and the cores there are).
  unsigned threads = static_cast<unsigned>(
      std::min<size_t>({order.size() / 32 + 1, 8,
                        std::max(1u, std::thread::hardware_concurrency())}));
  runOnThreads(threads, [&] { body(queue); });
  return queue.first();
}

Result<void> Verifier::indexRanks() {
  if (plans.empty())
    return makeError("the plan set is empty");
  Result<Mesh> m = Mesh::create(plans[0].mesh.axes, plans[0].mesh.deviceOrder);
  if (!m)
    return m.error().within("rank " + std::to_string(plans[0].rank) +
                            ": /mesh");
  mesh = std::move(*m);
  return {};
}

std::optional<VerifyFailure> Verifier::checkMeshes() {
  for (size_t i = 1; i < plans.size(); ++i)
    if (!(plans[i].mesh == plans[0].mesh)) {
      VerifyFailure f;
      f.kind = FailureKind::MeshMismatch;
      f.rank = plans[i].rank;
      f.otherRank = plans[0].rank;
      f.message = "rank " + std::to_string(plans[i].rank) + ": mesh " +
                  meshText(plans[i].mesh) + " differs from rank " +
                  std::to_string(plans[0].rank) + "'s mesh " +
                  meshText(plans[0].mesh);
      return f;
    }
  return std::nullopt;
}

std::optional<VerifyFailure> Verifier::checkFacts() {
  if (facts.plans.size() != plans.size())
    return std::nullopt;
  if (auto f = checkOperands())
    return f;
  if (auto f = checkTransferOperands())
    return f;
  if (auto f = checkBuffers())
    return f;
  if (auto f = checkParameters())
    return f;
  if (auto f = checkReductions())
    return f;
  if (auto f = checkLayoutFit())
    return f;
  if (auto f = checkMicrobatches())
    return f;
  if (auto f = checkComputeOrder())
    return f;
  if (auto f = checkOwnership())
    return f;
  if (auto f = checkLifetimes())
    return f;
  return checkAccumulation();
}

Result<VerifyResult> Verifier::run() {
  MESHPLAN_TRY(indexRanks());
  VerifyResult result;
  if (std::optional<VerifyFailure> f = checkMeshes()) {
    result.failure = std::move(f);
    return result;
  }
  // Plans by mesh position; the set must be complete.
  planOfPosition.assign(mesh->size(), -1);
  for (size_t p = 0; p < plans.size(); ++p) {
    Result<int64_t> pos = mesh->positionOf(plans[p].rank);
    if (!pos)
      return makeError("plan " + std::to_string(p) + ": " +
                       pos.error().message);
    if (planOfPosition[*pos] >= 0)
      return makeError("two plans for rank " + std::to_string(plans[p].rank));
    planOfPosition[*pos] = static_cast<int32_t>(p);
  }
  if (static_cast<int64_t>(plans.size()) != mesh->size()) {
    for (int64_t pos = 0; pos < mesh->size(); ++pos)
      if (planOfPosition[pos] < 0)
        return makeError("no plan for rank " +
                         std::to_string(mesh->rankAt(pos)) + " (the mesh has " +
                         std::to_string(mesh->size()) + " ranks; the set has " +
                         std::to_string(plans.size()) + " plans)");
  }
  order.resize(plans.size());
  for (size_t i = 0; i < plans.size(); ++i)
    order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return plans[a].rank < plans[b].rank;
  });

  // Per-rank indices.
  info.resize(plans.size());
  int64_t base = 0;
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    RankInfo &ri = info[p];
    ri.plan = &plan;
    ri.base = base;
    size_t n = plan.program.size();
    if (n > static_cast<size_t>(INT32_MAX / 2))
      return makeError("rank " + std::to_string(plan.rank) +
                       ": program too long");
    base += static_cast<int64_t>(n);
    std::unordered_map<std::string_view, int32_t> ids, streamIds;
    auto &commIds = ri.commIds;
    ids.reserve(n);
    for (size_t i = 0; i < n; ++i)
      ids.emplace(plan.program[i].id, static_cast<int32_t>(i));
    for (size_t c = 0; c < plan.communicators.size(); ++c)
      commIds.emplace(plan.communicators[c].id, static_cast<int32_t>(c));
    for (size_t s = 0; s < plan.streams.size(); ++s)
      streamIds.emplace(plan.streams[s], static_cast<int32_t>(s));
    std::vector<int32_t> lastOnStream(plan.streams.size(), -1);
    ri.depStart.assign(n + 1, 0);
    ri.streamPrev.assign(n, -1);
    ri.stream.assign(n, 0);
    ri.transferPrev.assign(n, -1);
    std::vector<int32_t> lastTransfer(plan.communicators.size(), -1);
    ri.localComm.assign(n, -1);
    ri.instance.assign(n, -1);
    ri.seqs.assign(plan.communicators.size(), {});
    for (size_t i = 0; i < n; ++i) {
      const Instruction &in = plan.program[i];
      for (const std::string &d : in.deps) {
        auto it = ids.find(d);
        if (it == ids.end())
          return makeError("rank " + std::to_string(plan.rank) + ": /program/" +
                           std::to_string(i) + ": unknown dep " + quote(d));
        ri.deps.push_back(it->second);
      }
      ri.depStart[i + 1] = static_cast<int32_t>(ri.deps.size());
      auto s = streamIds.find(in.stream);
      if (s == streamIds.end())
        return makeError("rank " + std::to_string(plan.rank) + ": /program/" +
                         std::to_string(i) + ": unknown stream");
      ri.stream[i] = s->second;
      ri.streamPrev[i] = lastOnStream[s->second];
      lastOnStream[s->second] = static_cast<int32_t>(i);
      if (isCollective(in.op)) {
        auto c = commIds.find(in.comm);
        if (c == commIds.end())
          return makeError("rank " + std::to_string(plan.rank) + ": /program/" +
                           std::to_string(i) + "/comm: unknown communicator " +
                           quote(in.comm));
        ri.localComm[i] = c->second;
        ++totalCollectives;
        // Sends and recvs pair by tag (matchPointToPoint), not by their
        // position among the communicator's collectives.
        if (isPointToPoint(in.op)) {
          ri.transferPrev[i] = lastTransfer[c->second];
          lastTransfer[c->second] = static_cast<int32_t>(i);
          continue;
        }
        ri.instance[i] = static_cast<int32_t>(ri.seqs[c->second].size());
        ri.seqs[c->second].push_back(static_cast<int32_t>(i));
      }
    }
  }
  totalInstructions = base;
  result.stats.ranks = static_cast<int64_t>(plans.size());
  result.stats.instructions = totalInstructions;
  result.stats.collectives = totalCollectives;

  if ((result.failure = buildCommunicators()))
    return result;
  result.stats.communicators = static_cast<int64_t>(comms.size());
  if ((result.failure = checkSequences()))
    return result;
  if ((result.failure = matchPointToPoint()))
    return result;
  if ((result.failure = checkStreamCycles()))
    return result;
  if ((result.failure = simulate()))
    return result;
  result.failure = checkFacts();
  return result;
}

} // namespace verifier

using verifier::Verifier;

Result<VerifyResult> verifyPlans(const std::vector<Plan> &plans) {
  PlanSetFacts facts = factsOf(plans);
  Verifier v(plans, facts);
  return v.run();
}

Result<VerifyResult> verifyPlans(const std::vector<Plan> &plans,
                                 const PlanSetFacts &facts) {
  Verifier v(plans, facts);
  return v.run();
}

} // namespace meshplan::plan
