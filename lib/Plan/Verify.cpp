//===- Verify.cpp - Cross-rank verification of plan sets ------------------===//

#include "meshplan/Plan/Verify.h"

#include "meshplan/Core/Text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <unordered_map>

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
  }
  return "failure";
}

namespace {

std::string quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

/// "[0,1,2,3]", shortened to "[0,1,2,...,4095] (4096 ranks)" when long.
std::string rankList(const std::vector<int64_t> &ranks) {
  if (ranks.size() <= 16)
    return "[" + joinInts(ranks) + "]";
  std::vector<int64_t> head(ranks.begin(), ranks.begin() + 8);
  return "[" + joinInts(head) + ",...," + std::to_string(ranks.back()) + "] (" +
         std::to_string(ranks.size()) + " ranks)";
}

std::string meshText(const PlanMesh &m) {
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

struct GlobalComm {
  const Communicator *def = nullptr;
  int64_t definer = -1;
  std::vector<int32_t> memberPlan;  ///< member key -> plan index
  std::vector<int32_t> memberLocal; ///< member key -> local comm index
};

std::string where(const Plan &p, int64_t index) {
  return "/program/" + std::to_string(index) + " " + quote(p.program[index].id);
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
    s += " tag=" + quote(in.tag);
  return s;
}

/// The first field in which two collectives differ, as "count 1024" for `a`
/// and "count 2048" for `b`; empty when equal.
std::pair<std::string, std::string> firstDifference(const Instruction &a,
                                                    const Instruction &b) {
  if (a.op != b.op)
    return {"op " + std::string(opKindName(a.op)),
            "op " + std::string(opKindName(b.op))};
  if (a.dtype != b.dtype)
    return {"dtype " + std::string(dtypeName(*a.dtype)),
            "dtype " + std::string(dtypeName(*b.dtype))};
  if (a.count != b.count)
    return {"count " + std::to_string(a.count),
            "count " + std::to_string(b.count)};
  if (a.reduce != b.reduce)
    return {"reduce " + std::string(reduceOpName(*a.reduce)),
            "reduce " + std::string(reduceOpName(*b.reduce))};
  if (a.op == OpKind::Broadcast && a.root != b.root)
    return {"root " + std::to_string(a.root), "root " + std::to_string(b.root)};
  return {};
}

bool sameCollective(const Instruction &a, const Instruction &b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count &&
         a.reduce == b.reduce &&
         (a.op != OpKind::Broadcast || a.root == b.root);
}

std::string ordinal(int64_t k) { return "#" + std::to_string(k + 1); }

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
  // (d): what the step computes (docs/plan-format.md).
  std::optional<VerifyFailure> checkFacts();
  std::optional<VerifyFailure> checkOperands();
  std::optional<VerifyFailure> checkTransferOperands();
  std::optional<VerifyFailure> checkBuffers();
  std::optional<VerifyFailure> checkParameters();
  std::optional<VerifyFailure> checkReductions();
  std::optional<VerifyFailure> checkMicrobatches();
  std::optional<VerifyFailure> checkComputeOrder();
  std::optional<VerifyFailure> checkOwnership();
  std::optional<VerifyFailure> checkLifetimes();

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
};

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

std::optional<VerifyFailure> Verifier::buildCommunicators() {
  // A communicator is one group: an id plus its member list. The same id may
  // name many groups (one per split color, as "tp" names every tp group).
  auto groupKey = [](const Communicator &c) {
    std::string key = c.id;
    key.push_back('\0');
    key.append(reinterpret_cast<const char *>(c.ranks.data()),
               c.ranks.size() * sizeof(int64_t));
    return key;
  };
  std::unordered_map<std::string, int32_t> byGroup;
  std::unordered_map<std::string, int32_t> byColor; // id + color -> comm
  auto mismatch = [&](const Plan &plan, size_t li, const GlobalComm &g,
                      const std::string &what) {
    VerifyFailure f;
    f.kind = FailureKind::CommMismatch;
    f.rank = plan.rank;
    f.otherRank = g.definer;
    f.comm = plan.communicators[li].id;
    f.message = "rank " + std::to_string(plan.rank) + ": /communicators/" +
                std::to_string(li) + ": communicator " + quote(f.comm) +
                " is defined with " + what;
    return f;
  };
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    RankInfo &ri = info[p];
    ri.globalComm.resize(plan.communicators.size());
    for (size_t li = 0; li < plan.communicators.size(); ++li) {
      const Communicator &c = plan.communicators[li];
      auto [it, fresh] =
          byGroup.emplace(groupKey(c), static_cast<int32_t>(comms.size()));
      if (fresh) {
        GlobalComm g;
        g.def = &c;
        g.definer = plan.rank;
        g.memberPlan.reserve(c.ranks.size());
        for (int64_t r : c.ranks)
          g.memberPlan.push_back(planOfPosition[*mesh->positionOf(r)]);
        g.memberLocal.assign(c.ranks.size(), -1);
        comms.push_back(std::move(g));
        std::string colorKey = c.id;
        colorKey.push_back('\0');
        colorKey += std::to_string(c.color);
        auto [ct, freshColor] = byColor.emplace(colorKey, it->second);
        if (!freshColor) {
          const GlobalComm &o = comms[ct->second];
          return mismatch(plan, li, o,
                          "color " + std::to_string(c.color) + " and ranks " +
                              rankList(c.ranks) + ", but rank " +
                              std::to_string(o.definer) +
                              " gives the same id and color to ranks " +
                              rankList(o.def->ranks));
        }
      } else {
        const GlobalComm &g = comms[it->second];
        const Communicator &d = *g.def;
        std::string other =
            ", but rank " + std::to_string(g.definer) + " defines it with ";
        if (c.color != d.color)
          return mismatch(plan, li, g,
                          "color " + std::to_string(c.color) + other +
                              "color " + std::to_string(d.color));
        if (c.axes != d.axes)
          return mismatch(
              plan, li, g,
              "axes [" +
                  [&] {
                    std::string s;
                    for (const std::string &a : c.axes)
                      s += (s.empty() ? "" : ",") + a;
                    return s;
                  }() +
                  "]" + other + "other axes");
        if (c.faultTolerant != d.faultTolerant)
          return mismatch(plan, li, g,
                          std::string("fault_tolerant ") +
                              (c.faultTolerant ? "true" : "false") + other +
                              (d.faultTolerant ? "true" : "false"));
      }
      comms[it->second].memberLocal[c.key] = static_cast<int32_t>(li);
      ri.globalComm[li] = it->second;
    }
  }
  for (const GlobalComm &g : comms)
    for (size_t k = 0; k < g.memberLocal.size(); ++k) {
      if (g.memberLocal[k] >= 0)
        continue;
      int32_t mp = g.memberPlan[k];
      const Plan &member = plans[mp];
      VerifyFailure f;
      f.rank = member.rank;
      f.otherRank = g.definer;
      f.comm = g.def->id;
      auto own = info[mp].commIds.find(g.def->id);
      if (own != info[mp].commIds.end()) {
        f.kind = FailureKind::CommMismatch;
        f.message = "rank " + std::to_string(member.rank) +
                    ": /communicators/" + std::to_string(own->second) +
                    ": communicator " + quote(g.def->id) +
                    " is defined with ranks " +
                    rankList(member.communicators[own->second].ranks) +
                    ", but rank " + std::to_string(g.definer) +
                    " defines it with ranks " + rankList(g.def->ranks);
      } else {
        f.kind = FailureKind::CommMissing;
        f.message = "rank " + std::to_string(member.rank) +
                    " does not define communicator " + quote(g.def->id) +
                    ", but rank " + std::to_string(g.definer) +
                    " defines it with member ranks " + rankList(g.def->ranks);
      }
      return f;
    }
  return std::nullopt;
}

