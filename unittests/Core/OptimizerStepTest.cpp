//===- OptimizerStepTest.cpp - learning-rate schedule, exact gradient norm ===//
//
// The schedule against torch's LambdaLR running torchtitan's
// linear_warmup_stable_decay (tables printed by the venv's torch 2.15, see
// docs/trainer.md "The optimizer step" for the command); the norm's
// accumulator against exact integer sums and across every way of splitting
// the values; and the norm's reduction: for every pair of whole-axis
// layouts on small meshes, every element of every gradient is counted by
// exactly one rank of each reduction group.
//
//===----------------------------------------------------------------------===//

#include "TestHelpers.h"

#include "meshplan/Core/GradNorm.h"
#include "meshplan/Core/LrSchedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

using namespace meshplan;

namespace {

struct Table {
  LrSchedule schedule;
  std::vector<double> rates; ///< LambdaLR's lr of steps 1.. with base lr 1
};

LrSchedule make(int64_t total, int64_t warmup, std::optional<double> ratio,
                LrDecayType type, double minFactor) {
  LrSchedule s;
  s.totalSteps = total;
  s.warmupSteps = warmup;
  s.decayRatio = ratio;
  s.decayType = type;
  s.minLrFactor = minFactor;
  return s;
}

TEST(LrSchedule, EqualsTorchtitanUnderLambdaLRBitForBit) {
  // torch.optim.lr_scheduler.LambdaLR(AdamW(lr=1.0), lambda c:
  // linear_warmup_stable_decay(c, ...)) with torchtitan's phase rules,
  // param_groups[0]["lr"] before each optimizer step.
  std::vector<Table> tables = {
      {make(10, 3, std::nullopt, LrDecayType::Cosine, 0.1),
       {0.3333333333333333, 0.6666666666666666, 1.0, 1.0, 0.9554359905560885,
        0.8305704108364301, 0.6501344202803414, 0.44986557971965857,
        0.26942958916356996, 0.14456400944391146}},
      {make(10, 2, 0.5, LrDecayType::Linear, 0.0),
       {0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.19999999999999996}},
      {make(8, 0, 0.25, LrDecayType::Sqrt, 0.2),
       {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.434314575050762}},
      {make(20, 5, std::nullopt, LrDecayType::Cosine, 0.0),
       {0.2,
        0.4,
        0.6,
        0.8,
        1.0,
        1.0,
        0.9890738003669028,
        0.9567727288213004,
        0.9045084971874737,
        0.8345653031794291,
        0.75,
        0.6545084971874737,
        0.5522642316338268,
        0.44773576836617335,
        0.34549150281252633,
        0.2500000000000001,
        0.16543469682057105,
        0.09549150281252633,
        0.04322727117869951,
        0.010926199633097156}},
      // round(5 * 0.5) is 2 in Python (half to even): decay over 2 steps.
      {make(5, 2, 0.5, LrDecayType::Linear, 0.0), {0.5, 1.0, 1.0, 1.0, 0.5}},
  };
  for (const Table &t : tables) {
    ASSERT_TRUE(checkLrSchedule(t.schedule));
    for (size_t i = 0; i < t.rates.size(); ++i)
      EXPECT_EQ(lrFactor(t.schedule, int64_t(i) + 1), t.rates[i])
          << "step " << i + 1 << " of a "
          << lrDecayTypeName(t.schedule.decayType) << " schedule over "
          << t.schedule.totalSteps;
  }
}

TEST(LrSchedule, RefusesWhatTorchtitanWouldBendSilently) {
  LrSchedule s = make(20, 30, std::nullopt, LrDecayType::Linear, 0);
  auto r = checkLrSchedule(s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "warmup_steps 30 is beyond the run's 20 steps "
                               "(torchtitan would shorten it silently)");
  s = make(20, 2, std::nullopt, LrDecayType::Linear, 1.5);
  EXPECT_FALSE(checkLrSchedule(s));
  s = make(20, 2, std::nan(""), LrDecayType::Linear, 0);
  EXPECT_FALSE(checkLrSchedule(s));
  s = make(20, 2, std::nullopt, LrDecayType::Linear, std::nan(""));
  EXPECT_FALSE(checkLrSchedule(s));
  s = make(0, 0, std::nullopt, LrDecayType::Linear, 0);
  EXPECT_FALSE(checkLrSchedule(s));
  EXPECT_EQ(parseLrDecayType("cosine"), LrDecayType::Cosine);
  EXPECT_FALSE(parseLrDecayType("exp"));
}

/// The L2 norm of `values` accumulated in `parts` pieces, each in its own
/// buffer, the buffers then summed as an int64 all_reduce sums them.
double splitNorm(const std::vector<float> &values, size_t parts) {
  std::vector<int64_t> total(size_t(gradNormBufferLength(GradNormType::L2)));
  size_t chunk = (values.size() + parts - 1) / parts;
  for (size_t p = 0; p < parts; ++p) {
    std::vector<int64_t> acc(total.size(), 0);
    size_t lo = std::min(values.size(), p * chunk);
    size_t hi = std::min(values.size(), lo + chunk);
    accumulateGradNorm(GradNormType::L2,
                       std::span<const float>(values).subspan(lo, hi - lo),
                       acc);
    for (size_t i = 0; i < acc.size(); ++i)
      total[i] += acc[i];
  }
  return gradNormOf(GradNormType::L2, total);
}

TEST(GradNorm, EqualsTheExactSumRoundedOnce) {
  // Values k * 2^-20 with |k| < 2^24: their squares are k^2 * 2^-40, and
  // 2^16 of them sum exactly in an unsigned __int128, whose conversion to
  // double rounds to nearest once.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> values(size_t(1) << 16);
    unsigned __int128 exact = 0;
    for (float &x : values) {
      int64_t k = int64_t(rng() % (uint64_t(1) << 24)) - (int64_t(1) << 23);
      x = std::ldexp(float(k), -20);
      exact += static_cast<unsigned __int128>(k * k);
    }
    double expected = std::sqrt(std::ldexp(double(exact), -40));
    EXPECT_EQ(splitNorm(values, 1), expected);
  }
}

