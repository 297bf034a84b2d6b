//===- AdamW.cpp - AdamW with fp32 or stochastically rounded bf16 params --===//
//
// One element update, written once (adamwElement in ../ScalarMath.h, shared
// with the CUDA kernels) in the operation order documented at adamwFp32, used
// by both variants. The large-weight form of
// lerp is a template parameter so that the loops have no per-element branch.
// The library is built with -ffp-contract=off: a fused multiply-add would
// change the bits and make the order in the header a lie.
//
//===----------------------------------------------------------------------===//

#include "KernelSupport.h"

#include <cmath>

namespace meshplan::runtime::kernels {
using namespace detail;

namespace {

using Scalars = AdamWScalars;

template <bool SmallWeight>
MESHPLAN_INLINE float updateElement(float p, float g, float &m, float &v,
                                    const Scalars &s) {
  return adamwElement<SmallWeight>(p, g, m, v, s);
}

template <bool SmallWeight>
MESHPLAN_INLINE void fp32Loop(float *p, const float *g, float *m, float *v,
                              const Scalars &s, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    p[i] = updateElement<SmallWeight>(p[i], g[i], m[i], v[i], s);
}

MESHPLAN_KERNEL_LOOP void fp32Loop(float *p, const float *g, float *m, float *v,
                                   Scalars s, int64_t n) {
  if (s.smallWeight)
    fp32Loop<true>(p, g, m, v, s, n);
  else
    fp32Loop<false>(p, g, m, v, s, n);
}

template <bool SmallWeight>
MESHPLAN_INLINE void bf16Loop(uint16_t *p, const float *g, float *m, float *v,
                              const uint32_t *random, const Scalars &s,
                              int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    p[i] = roundBf16Stochastic(
        updateElement<SmallWeight>(widenBf16(p[i]), g[i], m[i], v[i], s),
        random[i]);
}

MESHPLAN_KERNEL_LOOP void bf16Loop(uint16_t *p, const float *g, float *m,
                                   float *v, const uint32_t *random, Scalars s,
                                   int64_t n) {
  if (s.smallWeight)
    bf16Loop<true>(p, g, m, v, random, s, n);
  else
    bf16Loop<false>(p, g, m, v, random, s, n);
}

template <typename Param>
void requireShapes(std::span<Param> param, std::span<const float> grad,
                   std::span<float> expAvg, std::span<float> expAvgSq,
                   int64_t step, const char *kernel) {
  require(grad.size() == param.size() && expAvg.size() == param.size() &&
              expAvgSq.size() == param.size(),
          kernel, "parameter, gradient and state sizes differ");
  require(step >= 1, kernel, "the step is 1-based");
}

} // namespace

void adamwFp32(std::span<float> param, std::span<const float> grad,
               std::span<float> expAvg, std::span<float> expAvgSq,
               const AdamWParams &params, int64_t step,
               const Threading &threading) {
  requireShapes(param, grad, expAvg, expAvgSq, step, "adamwFp32");
  Scalars s = adamwScalarsOf(params, step);
  parallelFor(static_cast<int64_t>(param.size()), threading,
              [&](int64_t begin, int64_t end) {
                fp32Loop(param.data() + begin, grad.data() + begin,
                         expAvg.data() + begin, expAvgSq.data() + begin, s,
                         end - begin);
              });
}

void adamwBf16StochasticRounding(
    std::span<uint16_t> paramBf16, std::span<const float> grad,
    std::span<float> expAvg, std::span<float> expAvgSq,
    const AdamWParams &params, int64_t step, uint64_t seed, uint64_t tensorId,
    std::span<const IndexRun> runs, const Threading &threading) {
  const char *kernel = "adamwBf16StochasticRounding";
  requireShapes(paramBf16, grad, expAvg, expAvgSq, step, kernel);
  int64_t n = static_cast<int64_t>(paramBf16.size());
  requireTiling(runs, n, kernel);
  Scalars s = adamwScalarsOf(params, step);
  forEachRandomBlock(
      runs, n, {seed, step, tensorId}, threading,
      [&](int64_t local, int64_t length, const uint32_t *random) {
        bf16Loop(paramBf16.data() + local, grad.data() + local,
                 expAvg.data() + local, expAvgSq.data() + local, random, s,
                 length);
      });
}

} // namespace meshplan::runtime::kernels