std::optional<VerifyFailure> Verifier::checkSequences() {
  // Per communicator, the first position where members disagree; the member
  // in the minority there is blamed. Among all communicators, the failure
  // with the smallest (rank, instruction index) is reported.
  std::optional<VerifyFailure> best;
  auto better = [&](const VerifyFailure &f) {
    if (!best)
      return true;
    int64_t bi = best->index < 0 ? INT64_MAX : best->index;
    int64_t fi = f.index < 0 ? INT64_MAX : f.index;
    return std::pair(f.rank, fi) < std::pair(best->rank, bi);
  };
  for (const GlobalComm &g : comms) {
    size_t n = g.memberPlan.size();
    auto seqOf = [&](size_t k) -> const std::vector<int32_t> & {
      return info[g.memberPlan[k]].seqs[g.memberLocal[k]];
    };
    size_t maxLen = 0, minLen = SIZE_MAX;
    for (size_t k = 0; k < n; ++k) {
      maxLen = std::max(maxLen, seqOf(k).size());
      minLen = std::min(minLen, seqOf(k).size());
    }
    auto at = [&](size_t k, size_t pos) -> const Instruction * {
      const std::vector<int32_t> &s = seqOf(k);
      return pos < s.size() ? &plans[g.memberPlan[k]].program[s[pos]] : nullptr;
    };
    auto same = [](const Instruction *a, const Instruction *b) {
      return a && b ? sameCollective(*a, *b) : a == b;
    };
    for (size_t pos = 0; pos < maxLen; ++pos) {
      const Instruction *first = at(0, pos);
      bool allSame = true;
      for (size_t k = 1; k < n && allSame; ++k)
        allSame = same(at(k, pos), first);
      if (allSame)
        continue;
      // Majority signature at this position (distinct signatures are few).
      std::vector<std::pair<const Instruction *, size_t>> tally;
      for (size_t k = 0; k < n; ++k) {
        const Instruction *x = at(k, pos);
        auto it = std::find_if(tally.begin(), tally.end(),
                               [&](auto &t) { return same(t.first, x); });
        if (it == tally.end())
          tally.push_back({x, 1});
        else
          ++it->second;
      }
      // Most common wins; on a tie, the side that issued the collective.
      auto major = std::max_element(
          tally.begin(), tally.end(), [](const auto &a, const auto &b) {
            if (a.second != b.second)
              return a.second < b.second;
            return a.first == nullptr && b.first != nullptr;
          });
      size_t blamed = n, other = n;
      for (size_t k = 0; k < n; ++k) {
        bool inMajor = same(at(k, pos), major->first);
        if (!inMajor && blamed == n)
          blamed = k;
        if (inMajor && other == n)
          other = k;
      }
      const Plan &bp = plans[g.memberPlan[blamed]];
      const Plan &op = plans[g.memberPlan[other]];
      const Instruction *bi = at(blamed, pos), *oi = at(other, pos);
      VerifyFailure f;
      f.kind = FailureKind::Divergence;
      f.rank = bp.rank;
      f.otherRank = op.rank;
      f.comm = g.def->id;
      std::string head = "rank " + std::to_string(bp.rank);
      std::string coll =
          "collective " + ordinal(pos) + " on communicator " + quote(g.def->id);
      if (bi) {
        f.index = seqOf(blamed)[pos];
        f.instruction = bi->id;
        head += " " + where(bp, f.index) + ": " + coll;
      } else {
        head += ": " + coll;
      }
      std::string otherText = "rank " + std::to_string(op.rank);
      if (bi && oi) {
        auto [mine, theirs] = firstDifference(*bi, *oi);
        f.message = head + " has " + mine + ", but " + otherText + " has " +
                    theirs + " (" + otherText + " " +
                    where(op, seqOf(other)[pos]) + ": " +
                    describeCollective(*oi) + ")";
      } else if (bi) {
        f.message = head + " is " + describeCollective(*bi) + ", but " +
                    otherText + " issues only " +
                    std::to_string(seqOf(other).size()) + " collectives on " +
                    quote(g.def->id);
      } else {
        f.message = head + " is missing: rank " + std::to_string(bp.rank) +
                    " issues only " + std::to_string(seqOf(blamed).size()) +
                    " collectives on " + quote(g.def->id) + ", but " +
                    otherText + " issues " + where(op, seqOf(other)[pos]) +
                    ": " + describeCollective(*oi);
      }
      if (better(f))
        best = std::move(f);
      break;
    }
    (void)minLen;
  }
  return best;
}

std::optional<VerifyFailure> Verifier::matchPointToPoint() {
  // On a pair communicator, a send tagged T pairs with the other member's
  // recv tagged T, wherever each stands in its program: the runtime keys the
  // transfer by its tag, so two transfers issued in different orders wait
  // for each other (a deadlock the simulation finds, with its cycle) rather
  // than delivering one message into the buffer meant for the other. Here:
  // every send and recv has exactly one partner, of the same dtype and
  // count.
  auto describeP2p = [&](int32_t p, int64_t i) {
    const Plan &plan = plans[p];
    const Instruction &in = plan.program[i];
    return "rank " + std::to_string(plan.rank) + " " + where(plan, i) + " (" +
           std::string(opKindName(in.op)) + " " + quote(in.tag) + " on " +
           quote(in.comm) + ")";
  };
  auto failure = [&](int32_t p, int64_t i, int32_t q, std::string message) {
    VerifyFailure f;
    f.kind = FailureKind::Divergence;
    f.rank = plans[p].rank;
    f.otherRank = plans[q].rank;
    f.index = i;
    f.instruction = plans[p].program[i].id;
    f.comm = plans[p].program[i].comm;
    f.message = std::move(message);
    return f;
  };
  // Per (plan, local comm): tag -> instruction, one map per direction.
  using TagMap = std::unordered_map<std::string_view, int32_t>;
  std::vector<std::vector<std::array<TagMap, 2>>> byTag(plans.size());
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    RankInfo &ri = info[p];
    ri.partner.assign(plan.program.size(), -1);
    for (size_t i = 0; i < plan.program.size(); ++i) {
      const Instruction &in = plan.program[i];
      if (!isPointToPoint(in.op))
        continue;
      auto &maps = byTag[p];
      if (maps.empty())
        maps.resize(plan.communicators.size());
      TagMap &m = maps[ri.localComm[i]][in.op == OpKind::Send ? 0 : 1];
      auto [it, fresh] = m.emplace(in.tag, static_cast<int32_t>(i));
      if (!fresh)
        return failure(p, static_cast<int64_t>(i), p,
                       describeP2p(p, static_cast<int64_t>(i)) +
                           ": the tag is used twice on " + quote(in.comm) +
                           " (also " + where(plan, it->second) +
                           "); each transfer needs its own");
    }
  }
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    RankInfo &ri = info[p];
    for (size_t i = 0; i < plan.program.size(); ++i) {
      const Instruction &in = plan.program[i];
      if (!isPointToPoint(in.op))
        continue;
      const GlobalComm &g = comms[ri.globalComm[ri.localComm[i]]];
      // A pair (validatePlan checks the size and the peer).
      size_t other = g.memberPlan[0] == p ? 1 : 0;
      int32_t q = g.memberPlan[other];
      int32_t lq = g.memberLocal[other];
      const auto &theirs = byTag[q];
      const TagMap *m =
          theirs.empty() ? nullptr : &theirs[lq][in.op == OpKind::Send ? 1 : 0];
      auto it = m ? m->find(in.tag) : TagMap::const_iterator{};
      if (!m || it == m->end())
        return failure(
            p, static_cast<int64_t>(i), q,
            describeP2p(p, static_cast<int64_t>(i)) + " has no partner: rank " +
                std::to_string(plans[q].rank) + " never " +
                (in.op == OpKind::Send ? "receives" : "sends") +
                " a message tagged " + quote(in.tag) + " on " + quote(in.comm));
      const Instruction &peer = plans[q].program[it->second];
      if (peer.dtype != in.dtype || peer.count != in.count)
        return failure(p, static_cast<int64_t>(i), q,
                       describeP2p(p, static_cast<int64_t>(i)) + " moves " +
                           describeCollective(in) + ", but " +
                           describeP2p(q, it->second) + " moves " +
                           describeCollective(peer));
      ri.partner[i] = info[q].base + it->second;
    }
  }
  return std::nullopt;
}

std::optional<VerifyFailure> Verifier::checkStreamCycles() {
  std::vector<int32_t> indeg, queue;
  std::vector<std::vector<int32_t>> unused;
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const RankInfo &ri = info[p];
    int32_t n = static_cast<int32_t>(plan.program.size());
    // Successor lists: stream next + reverse deps (CSR).
    std::vector<int32_t> outStart(n + 1, 0), out;
    for (int32_t i = 0; i < n; ++i) {
      if (ri.streamPrev[i] >= 0)
        ++outStart[ri.streamPrev[i] + 1];
      for (int32_t e = ri.depStart[i]; e < ri.depStart[i + 1]; ++e)
        ++outStart[ri.deps[e] + 1];
    }
    for (int32_t i = 0; i < n; ++i)
      outStart[i + 1] += outStart[i];
    out.resize(outStart[n]);
    std::vector<int32_t> fill(outStart.begin(), outStart.end() - 1);
    indeg.assign(n, 0);
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
    queue.clear();
    for (int32_t i = 0; i < n; ++i)
      if (indeg[i] == 0)
        queue.push_back(i);
    for (size_t q = 0; q < queue.size(); ++q)
      for (int32_t e = outStart[queue[q]]; e < outStart[queue[q] + 1]; ++e)
        if (--indeg[out[e]] == 0)
          queue.push_back(out[e]);
    if (static_cast<int32_t>(queue.size()) == n)
      continue;
    // Walk "waits for" edges among unfinished instructions to a cycle.
    auto blocker = [&](int32_t i) -> std::pair<int32_t, std::string> {
      if (ri.streamPrev[i] >= 0 && indeg[ri.streamPrev[i]] > 0)
        return {ri.streamPrev[i],
                "runs after it on stream " + quote(plan.program[i].stream)};
      for (int32_t e = ri.depStart[i]; e < ri.depStart[i + 1]; ++e)
        if (indeg[ri.deps[e]] > 0)
          return {ri.deps[e], "deps"};
      return {-1, ""};
    };
    int32_t start = 0;
    while (indeg[start] == 0)
      ++start;
    std::vector<int32_t> seen(n, -1), path;
    int32_t cur = start;
    while (seen[cur] < 0) {
      seen[cur] = static_cast<int32_t>(path.size());
      path.push_back(cur);
      cur = blocker(cur).first;
    }
    std::vector<int32_t> cycle(path.begin() + seen[cur], path.end());
    VerifyFailure f;
    f.kind = FailureKind::StreamCycle;
    f.rank = plan.rank;
    f.index = cycle[0];
    f.instruction = plan.program[cycle[0]].id;
    f.message = "rank " + std::to_string(plan.rank) +
                ": wait cycle among its own instructions:";
    for (int32_t i : cycle) {
      auto [b, why] = blocker(i);
      f.message += "\n  " + where(plan, i) + " (stream " +
                   quote(plan.program[i].stream) + ") waits for " +
                   where(plan, b) + " (" + why + ")";
    }
    return f;
  }
  return std::nullopt;
}

