//===- VerifyCollectives.cpp - Matching collectives across ranks ---------===//
//
// The Verifier's checks (a)-(c): communicators built from every rank's
// definitions, collective sequences matched per communicator, sends paired
// with receives, and deadlock: cycles among streams and the simulation of
// every rank's program (Verifier.h).
//
//===----------------------------------------------------------------------===//

#include "Verifier.h"

namespace meshplan::plan::verifier {

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
        auto [mine, theirs] = firstCollectiveDifference(*bi, *oi);
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
  std::vector<int32_t> queue;
  Successors g;
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const RankInfo &ri = info[p];
    int32_t n = static_cast<int32_t>(plan.program.size());
    g.build(ri, n);
    std::vector<int32_t> &indeg = g.indeg;
    const std::vector<int32_t> &outStart = g.outStart, &out = g.out;
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
  RunGraph graph;
  buildRunGraph(graph);
  if (runSimulation(graph) == totalInstructions)
    return std::nullopt;
  return deadlockReport(graph);
}

void Verifier::buildRunGraph(RunGraph &graph) const {
  // Global instruction g = info[p].base + i. Edges: stream order, transfer
  // order on a communicator, deps; a collective also waits for the previous
  // one on its communicator to be issued (counted in pending, released in
  // runSimulation).
  int64_t total = totalInstructions;
  std::vector<int32_t> &pending = graph.pending, &planOf = graph.planOf;
  std::vector<int64_t> &outStart = graph.outStart, &out = graph.out;
  pending.assign(total, 0);
  graph.state.assign(total, 0);
  outStart.assign(total + 1, 0);
  planOf.assign(total, 0);
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
}

int64_t Verifier::runSimulation(RunGraph &graph) const {
  int64_t total = totalInstructions;
  std::vector<int32_t> &pending = graph.pending;
  std::vector<uint8_t> &state = graph.state;
  const std::vector<int32_t> &planOf = graph.planOf;
  const std::vector<int64_t> &outStart = graph.outStart, &out = graph.out;
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
  return done;
}

VerifyFailure Verifier::deadlockReport(const RunGraph &graph) const {
  const std::vector<uint8_t> &state = graph.state;
  const std::vector<int32_t> &planOf = graph.planOf;
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

} // namespace meshplan::plan::verifier
