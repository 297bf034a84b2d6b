//===- GradNorm.cpp - The global gradient norm, exact under every layout --===//

#include "meshplan/Core/GradNorm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>

namespace meshplan {

std::string_view gradNormTypeName(GradNormType type) {
  return kGradNormTypeNames[static_cast<size_t>(type)];
}

std::optional<GradNormType> parseGradNormType(std::string_view name) {
  for (size_t i = 0; i < kGradNormTypeNames.size(); ++i)
    if (kGradNormTypeNames[i] == name)
      return static_cast<GradNormType>(i);
  return std::nullopt;
}

int64_t gradNormBufferLength(GradNormType type) {
  return type == GradNormType::L2 ? kGradNormLimbs + 1 : 2;
}

ReduceOp gradNormReduceOp(GradNormType type) {
  return type == GradNormType::L2 ? ReduceOp::Sum : ReduceOp::Max;
}

// Bit 0 of limb 0 weighs 2^kLowestExponent: the square of the smallest
// fp32 subnormal, 2^-149 squared.
static constexpr int kLowestExponent = -298;
static constexpr int kDigitBits = 32;
static constexpr int64_t kDigitMask = (int64_t(1) << kDigitBits) - 1;

/// Moves every limb's carries into the next one: limbs below the top end in
/// [0, 2^32). Limbs are never negative, so an arithmetic shift is the carry.
static void normalize(std::span<int64_t> limbs) {
  for (int i = 0; i + 1 < kGradNormLimbs; ++i) {
    limbs[size_t(i) + 1] += limbs[size_t(i)] >> kDigitBits;
    limbs[size_t(i)] &= kDigitMask;
  }
}

void accumulateGradNorm(GradNormType type, std::span<const float> values,
                        std::span<int64_t> acc) {
  if (type == GradNormType::Inf) {
    for (float x : values) {
      uint32_t magnitude = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
      if (magnitude >= 0x7F800000u) // inf or NaN
        acc[1] = 1;
      else
        acc[0] = std::max<int64_t>(acc[0], magnitude);
    }
    return;
  }
  // Squares of equal exponent field are summed as plain integers first
  // (a mantissa squared is < 2^48, so 2^16 of them fit a uint64 bin), and
  // each bin goes into the limbs once per 2^16 elements: one multiply and
  // one add per element instead of three limb additions.
  constexpr size_t kBlock = size_t(1) << 16;
  uint64_t bins[255];
  for (size_t start = 0; start < values.size(); start += kBlock) {
    std::fill(std::begin(bins), std::end(bins), 0);
    size_t end = std::min(values.size(), start + kBlock);
    int64_t nonFinite = 0;
    for (size_t i = start; i < end; ++i) {
      uint32_t bits = std::bit_cast<uint32_t>(values[i]);
      uint32_t field = (bits >> 23) & 0xFFu;
      uint64_t mantissa = bits & 0x7FFFFFu;
      if (field == 0xFFu) {
        ++nonFinite;
        continue;
      }
      if (field != 0)
        mantissa |= 0x800000u;
      bins[field] += mantissa * mantissa;
    }
    acc[kGradNormLimbs] += nonFinite;
    for (uint32_t field = 0; field < 255; ++field) {
      if (!bins[field])
        continue;
      // |x| = mantissa * 2^e with e = field - 150 (subnormals: -149), so the
      // bin is an integer times 2^(2e), 2e >= kLowestExponent.
      int e = field == 0 ? -149 : int(field) - 150;
      int position = 2 * e - kLowestExponent; // in [0, 506]
      unsigned __int128 shifted = static_cast<unsigned __int128>(bins[field])
                                  << (position % kDigitBits);
      size_t limb = size_t(position / kDigitBits);
      for (int k = 0; k < 3; ++k, shifted >>= kDigitBits)
        acc[limb + size_t(k)] += int64_t(uint64_t(shifted) & kDigitMask);
    }
    // Each flush adds < 2^32 per limb, so 2^30 flushes would fit; one
    // normalization per block keeps every limb small anyway.
    normalize(acc);
  }
}

/// The exact fixed-point value of normalized limbs, rounded once to double
/// (round to nearest, ties to even).
static double roundLimbs(std::span<const int64_t> limbs) {
  int top = kGradNormLimbs - 1;
  while (top > 0 && limbs[size_t(top)] == 0)
    --top;
  if (top == 0 && limbs[0] == 0)
    return 0.0;
  // The three limbs from the top (96 bits or more) hold more than the 53
  // bits a double keeps; anything below only decides ties (sticky).
  int base = std::max(top, 2) - 2;
  unsigned __int128 window = 0;
  for (int i = std::max(top, 2); i >= base; --i)
    window = (window << kDigitBits) + uint64_t(limbs[size_t(i)]);
  bool sticky = false;
  for (int i = 0; i < base; ++i)
    sticky |= limbs[size_t(i)] != 0;
  int bits = 0;
  for (unsigned __int128 w = window; w; w >>= 1)
    ++bits;
  int exponent = base * kDigitBits + kLowestExponent;
  if (bits <= 53)
    return std::ldexp(double(uint64_t(window)), exponent);
  int shift = bits - 53;
  uint64_t mantissa = uint64_t(window >> shift);
  unsigned __int128 rest = window & (((unsigned __int128)1 << shift) - 1);
  unsigned __int128 half = (unsigned __int128)1 << (shift - 1);
  if (rest > half || (rest == half && (sticky || (mantissa & 1))))
    ++mantissa; // 2^53 still converts exactly
  return std::ldexp(double(mantissa), exponent + shift);
}

double gradNormOf(GradNormType type, std::span<const int64_t> reduced) {
  if (type == GradNormType::Inf) {
    if (reduced[1] != 0)
      return std::nan("");
    return double(std::bit_cast<float>(uint32_t(reduced[0])));
  }
  if (reduced[kGradNormLimbs] != 0)
    return std::nan("");
  std::vector<int64_t> limbs(reduced.begin(), reduced.begin() + kGradNormLimbs);
  normalize(limbs);
  return std::sqrt(roundLimbs(limbs));
}

float clipCoefficient(double maxNorm, double norm) {
  return float(std::min(1.0, maxNorm / (norm + 1e-6)));
}

Result<AxisRefList> gradNormAxes(const Mesh &mesh,
                                 const std::vector<Layout> &gradientLayouts,
                                 std::optional<int> pipelineAxis) {
  // Per axis, the union of the intervals [pre, pre * size) that split some
  // gradient: one ref per connected run.
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> spans;
  for (const Layout &layout : gradientLayouts) {
    if (!layout.partial.empty())
      return makeError("a gradient norm reads reduced gradients; a layout "
                       "with partial refs is not reduced yet");
    for (int d = 0; d < layout.rank(); ++d)
      for (const AxisRef &ref : layout.dimRefs(d))
        if (ref.size > 1)
          spans[ref.axis].push_back({ref.pre, ref.pre * ref.size});
  }
  if (pipelineAxis && mesh.axis(*pipelineAxis).size > 1)
    spans[*pipelineAxis].push_back({1, mesh.axis(*pipelineAxis).size});
  AxisRefList out;
  for (auto &[axis, list] : spans) {
    std::sort(list.begin(), list.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (auto [lo, hi] : list) {
      if (!merged.empty() && lo <= merged.back().second)
        merged.back().second = std::max(merged.back().second, hi);
      else
        merged.push_back({lo, hi});
    }
    for (auto [lo, hi] : merged) {
      auto ref = makeAxisRef(mesh, axis, lo, hi / lo);
      if (!ref || hi % lo != 0)
        return makeError("the gradients split axis \"" + mesh.axis(axis).name +
                         "\" into parts whose boundaries do not nest");
      out.push_back(*ref);
    }
  }
  if (auto ok = checkRefsCompatible(mesh, out, "the gradient norm's axes"); !ok)
    return ok.error();
  return canonicalizeRefs(mesh, out);
}

Result<bool> countsInGradNorm(const View &view, const Layout &layout,
                              const AxisRefList &normAxes, int64_t rank,
                              std::optional<int> pipelineAxis) {
  if (!layout.partial.empty())
    return makeError("a gradient norm reads reduced gradients; a layout with "
                     "partial refs is not reduced yet");
  const Mesh &mesh = view.mesh();
  Result<int64_t> position = mesh.positionOf(rank);
  if (!position)
    return position.error();
  AxisRefList replicated = replicatedRefs(view, layout);
  AxisRefList universe = normAxes;
  universe.insert(universe.end(), replicated.begin(), replicated.end());
  // Cut at the norm axes' boundaries: each factor lies inside them or
  // outside them entirely.
  for (const AxisRef &f : splitIntoFactors(mesh, replicated, universe)) {
    if (pipelineAxis && f.axis == *pipelineAxis)
      continue; // a tensor lives on one pp coordinate: no replica there
    if (refsCover(mesh, normAxes, {f}) && f.coordinateAt(mesh, *position) != 0)
      return false;
  }
  return true;
}

} // namespace meshplan