std::optional<VerifyFailure> Verifier::simulate() {
  int64_t total = totalInstructions;
  std::vector<int32_t> pending(total, 0);
  std::vector<uint8_t> state(total, 0); // 0 waiting, 1 issued, 2 done
  std::vector<int64_t> outStart(total + 1, 0);
  std::vector<int64_t> out;
  std::vector<int32_t> planOf(total);
  for (int32_t p : order) {
    const RankInfo &ri = info[p];
    int64_t n = static_cast<int64_t>(plans[p].program.size());
    for (int64_t i = 0; i < n; ++i) {
      int64_t g = ri.base + i;
      planOf[g] = p;
      if (ri.streamPrev[i] >= 0) {
        ++outStart[ri.base + ri.streamPrev[i] + 1];
        ++pending[g];
      }
      if (ri.transferPrev[i] >= 0) {
        ++outStart[ri.base + ri.transferPrev[i] + 1];
        ++pending[g];
      }
      for (int32_t e = ri.depStart[i]; e < ri.depStart[i + 1]; ++e) {
        ++outStart[ri.base + ri.deps[e] + 1];
        ++pending[g];
      }
      if (ri.localComm[i] >= 0 && ri.instance[i] > 0)
        ++pending[g]; // previous collective on the same comm must be issued
    }
  }
  for (int64_t g = 0; g < total; ++g)
    outStart[g + 1] += outStart[g];
  out.resize(outStart[total]);
  {
    std::vector<int64_t> fill(outStart.begin(), outStart.end() - 1);
    for (int32_t p : order) {
      const RankInfo &ri = info[p];
      int64_t n = static_cast<int64_t>(plans[p].program.size());
      for (int64_t i = 0; i < n; ++i) {
        if (ri.streamPrev[i] >= 0)
          out[fill[ri.base + ri.streamPrev[i]]++] = ri.base + i;
        if (ri.transferPrev[i] >= 0)
          out[fill[ri.base + ri.transferPrev[i]]++] = ri.base + i;
        for (int32_t e = ri.depStart[i]; e < ri.depStart[i + 1]; ++e)
          out[fill[ri.base + ri.deps[e]]++] = ri.base + i;
      }
    }
  }
  std::vector<std::vector<int32_t>> arrived(comms.size());
  for (size_t c = 0; c < comms.size(); ++c) {
    const GlobalComm &gc = comms[c];
    arrived[c].assign(info[gc.memberPlan[0]].seqs[gc.memberLocal[0]].size(), 0);
  }

  std::vector<int64_t> work;
  work.reserve(1024);
  for (int64_t g = 0; g < total; ++g)
    if (pending[g] == 0)
      work.push_back(g);
  int64_t done = 0;
  auto complete = [&](int64_t g) {
    state[g] = 2;
    ++done;
    for (int64_t e = outStart[g]; e < outStart[g + 1]; ++e)
      if (--pending[out[e]] == 0)
        work.push_back(out[e]);
  };
  while (!work.empty()) {
    int64_t g = work.back();
    work.pop_back();
    int32_t p = planOf[g];
    const RankInfo &ri = info[p];
    int64_t i = g - ri.base;
    int32_t lc = ri.localComm[i];
    if (lc < 0) {
      complete(g);
      continue;
    }
    if (ri.partner.size() && ri.partner[i] >= 0) {
      // Rendezvous: a send and its recv complete together once both are
      // issued (the strictest point-to-point semantics: no buffering).
      state[g] = 1;
      if (state[ri.partner[i]] == 1) {
        complete(g);
        complete(ri.partner[i]);
      }
      continue;
    }
    state[g] = 1;
    const std::vector<int32_t> &seq = ri.seqs[lc];
    int32_t k = ri.instance[i];
    if (static_cast<size_t>(k + 1) < seq.size()) {
      int64_t next = ri.base + seq[k + 1];
      if (--pending[next] == 0)
        work.push_back(next);
    }
    int32_t c = ri.globalComm[lc];
    const GlobalComm &gc = comms[c];
    if (++arrived[c][k] == static_cast<int32_t>(gc.memberPlan.size()))
      for (size_t m = 0; m < gc.memberPlan.size(); ++m) {
        const RankInfo &mi = info[gc.memberPlan[m]];
        complete(mi.base + mi.seqs[gc.memberLocal[m]][k]);
      }
  }
  if (done == total)
    return std::nullopt;

  // Deadlock: follow "waits for" from the first stuck instruction of the
  // lowest stuck rank until an instruction repeats.
  struct Step {
    int64_t next;
    std::string why;
  };
  auto describe = [&](int64_t g) {
    const RankInfo &ri = info[planOf[g]];
    const Plan &p = plans[planOf[g]];
    int64_t i = g - ri.base;
    std::string s = "rank " + std::to_string(p.rank) + " " + where(p, i) +
                    " (" + std::string(opKindName(p.program[i].op));
    if (isPointToPoint(p.program[i].op))
      s += " " + quote(p.program[i].tag) + " on " + quote(p.program[i].comm);
    else if (ri.localComm[i] >= 0)
      s += " " + ordinal(ri.instance[i]) + " on " + quote(p.program[i].comm);
    return s + ", stream " + quote(p.program[i].stream) + ")";
  };
  auto blocker = [&](int64_t g) -> Step {
    const RankInfo &ri = info[planOf[g]];
    const Plan &p = plans[planOf[g]];
    int64_t i = g - ri.base;
    int32_t lc = ri.localComm[i];
    if (state[g] == 1 && isPointToPoint(p.program[i].op)) {
      int64_t h = ri.partner[i];
      const Plan &q = plans[planOf[h]];
      return {h, "issued; waits for rank " + std::to_string(q.rank) + " to " +
                     (p.program[i].op == OpKind::Send ? "receive" : "send") +
                     " it"};
    }
    if (state[g] == 1) {
      int32_t c = ri.globalComm[lc];
      const GlobalComm &gc = comms[c];
      int32_t k = ri.instance[i];
      for (size_t m = 0; m < gc.memberPlan.size(); ++m) {
        const RankInfo &mi = info[gc.memberPlan[m]];
        int64_t h = mi.base + mi.seqs[gc.memberLocal[m]][k];
        if (state[h] == 0)
          return {h, "issued; waits for rank " +
                         std::to_string(plans[gc.memberPlan[m]].rank) +
                         " to issue its " + ordinal(k) + " on " +
                         quote(gc.def->id)};
      }
    }
    if (ri.streamPrev[i] >= 0 && state[ri.base + ri.streamPrev[i]] != 2)
      return {ri.base + ri.streamPrev[i],
              "waits for the previous instruction on its stream"};
    if (ri.transferPrev[i] >= 0 && state[ri.base + ri.transferPrev[i]] != 2)
      return {ri.base + ri.transferPrev[i],
              "waits for the previous transfer on " + quote(p.program[i].comm)};
    for (int32_t e = ri.depStart[i]; e < ri.depStart[i + 1]; ++e)
      if (state[ri.base + ri.deps[e]] != 2)
        return {ri.base + ri.deps[e], "waits for its dep"};
    if (lc >= 0 && ri.instance[i] > 0) { // point to point: instance -1
      int64_t prev = ri.base + ri.seqs[lc][ri.instance[i] - 1];
      if (state[prev] == 0)
        return {prev, "waits for the previous collective on " +
                          quote(p.program[i].comm) + " to be issued"};
    }
    return {-1, "?"};
  };
  int64_t start = -1, stuck = 0;
  std::vector<uint8_t> rankStuck(plans.size(), 0);
  int64_t stuckRanks = 0;
  for (int32_t p : order) {
    const RankInfo &ri = info[p];
    for (size_t i = 0; i < plans[p].program.size(); ++i)
      if (state[ri.base + i] != 2) {
        if (start < 0)
          start = ri.base + i;
        ++stuck;
        if (!rankStuck[p]) {
          rankStuck[p] = 1;
          ++stuckRanks;
        }
      }
  }
  std::unordered_map<int64_t, size_t> seen;
  std::vector<int64_t> path;
  int64_t cur = start;
  while (cur >= 0 && !seen.count(cur)) {
    seen[cur] = path.size();
    path.push_back(cur);
    cur = blocker(cur).next;
  }
  size_t from = cur >= 0 ? seen[cur] : 0;
  int64_t head = path[from];
  const RankInfo &hi = info[planOf[head]];
  const Plan &hp = plans[planOf[head]];
  VerifyFailure f;
  f.kind = FailureKind::Deadlock;
  f.rank = hp.rank;
  f.index = head - hi.base;
  f.instruction = hp.program[f.index].id;
  f.comm = hi.localComm[f.index] >= 0 ? hp.program[f.index].comm : "";
  f.message = "deadlock: " + std::to_string(stuck) + " instructions on " +
              std::to_string(stuckRanks) + " ranks can never run; wait cycle:";
  constexpr size_t kMaxLines = 16;
  for (size_t s = from; s < path.size(); ++s) {
    if (s - from == kMaxLines) {
      f.message +=
          "\n  ... (" + std::to_string(path.size() - s) + " more steps)";
      break;
    }
    Step st = blocker(path[s]);
    f.message += "\n  " + describe(path[s]) + " " + st.why + ": " +
                 (st.next >= 0 ? describe(st.next) : "?");
  }
  return f;
}

//===----------------------------------------------------------------------===//
// (d) What the step computes
//===----------------------------------------------------------------------===//

std::string Verifier::whereLabeled(int32_t p, int64_t i) const {
  std::string s = where(plans[p], i);
  const PlanFacts &f = factsOf(p);
  if (static_cast<size_t>(i) < f.label.size() && f.label[i] >= 0)
    s += " (" + quote(text(f.label[i])) + ")";
  return s;
}

std::string Verifier::describeBuffer(const BufferFacts &b) const {
  std::string s =
      quote(text(b.id)) + " (" + std::string(bufferKindName(b.kind)) + " " +
      std::string(dtypeName(b.dtype)) + " [" + joinInts(b.globalShape) + "]";
  if (b.tensor >= 0)
    s += " of " + quote(text(b.tensor));
  if (b.tensorId)
    s += " tensor_id " + std::to_string(*b.tensorId);
  return s + ", layout " + quote(text(b.layout)) + ")";
}

