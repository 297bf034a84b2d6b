//===- LayoutRules.h - How layouts flow through model operations ----------===//
//
// Propagation asks, for each model op, which layouts its operands must have
// given what is known, and which layouts its results then get. The answers
// are semantics, so they live here; the dist dialect's layout-rule interface
// only maps its ops to these functions.
//
// A rule takes the layouts known so far (null = unknown) and returns a full
// assignment for operands and results, or nullopt when nothing is known yet.
// Where a known operand layout differs from the assignment, the caller
// inserts a redistribute: the rule states what the op needs, not what it got.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_LAYOUTRULES_H
#define MESHPLAN_CORE_LAYOUTRULES_H

#include "meshplan/Core/Layout.h"

#include <optional>
#include <vector>

namespace meshplan {

struct RuleLayouts {
  std::vector<Layout> operands;
  std::vector<Layout> results;
};

/// Elementwise ops (same shape in and out, one result): every operand and the
/// result share one layout, the first known one in the order results,
/// operands. Pending reductions do not pass through a nonlinear op, so the
/// shared layout drops them (operands get reduced first).
std::optional<RuleLayouts>
elementwiseRule(int numOperands, const std::vector<const Layout *> &operands,
                const Layout *result);

/// Addition and subtraction are linear: when every operand is known and all
/// are pending the same reduction (sum or avg over the same refs) with the
/// same splits, the result is pending it too (sum_r a_r + sum_r b_r =
/// sum_r (a_r + b_r), and likewise for the average), so no operand needs
/// reducing first. Anything else is elementwiseRule.
std::optional<RuleLayouts>
linearElementwiseRule(int numOperands,
                      const std::vector<const Layout *> &operands,
                      const Layout *result);

/// C[M,N] = A[M,K] x B[K,N]. M follows A's dim 0, N follows B's dim 1, and
/// when A's dim 1 and B's dim 0 are split by the same levels the product is
/// partial(sum) over them (row-wise tensor parallel). Conflicts resolve in
/// favour of A, then C: a ref already used is dropped from the later dim.
std::optional<RuleLayouts> matmulRule(const View &view, const Layout *lhs,
                                      const Layout *rhs, const Layout *result);

/// Reinterprets the last dim's elements as `ratio` times smaller
/// (ratio > 0: e.g. fp32 -> 2 x bf16, ratio 2) or larger (ratio < 0: the
/// inverse) elements. The layout carries over when the last dim splits evenly
/// in both shapes (each rank's bytes stay its own); otherwise the last dim
/// must be unsplit.
std::optional<RuleLayouts> bitcastRule(const Layout *operand,
                                       const Layout *result,
                                       const std::vector<int64_t> &inShape,
                                       const std::vector<int64_t> &outShape);

/// Sum over `dims` (removed from the shape). Splits of a reduced dim become
/// partial(sum) axes of the result; the operand may not already be partial
/// with another op.
std::optional<RuleLayouts> reduceSumRule(const Layout *operand,
                                         const Layout *result,
                                         const std::vector<int> &dims,
                                         int operandRank);

/// Reshape between shapes with the same element count. Dims are matched in
/// groups of equal products (an unchanged dim, several merged into one, one
/// split into several). A group keeps its split only where that is exact:
/// an unchanged dim keeps its levels; a merge keeps the major dim's levels
/// when the other merged dims are unsplit and the major dim splits evenly;
/// a split gives the old levels to the new major dim when it splits evenly.
/// Otherwise the group is unsplit (replicated over those axes).
std::optional<RuleLayouts> reshapeRule(const Layout *operand,
                                       const Layout *result,
                                       const std::vector<int64_t> &inShape,
                                       const std::vector<int64_t> &outShape);

} // namespace meshplan

#endif // MESHPLAN_CORE_LAYOUTRULES_H