TEST(GradNorm, DoesNotDependOnHowTheValuesAreSplit) {
  // Magnitudes from subnormals to 1e30, where float or double sums in
  // different orders disagree.
  std::mt19937_64 rng(11);
  std::vector<float> values(100003);
  for (float &x : values) {
    int e = int(rng() % 250) - 149;
    x = std::ldexp(float(rng() % (1u << 24)) / float(1u << 24), e);
    if (rng() & 1)
      x = -x;
  }
  values[17] = std::numeric_limits<float>::denorm_min();
  values[18] = std::numeric_limits<float>::max();
  double one = splitNorm(values, 1);
  EXPECT_TRUE(std::isfinite(one));
  for (size_t parts : {2, 3, 7, 64, 1000})
    EXPECT_EQ(splitNorm(values, parts), one) << parts << " parts";
  // Reversed and shuffled: the same integers, the same bits.
  std::vector<float> shuffled = values;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  EXPECT_EQ(splitNorm(shuffled, 5), one);
  // The same value as the double sum, to double-rounding noise.
  double forward = 0;
  for (float x : values)
    forward += double(x) * double(x);
  EXPECT_NEAR(std::sqrt(forward) / one, 1.0, 1e-12);
}

TEST(GradNorm, NonFiniteValuesGiveNaNAndInfNormIsTheLargestMagnitude) {
  std::vector<float> values = {1.0f, -3.0f, 2.0f};
  std::vector<int64_t> acc(size_t(gradNormBufferLength(GradNormType::L2)), 0);
  accumulateGradNorm(GradNormType::L2, values, acc);
  EXPECT_EQ(gradNormOf(GradNormType::L2, acc), std::sqrt(14.0));
  values.push_back(std::numeric_limits<float>::infinity());
  std::fill(acc.begin(), acc.end(), 0);
  accumulateGradNorm(GradNormType::L2, values, acc);
  EXPECT_TRUE(std::isnan(gradNormOf(GradNormType::L2, acc)));

  std::vector<int64_t> inf(size_t(gradNormBufferLength(GradNormType::Inf)), 0);
  accumulateGradNorm(GradNormType::Inf, std::vector<float>{1.0f, -3.5f, 2.0f},
                     inf);
  EXPECT_EQ(gradNormOf(GradNormType::Inf, inf), 3.5);
  accumulateGradNorm(
      GradNormType::Inf,
      std::vector<float>{std::numeric_limits<float>::quiet_NaN()}, inf);
  EXPECT_TRUE(std::isnan(gradNormOf(GradNormType::Inf, inf)));
  EXPECT_EQ(gradNormReduceOp(GradNormType::L2), ReduceOp::Sum);
  EXPECT_EQ(gradNormReduceOp(GradNormType::Inf), ReduceOp::Max);
}