std::pair<std::string, std::string>
Verifier::bufferDifference(const BufferFacts &a, const BufferFacts &b) const {
  auto tensorText = [&](const BufferFacts &x) {
    return x.tensor < 0 ? std::string("no tensor") : quote(text(x.tensor));
  };
  if (a.tensor != b.tensor)
    return {"tensor " + tensorText(a), "tensor " + tensorText(b)};
  if (a.layout != b.layout)
    return {"layout " + quote(text(a.layout)),
            "layout " + quote(text(b.layout))};
  if (a.globalShape != b.globalShape)
    return {"global shape [" + joinInts(a.globalShape) + "]",
            "global shape [" + joinInts(b.globalShape) + "]"};
  if (a.dtype != b.dtype)
    return {"dtype " + std::string(dtypeName(a.dtype)),
            "dtype " + std::string(dtypeName(b.dtype))};
  if (a.kind != b.kind)
    return {"kind " + std::string(bufferKindName(a.kind)),
            "kind " + std::string(bufferKindName(b.kind))};
  auto idText = [](const std::optional<int64_t> &t) {
    return t ? std::to_string(*t) : std::string("none");
  };
  if (a.tensorId != b.tensorId)
    return {"tensor_id " + idText(a.tensorId),
            "tensor_id " + idText(b.tensorId)};
  if (a.id != b.id)
    return {"buffer " + quote(text(a.id)), "buffer " + quote(text(b.id))};
  if (!(a == b)) {
    auto scaleText = [&](const BufferFacts &x) {
      return x.scaleAmax < 0 ? std::string("no scale")
                             : "scale " + quote(text(x.scaleAmax)) + "[" +
                                   std::to_string(x.scaleIndex) + "]" +
                                   (x.scalePowerOf2 ? " power_of_2" : "");
    };
    return {scaleText(a), scaleText(b)};
  }
  return {};
}

VerifyFailure Verifier::failureAt(FailureKind kind, int32_t p,
                                  int64_t i) const {
  VerifyFailure f;
  f.kind = kind;
  f.rank = plans[p].rank;
  f.index = i;
  if (i >= 0) {
    f.instruction = plans[p].program[i].id;
    if (isCollective(plans[p].program[i].op))
      f.comm = plans[p].program[i].comm;
  }
  return f;
}

const Layout *Verifier::layoutOf(int32_t t) {
  auto [it, fresh] = layouts.try_emplace(t);
  if (fresh) {
    if (!sharedMesh)
      sharedMesh = std::make_shared<const Mesh>(*mesh);
    Result<Layout> l =
        parseLayout(View::root(sharedMesh), AxisNamespace(sharedMesh), text(t));
    // validatePlan parsed every layout already; one that does not parse
    // here is not judged by (d).
    if (l)
      it->second = std::move(*l);
  }
  return it->second ? &*it->second : nullptr;
}

const AxisRefList *Verifier::refsOf(int32_t c) {
  auto [it, fresh] = commRefs.try_emplace(c);
  if (fresh) {
    AxisRefList refs;
    bool ok = !comms[c].def->axes.empty();
    for (const std::string &a : comms[c].def->axes) {
      Result<AxisRef> r = parseAxisRefText(*mesh, a);
      if (!r) {
        ok = false;
        break;
      }
      refs.push_back(*r);
    }
    if (ok)
      it->second = std::move(refs);
  }
  return it->second ? &*it->second : nullptr;
}

std::optional<VerifyFailure> Verifier::checkOperands() {
  // The members of a collective must hand it the same tensor in the same
  // layout: counts alone let two same-sized buffers swap on one rank and
  // train on the wrong data. Buffers are interned per set, so "the same"
  // is one integer per operand.
  std::vector<int32_t> key, firstKey;
  std::optional<VerifyFailure> best;
  auto operandsOf = [&](int32_t p, int64_t i, std::vector<int32_t> &out) {
    const PlanFacts &f = factsOf(p);
    out.clear();
    out.push_back(f.inputCount[i]);
    for (int32_t o = f.operandStart[i]; o < f.operandStart[i + 1]; ++o)
      out.push_back(f.operands[o] < 0 ? -1 : f.buffers[f.operands[o]]);
  };
  for (const GlobalComm &g : comms) {
    size_t n = g.memberPlan.size();
    if (n < 2)
      continue;
    const std::vector<int32_t> &seq0 =
        info[g.memberPlan[0]].seqs[g.memberLocal[0]];
    for (size_t pos = 0; pos < seq0.size(); ++pos) {
      operandsOf(g.memberPlan[0], seq0[pos], firstKey);
      size_t k = 1;
      for (; k < n; ++k) {
        int32_t mp = g.memberPlan[k];
        operandsOf(mp, info[mp].seqs[g.memberLocal[k]][pos], key);
        if (key != firstKey)
          break;
      }
      if (k == n)
        continue;
      // Majority over the members' operand lists; the first member outside
      // it is blamed, the first inside it is the reference.
      std::vector<std::pair<std::vector<int32_t>, size_t>> tally;
      std::vector<size_t> tallyOf(n);
      for (size_t m = 0; m < n; ++m) {
        int32_t mp = g.memberPlan[m];
        operandsOf(mp, info[mp].seqs[g.memberLocal[m]][pos], key);
        auto it = std::find_if(tally.begin(), tally.end(),
                               [&](auto &t) { return t.first == key; });
        if (it == tally.end()) {
          tally.push_back({key, 1});
          it = tally.end() - 1;
        } else {
          ++it->second;
        }
        tallyOf[m] = static_cast<size_t>(it - tally.begin());
      }
      size_t major = 0;
      for (size_t t = 1; t < tally.size(); ++t)
        if (tally[t].second > tally[major].second)
          major = t;
      size_t blamed = n, other = n;
      for (size_t m = 0; m < n; ++m) {
        if (tallyOf[m] != major && blamed == n)
          blamed = m;
        if (tallyOf[m] == major && other == n)
          other = m;
      }
      int32_t bp = g.memberPlan[blamed], op = g.memberPlan[other];
      int64_t bi = info[bp].seqs[g.memberLocal[blamed]][pos];
      int64_t oi = info[op].seqs[g.memberLocal[other]][pos];
      const PlanFacts &bf = factsOf(bp), &of = factsOf(op);
      VerifyFailure f = failureAt(FailureKind::OperandMismatch, bp, bi);
      f.otherRank = plans[op].rank;
      std::string head = "rank " + std::to_string(plans[bp].rank) + " " +
                         whereLabeled(bp, bi) + ": " +
                         std::string(opKindName(plans[bp].program[bi].op)) +
                         " " + ordinal(static_cast<int64_t>(pos)) +
                         " on communicator " + quote(g.def->id);
      std::string otherAt =
          "rank " + std::to_string(plans[op].rank) + " " + whereLabeled(op, oi);
      int32_t bn = bf.operandStart[bi + 1] - bf.operandStart[bi];
      int32_t on = of.operandStart[oi + 1] - of.operandStart[oi];
      if (bf.inputCount[bi] != of.inputCount[oi] || bn != on) {
        f.message = head + " has " + std::to_string(bf.inputCount[bi]) +
                    " inputs and " + std::to_string(bn - bf.inputCount[bi]) +
                    " outputs, but " + otherAt + " has " +
                    std::to_string(of.inputCount[oi]) + " and " +
                    std::to_string(on - of.inputCount[oi]);
      } else {
        for (int32_t o = 0; o < bn; ++o) {
          int32_t lb = bf.operands[bf.operandStart[bi] + o];
          int32_t lo = of.operands[of.operandStart[oi] + o];
          const BufferFacts &a = bufferOf(bp, lb), &b = bufferOf(op, lo);
          if (&a == &b)
            continue;
          bool input = o < bf.inputCount[bi];
          std::string which = (input ? "input " : "output ") +
                              std::to_string(input ? o : o - bf.inputCount[bi]);
          auto [mine, theirs] = bufferDifference(a, b);
          f.tensor = a.tensor >= 0 ? std::string(text(a.tensor)) : "";
          f.message = head + ": its " + which + " is " + describeBuffer(a) +
                      ", but " + otherAt + " has " + describeBuffer(b) +
                      "; they differ in " + mine + " vs " + theirs +
                      ", so the members would " +
                      (input ? "contribute" : "receive") + " different tensors";
          break;
        }
      }
      if (!best ||
          std::pair(f.rank, f.index) < std::pair(best->rank, best->index))
        best = std::move(f);
      break;
    }
  }
  return best;
}

