//===- GradNorm.h - The global gradient norm, exact under every layout ----===//
//
// torch.nn.utils.clip_grad_norm_ computes one norm over every element of
// every gradient and scales all gradients by min(1, max_norm / (norm +
// 1e-6)). Under sharding that needs two decisions, both made here once:
//
// * Which elements a rank counts, and over which mesh refs the partial
//   results are reduced, so that every element counts exactly once. The
//   reduction runs over every ref that splits some gradient (shard axes, the
//   tensor-parallel axis) and the pipeline axis; a rank counts its box of a
//   gradient when its coordinate is 0 along each part of those refs that the
//   gradient's layout replicates over (a TP-replicated norm weight: tp
//   coordinate 0 only). Refs no gradient splits (HSDP replicas, extra axes,
//   managed axes) are not reduced over: the ranks along them hold equal
//   gradients and compute the same norm, which is why a fault-tolerant
//   quorum that lost a group still gets the uninterrupted run's norm.
//
// * How the partial results are summed so that the norm does not depend on
//   the layout. A float sum of squares depends on its order. The square of
//   an fp32 value is an integer of at most 48 bits times 2^(2e) with
//   2e >= -298, so the sum of squares is held exactly as a fixed-point
//   integer in kGradNormLimbs int64 limbs of 32 bits each (bit 0 weighs
//   2^-298; 640 bits cover every fp32 square times 2^50 elements), plus a
//   count of non-finite elements. Integer sums are associative, so the
//   reduction (an all_reduce of int64 "sum") gives the same bits in any
//   order and grouping, and the single-process reference gets them too. The
//   exact sum is rounded once, to double; the norm is its IEEE sqrt. The inf
//   norm is a max, exact by nature: the largest |x|'s fp32 bits (order
//   preserving for non-negative floats), reduced with int64 "max".
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_GRADNORM_H
#define MESHPLAN_CORE_GRADNORM_H

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/MeshView.h"
#include "meshplan/Core/Result.h"

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace meshplan {

/// torch's norm_type: 2 (Euclidean) or inf (largest magnitude).
enum class GradNormType { L2, Inf };
inline constexpr std::array<std::string_view, 2> kGradNormTypeNames = {"2",
                                                                       "inf"};
std::string_view gradNormTypeName(GradNormType type);
std::optional<GradNormType> parseGradNormType(std::string_view name);

inline constexpr int kGradNormLimbs = 20;
/// Elements of the int64 norm buffer: L2: the limbs then the non-finite
/// count; inf: the largest |x|'s fp32 bits then a non-finite flag.
int64_t gradNormBufferLength(GradNormType type);
/// How the buffers of the ranks combine: L2 sum, inf max.
ReduceOp gradNormReduceOp(GradNormType type);

/// Adds the squares (L2) or magnitudes (inf) of `values` into `acc` (a
/// buffer of gradNormBufferLength, zeroed by the caller before the first
/// call). Afterwards every L2 limb is in [0, 2^32), so up to 2^31 such
/// buffers may be summed by an int64 all_reduce before a carry can be lost.
void accumulateGradNorm(GradNormType type, std::span<const float> values,
                        std::span<int64_t> acc);

/// The norm of a reduced buffer: sqrt of the exact sum rounded once to
/// double (L2), or the largest magnitude (inf). NaN when any element was
/// not finite.
double gradNormOf(GradNormType type, std::span<const int64_t> reduced);

/// torch's clip coefficient min(1, maxNorm / (norm + 1e-6)), computed in
/// double and rounded once to the float the gradients are multiplied by.
float clipCoefficient(double maxNorm, double norm);

/// The refs the partial norms are reduced over (see file comment):
/// canonical, in mesh order; empty when one rank holds everything.
Result<AxisRefList> gradNormAxes(const Mesh &mesh,
                                 const std::vector<Layout> &gradientLayouts,
                                 std::optional<int> pipelineAxis);

/// Whether `rank` counts its box of a gradient with `layout` (a reduced
/// layout, no partial refs) in the norm reduced over `normAxes`.
Result<bool> countsInGradNorm(const View &view, const Layout &layout,
                              const AxisRefList &normAxes, int64_t rank,
                              std::optional<int> pipelineAxis);

} // namespace meshplan

#endif // MESHPLAN_CORE_GRADNORM_H