TEST(GradNorm, ClipCoefficientIsTorchs) {
  EXPECT_EQ(clipCoefficient(1.0, 0.5), 1.0f);
  EXPECT_EQ(clipCoefficient(1.0, 4.0), float(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clipCoefficient(0.05, 0.05), float(0.05 / (0.05 + 1e-6)));
}

/// For every rank: within its reduction group, each element of each
/// gradient is counted by exactly one rank (pipelineAxis: tensor t lives on
/// pp coordinate t % size only).
void expectEveryElementOnce(const View &view, const std::vector<Layout> &ls,
                            const std::vector<int64_t> &shape,
                            std::optional<int> pipelineAxis) {
  const Mesh &mesh = view.mesh();
  auto axes = gradNormAxes(mesh, ls, pipelineAxis);
  ASSERT_TRUE(axes) << axes.error().message;
  for (int64_t rank = 0; rank < mesh.size(); ++rank) {
    auto group = groupOf(mesh, *axes, rank);
    ASSERT_TRUE(group);
    for (size_t t = 0; t < ls.size(); ++t) {
      int64_t n = 1;
      for (int64_t d : shape)
        n *= d;
      std::vector<int> counted(size_t(n), 0);
      for (int64_t member : *group) {
        if (pipelineAxis) {
          int64_t c =
              mesh.coordinateAt(*mesh.positionOf(member), *pipelineAxis);
          if (c != int64_t(t) % mesh.axis(*pipelineAxis).size)
            continue;
        }
        auto counts =
            countsInGradNorm(view, ls[t], *axes, member, pipelineAxis);
        ASSERT_TRUE(counts) << counts.error().message;
        if (!*counts)
          continue;
        auto box = shardOf(view, ls[t], shape, member);
        ASSERT_TRUE(box);
        // Row-major walk of the box (rank 1 or 2 tensors here).
        int64_t rows = box->localShape[0];
        int64_t cols = shape.size() > 1 ? box->localShape[1] : 1;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            int64_t gi = box->offset[0] + i;
            int64_t gj = shape.size() > 1 ? box->offset[1] + j : 0;
            ++counted[size_t(gi * (shape.size() > 1 ? shape[1] : 1) + gj)];
          }
      }
      for (int64_t e = 0; e < n; ++e)
        ASSERT_EQ(counted[size_t(e)], 1)
            << "rank " << rank << " tensor " << t << " element " << e
            << " layout " << formatLayout(mesh, ls[t]) << " axes "
            << formatAxisRefs(mesh, *axes);
    }
  }
}

TEST(GradNorm, EveryElementCountsOnceInEveryReductionGroup) {
  struct Case {
    std::vector<int64_t> mesh;
    std::vector<int64_t> shape;
  };
  int64_t checked = 0;
  for (const Case &c : std::vector<Case>{
           {{2, 3}, {7, 5}}, {{2, 2, 2}, {8, 3}}, {{3, 2}, {5}}}) {
    auto mesh = testutil::makeMesh(c.mesh);
    View view = View::root(mesh);
    std::vector<Layout> layouts = testutil::wholeAxisLayouts(
        view, int(c.shape.size()), /*withPartial=*/false);
    for (size_t i = 0; i < layouts.size(); ++i)
      for (size_t j = i; j < layouts.size(); j += 3) {
        expectEveryElementOnce(view, {layouts[i], layouts[j]}, c.shape,
                               std::nullopt);
        ++checked;
      }
    // The last axis as a pipeline axis: layouts that do not use it.
    int pp = mesh->numAxes() - 1;
    std::vector<Layout> staged;
    for (const Layout &l : layouts) {
      bool usesPp = false;
      for (const AxisRef &r : l.usedRefs())
        usesPp |= r.axis == pp;
      if (!usesPp)
        staged.push_back(l);
    }
    for (size_t i = 0; i < staged.size(); ++i) {
      expectEveryElementOnce(view, {staged[i], staged[(i + 1) % staged.size()]},
                             c.shape, pp);
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(GradNorm, ReplicateAxesAreNotReducedOverAndTpReplicasCountOnce) {
  // (dp=2, fsdp=2, tp=2): a weight split over [tp, fsdp] and a norm weight
  // split over fsdp only (replicated over tp and dp). The norm reduces over
  // fsdp and tp; of the norm weight's two TP replicas only tp 0 counts.
  auto mesh = testutil::makeMesh({2, 2, 2}, {"dp", "fsdp", "tp"});
  View view = View::root(mesh);
  AxisNamespace ns(mesh);
  auto weight = parseLayout(view, ns, "[{tp, fsdp}, {}]");
  auto norm = parseLayout(view, ns, "[{fsdp}]");
  ASSERT_TRUE(weight && norm);
  auto axes = gradNormAxes(*mesh, {*weight, *norm}, std::nullopt);
  ASSERT_TRUE(axes);
  EXPECT_EQ(formatAxisRefs(*mesh, *axes), "fsdp,tp");
  for (int64_t rank = 0; rank < 8; ++rank) {
    auto counts = countsInGradNorm(view, *norm, *axes, rank, std::nullopt);
    ASSERT_TRUE(counts);
    EXPECT_EQ(*counts, rank % 2 == 0) << rank; // tp is the minor axis
    EXPECT_TRUE(*countsInGradNorm(view, *weight, *axes, rank, std::nullopt));
  }
  // Sub-axes: a split over "fsdp":(1)2 of a 4-wide axis reduces over that
  // part; the other half replicates and counts at coordinate 0.
  auto wide = testutil::makeMesh({4}, {"fsdp"});
  View wideView = View::root(wide);
  AxisNamespace wideNs(wide);
  auto half = parseLayout(wideView, wideNs, "[{\"fsdp\":(1)2}]");
  ASSERT_TRUE(half) << half.error().message;
  expectEveryElementOnce(wideView, {*half}, {6}, std::nullopt);
}

} // namespace