std::optional<VerifyFailure> Verifier::checkTransferOperands() {
  // A send delivers its one input into the recv's one output: the same
  // activation of the same microbatch (the receiver names the buffer as its
  // producer does), of the same shape and layout.
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const RankInfo &ri = info[p];
    const PlanFacts &pf = factsOf(p);
    for (size_t i = 0; i < plan.program.size(); ++i) {
      if (plan.program[i].op != OpKind::Send || ri.partner[i] < 0)
        continue;
      int64_t h = ri.partner[i];
      int32_t q = 0;
      // The partner's plan: the other member of the pair.
      const GlobalComm &g = comms[ri.globalComm[ri.localComm[i]]];
      q = g.memberPlan[g.memberPlan[0] == p ? 1 : 0];
      int64_t j = h - info[q].base;
      const PlanFacts &qf = factsOf(q);
      if (pf.inputCount[i] < 1 ||
          qf.operandStart[j + 1] - qf.operandStart[j] - qf.inputCount[j] < 1)
        continue; // validatePlan requires them; nothing to compare
      int32_t sb = pf.operands[pf.operandStart[i]];
      int32_t rb = qf.operands[qf.operandStart[j] + qf.inputCount[j]];
      if (sb < 0 || rb < 0 || pf.buffers[sb] == qf.buffers[rb])
        continue;
      const BufferFacts &a = bufferOf(p, sb), &b = bufferOf(q, rb);
      auto [mine, theirs] = bufferDifference(a, b);
      VerifyFailure f =
          failureAt(FailureKind::OperandMismatch, p, static_cast<int64_t>(i));
      f.otherRank = plans[q].rank;
      f.tensor = a.tensor >= 0 ? std::string(text(a.tensor)) : "";
      f.message = "rank " + std::to_string(plan.rank) + " " +
                  whereLabeled(p, static_cast<int64_t>(i)) + " (send " +
                  quote(plan.program[i].tag) + " on " +
                  quote(plan.program[i].comm) + ") sends " + describeBuffer(a) +
                  ", but rank " + std::to_string(plans[q].rank) + " " +
                  whereLabeled(q, j) + " receives it into " +
                  describeBuffer(b) + "; they differ in " + mine + " vs " +
                  theirs;
      return f;
    }
  }
  return std::nullopt;
}

/// An optimizer record as its fields (key, JSON value), as writePlan writes
/// it: compared field by field, so a field added to the record (and to the
/// writer, as the round-trip tests require) is compared without a change
/// here.
std::vector<std::pair<std::string, std::string>>
optimizerFields(const OptimizerConfig &o) {
  Plan carrier;
  carrier.optimizer = o;
  nlohmann::json doc = nlohmann::json::parse(writePlan(carrier), nullptr,
                                             /*allow_exceptions=*/false);
  std::vector<std::pair<std::string, std::string>> out;
  if (doc.is_object() && doc.contains("optimizer"))
    for (auto &[k, v] : doc["optimizer"].items())
      out.emplace_back(k, v.dump());
  return out;
}

std::optional<VerifyFailure> Verifier::checkBuffers() {
  // A buffer id names one tensor version on every rank: the same tensor,
  // kind, dtype, global shape, layout, tensor_id and scale (validatePlan
  // checked each rank's box against the layout). Buffers are interned, so
  // two ranks that describe one id differently hold two entries with it.
  // In rank order, so that the report does not depend on which reading
  // thread interned what first.
  std::vector<int32_t> firstOfId(facts.strings.size(), -1);
  int32_t clash = -1, first = -1;
  for (size_t o = 0; o < order.size() && clash < 0; ++o)
    for (int32_t sb : factsOf(order[o]).buffers) {
      int32_t &f = firstOfId[facts.buffers[sb].id];
      if (f < 0) {
        f = sb;
      } else if (f != sb) {
        clash = sb;
        first = f;
        break;
      }
    }
  if (clash < 0)
    return std::nullopt;
  // The ranks holding each description: the lowest rank holding the less
  // common one is blamed.
  int64_t count[2] = {0, 0};
  int32_t holder[2] = {-1, -1};
  for (int32_t p : order)
    for (int32_t sb : factsOf(p).buffers)
      for (int k = 0; k < 2; ++k)
        if (sb == (k ? clash : first)) {
          ++count[k];
          if (holder[k] < 0)
            holder[k] = p;
        }
  int blamed = count[1] <= count[0] ? 1 : 0;
  const BufferFacts &a = facts.buffers[blamed ? clash : first];
  const BufferFacts &b = facts.buffers[blamed ? first : clash];
  auto [mine, theirs] = bufferDifference(a, b);
  VerifyFailure f = failureAt(FailureKind::OperandMismatch, holder[blamed], -1);
  f.otherRank = plans[holder[1 - blamed]].rank;
  f.tensor = a.tensor >= 0 ? std::string(text(a.tensor)) : "";
  f.message = "rank " + std::to_string(plans[holder[blamed]].rank) +
              ": buffer " + describeBuffer(a) + " has " + mine + ", but rank " +
              std::to_string(f.otherRank) + " describes the same buffer with " +
              theirs + " (" + std::to_string(count[1 - blamed]) + " ranks to " +
              std::to_string(count[blamed]) + ")";
  return f;
}

std::optional<VerifyFailure> Verifier::checkParameters() {
  // Every piece of a parameter is one tensor: the same tensor_id (stochastic
  // rounding keys its bits with it), shape, dtype and layout on every rank
  // that holds a piece, and a tensor_id names one tensor.
  struct Holder {
    int32_t buffer = -1; ///< set buffer index
    int32_t plan = -1;
  };
  std::unordered_map<int32_t, Holder> byTensor;
  std::unordered_map<int64_t, Holder> byId;
  std::vector<uint8_t> seenBuffer(facts.buffers.size(), 0);
  for (int32_t p : order) {
    const PlanFacts &pf = factsOf(p);
    for (size_t b = 0; b < pf.buffers.size(); ++b) {
      int32_t sb = pf.buffers[b];
      const BufferFacts &x = facts.buffers[sb];
      if (x.kind != BufferKind::ParamShard || seenBuffer[sb])
        continue;
      seenBuffer[sb] = 1;
      auto [it, fresh] = byTensor.emplace(x.tensor, Holder{sb, p});
      const BufferFacts &y = facts.buffers[it->second.buffer];
      std::pair<std::string, std::string> diff;
      if (!fresh && (x.tensorId != y.tensorId || x.dtype != y.dtype ||
                     x.globalShape != y.globalShape || x.layout != y.layout))
        diff = bufferDifference(x, y);
      int32_t q = it->second.plan;
      if (diff.first.empty() && x.tensorId) {
        auto [jt, freshId] = byId.emplace(*x.tensorId, Holder{sb, p});
        const BufferFacts &z = facts.buffers[jt->second.buffer];
        if (!freshId && z.tensor != x.tensor) {
          diff = {"tensor " + quote(text(x.tensor)),
                  "tensor " + quote(text(z.tensor))};
          q = jt->second.plan;
          VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, -1);
          f.otherRank = plans[q].rank;
          f.tensor = std::string(text(x.tensor));
          f.message = "rank " + std::to_string(plans[p].rank) +
                      ": parameter shard " + describeBuffer(x) +
                      " has tensor_id " + std::to_string(*x.tensorId) +
                      ", but rank " + std::to_string(plans[q].rank) +
                      " gives tensor_id " + std::to_string(*x.tensorId) +
                      " to " + quote(text(z.tensor)) +
                      ": a tensor_id names one parameter (stochastic "
                      "rounding and checkpoints key by it)";
          return f;
        }
      }
      if (diff.first.empty())
        continue;
      VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, -1);
      f.otherRank = plans[q].rank;
      f.tensor = std::string(text(x.tensor));
      f.message = "rank " + std::to_string(plans[p].rank) +
                  ": parameter shard " + describeBuffer(x) + " has " +
                  diff.first + ", but rank " + std::to_string(plans[q].rank) +
                  " holds a piece of the same parameter with " + diff.second;
      return f;
    }
  }

  // Every parameter shard of a rank that updates parameters is updated
  // exactly once, from its own gradient and optimizer state, fully reduced,
  // by the same optimizer record on every rank that holds a piece of it.
  std::unordered_map<int32_t, std::pair<int32_t, int64_t>>
      recordOf; // tensor -> (plan, instruction)
  std::vector<int32_t> updatedBy;
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const PlanFacts &pf = factsOf(p);
    updatedBy.assign(pf.buffers.size(), -1);
    bool updates = false;
    for (size_t i = 0; i < plan.program.size(); ++i) {
      if (plan.program[i].op != OpKind::OptimizerUpdate)
        continue;
      updates = true;
      int64_t ii = static_cast<int64_t>(i);
      int32_t start = pf.operandStart[i];
      for (int32_t k = 0; k + 3 < pf.inputCount[i]; k += 4) {
        int32_t lp = pf.operands[start + k];
        if (lp < 0)
          continue;
        const BufferFacts &param = bufferOf(p, lp);
        static constexpr const char *kRole[] = {"parameter", "gradient",
                                                "exp_avg", "exp_avg_sq"};
        static constexpr BufferKind kKind[] = {
            BufferKind::ParamShard, BufferKind::Gradient,
            BufferKind::OptimizerState, BufferKind::OptimizerState};
        for (int32_t r = 1; r < 4; ++r) {
          int32_t lb = pf.operands[start + k + r];
          if (lb < 0)
            continue;
          const BufferFacts &x = bufferOf(p, lb);
          if (x.tensor == param.tensor && x.kind == kKind[r])
            continue;
          VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, ii);
          f.tensor = std::string(text(param.tensor));
          f.message = "rank " + std::to_string(plan.rank) + " " +
                      whereLabeled(p, ii) + ": updates " +
                      describeBuffer(param) + " with " + kRole[r] + " " +
                      describeBuffer(x) + ", which is not the " + kRole[r] +
                      " (" + std::string(bufferKindName(kKind[r])) + ") of " +
                      quote(text(param.tensor));
          return f;
        }
        if (param.kind != kKind[0])
          continue; // validatePlan requires a param_shard
        if (updatedBy[lp] >= 0) {
          VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, ii);
          f.tensor = std::string(text(param.tensor));
          f.message = "rank " + std::to_string(plan.rank) + " " +
                      whereLabeled(p, ii) + ": updates " +
                      describeBuffer(param) + " a second time (also " +
                      whereLabeled(p, updatedBy[lp]) +
                      "); each parameter shard is updated once per step";
          return f;
        }
        if (pf.operands[start + k + 2] == pf.operands[start + k + 3]) {
          VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, ii);
          f.tensor = std::string(text(param.tensor));
          f.message = "rank " + std::to_string(plan.rank) + " " +
                      whereLabeled(p, ii) + ": updates " +
                      quote(text(param.id)) + " with one buffer " +
                      describeBuffer(bufferOf(p, pf.operands[start + k + 2])) +
                      " as both exp_avg and exp_avg_sq";
          return f;
        }
        updatedBy[lp] = static_cast<int32_t>(i);
        // The gradient the update reads must be reduced over every axis.
        int32_t lg = pf.operands[start + k + 1];
        if (lg >= 0) {
          const BufferFacts &grad = bufferOf(p, lg);
          const Layout *l = layoutOf(grad.layout);
          if (l && !l->partial.empty()) {
            VerifyFailure f = failureAt(FailureKind::Reduction, p, ii);
            f.tensor = std::string(text(param.tensor));
            f.message = "rank " + std::to_string(plan.rank) + " " +
                        whereLabeled(p, ii) + ": updates " +
                        quote(text(param.id)) + " from gradient " +
                        describeBuffer(grad) +
                        ", which is still partial: every partial axis must "
                        "be reduced before the optimizer reads it";
            return f;
          }
        }
        auto [it, fresh] = recordOf.emplace(param.tensor, std::pair(p, ii));
        int32_t q = it->second.first;
        if (!fresh) {
          // The same roles on every rank: a rank whose exp_avg is another
          // rank's exp_avg_sq updates with the moments exchanged.
          const PlanFacts &qf = factsOf(q);
          int64_t qi = it->second.second;
          for (int32_t r = 1; r < 4; ++r) {
            int32_t qb = -1;
            for (int32_t qk = 0; qk + 3 < qf.inputCount[qi]; qk += 4) {
              int32_t qp = qf.operands[qf.operandStart[qi] + qk];
              if (qp >= 0 && bufferOf(q, qp).tensor == param.tensor)
                qb = qf.operands[qf.operandStart[qi] + qk + r];
            }
            int32_t lb = pf.operands[start + k + r];
            if (qb < 0 || lb < 0 || bufferOf(q, qb).id == bufferOf(p, lb).id)
              continue;
            VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, ii);
            f.otherRank = plans[q].rank;
            f.tensor = std::string(text(param.tensor));
            f.message = "rank " + std::to_string(plan.rank) + " " +
                        whereLabeled(p, ii) + ": updates its piece of " +
                        quote(text(param.tensor)) + " with " + kRole[r] + " " +
                        quote(text(bufferOf(p, lb).id)) + ", but rank " +
                        std::to_string(plans[q].rank) + " " +
                        whereLabeled(q, qi) + " uses " +
                        quote(text(bufferOf(q, qb).id)) + " as its " + kRole[r];
            return f;
          }
        }
        if (fresh || factsOf(q).optimizer == pf.optimizer)
          continue;
        const OptimizerConfig &mine = facts.optimizers[pf.optimizer];
        const OptimizerConfig &theirs = facts.optimizers[factsOf(q).optimizer];
        auto a = optimizerFields(mine), b = optimizerFields(theirs);
        std::map<std::string, std::pair<std::string, std::string>> fields;
        for (auto &[key, v] : a)
          fields[key].first = v;
        for (auto &[key, v] : b)
          fields[key].second = v;
        std::string differs;
        for (auto &[key, v] : fields)
          if (v.first != v.second)
            differs += std::string(differs.empty() ? "" : ", ") + key + " " +
                       (v.first.empty() ? "absent" : v.first) + " vs " +
                       (v.second.empty() ? "absent" : v.second);
        VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, ii);
        f.otherRank = plans[q].rank;
        f.tensor = std::string(text(param.tensor));
        f.message =
            "rank " + std::to_string(plan.rank) + " " + whereLabeled(p, ii) +
            ": updates its piece of " + quote(text(param.tensor)) +
            " with another optimizer record than rank " +
            std::to_string(plans[q].rank) + " " +
            whereLabeled(q, it->second.second) + " updates its piece: " +
            (differs.empty() ? std::string("(records differ)") : differs) +
            " (rank " + std::to_string(plan.rank) + " vs rank " +
            std::to_string(plans[q].rank) + ")";
        return f;
      }
    }
    if (!updates)
      continue;
    for (size_t b = 0; b < pf.buffers.size(); ++b) {
      const BufferFacts &x = bufferOf(p, static_cast<int32_t>(b));
      if (x.kind != BufferKind::ParamShard || updatedBy[b] >= 0)
        continue;
      VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, -1);
      f.tensor = std::string(text(x.tensor));
      f.message = "rank " + std::to_string(plan.rank) + ": parameter shard " +
                  describeBuffer(x) +
                  " is never updated, but the rank updates its other "
                  "parameters: every optimizer_update group must cover it";
      return f;
    }
  }
  return std::nullopt;
}

