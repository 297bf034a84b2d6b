//===- VerifyDataflow.cpp - What collectives make of their operands, and
//===- what each gradient holds ------------------------------------------===//
//
// Two of the Verifier's checks of what the step computes (Verifier.h):
// - layout fit: a collective's output layouts are what its op makes of its
//   input layouts over the communicator's axes, as core's applyStep states
//   the step's semantics (called here, never re-derived);
// - accumulation: with gradient accumulation, every gradient the optimizer
//   reads holds each microbatch's contribution exactly once, followed
//   buffer by buffer through the backwards, their carries, the
//   accumulates, casts and reductions of each rank's program.
//
//===----------------------------------------------------------------------===//

#include "Verifier.h"

#include "meshplan/Core/Redistribute.h"

namespace meshplan::plan::verifier {

//===----------------------------------------------------------------------===//
// Layout fit
//===----------------------------------------------------------------------===//

namespace {

std::optional<StepKind> stepKindOf(OpKind op) {
  switch (op) {
  case OpKind::AllGather:
    return StepKind::AllGather;
  case OpKind::ReduceScatter:
    return StepKind::ReduceScatter;
  case OpKind::AllReduce:
    return StepKind::AllReduce;
  case OpKind::AllToAll:
    return StepKind::AllToAll;
  case OpKind::Permute:
    return StepKind::Permute;
  case OpKind::Broadcast:
    return StepKind::Broadcast;
  default:
    return std::nullopt;
  }
}

/// The steps a plan's collective may stand for: a plan names the op and the
/// group, not the dim (nor a permute's target order), so every choice is
/// tried; the op fits when one of them gives the output's layout.
std::vector<StepSpec> candidateSteps(StepKind kind, const AxisRefList &axes,
                                     ReduceOp op, int rank) {
  std::vector<StepSpec> out;
  StepSpec s;
  s.kind = kind;
  s.axes = axes;
  s.op = op;
  switch (kind) {
  case StepKind::AllReduce:
  case StepKind::Broadcast:
    out.push_back(s);
    break;
  case StepKind::AllToAll:
    for (int d = 0; d < rank; ++d)
      for (int e = 0; e < rank; ++e)
        if (d != e) {
          s.dim = d;
          s.dstDim = e;
          out.push_back(s);
        }
    break;
  case StepKind::Permute: {
    AxisRefList order = axes;
    std::sort(order.begin(), order.end());
    int orders = 0;
    do {
      for (int d = 0; d < rank; ++d) {
        s.dim = d;
        s.dstAxes = order;
        out.push_back(s);
      }
    } while (++orders < 120 &&
             std::next_permutation(order.begin(), order.end()));
    break;
  }
  default:
    for (int d = 0; d < rank; ++d) {
      s.dim = d;
      out.push_back(s);
    }
  }
  return out;
}

} // namespace

std::string Verifier::layoutFit(OpKind op, std::optional<ReduceOp> reduce,
                                const AxisRefList &axes, const BufferFacts &a,
                                const BufferFacts &b) {
  std::optional<StepKind> kind = stepKindOf(op);
  const Layout *la = layoutOf(a.layout), *lb = layoutOf(b.layout);
  if (!kind || !la || !lb)
    return ""; // not a step core describes, or a layout not judged here
  if (a.globalShape != b.globalShape)
    return "its output has global shape [" + joinInts(b.globalShape) +
           "], its input [" + joinInts(a.globalShape) + "]";
  View view = View::root(sharedMesh);
  std::optional<Layout> expected;
  std::optional<Error> error;
  for (const StepSpec &s : candidateSteps(
           *kind, axes, reduce.value_or(ReduceOp::Sum), la->rank())) {
    Result<Layout> r = applyStep(view, *la, s, a.globalShape);
    if (!r) {
      if (!error)
        error = r.error();
      continue;
    }
    if (sameShards(view, *r, *lb, a.globalShape))
      return "";
    if (!expected)
      expected = std::move(*r);
  }
  if (expected)
    return "its output layout is not what " + std::string(opKindName(op)) +
           " makes of its input's: core's applyStep gives \"" +
           formatLayout(*mesh, *expected) + "\"";
  return "core's applyStep refuses the step: " +
         (error ? error->message : std::string("no dim to apply it to"));
}

std::optional<VerifyFailure> Verifier::checkLayoutFit() {
  // checkOperands proved that the members of a collective name the same
  // buffers, so each position of each communicator is judged once, at its
  // lowest rank, and each distinct (op, reduce, axes, input, output) once.
  std::map<std::vector<std::string>, int32_t> axesClasses;
  std::vector<int32_t> axesClass(comms.size(), -1);
  for (size_t c = 0; c < comms.size(); ++c)
    axesClass[c] = axesClasses
                       .try_emplace(comms[c].def->axes,
                                    static_cast<int32_t>(axesClasses.size()))
                       .first->second;
  std::map<std::array<int32_t, 5>, std::string> memo;
  std::optional<VerifyFailure> best;
  for (size_t c = 0; c < comms.size(); ++c) {
    const GlobalComm &g = comms[c];
    const AxisRefList *axes = refsOf(static_cast<int32_t>(c));
    if (!axes)
      continue; // a group not derived from axes: nothing to compare
    size_t lowest = 0;
    for (size_t m = 1; m < g.memberPlan.size(); ++m)
      if (plans[g.memberPlan[m]].rank < plans[g.memberPlan[lowest]].rank)
        lowest = m;
    int32_t p = g.memberPlan[lowest];
    const PlanFacts &pf = factsOf(p);
    for (int32_t i : info[p].seqs[g.memberLocal[lowest]]) {
      const Instruction &in = plans[p].program[i];
      int32_t nin = pf.inputCount[i];
      int32_t nout = pf.operandStart[i + 1] - pf.operandStart[i] - nin;
      for (int32_t k = 0; k < nin && k < nout; ++k) {
        int32_t li = pf.operands[pf.operandStart[i] + k];
        int32_t lo = pf.operands[pf.operandStart[i] + nin + k];
        if (li < 0 || lo < 0)
          continue;
        std::array<int32_t, 5> key{
            static_cast<int32_t>(in.op),
            in.reduce ? static_cast<int32_t>(*in.reduce) : -1, axesClass[c],
            pf.buffers[li], pf.buffers[lo]};
        auto [it, fresh] = memo.try_emplace(key);
        if (fresh)
          it->second = layoutFit(in.op, in.reduce, *axes, bufferOf(p, li),
                                 bufferOf(p, lo));
        if (it->second.empty())
          continue;
        const BufferFacts &a = bufferOf(p, li), &b = bufferOf(p, lo);
        VerifyFailure f = failureAt(FailureKind::LayoutFit, p, i);
        f.tensor = a.tensor >= 0 ? std::string(text(a.tensor)) : "";
        std::string axesText;
        for (const AxisRef &r : *axes)
          axesText += (axesText.empty() ? "" : ",") + formatAxisRef(*mesh, r);
        f.message = "rank " + std::to_string(plans[p].rank) + " " +
                    whereLabeled(p, i) + ": " + std::string(opKindName(in.op)) +
                    " over {" + axesText + "} on " + quote(in.comm) +
                    " makes its output " + std::to_string(k) + " " +
                    describeBuffer(b) + " of its input " + std::to_string(k) +
                    " " + describeBuffer(a) + ", but " + it->second;
        if (!best ||
            std::pair(f.rank, f.index) < std::pair(best->rank, best->index))
          best = std::move(f);
        break;
      }
    }
  }
  return best;
}

//===----------------------------------------------------------------------===//
// Accumulation
//===----------------------------------------------------------------------===//

/// Where microbatch `missing`'s gradient of the tensor of gradient buffer
/// `grad` was computed before instruction `at` of plan p, and the first
/// later backward that starts the tensor's gradient from zero (it reads no
/// gradient of the tensor to carry in): "; ... computes it into ..., but
/// ... starts ... from zero: ...", or "".
std::string Verifier::lostMicrobatch(int32_t p, int64_t at, int32_t grad,
                                     int64_t missing) const {
  const PlanFacts &pf = factsOf(p);
  int32_t tensor = bufferOf(p, grad).tensor;
  auto gradientOf = [&](size_t j, bool outputs) {
    int32_t from = pf.operandStart[j] + (outputs ? pf.inputCount[j] : 0);
    int32_t to = outputs ? pf.operandStart[j + 1]
                         : pf.operandStart[j] + pf.inputCount[j];
    for (int32_t o = from; o < to; ++o)
      if (pf.operands[o] >= 0 && bufferOf(p, pf.operands[o]).tensor == tensor &&
          bufferOf(p, pf.operands[o]).kind == BufferKind::Gradient)
        return pf.operands[o];
    return -1;
  };
  std::string lost;
  bool computed = false;
  for (size_t j = 0; j < static_cast<size_t>(at); ++j) {
    if (pf.phase[j] != Phase::Backward && pf.phase[j] != Phase::BackwardWeight)
      continue;
    int32_t out = gradientOf(j, true);
    if (out < 0)
      continue;
    int64_t jj = static_cast<int64_t>(j);
    if (!computed && pf.microbatch[j] == missing) {
      computed = true;
      lost += "; " + whereLabeled(p, jj) + " computes it into " +
              quote(text(bufferOf(p, out).id));
    } else if (computed && gradientOf(j, false) < 0) {
      return lost + ", but " + whereLabeled(p, jj) + " starts " +
             quote(text(bufferOf(p, out).id)) +
             " from zero: it reads no gradient of " + quote(text(tensor)) +
             " to carry in";
    }
  }
  return lost;
}

std::optional<VerifyFailure> Verifier::checkAccumulation() {
  // What each buffer holds, as the backward instructions whose microbatch
  // contributions it sums (a backward adds its microbatch's gradient into
  // its outputs, which start at zero unless it reads a gradient of the same
  // tensor: then the runtime carries that one in). Casts, sums and
  // collectives pass their input's contributions to their output (a
  // reduction sums the members' same contributions), an accumulate adds
  // the addend's to the accumulator's, a free empties a buffer. The
  // lifetime check proved program order to be run order for each buffer.
  // Then each gradient an optimizer_update reads must hold every
  // microbatch of the step exactly once: one added twice is caught where
  // it is added, one missing where the optimizer reads.
  if (stepMicrobatches <= 0)
    return std::nullopt;
  return perRank([&](RankQueue &ranks) {
    struct Part {
      int64_t microbatch;
      int32_t by; ///< the backward that computed it
    };
    std::vector<std::vector<Part>> holds;
    std::vector<uint8_t> known;
    std::vector<int32_t> carried; // by tensor string: the input carried in
    std::vector<Part> scratch;
    auto gradientText = [&](int32_t p, int32_t b) {
      return describeBuffer(bufferOf(p, b));
    };
    for (size_t k; ranks.next(k);) {
      int32_t p = order[k];
      auto f = [&]() -> std::optional<VerifyFailure> {
        const Plan &plan = plans[p];
        const PlanFacts &pf = factsOf(p);
        size_t nb = pf.buffers.size();
        holds.resize(std::max(holds.size(), nb));
        for (size_t b = 0; b < nb; ++b)
          holds[b].clear();
        known.assign(nb, 0);
        auto fail = [&](int64_t i, int32_t b, std::string message) {
          VerifyFailure f = failureAt(FailureKind::Accumulation, p, i);
          const BufferFacts &x = bufferOf(p, b);
          f.tensor = x.tensor >= 0 ? std::string(text(x.tensor)) : "";
          f.message = "rank " + std::to_string(plan.rank) + " " +
                      whereLabeled(p, i) + ": " + std::move(message);
          return f;
        };
        // Adds `parts` into buffer `to` at instruction i (from buffer `from`,
        // or computed there when from < 0).
        auto add = [&](int64_t i, int32_t to, int32_t from,
                       const std::vector<Part> &parts)
            -> std::optional<VerifyFailure> {
          for (const Part &x : parts)
            for (const Part &y : holds[to])
              if (x.microbatch == y.microbatch)
                return fail(
                    i, to,
                    (from < 0
                         ? "adds its gradient of microbatch " +
                               std::to_string(x.microbatch) + " into "
                         : "adds microbatch " + std::to_string(x.microbatch) +
                               " of " + quote(text(bufferOf(p, from).id)) +
                               " (from " + whereLabeled(p, x.by) + ") into ") +
                        gradientText(p, to) +
                        ", which already holds microbatch " +
                        std::to_string(y.microbatch) + " (from " +
                        whereLabeled(p, y.by) +
                        "): each microbatch's gradient is accumulated once");
          holds[to].insert(holds[to].end(), parts.begin(), parts.end());
          known[to] = 1;
          return std::nullopt;
        };
        auto sameLayout = [&](int64_t i, int32_t into, int32_t from,
                              const char *how) -> std::optional<VerifyFailure> {
          const BufferFacts &a = bufferOf(p, into), &b = bufferOf(p, from);
          if (a.layout == b.layout)
            return std::nullopt;
          return fail(i, into,
                      std::string(how) + " " + describeBuffer(b) + " into " +
                          describeBuffer(a) +
                          ": their layouts differ, so the sum would mix values "
                          "reduced over different axes");
        };
        for (size_t ii = 0; ii < plan.program.size(); ++ii) {
          int64_t i = static_cast<int64_t>(ii);
          OpKind op = plan.program[ii].op;
          int32_t start = pf.operandStart[ii], nin = pf.inputCount[ii];
          int32_t nout = pf.operandStart[ii + 1] - start - nin;
          const int32_t *ins = pf.operands.data() + start;
          const int32_t *outs = ins + nin;
          switch (op) {
          case OpKind::Compute: {
            Phase ph = pf.phase[ii];
            if (ph != Phase::Backward && ph != Phase::BackwardWeight)
              break;
            // The runtime carries the last gradient input of a tensor into the
            // output of that tensor.
            carried.resize(std::max(carried.size(), facts.strings.size()), -1);
            for (int32_t k = 0; k < nin; ++k)
              if (ins[k] >= 0 &&
                  bufferOf(p, ins[k]).kind == BufferKind::Gradient &&
                  bufferOf(p, ins[k]).tensor >= 0)
                carried[bufferOf(p, ins[k]).tensor] = ins[k];
            for (int32_t k = 0; k < nout; ++k) {
              int32_t o = outs[k];
              if (o < 0)
                continue;
              const BufferFacts &x = bufferOf(p, o);
              if (x.kind != BufferKind::Gradient || x.tensor < 0)
                continue;
              int32_t from = carried[x.tensor];
              if (from >= 0 && from != o) {
                if (auto f = sameLayout(i, o, from, "carries"))
                  return f;
                holds[o] = holds[from];
                known[o] = known[from];
              } else if (from < 0) {
                holds[o].clear();
              }
              scratch.assign(1,
                             Part{pf.microbatch[ii], static_cast<int32_t>(i)});
              if (auto f = add(i, o, -1, scratch))
                return f;
            }
            for (int32_t k = 0; k < nin; ++k)
              if (ins[k] >= 0 && bufferOf(p, ins[k]).tensor >= 0)
                carried[bufferOf(p, ins[k]).tensor] = -1;
            break;
          }
          case OpKind::Accumulate:
            for (int32_t k = 0; k < nout && 2 * k + 1 < nin; ++k) {
              int32_t acc = ins[2 * k], addend = ins[2 * k + 1];
              if (acc < 0 || addend < 0 || !known[addend])
                continue;
              if (auto f = sameLayout(i, acc, addend, "adds"))
                return f;
              scratch = holds[addend];
              if (auto f = add(i, acc, addend, scratch))
                return f;
            }
            break;
          case OpKind::Cast:
          case OpKind::Sum:
          case OpKind::AllGather:
          case OpKind::ReduceScatter:
          case OpKind::AllReduce:
          case OpKind::AllToAll:
          case OpKind::Permute:
          case OpKind::Broadcast:
            for (int32_t k = 0; k < nout && k < nin; ++k)
              if (ins[k] >= 0 && outs[k] >= 0 && ins[k] != outs[k]) {
                holds[outs[k]] = holds[ins[k]];
                known[outs[k]] = known[ins[k]];
              }
            break;
          case OpKind::Free:
            for (int32_t k = 0; k < nin; ++k)
              if (ins[k] >= 0) {
                holds[ins[k]].clear();
                known[ins[k]] = 0;
              }
            break;
          case OpKind::OptimizerUpdate:
            for (int32_t k = 0; k + 3 < nin; k += 4) {
              int32_t grad = ins[k + 1];
              if (grad < 0 || !known[grad])
                continue; // no backward wrote it: not judged here
              const std::vector<Part> &h = holds[grad];
              if (static_cast<int64_t>(h.size()) == stepMicrobatches)
                continue; // distinct (add refused repeats), each < the count
              int64_t missing = 0;
              while (std::any_of(h.begin(), h.end(), [&](const Part &x) {
                return x.microbatch == missing;
              }))
                ++missing;
              std::string held;
              for (const Part &x : h)
                held +=
                    (held.empty() ? "" : ",") + std::to_string(x.microbatch);
              std::string lost = lostMicrobatch(p, i, grad, missing);
              return fail(
                  i, grad,
                  "updates " +
                      quote(text(
                          bufferOf(p, ins[k] < 0 ? grad : ins[k]).tensor)) +
                      " from gradient " + gradientText(p, grad) +
                      ", which holds microbatches {" + held +
                      "}, not microbatch " + std::to_string(missing) +
                      " (the step has " + std::to_string(stepMicrobatches) +
                      "): its gradient is never accumulated into it" + lost);
            }
            break;
          default:
            break;
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
