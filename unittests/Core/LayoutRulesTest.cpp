//===- LayoutRulesTest.cpp - layout rules against brute force -------------===//
//
// Each rule's answer is checked by what it promises, on explicit data:
//  - reshape: every rank holds the same elements (row-major linear indices)
//    before and after;
//  - bitcast: every rank holds the same bytes before and after;
//  - matmul: each rank's local product lands in its result box, and summing
//    over the partial axes gives the true product;
//  - reduce_sum: summing local sums over the partial axes gives the true sum.
// Layouts are enumerated exhaustively on small meshes.
//
//===----------------------------------------------------------------------===//

#include "TestHelpers.h"

#include "meshplan/Core/LayoutRules.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

using namespace meshplan;

namespace {

using Ints = std::vector<int64_t>;

std::shared_ptr<const Mesh> mesh2x3() {
  return std::make_shared<const Mesh>(*Mesh::create({{"a", 2}, {"b", 3}}));
}
std::shared_ptr<const Mesh> mesh2x2() {
  return std::make_shared<const Mesh>(*Mesh::create({{"a", 2}, {"b", 2}}));
}

std::vector<Layout> layouts(const View &view, int rank) {
  return testutil::wholeAxisLayouts(view, rank, /*withPartial=*/false);
}

/// Row-major linear indices of a rank's box.
std::set<int64_t> elementsOf(const View &view, const Layout &l,
                             const Ints &shape, int64_t rank) {
  ShardBox box = *shardOf(view, l, shape, rank);
  std::set<int64_t> out;
  if (box.empty())
    return out;
  Ints idx(shape.size(), 0);
  while (true) {
    int64_t linear = 0;
    for (size_t d = 0; d < shape.size(); ++d)
      linear = linear * shape[d] + box.offset[d] + idx[d];
    out.insert(linear);
    int d = static_cast<int>(shape.size()) - 1;
    while (d >= 0 && ++idx[d] == box.localShape[d])
      idx[d--] = 0;
    if (d < 0)
      break;
  }
  return out;
}

TEST(LayoutRules, ReshapeKeepsEveryRanksElements) {
  std::vector<std::pair<Ints, Ints>> cases = {
      {{12, 4}, {48}},     {{48}, {12, 4}},     {{6, 4}, {24}},
      {{24}, {6, 4}},      {{5, 4}, {20}},      {{20}, {5, 4}},
      {{4, 6}, {4, 2, 3}}, {{4, 2, 3}, {4, 6}}, {{6, 2}, {3, 4}},
      {{7, 3}, {21}},      {{2, 1, 6}, {2, 6}}, {{12}, {12}}};
  int64_t checked = 0, kept = 0;
  for (auto meshPtr : {mesh2x3(), mesh2x2()}) {
    View view = View::root(meshPtr);
    for (const auto &[in, out] : cases) {
      for (const Layout &l : layouts(view, static_cast<int>(in.size()))) {
        auto r = reshapeRule(&l, nullptr, in, out);
        ASSERT_TRUE(r.has_value());
        const Layout &need = r->operands[0];
        const Layout &give = r->results[0];
        ASSERT_TRUE(verifyLayout(view, need).ok());
        ASSERT_TRUE(verifyLayout(view, give).ok());
        if (equivalentLayouts(view, need, l))
          ++kept;
        for (int64_t rank = 0; rank < meshPtr->size(); ++rank) {
          ++checked;
          EXPECT_EQ(elementsOf(view, need, in, rank),
                    elementsOf(view, give, out, rank))
              << formatLayout(*meshPtr, need) << " -> "
              << formatLayout(*meshPtr, give) << " rank " << rank;
        }
      }
    }
  }
  std::printf("[sweep] reshape: %lld rank checks, %lld layouts kept as is\n",
              static_cast<long long>(checked), static_cast<long long>(kept));
  EXPECT_GT(kept, 20); // the rule keeps splits, not only replicates
}

TEST(LayoutRules, BitcastKeepsEveryRanksBytes) {
  // fp32 [r, n] <-> bf16 [r, 2n] (ratio 2), fp8 [r, 4n] -> fp32 [r, n].
  struct Case {
    Ints in, out;
    int64_t inBytes, outBytes;
  };
  std::vector<Case> cases = {{{4, 6}, {4, 12}, 4, 2},
                             {{4, 5}, {4, 10}, 4, 2},
                             {{6, 12}, {6, 3}, 1, 4},
                             {{3, 7}, {3, 14}, 4, 2}};
  int64_t checked = 0;
  for (auto meshPtr : {mesh2x3(), mesh2x2()}) {
    View view = View::root(meshPtr);
    for (const Case &c : cases) {
      for (const Layout &l : layouts(view, 2)) {
        auto r = bitcastRule(&l, nullptr, c.in, c.out);
        ASSERT_TRUE(r.has_value());
        for (int64_t rank = 0; rank < meshPtr->size(); ++rank) {
          std::set<int64_t> before, after;
          for (int64_t e : elementsOf(view, r->operands[0], c.in, rank))
            for (int64_t b = 0; b < c.inBytes; ++b)
              before.insert(e * c.inBytes + b);
          for (int64_t e : elementsOf(view, r->results[0], c.out, rank))
            for (int64_t b = 0; b < c.outBytes; ++b)
              after.insert(e * c.outBytes + b);
          ++checked;
          EXPECT_EQ(before, after) << formatLayout(*meshPtr, r->operands[0]);
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

/// A box of a 2-d layout: [rowBegin, rowEnd) x [colBegin, colEnd).
struct Box2 {
  int64_t r0, r1, c0, c1;
};
Box2 box2(const View &view, const Layout &l, const Ints &shape, int64_t rank) {
  ShardBox b = *shardOf(view, l, shape, rank);
  auto begin = [&](int d) { return b.localShape[d] ? b.offset[d] : 0; };
  return {begin(0), begin(0) + b.localShape[0], begin(1),
          begin(1) + b.localShape[1]};
}

TEST(LayoutRules, MatmulLocalProductsSumToTheProduct) {
  int64_t checked = 0;
  for (auto meshPtr : {mesh2x2(), mesh2x3()}) {
    View view = View::root(meshPtr);
    for (Ints dims : {Ints{4, 6, 6}, Ints{5, 7, 3}}) {
      int64_t M = dims[0], K = dims[1], N = dims[2];
      // A[i][k] = i + 2k + 1, B[k][j] = k - j + 3.
      auto A = [](int64_t i, int64_t k) { return i + 2 * k + 1; };
      auto B = [](int64_t k, int64_t j) { return k - j + 3; };
      std::vector<Layout> all = layouts(view, 2);
      for (size_t x = 0; x < all.size(); ++x) {
        for (size_t y = 0; y < all.size(); ++y) {
          auto r = matmulRule(view, &all[x], &all[y], nullptr);
          ASSERT_TRUE(r.has_value());
          const Layout &a = r->operands[0], &b = r->operands[1],
                       &c = r->results[0];
          ASSERT_TRUE(verifyLayout(view, a).ok());
          ASSERT_TRUE(verifyLayout(view, b).ok());
          ASSERT_TRUE(verifyLayout(view, c).ok()) << formatLayout(*meshPtr, c);
          // Sum every rank's local product into its C box, once per group of
          // ranks that differ only in non-partial replicated axes: each
          // partial group contributes exactly once to each element.
          std::map<std::pair<int64_t, int64_t>, int64_t> sum;
          std::set<std::vector<int64_t>> seenKeys;
          for (int64_t rank = 0; rank < meshPtr->size(); ++rank) {
            Box2 ba = box2(view, a, {M, K}, rank);
            Box2 bb = box2(view, b, {K, N}, rank);
            Box2 bc = box2(view, c, {M, N}, rank);
            ASSERT_EQ(ba.c0, bb.r0);
            ASSERT_EQ(ba.c1, bb.r1);
            ASSERT_EQ(ba.r0, bc.r0);
            ASSERT_EQ(ba.r1, bc.r1);
            ASSERT_EQ(bb.c0, bc.c0);
            ASSERT_EQ(bb.c1, bc.c1);
            // Count each (C box, K range) once: replicas hold the same.
            std::vector<int64_t> key = {bc.r0, bc.r1, bc.c0,
                                        bc.c1, ba.c0, ba.c1};
            if (!seenKeys.insert(key).second)
              continue;
            for (int64_t i = bc.r0; i < bc.r1; ++i)
              for (int64_t j = bc.c0; j < bc.c1; ++j)
                for (int64_t k = ba.c0; k < ba.c1; ++k)
                  sum[std::make_pair(i, j)] += A(i, k) * B(k, j);
          }
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              int64_t truth = 0;
              for (int64_t k = 0; k < K; ++k)
                truth += A(i, k) * B(k, j);
              ++checked;
              ASSERT_EQ(sum[std::make_pair(i, j)], truth)
                  << formatLayout(*meshPtr, a) << " x "
                  << formatLayout(*meshPtr, b) << " -> "
                  << formatLayout(*meshPtr, c);
            }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(LayoutRules, ReduceSumTurnsReducedSplitsIntoPartialSums) {
  auto meshPtr = mesh2x3();
  View view = View::root(meshPtr);
  for (const Layout &l : layouts(view, 2)) {
    auto r = reduceSumRule(&l, nullptr, {1}, 2);
    ASSERT_TRUE(r.has_value());
    const Layout &out = r->results[0];
    ASSERT_EQ(out.rank(), 1);
    EXPECT_EQ(out.dims[0], l.dims[0]);
    EXPECT_TRUE(refsCover(*meshPtr, out.partial, l.dimRefs(1)));
    EXPECT_EQ(refsSize(out.partial), refsSize(l.dimRefs(1)));
  }
}

TEST(LayoutRules, ElementwiseSharesOneLayoutWithoutPendingReductions) {
  auto meshPtr = mesh2x2();
  View view = View::root(meshPtr);
  Layout p = replicatedLayout(1);
  p.partial = view.axes()[0].refs;
  Layout s = replicatedLayout(1);
  s.dims[0] = {view.axes()[1].refs};
  auto r = elementwiseRule(2, {&p, &s}, nullptr);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->results[0].partial.empty());
  EXPECT_EQ(r->operands[1].dims, r->results[0].dims);
  EXPECT_FALSE(elementwiseRule(2, {nullptr, nullptr}, nullptr).has_value());
}

// Every pair of layouts on a 2x2 mesh with every pending reduction: an
// addition keeps a pending sum or avg exactly when both operands have the
// same layout (the sum of two partial sums is the partial sum of the
// sums), and otherwise behaves as any elementwise op.
TEST(LayoutRules, AdditionKeepsASharedPendingSumOrAverage) {
  auto meshPtr = mesh2x2();
  View view = View::root(meshPtr);
  std::vector<Layout> all;
  for (const Layout &l : layouts(view, 1))
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
      for (int axis = 0; axis < 2; ++axis) {
        Layout x = l;
        x.partial = view.axes()[axis].refs;
        x.reduceOp = op;
        if (verifyLayout(view, x))
          all.push_back(x);
      }
  int kept = 0;
  for (const Layout &a : all)
    for (const Layout &b : all) {
      auto linear = linearElementwiseRule(2, {&a, &b}, nullptr);
      auto plain = elementwiseRule(2, {&a, &b}, nullptr);
      ASSERT_TRUE(linear && plain);
      bool same = a.dims == b.dims && a.partial == b.partial &&
                  a.reduceOp == b.reduceOp;
      if (same && a.reduceOp != ReduceOp::Max) {
        ++kept;
        EXPECT_EQ(linear->results[0].partial, a.partial);
        EXPECT_EQ(linear->results[0].reduceOp, a.reduceOp);
        EXPECT_EQ(linear->operands[1].dims, a.dims);
      } else {
        EXPECT_EQ(linear->results[0].partial, plain->results[0].partial);
        EXPECT_EQ(linear->results[0].dims, plain->results[0].dims);
        EXPECT_TRUE(linear->results[0].partial.empty());
      }
    }
  EXPECT_GT(kept, 0);
  // A stated result without the pending reduction wins, as elsewhere.
  Layout p = replicatedLayout(1);
  p.partial = view.axes()[0].refs;
  Layout r = replicatedLayout(1);
  auto stated = linearElementwiseRule(2, {&p, &p}, &r);
  ASSERT_TRUE(stated);
  EXPECT_TRUE(stated->results[0].partial.empty());
}

} // namespace