std::optional<VerifyFailure> Verifier::checkReductions() {
  // A reduction over a communicator reduces exactly its axes of the input's
  // pending (partial) axes, with the input's reduce op, and the output
  // keeps the rest pending: then a gradient the optimizer reads with no
  // partial axis left has been reduced over each axis exactly once.
  auto refsText = [&](const AxisRefList &refs) {
    std::string s;
    for (const AxisRef &r : refs)
      s += (s.empty() ? "" : ",") + formatAxisRef(*mesh, r);
    return "{" + s + "}";
  };
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const RankInfo &ri = info[p];
    const PlanFacts &pf = factsOf(p);
    for (size_t i = 0; i < plan.program.size(); ++i) {
      const Instruction &in = plan.program[i];
      if (!isReduction(in.op) || ri.localComm[i] < 0)
        continue;
      int64_t ii = static_cast<int64_t>(i);
      const AxisRefList *axes = refsOf(ri.globalComm[ri.localComm[i]]);
      if (!axes)
        continue; // a group not derived from axes: nothing to compare
      int32_t nin = pf.inputCount[i];
      int32_t nout = pf.operandStart[i + 1] - pf.operandStart[i] - nin;
      for (int32_t k = 0; k < nin && k < nout; ++k) {
        int32_t li = pf.operands[pf.operandStart[i] + k];
        int32_t lo = pf.operands[pf.operandStart[i] + nin + k];
        if (li < 0 || lo < 0)
          continue;
        const BufferFacts &a = bufferOf(p, li), &b = bufferOf(p, lo);
        const Layout *la = layoutOf(a.layout), *lb = layoutOf(b.layout);
        if (!la || !lb)
          continue;
        std::string problem;
        AxisRefList left;
        for (const AxisRef &r : la->partial)
          if (std::find(axes->begin(), axes->end(), r) == axes->end())
            left.push_back(r);
        for (const AxisRef &r : *axes)
          if (std::find(la->partial.begin(), la->partial.end(), r) ==
              la->partial.end()) {
            problem = "its input " + describeBuffer(a) +
                      " is not partial over " + formatAxisRef(*mesh, r) +
                      " (a reduction over an axis the input is not partial "
                      "over counts that axis's contribution again)";
            break;
          }
        if (problem.empty() && !la->partial.empty() &&
            la->reduceOp != *in.reduce)
          problem = "it reduces with " + std::string(reduceOpName(*in.reduce)) +
                    ", but its input " + describeBuffer(a) + " is partial(" +
                    std::string(reduceOpName(la->reduceOp)) + ")";
        if (problem.empty()) {
          AxisRefList got = lb->partial, want = left;
          std::sort(got.begin(), got.end());
          std::sort(want.begin(), want.end());
          if (got != want)
            problem = "its output " + describeBuffer(b) + " leaves partial " +
                      refsText(lb->partial) + ", but reducing " +
                      refsText(*axes) + " of the input's " +
                      refsText(la->partial) + " leaves " + refsText(left);
        }
        if (problem.empty())
          continue;
        VerifyFailure f = failureAt(FailureKind::Reduction, p, ii);
        f.tensor = a.tensor >= 0 ? std::string(text(a.tensor)) : "";
        f.message = "rank " + std::to_string(plan.rank) + " " +
                    whereLabeled(p, ii) + ": " +
                    std::string(opKindName(in.op)) + " over " +
                    refsText(*axes) + " on " + quote(in.comm) + ": " + problem;
        return f;
      }
    }
  }
  return std::nullopt;
}

