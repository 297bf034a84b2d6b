//===- VerifyFacts.cpp - What a plan set computes, from its PlanFacts ----===//
//
// The Verifier's check (d): operands, transfers, buffers, parameters,
// reductions, microbatches, compute order, ownership and lifetimes, read
// from the plans' PlanFacts (Verifier.h).
//
//===----------------------------------------------------------------------===//

#include "Verifier.h"

namespace meshplan::plan::verifier {

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
  if (auto f = checkParameterPieces())
    return f;
  return checkParameterUpdates();
}

std::optional<VerifyFailure> Verifier::checkParameterPieces() {
  // Every piece of a parameter is one tensor: the same tensor_id (stochastic
  // rounding keys its bits with it), shape, dtype and layout on every rank
  // that holds a piece, and a tensor_id names one tensor.
  struct Holder {
    int32_t buffer = -1; ///< set buffer index
    int32_t plan = -1;
  };
  std::vector<Holder> byTensor(facts.strings.size() + 1);
  std::unordered_map<int64_t, Holder> byId;
  std::vector<uint8_t> seenBuffer(facts.buffers.size(), 0);
  for (int32_t p : order) {
    for (int32_t sb : factsOf(p).buffers) {
      const BufferFacts &x = facts.buffers[sb];
      if (x.kind != BufferKind::ParamShard || seenBuffer[sb])
        continue;
      seenBuffer[sb] = 1;
      Holder &first = byTensor[x.tensor + 1]; // no tensor: slot 0
      if (first.buffer < 0)
        first = Holder{sb, p};
      const BufferFacts &y = facts.buffers[first.buffer];
      std::pair<std::string, std::string> diff;
      if (x.tensorId != y.tensorId || x.dtype != y.dtype ||
          x.globalShape != y.globalShape || x.layout != y.layout)
        diff = bufferDifference(x, y);
      int32_t q = first.plan;
      if (diff.first.empty() && x.tensorId) {
        auto [jt, freshId] = byId.try_emplace(*x.tensorId, Holder{sb, p});
        const BufferFacts &z = facts.buffers[jt->second.buffer];
        if (!freshId && z.tensor != x.tensor) {
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
  return std::nullopt;
}

namespace {
constexpr const char *kRole[] = {"parameter", "gradient", "exp_avg",
                                 "exp_avg_sq"};
constexpr BufferKind kRoleKind[] = {
    BufferKind::ParamShard, BufferKind::Gradient, BufferKind::OptimizerState,
    BufferKind::OptimizerState};
} // namespace

std::optional<VerifyFailure> Verifier::checkParameterUpdates() {
  // Every parameter shard of a rank that updates parameters is updated
  // exactly once, from its own gradient and optimizer state, fully reduced,
  // by the same optimizer record on every rank that holds a piece of it.
  UpdateState state;
  state.recordOf.assign(facts.strings.size() + 1, {-1, -1});
  for (int32_t p : order) {
    const Plan &plan = plans[p];
    const PlanFacts &pf = factsOf(p);
    state.updatedBy.assign(pf.buffers.size(), -1);
    bool updates = false;
    for (size_t i = 0; i < plan.program.size(); ++i) {
      if (plan.program[i].op != OpKind::OptimizerUpdate)
        continue;
      updates = true;
      for (int32_t k = 0; k + 3 < pf.inputCount[i]; k += 4)
        if (auto f = checkUpdateGroup(p, static_cast<int64_t>(i), k, state))
          return f;
    }
    if (!updates)
      continue;
    for (size_t b = 0; b < pf.buffers.size(); ++b) {
      const BufferFacts &x = bufferOf(p, static_cast<int32_t>(b));
      if (x.kind != BufferKind::ParamShard || state.updatedBy[b] >= 0)
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

std::optional<VerifyFailure> Verifier::checkUpdateGroup(int32_t p, int64_t ii,
                                                        int32_t k,
                                                        UpdateState &state) {
  // Group k of optimizer_update ii: (param, grad, exp_avg, exp_avg_sq).
  const Plan &plan = plans[p];
  const PlanFacts &pf = factsOf(p);
  int32_t start = pf.operandStart[ii];
  int32_t lp = pf.operands[start + k];
  if (lp < 0)
    return std::nullopt;
  const BufferFacts &param = bufferOf(p, lp);
  auto failure = [&](FailureKind kind, std::string message) {
    VerifyFailure f = failureAt(kind, p, ii);
    f.tensor = std::string(text(param.tensor));
    f.message = "rank " + std::to_string(plan.rank) + " " +
                whereLabeled(p, ii) + ": " + std::move(message);
    return f;
  };
  for (int32_t r = 1; r < 4; ++r) {
    int32_t lb = pf.operands[start + k + r];
    if (lb < 0)
      continue;
    const BufferFacts &x = bufferOf(p, lb);
    if (x.tensor == param.tensor && x.kind == kRoleKind[r])
      continue;
    return failure(FailureKind::ParameterMismatch,
                   "updates " + describeBuffer(param) + " with " + kRole[r] +
                       " " + describeBuffer(x) + ", which is not the " +
                       kRole[r] + " (" +
                       std::string(bufferKindName(kRoleKind[r])) + ") of " +
                       quote(text(param.tensor)));
  }
  if (param.kind != kRoleKind[0])
    return std::nullopt; // validatePlan requires a param_shard
  if (state.updatedBy[lp] >= 0)
    return failure(FailureKind::ParameterMismatch,
                   "updates " + describeBuffer(param) +
                       " a second time (also " +
                       whereLabeled(p, state.updatedBy[lp]) +
                       "); each parameter shard is updated once per step");
  if (pf.operands[start + k + 2] == pf.operands[start + k + 3])
    return failure(FailureKind::ParameterMismatch,
                   "updates " + quote(text(param.id)) + " with one buffer " +
                       describeBuffer(bufferOf(p, pf.operands[start + k + 2])) +
                       " as both exp_avg and exp_avg_sq");
  state.updatedBy[lp] = static_cast<int32_t>(ii);
  // The gradient the update reads must be reduced over every axis.
  int32_t lg = pf.operands[start + k + 1];
  if (lg >= 0) {
    const BufferFacts &grad = bufferOf(p, lg);
    const Layout *l = layoutOf(grad.layout);
    if (l && !l->partial.empty())
      return failure(FailureKind::Reduction,
                     "updates " + quote(text(param.id)) + " from gradient " +
                         describeBuffer(grad) +
                         ", which is still partial: every partial axis must "
                         "be reduced before the optimizer reads it");
  }
  auto &record = state.recordOf[param.tensor + 1];
  if (record.first < 0) {
    record = {p, ii};
    return std::nullopt;
  }
  if (auto f = compareUpdateRoles(p, ii, k, record.first, record.second))
    return f;
  if (factsOf(record.first).optimizer == pf.optimizer)
    return std::nullopt;
  return optimizerDifference(p, ii, param.tensor, record.first, record.second);
}

std::optional<VerifyFailure> Verifier::compareUpdateRoles(int32_t p, int64_t ii,
                                                          int32_t k, int32_t q,
                                                          int64_t qi) const {
  // The same roles on every rank: a rank whose exp_avg is another rank's
  // exp_avg_sq updates with the moments exchanged.
  const PlanFacts &pf = factsOf(p), &qf = factsOf(q);
  int32_t start = pf.operandStart[ii];
  int32_t tensor = bufferOf(p, pf.operands[start + k]).tensor;
  for (int32_t r = 1; r < 4; ++r) {
    int32_t qb = -1;
    for (int32_t qk = 0; qk + 3 < qf.inputCount[qi]; qk += 4) {
      int32_t qp = qf.operands[qf.operandStart[qi] + qk];
      if (qp >= 0 && bufferOf(q, qp).tensor == tensor)
        qb = qf.operands[qf.operandStart[qi] + qk + r];
    }
    int32_t lb = pf.operands[start + k + r];
    if (qb < 0 || lb < 0 || bufferOf(q, qb).id == bufferOf(p, lb).id)
      continue;
    VerifyFailure f = failureAt(FailureKind::ParameterMismatch, p, ii);
    f.otherRank = plans[q].rank;
    f.tensor = std::string(text(tensor));
    f.message =
        "rank " + std::to_string(plans[p].rank) + " " + whereLabeled(p, ii) +
        ": updates its piece of " + quote(text(tensor)) + " with " + kRole[r] +
        " " + quote(text(bufferOf(p, lb).id)) + ", but rank " +
        std::to_string(plans[q].rank) + " " + whereLabeled(q, qi) + " uses " +
        quote(text(bufferOf(q, qb).id)) + " as its " + kRole[r];
    return f;
  }
  return std::nullopt;
}

VerifyFailure Verifier::optimizerDifference(int32_t p, int64_t ii,
                                            int32_t tensor, int32_t q,
                                            int64_t qi) const {
  const OptimizerConfig &mine = facts.optimizers[factsOf(p).optimizer];
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
  f.tensor = std::string(text(tensor));
  f.message = "rank " + std::to_string(plans[p].rank) + " " +
              whereLabeled(p, ii) + ": updates its piece of " +
              quote(text(tensor)) +
              " with another optimizer record than rank " +
              std::to_string(plans[q].rank) + " " + whereLabeled(q, qi) +
              " updates its piece: " +
              (differs.empty() ? std::string("(records differ)") : differs) +
              " (rank " + std::to_string(plans[p].rank) + " vs rank " +
              std::to_string(plans[q].rank) + ")";
  return f;
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
  stepMicrobatches = microbatches;
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
  return perRank([&](RankQueue &ranks) {
    std::vector<int32_t> derivedBy;
    for (size_t k; ranks.next(k);) {
      int32_t p = order[k];
      auto f = [&]() -> std::optional<VerifyFailure> {
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
              // What the callbacks of generated plans write: the runtime hands
              // a callback its gradients and activations, nothing else.
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
                       std::string(opKindName(
                           plan.program[derivedBy[pf.operands[o]]].op)) +
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
        return std::nullopt;
      }();
      if (f)
        ranks.fail(k, std::move(*f));
    }
  });
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
  return perRank([&](RankQueue &ranks) {
    enum : uint8_t { Unwritten, Written, Freed };
    std::vector<uint8_t> state;
    std::vector<int32_t> freedAt, lastWrite, posOf, clock, queue, count;
    Successors graph;
    // Per buffer and stream: the last read since the buffer's last write
    // (earlier reads on the stream run before it).
    std::vector<int32_t> reads;
    for (size_t k; ranks.next(k);) {
      int32_t p = order[k];
      auto f = [&]() -> std::optional<VerifyFailure> {
        const Plan &plan = plans[p];
        const RankInfo &ri = info[p];
        const PlanFacts &pf = factsOf(p);
        int32_t n = static_cast<int32_t>(plan.program.size());
        size_t S = std::max<size_t>(plan.streams.size(), 1);
        // Position of each instruction on its stream.
        const std::vector<int32_t> &streamOf = ri.stream;
        posOf.assign(n, 0);
        count.assign(S, 0);
        for (int32_t i = 0; i < n; ++i)
          posOf[i] = count[streamOf[i]]++;
        // Vector clocks in a topological order (the set has no cycle by now).
        graph.build(ri, n);
        std::vector<int32_t> &indeg = graph.indeg;
        const std::vector<int32_t> &outStart = graph.outStart, &out = graph.out;
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
        return std::nullopt;
      }();
      if (f)
        ranks.fail(k, std::move(*f));
    }
  });
}

} // namespace meshplan::plan::verifier
