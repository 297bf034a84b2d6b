//===- LayoutRules.cpp - How layouts flow through model operations --------===//

#include "meshplan/Core/LayoutRules.h"

#include <algorithm>

namespace meshplan {

static Layout withoutPartial(Layout l) {
  l.partial.clear();
  l.reduceOp = ReduceOp::Sum;
  return l;
}

std::optional<RuleLayouts>
elementwiseRule(int numOperands, const std::vector<const Layout *> &operands,
                const Layout *result) {
  const Layout *known = result;
  for (const Layout *l : operands)
    if (!known && l)
      known = l;
  if (!known)
    return std::nullopt;
  Layout shared = withoutPartial(*known);
  RuleLayouts out;
  out.operands.assign(numOperands, shared);
  out.results = {shared};
  return out;
}

static bool sameLayout(const Layout &a, const Layout &b) {
  return a.dims == b.dims && a.partial == b.partial && a.reduceOp == b.reduceOp;
}

std::optional<RuleLayouts>
linearElementwiseRule(int numOperands,
                      const std::vector<const Layout *> &operands,
                      const Layout *result) {
  bool samePending =
      numOperands > 0 && static_cast<int>(operands.size()) == numOperands &&
      std::all_of(operands.begin(), operands.end(), [&](const Layout *l) {
        return l && sameLayout(*l, *operands[0]);
      });
  if (!samePending)
    return elementwiseRule(numOperands, operands, result);
  const Layout &first = *operands[0];
  if (first.partial.empty() ||
      (first.reduceOp != ReduceOp::Sum && first.reduceOp != ReduceOp::Avg) ||
      (result && !sameLayout(*result, first)))
    return elementwiseRule(numOperands, operands, result);
  RuleLayouts out;
  out.operands.assign(numOperands, first);
  out.results = {first};
  return out;
}

/// Refs of a list of levels.
static AxisRefList refsOf(const SplitLevels &levels) {
  AxisRefList out;
  for (const AxisRefList &level : levels)
    out.insert(out.end(), level.begin(), level.end());
  return out;
}

/// Drops from `levels` every level that shares a factor with `used`.
static SplitLevels without(const Mesh &mesh, const SplitLevels &levels,
                           const AxisRefList &used,
                           const AxisRefList &universe) {
  AxisRefList usedF = splitIntoFactors(mesh, used, universe);
  SplitLevels out;
  for (const AxisRefList &level : levels) {
    AxisRefList f = splitIntoFactors(mesh, level, universe);
    bool clash = std::any_of(f.begin(), f.end(), [&](const AxisRef &r) {
      return std::find(usedF.begin(), usedF.end(), r) != usedF.end();
    });
    if (!clash)
      out.push_back(level);
  }
  return out;
}

std::optional<RuleLayouts> matmulRule(const View &view, const Layout *lhs,
                                      const Layout *rhs, const Layout *result) {
  if (!lhs && !rhs && !result)
    return std::nullopt;
  const Mesh &mesh = view.mesh();
  AxisRefList universe = view.refs();
  for (const Layout *l : {lhs, rhs, result})
    if (l) {
      AxisRefList used = l->usedRefs();
      universe.insert(universe.end(), used.begin(), used.end());
    }
  // Start from what is known, A first.
  SplitLevels m, k, n;
  if (lhs) {
    m = lhs->dims[0];
    k = lhs->dims[1];
  } else if (result) {
    m = result->dims[0];
    // A row-wise product (partial over refs) reads K split by those refs.
    if (!result->partial.empty())
      k = {result->partial};
  }
  if (rhs) {
    if (!lhs)
      k = rhs->dims[0];
    n = rhs->dims[1];
  } else if (result) {
    n = result->dims[1];
  }
  // Every ref splits at most one of M, K, N (priority M, K, N).
  k = without(mesh, k, refsOf(m), universe);
  AxisRefList mk = refsOf(m);
  AxisRefList kRefs = refsOf(k);
  mk.insert(mk.end(), kRefs.begin(), kRefs.end());
  n = without(mesh, n, mk, universe);

  RuleLayouts out;
  Layout a = replicatedLayout(2), b = replicatedLayout(2),
         c = replicatedLayout(2);
  a.dims = {m, k};
  b.dims = {k, n};
  c.dims = {m, n};
  c.partial = refsOf(k); // contraction over split K leaves partial sums
  out.operands = {a, b};
  out.results = {c};
  return out;
}

std::optional<RuleLayouts> bitcastRule(const Layout *operand,
                                       const Layout *result,
                                       const std::vector<int64_t> &inShape,
                                       const std::vector<int64_t> &outShape) {
  const Layout *known = operand ? operand : result;
  if (!known || inShape.empty())
    return std::nullopt;
  Layout shared = withoutPartial(*known);
  int last = static_cast<int>(inShape.size()) - 1;
  int64_t split = refsSize(shared.dimRefs(last));
  if (inShape[last] % split != 0 || outShape[last] % split != 0)
    shared.dims[last].clear(); // boxes would cut elements: keep dim whole
  RuleLayouts out;
  out.operands = {shared};
  out.results = {shared};
  return out;
}

std::optional<RuleLayouts> reduceSumRule(const Layout *operand,
                                         const Layout *result,
                                         const std::vector<int> &dims,
                                         int operandRank) {
  auto reduced = [&](int d) {
    return std::find(dims.begin(), dims.end(), d) != dims.end();
  };
  Layout in;
  if (operand) {
    in = *operand;
    if (!in.partial.empty() && in.reduceOp != ReduceOp::Sum)
      in = withoutPartial(in); // sum does not commute with a pending max
  } else if (result) {
    in = replicatedLayout(operandRank);
    int r = 0;
    for (int d = 0; d < operandRank; ++d)
      if (!reduced(d))
        in.dims[d] = result->dims[r++];
  } else {
    return std::nullopt;
  }
  Layout outLayout;
  outLayout.partial = in.partial;
  outLayout.reduceOp = ReduceOp::Sum;
  for (int d = 0; d < operandRank; ++d) {
    if (!reduced(d)) {
      outLayout.dims.push_back(in.dims[d]);
      continue;
    }
    AxisRefList refs = in.dimRefs(d);
    outLayout.partial.insert(outLayout.partial.end(), refs.begin(), refs.end());
  }
  RuleLayouts out;
  out.operands = {in};
  out.results = {outLayout};
  return out;
}

std::optional<RuleLayouts> reshapeRule(const Layout *operand,
                                       const Layout *result,
                                       const std::vector<int64_t> &inShape,
                                       const std::vector<int64_t> &outShape) {
  if (!operand && !result)
    return std::nullopt;
  // Groups of dims with equal products, as [begin, end) in each shape.
  struct Group {
    size_t inBegin, inEnd, outBegin, outEnd;
  };
  std::vector<Group> groups;
  size_t i = 0, o = 0;
  while (i < inShape.size() || o < outShape.size()) {
    Group g{i, i, o, o};
    int64_t pi = 1, po = 1;
    if (i < inShape.size())
      pi *= inShape[i++];
    if (o < outShape.size())
      po *= outShape[o++];
    while (pi != po) {
      if (pi < po && i < inShape.size())
        pi *= inShape[i++];
      else if (po < pi && o < outShape.size())
        po *= outShape[o++];
      else
        break; // zero-size dims: nothing left to match
    }
    g.inEnd = i;
    g.outEnd = o;
    groups.push_back(g);
  }
  Layout in = replicatedLayout(static_cast<int>(inShape.size()));
  Layout out = replicatedLayout(static_cast<int>(outShape.size()));
  const Layout &known = operand ? *operand : *result;
  bool fromIn = operand != nullptr;
  for (const Group &g : groups) {
    size_t nIn = g.inEnd - g.inBegin, nOut = g.outEnd - g.outBegin;
    // The major dim on the known side, and whether the rest is unsplit.
    size_t knownBegin = fromIn ? g.inBegin : g.outBegin;
    size_t knownCount = fromIn ? nIn : nOut;
    if (knownCount == 0)
      continue;
    bool restUnsplit = true;
    for (size_t d = knownBegin + 1; d < knownBegin + knownCount; ++d)
      restUnsplit &= known.dims[d].empty();
    const SplitLevels &levels = known.dims[knownBegin];
    int64_t split = 1;
    for (const AxisRefList &level : levels)
      split *= levelSize(level);
    int64_t inMajor = nIn ? inShape[g.inBegin] : 1;
    int64_t outMajor = nOut ? outShape[g.outBegin] : 1;
    bool keep =
        restUnsplit && nIn > 0 && nOut > 0 &&
        (nIn == 1 && nOut == 1 ? true
                               : inMajor % split == 0 && outMajor % split == 0);
    if (keep) {
      in.dims[g.inBegin] = levels;
      out.dims[g.outBegin] = levels;
    }
  }
  in.partial = out.partial = known.partial;
  in.reduceOp = out.reduceOp = known.reduceOp;
  RuleLayouts rules;
  rules.operands = {in};
  rules.results = {out};
  return rules;
}

} // namespace meshplan