std::optional<VerifyFailure> Verifier::checkMicrobatches() {
  // Every unit's callback runs each microbatch exactly once per phase on
  // every rank that runs the unit, and every rank runs the same number of
  // microbatches: a microbatch run twice is accumulated twice, one never
  // run is missing from the mean.
  // The step's microbatch count: what most ranks run (a rank that runs a
  // microbatch beyond it is blamed, not every rank that lacks it).
  std::map<int64_t, std::pair<int64_t, int32_t>> countOf; // M -> (ranks, first)
  for (int32_t p : order) {
    const PlanFacts &pf = factsOf(p);
    int64_t m = 0;
    for (size_t i = 0; i < pf.phase.size(); ++i)
      if (pf.phase[i] != Phase::None)
        m = std::max(m, pf.microbatch[i] + 1);
    if (m == 0)
      continue;
    auto [it, fresh] = countOf.try_emplace(m, 0, p);
    ++it->second.first;
  }
  if (countOf.empty())
    return std::nullopt;
  int64_t microbatches = 0, most = 0;
  int32_t widest = -1;
  for (auto &[m, n] : countOf)
    if (n.first > most) {
      most = n.first;
      microbatches = m;
      widest = n.second;
    }
  for (int32_t p : order) {
    const PlanFacts &pf = factsOf(p);
    for (size_t i = 0; i < pf.phase.size(); ++i) {
      if (pf.phase[i] == Phase::None || pf.microbatch[i] < microbatches)
        continue;
      int64_t ii = static_cast<int64_t>(i);
      VerifyFailure f = failureAt(FailureKind::Microbatch, p, ii);
      f.otherRank = plans[widest].rank;
      f.message =
          "rank " + std::to_string(plans[p].rank) + " " + whereLabeled(p, ii) +
          ": " + std::string(phaseName(pf.phase[i])) + " of unit " +
          quote(text(pf.unit[i])) + " runs microbatch " +
          std::to_string(pf.microbatch[i]) + ", but the step has " +
          std::to_string(microbatches) + " microbatches (" +
          std::to_string(most) + " ranks, e.g. rank " +
          std::to_string(plans[widest].rank) + ", run microbatches 0.." +
          std::to_string(microbatches - 1) + ")";
      return f;
    }
  }
  // Per (unit, phase): microbatch -> its instruction (a map: microbatch
  // numbers are untrusted and may be huge).
  std::map<std::pair<int32_t, Phase>, std::map<int64_t, int32_t>> runs;
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const PlanFacts &pf = factsOf(p);
    runs.clear();
    for (size_t i = 0; i < pf.phase.size(); ++i) {
      if (pf.phase[i] == Phase::None)
        continue;
      int64_t mb = pf.microbatch[i];
      auto [it, fresh] =
          runs[{pf.unit[i], pf.phase[i]}].emplace(mb, static_cast<int32_t>(i));
      if (fresh)
        continue;
      int64_t ii = static_cast<int64_t>(i);
      VerifyFailure f = failureAt(FailureKind::Microbatch, p, ii);
      f.message =
          "rank " + std::to_string(plan.rank) + " " + whereLabeled(p, ii) +
          ": " + std::string(phaseName(pf.phase[i])) + " of unit " +
          quote(text(pf.unit[i])) + " runs microbatch " + std::to_string(mb) +
          " again (also " + whereLabeled(p, it->second) + "); each runs once";
      return f;
    }
    // A backward of a microbatch follows its forward (zbv's
    // backward_weight its backward_input) in program order: it reads what
    // the forward left.
    for (auto &[key, at] : runs) {
      Phase before = key.second == Phase::BackwardWeight &&
                             runs.count({key.first, Phase::BackwardInput})
                         ? Phase::BackwardInput
                         : Phase::Forward;
      if (key.second == Phase::Forward)
        continue;
      auto pred = runs.find({key.first, before});
      if (pred == runs.end())
        continue;
      for (auto &[mb, index] : at) {
        auto it = pred->second.find(mb);
        if (it == pred->second.end() || it->second < index)
          continue;
        VerifyFailure f = failureAt(FailureKind::Microbatch, p, index);
        f.message =
            "rank " + std::to_string(plan.rank) + " " + whereLabeled(p, index) +
            ": " + std::string(phaseName(key.second)) + " of unit " +
            quote(text(key.first)) + " microbatch " + std::to_string(mb) +
            " runs before its " + std::string(phaseName(before)) + " " +
            whereLabeled(p, it->second);
        return f;
      }
    }
    for (auto &[key, at] : runs) {
      if (static_cast<int64_t>(at.size()) == microbatches)
        continue; // distinct, each < microbatches: all of them
      int64_t missing = 0;
      for (auto &[mb, index] : at) {
        if (mb != missing)
          break;
        ++missing;
      }
      int32_t any = at.begin()->second;
      VerifyFailure f = failureAt(FailureKind::Microbatch, p, any);
      f.otherRank = plans[widest].rank;
      f.message = "rank " + std::to_string(plan.rank) + ": " +
                  std::string(phaseName(key.second)) + " of unit " +
                  quote(text(key.first)) + " never runs microbatch " +
                  std::to_string(missing) + " (it runs " +
                  std::to_string(at.size()) + ", e.g. " + whereLabeled(p, any) +
                  "), but the step has " + std::to_string(microbatches) +
                  " microbatches (rank " + std::to_string(plans[widest].rank) +
                  " runs microbatch " + std::to_string(microbatches - 1) + ")";
      return f;
    }
  }
  return std::nullopt;
}

/// Whether instruction i of plan p reads a parameter of `tensor`: its
/// shard, its gathered copy, or a cast or float8 copy (scratch).
static bool readsParameter(const PlanSetFacts &facts, const PlanFacts &pf,
                           size_t i, int32_t tensor) {
  for (int32_t o = pf.operandStart[i];
       o < pf.operandStart[i] + pf.inputCount[i]; ++o) {
    if (pf.operands[o] < 0)
      continue;
    const BufferFacts &b = facts.buffers[pf.buffers[pf.operands[o]]];
    if ((b.tensor == tensor || (tensor == -2 && b.tensor >= 0)) &&
        (b.kind == BufferKind::Gathered || b.kind == BufferKind::ParamShard ||
         b.kind == BufferKind::Scratch))
      return true;
  }
  return false;
}

std::optional<VerifyFailure> Verifier::checkComputeOrder() {
  // The trainer owns the activations between units, so the order of the
  // callbacks is part of the step: every rank that runs the same callbacks
  // (a pipeline stage's ranks, or every rank without a pipeline) runs them
  // in the same order. Ranks are grouped by the multiset of their
  // (unit, phase, microbatch) calls; within a group the order most ranks
  // use is the reference.
  auto callHash = [&](const PlanFacts &pf, size_t i) {
    uint64_t h = static_cast<uint64_t>(pf.unit[i]) * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(pf.phase[i]) + 1) * 0xBF58476D1CE4E5B9ull;
    h ^= static_cast<uint64_t>(pf.microbatch[i]) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
  };
  struct Seq {
    uint64_t set = 0, ordered = 0;
  };
  std::vector<Seq> seqs(plans.size());
  for (int32_t p : order) {
    const PlanFacts &pf = factsOf(p);
    for (size_t i = 0; i < pf.phase.size(); ++i) {
      if (pf.phase[i] == Phase::None)
        continue;
      uint64_t h = callHash(pf, i);
      seqs[p].set += h;
      seqs[p].ordered = (seqs[p].ordered ^ h) * 0x100000001B3ull;
    }
  }
  std::map<uint64_t, std::map<uint64_t, std::vector<int32_t>>> groups;
  for (int32_t p : order)
    groups[seqs[p].set][seqs[p].ordered].push_back(p);
  for (auto &[set, orders] : groups) {
    if (orders.size() < 2)
      continue;
    const std::vector<int32_t> *major = nullptr;
    for (auto &[h, ranks] : orders)
      if (!major || ranks.size() > major->size())
        major = &ranks;
    int32_t q = major->front(), p = -1;
    for (auto &[h, ranks] : orders)
      if (&ranks != major &&
          (p < 0 || plans[ranks.front()].rank < plans[p].rank))
        p = ranks.front();
    // The first call where p and q differ.
    const PlanFacts &pf = factsOf(p), &qf = factsOf(q);
    size_t i = 0, j = 0;
    for (;;) {
      while (i < pf.phase.size() && pf.phase[i] == Phase::None)
        ++i;
      while (j < qf.phase.size() && qf.phase[j] == Phase::None)
        ++j;
      if (i >= pf.phase.size() || j >= qf.phase.size())
        break;
      if (callHash(pf, i) != callHash(qf, j))
        break;
      ++i;
      ++j;
    }
    if (i >= pf.phase.size() || j >= qf.phase.size())
      continue; // a hash collision of equal sequences: nothing to report
    int64_t ii = static_cast<int64_t>(i), jj = static_cast<int64_t>(j);
    VerifyFailure f = failureAt(FailureKind::Microbatch, p, ii);
    f.otherRank = plans[q].rank;
    f.message = "rank " + std::to_string(plans[p].rank) + " " +
                whereLabeled(p, ii) + ": calls " +
                std::string(phaseName(pf.phase[i])) + " of unit " +
                quote(text(pf.unit[i])) + " microbatch " +
                std::to_string(pf.microbatch[i]) + " where rank " +
                std::to_string(plans[q].rank) + " " + whereLabeled(q, jj) +
                " calls " + std::string(phaseName(qf.phase[j])) + " of unit " +
                quote(text(qf.unit[j])) + " microbatch " +
                std::to_string(qf.microbatch[j]) + " (" +
                std::to_string(major->size()) +
                " ranks call the same callbacks in that order): the "
                "callbacks pass activations in program order";
    return f;
  }
  return std::nullopt;
}

std::optional<VerifyFailure> Verifier::checkOwnership() {
  auto readsTensor = [&](int32_t p, size_t i, int32_t tensor) {
    return readsParameter(facts, factsOf(p), i, tensor);
  };
  // Parameter shards and optimizer state change only in the optimizer
  // update; a forward writes only activations and scratch, a backward also
  // gradients (zbv's backward_input only the input activation's gradient).
  // A gradient buffer holds either what a backward computes or what a
  // reduction, sum, accumulate or cast made of such a buffer, never both:
  // a backward that also adds into a reduced buffer adds its microbatch to
  // a sum that already holds it (or that the reduction then overwrites).
  std::vector<int32_t> derivedBy;
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const PlanFacts &pf = factsOf(p);
    derivedBy.assign(pf.buffers.size(), -1);
    for (size_t i = 0; i < plan.program.size(); ++i) {
      OpKind op = plan.program[i].op;
      if (op == OpKind::Compute || op == OpKind::OptimizerUpdate)
        continue;
      for (int32_t o = pf.operandStart[i] + pf.inputCount[i];
           o < pf.operandStart[i + 1]; ++o)
        if (pf.operands[o] >= 0 && derivedBy[pf.operands[o]] < 0)
          derivedBy[pf.operands[o]] = static_cast<int32_t>(i);
    }
    for (size_t i = 0; i < plan.program.size(); ++i) {
      OpKind op = plan.program[i].op;
      for (int32_t o = pf.operandStart[i] + pf.inputCount[i];
           o < pf.operandStart[i + 1]; ++o) {
        if (pf.operands[o] < 0)
          continue;
        const BufferFacts &b = bufferOf(p, pf.operands[o]);
        std::string rule;
        bool persistent = b.kind == BufferKind::ParamShard ||
                          b.kind == BufferKind::OptimizerState;
        if (persistent && op != OpKind::OptimizerUpdate)
          rule = std::string(bufferKindName(b.kind)) +
                 " buffers change only in optimizer_update";
        else if (op == OpKind::Compute) {
          // What the callbacks of generated plans write: the runtime hands a
          // callback its gradients and activations, nothing else.
          Phase ph = pf.phase[i];
          bool grad = b.kind == BufferKind::Gradient;
          bool act = b.kind == BufferKind::Activation;
          if (ph == Phase::Forward && !act)
            rule = "a forward writes only activation buffers";
          else if (ph == Phase::BackwardInput && !act)
            rule = "a backward_input writes only activation buffers";
          else if ((ph == Phase::Backward || ph == Phase::BackwardWeight) &&
                   !act && !grad)
            rule = "a backward writes only gradient and activation buffers";
          else if (grad && !readsTensor(p, i, b.tensor) &&
                   readsTensor(p, i, -2))
            // The callback computes the gradients of the parameters it is
            // handed; a gradient of another tensor would be left as is or
            // clobber another reduction's buffer. (A backward that lists no
            // parameter, as hand-written plans may, is not judged.)
            rule = "a backward writes the gradients of the parameters it "
                   "reads, and it reads no parameter of " +
                   quote(text(b.tensor));
          else if (grad && derivedBy[pf.operands[o]] >= 0)
            rule = "a backward writes the gradient it computes, and " +
                   whereLabeled(p, derivedBy[pf.operands[o]]) + " (" +
                   std::string(
                       opKindName(plan.program[derivedBy[pf.operands[o]]].op)) +
                   ") writes this buffer from other gradients";
        }
        if (rule.empty())
          continue;
        int64_t ii = static_cast<int64_t>(i);
        VerifyFailure f = failureAt(FailureKind::Ownership, p, ii);
        f.tensor = b.tensor >= 0 ? std::string(text(b.tensor)) : "";
        std::string what =
            op == OpKind::Compute
                ? std::string(phaseName(pf.phase[i])) + " compute"
                : std::string(opKindName(op));
        f.message = "rank " + std::to_string(plan.rank) + " " +
                    whereLabeled(p, ii) + ": " + what + " writes " +
                    describeBuffer(b) + ", but " + rule;
        return f;
      }
    }
  }
  return std::nullopt;
}

std::optional<VerifyFailure> Verifier::checkLifetimes() {
  // In program order a buffer that is not persistent (parameter shards and
  // optimizer state are) holds nothing until an instruction writes it, and
  // nothing again from its free until it is written again (a re-gather).
  // Reading it then reads zeros, stale data or memory the runtime handed to
  // another buffer: a gather whose output an edit dropped would feed the
  // forward whatever the buffer held. And since streams run concurrently,
  // program order must also be run order for each buffer: a read follows
  // the write it reads, and a free or the next write follows every access
  // to the value before it, through stream order and deps (happens-before,
  // by vector clocks over the rank's streams).
  enum : uint8_t { Unwritten, Written, Freed };
  std::vector<uint8_t> state;
  std::vector<int32_t> freedAt, lastWrite, streamOf, posOf, clock, indeg, queue,
      outStart, out;
  // Per buffer and stream: the last read since the buffer's last write
  // (earlier reads on the stream run before it).
  std::vector<int32_t> reads;
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const RankInfo &ri = info[p];
    const PlanFacts &pf = factsOf(p);
    int32_t n = static_cast<int32_t>(plan.program.size());
    size_t S = std::max<size_t>(plan.streams.size(), 1);
    // Stream index and position of each instruction.
    streamOf.assign(n, 0);
    posOf.assign(n, 0);
    {
      std::unordered_map<std::string_view, int32_t> streamIds;
      for (size_t k = 0; k < plan.streams.size(); ++k)
        streamIds.emplace(plan.streams[k], static_cast<int32_t>(k));
      std::vector<int32_t> count(S, 0);
      for (int32_t i = 0; i < n; ++i) {
        auto it = streamIds.find(plan.program[i].stream);
        streamOf[i] = it == streamIds.end() ? 0 : it->second;
        posOf[i] = count[streamOf[i]]++;
      }
    }
    // Vector clocks in a topological order (the set has no cycle by now).
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
    out.assign(outStart[n], 0);
    {
      std::vector<int32_t> fill(outStart.begin(), outStart.end() - 1);
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
    clock.assign(static_cast<size_t>(n) * S, -1);
    queue.clear();
    for (int32_t i = 0; i < n; ++i)
      if (indeg[i] == 0)
        queue.push_back(i);
    for (size_t q = 0; q < queue.size(); ++q) {
      int32_t i = queue[q];
      int32_t *ci = &clock[static_cast<size_t>(i) * S];
      ci[streamOf[i]] = std::max(ci[streamOf[i]], posOf[i]);
      for (int32_t e = outStart[i]; e < outStart[i + 1]; ++e) {
        int32_t j = out[e];
        int32_t *cj = &clock[static_cast<size_t>(j) * S];
        for (size_t k = 0; k < S; ++k)
          cj[k] = std::max(cj[k], ci[k]);
        if (--indeg[j] == 0)
          queue.push_back(j);
      }
    }
    // a completes before b starts.
    auto before = [&](int32_t a, int32_t b) {
      return a == b ||
             clock[static_cast<size_t>(b) * S + streamOf[a]] >= posOf[a];
    };

    state.assign(pf.buffers.size(), Unwritten);
    freedAt.assign(pf.buffers.size(), -1);
    lastWrite.assign(pf.buffers.size(), -1);
    reads.assign(pf.buffers.size() * S, -1);
    for (size_t b = 0; b < pf.buffers.size(); ++b) {
      BufferKind k = bufferOf(p, static_cast<int32_t>(b)).kind;
      if (k == BufferKind::ParamShard || k == BufferKind::OptimizerState)
        state[b] = Written;
    }
    auto unordered = [&](int32_t i, int32_t j, int32_t b,
                         const std::string &what, const char *theirs) {
      int64_t ii = static_cast<int64_t>(i);
      const BufferFacts &x = bufferOf(p, b);
      VerifyFailure f = failureAt(FailureKind::Lifetime, p, ii);
      f.tensor = x.tensor >= 0 ? std::string(text(x.tensor)) : "";
      f.message =
          "rank " + std::to_string(plan.rank) + " " + whereLabeled(p, ii) +
          " (stream " + quote(plan.program[i].stream) + ") " + what + " " +
          describeBuffer(x) + ", but nothing orders it after " +
          whereLabeled(p, j) + " (stream " + quote(plan.program[j].stream) +
          "), which comes first in program order and " + theirs +
          " it: add a dep (streams run concurrently)";
      return f;
    };
    for (int32_t i = 0; i < n; ++i) {
      int32_t start = pf.operandStart[i], mid = start + pf.inputCount[i],
              end = pf.operandStart[i + 1];
      if (plan.program[i].op == OpKind::Free) {
        for (int32_t o = start; o < mid; ++o) {
          int32_t b = pf.operands[o];
          if (b < 0)
            continue;
          if (lastWrite[b] >= 0 && !before(lastWrite[b], i))
            return unordered(i, lastWrite[b], b, "frees", "writes");
          for (size_t k = 0; k < S; ++k) {
            int32_t r = reads[b * S + k];
            if (r >= 0 && !before(r, i))
              return unordered(i, r, b, "frees", "reads");
            reads[b * S + k] = -1;
          }
          state[b] = Freed;
          freedAt[b] = i;
        }
        continue;
      }
      for (int32_t o = start; o < mid; ++o) {
        int32_t b = pf.operands[o];
        if (b < 0)
          continue;
        if (state[b] == Written) {
          if (lastWrite[b] >= 0 && !before(lastWrite[b], i))
            return unordered(i, lastWrite[b], b, "reads", "writes");
          reads[b * S + streamOf[i]] = i;
          continue;
        }
        int64_t ii = static_cast<int64_t>(i);
        const BufferFacts &x = bufferOf(p, b);
        VerifyFailure f = failureAt(FailureKind::Lifetime, p, ii);
        f.tensor = x.tensor >= 0 ? std::string(text(x.tensor)) : "";
        f.message = "rank " + std::to_string(plan.rank) + " " +
                    whereLabeled(p, ii) + ": reads " + describeBuffer(x) +
                    (state[b] == Freed
                         ? " after " + whereLabeled(p, freedAt[b]) +
                               " freed it, and no instruction writes it in "
                               "between"
                         : " before any instruction writes it");
        return f;
      }
      for (int32_t o = mid; o < end; ++o) {
        int32_t b = pf.operands[o];
        if (b < 0)
          continue;
        if (state[b] == Freed && !before(freedAt[b], i))
          return unordered(i, freedAt[b], b, "writes", "frees");
        for (size_t k = 0; k < S; ++k) {
          int32_t r = reads[b * S + k];
          if (r >= 0 && !before(r, i))
            return unordered(i, r, b, "writes", "reads");
          reads[b * S + k] = -1;
        }
        state[b] = Written;
        lastWrite[b] = i;
      }
    }
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
  if (auto f = checkMicrobatches())
    return f;
  if (auto f = checkComputeOrder())
    return f;
  if (auto f = checkOwnership())
    return f;
  return checkLifetimes();
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

} // namespace

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
