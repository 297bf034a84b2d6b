//===- PlacementTest.cpp - DTensor placement lists -> layouts -------------===//
//
// For every placement list (Replicate, Partial, Shard(d), _StridedShard(d, sf)
// with sf among products of the other axes' sizes) on small views and every
// small 1-D / 2-D shape, DTensor's left-to-right rule is evaluated on explicit
// index lists. layoutFromPlacements must either return a layout whose boxes
// are exactly those lists, with one level per splitting view axis, or fail;
// and it must fail exactly when no nesting order of the dim's view axes (each
// one level, chunking once by its size) reproduces the lists.
//
//===----------------------------------------------------------------------===//

#include "BruteForce.h"
#include "TestHelpers.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Placement.h"

#include <gtest/gtest.h>

#include <set>

using namespace meshplan;
using bf::Ints;

namespace {

struct ViewCase {
  std::string desc;
  Ints shape;
  std::string viewExpr; // "" for the root view
  std::optional<Ints> order;
};

struct Stats {
  int64_t lists = 0, evaluations = 0, accepted = 0, rejected = 0,
          nonContiguous = 0;
};

std::vector<std::vector<Placement>> enumeratePlacements(const Ints &axisSizes,
                                                        int rank) {
  int n = static_cast<int>(axisSizes.size());
  std::vector<std::vector<Placement>> options(n);
  for (int a = 0; a < n; ++a) {
    options[a].push_back(Placement::replicate());
    options[a].push_back(Placement::partial(ReduceOp::Sum));
    std::set<int64_t> sfs;
    for (int mask = 1; mask < (1 << n); ++mask) {
      if (mask & (1 << a))
        continue;
      int64_t p = 1;
      for (int b = 0; b < n; ++b)
        if (mask & (1 << b))
          p *= axisSizes[b];
      if (p > 1)
        sfs.insert(p);
    }
    for (int d = 0; d < rank; ++d) {
      options[a].push_back(Placement::shard(d));
      for (int64_t sf : sfs)
        options[a].push_back(Placement::strided(d, sf));
    }
  }
  std::vector<std::vector<Placement>> out = {{}};
  for (int a = 0; a < n; ++a) {
    std::vector<std::vector<Placement>> next;
    for (const auto &prefix : out)
      for (const Placement &p : options[a]) {
        auto list = prefix;
        list.push_back(p);
        next.push_back(list);
      }
    out = std::move(next);
  }
  return out;
}

bool isSplit(const Placement &p) {
  return p.kind == Placement::Kind::Shard ||
         p.kind == Placement::Kind::StridedShard;
}

/// True when the split factors of the placements on dim d correspond to a
/// nesting order: some order of the dim's axes in which every
/// _StridedShard's sf is the product of the sizes of the axes that come
/// after it in the list but before it in the nesting.
bool splitFactorsNest(const std::vector<Placement> &placements,
                      const Ints &axisSizes, int d) {
  std::vector<int> axes;
  for (size_t a = 0; a < placements.size(); ++a)
    if (isSplit(placements[a]) && placements[a].dim == d)
      axes.push_back(static_cast<int>(a));
  for (const auto &perm : bf::permutations(static_cast<int>(axes.size()))) {
    std::vector<int> order; // nesting order of list positions
    for (int i : perm)
      order.push_back(i);
    bool ok = true;
    for (size_t pos = 0; pos < order.size() && ok; ++pos) {
      int i = order[pos];
      int64_t sf = 1;
      for (size_t before = 0; before < pos; ++before)
        if (order[before] > i)
          sf *= axisSizes[axes[order[before]]];
      ok = sf == placements[axes[i]].splitFactor;
    }
    if (ok)
      return true;
  }
  return false;
}

/// layoutFromPlacements must accept a list exactly when DTensor's lists are
/// the nested boxes of some order of the dim's view axes, one level each.
/// `onlyNonNesting`: check only the lists whose split factors correspond to
/// no nesting order (degenerate sizes can still give one nested box each).
void runViewCase(const ViewCase &vc, Stats &stats, bool onlyNonNesting) {
  std::vector<std::string> names;
  for (size_t i = 0; i < vc.shape.size(); ++i)
    names.push_back(testutil::axisName(static_cast<int>(i)));
  auto mesh = testutil::makeMesh(vc.shape, names, vc.order);
  ASSERT_TRUE(mesh);
  AxisNamespace ns(mesh);
  auto viewR = vc.viewExpr.empty()
                   ? Result<View>(View::root(mesh))
                   : evaluateViewExpr(View::root(mesh), vc.viewExpr, ns);
  ASSERT_TRUE(viewR.ok()) << vc.desc << ": " << viewR.error().message;
  const View &view = *viewR;
  testutil::FailureLog log(vc.desc);

  // Brute-force view coordinates: a view axis is a list of root axes (no
  // sub-axes in these cases); its coordinate is their mixed radix.
  bf::NDArray ranks = testutil::rankArray(vc.shape, vc.order);
  int64_t world = ranks.numel();
  Ints axisSizes;
  std::vector<std::vector<int>> axisRoots;
  for (const ViewAxis &axis : view.axes()) {
    axisSizes.push_back(axis.size());
    std::vector<int> roots;
    for (const AxisRef &ref : axis.refs) {
      ASSERT_TRUE(ref.isWhole(*mesh));
      roots.push_back(ref.axis);
    }
    axisRoots.push_back(roots);
  }
  // Each view axis's refs as the test builds them: whole root axes, major to
  // minor, size-1 ones dropped.
  std::vector<AxisRefList> rootRefs;
  for (const auto &roots : axisRoots) {
    AxisRefList refs;
    for (int r : roots)
      if (vc.shape[r] > 1)
        refs.push_back(AxisRef{r, 1, vc.shape[r]});
    rootRefs.push_back(refs);
  }
  std::vector<Ints> viewCoord(world);
  for (int64_t flat = 0; flat < world; ++flat) {
    Ints c = ranks.unravel(flat);
    for (const auto &roots : axisRoots) {
      int64_t digit = 0;
      for (int r : roots)
        digit = digit * vc.shape[r] + c[r];
      viewCoord[flat].push_back(digit);
    }
  }

  std::vector<Ints> shapes;
  for (int64_t n = 0; n <= 13; ++n)
    shapes.push_back({n});
  for (int64_t n0 = 0; n0 <= 13; ++n0)
    for (int64_t n1 : {0, 1, 3, 5, 8})
      shapes.push_back({n0, n1});

  for (int rank : {1, 2}) {
    for (const auto &placements : enumeratePlacements(axisSizes, rank)) {
      ++stats.lists;
      if (onlyNonNesting) {
        bool nests = true;
        for (int d = 0; d < rank; ++d)
          nests &= splitFactorsNest(placements, axisSizes, d);
        if (nests)
          continue;
      }
      std::string text = formatPlacements(placements);
      // Text round trips, short and torch style.
      for (bool torch : {false, true}) {
        auto parsed = parsePlacements(formatPlacements(placements, torch));
        SWEEP_EXPECT(log, parsed.ok() && *parsed == placements)
            << vc.desc << ": " << formatPlacements(placements, torch)
            << " does not parse back: " << testutil::errorOf(parsed);
      }
      for (const Ints &shape : shapes) {
        if (static_cast<int>(shape.size()) != rank)
          continue;
        ++stats.evaluations;
        std::string where =
            vc.desc + " placements " + text + " shape " + bf::str(shape);
        // DTensor's lists per rank and dim.
        std::vector<std::vector<Ints>> lists(world);
        std::vector<bool> dimContiguous(rank, true);
        for (int64_t flat = 0; flat < world; ++flat)
          for (int d = 0; d < rank; ++d) {
            std::vector<bf::DimPlacement> splits;
            for (size_t a = 0; a < placements.size(); ++a)
              if (isSplit(placements[a]) && placements[a].dim == d)
                splits.push_back({placements[a].splitFactor, axisSizes[a],
                                  viewCoord[flat][a]});
            lists[flat].push_back(bf::dtensorRule(shape[d], splits));
            if (!bf::isContiguous(lists[flat].back()))
              dimContiguous[d] = false;
          }
        // Does some nesting order per dim reproduce them?
        bool expressible = true;
        for (int d = 0; d < rank && expressible; ++d) {
          std::vector<int> axes;
          for (size_t a = 0; a < placements.size(); ++a)
            if (isSplit(placements[a]) && placements[a].dim == d)
              axes.push_back(static_cast<int>(a));
          bool found = false;
          for (const auto &perm :
               bf::permutations(static_cast<int>(axes.size()))) {
            bool all = true;
            for (int64_t flat = 0; flat < world && all; ++flat) {
              Ints sizes, coords;
              for (int i : perm) {
                sizes.push_back(axisSizes[axes[i]]);
                coords.push_back(viewCoord[flat][axes[i]]);
              }
              all = bf::nestedChunk(shape[d], sizes, coords) == lists[flat][d];
            }
            if (all) {
              found = true;
              break;
            }
          }
          expressible = found;
        }

        auto layout = layoutFromPlacements(view, placements, shape);
        if (!layout.ok()) {
          ++stats.rejected;
          SWEEP_EXPECT(log, !expressible)
              << where << ": rejected, but a nesting order gives DTensor's "
              << "boxes: " << layout.error().message;
          // The first dim that is not exact decides the message: when some
          // rank holds several pieces there, the error names a rank.
          bool namesRank = false;
          for (int d = 0; d < rank; ++d) {
            if (!dimContiguous[d]) {
              namesRank = true;
              break;
            }
            if (!splitFactorsNest(placements, axisSizes, d))
              break;
          }
          if (namesRank) {
            ++stats.nonContiguous;
            SWEEP_EXPECT(log, layout.error().message.find("rank ") !=
                                  std::string::npos)
                << where
                << ": the error should name a rank: " << layout.error().message;
          }
          continue;
        }
        ++stats.accepted;
        SWEEP_EXPECT(log, expressible)
            << where << ": accepted as " << formatLayout(*mesh, *layout)
            << " but no nesting order gives DTensor's boxes";
        for (int64_t flat = 0; flat < world; ++flat) {
          auto box = shardOf(view, *layout, shape, ranks.data[flat]);
          SWEEP_EXPECT(log, box.ok()) << where;
          if (!box.ok())
            continue;
          for (int d = 0; d < rank; ++d) {
            const Ints &list = lists[flat][d];
            int64_t offset = list.empty() ? shape[d] : list[0];
            SWEEP_EXPECT(log, box->offset[d] == offset &&
                                  bf::isRange(list, offset, box->localShape[d]))
                << where << " as " << formatLayout(*mesh, *layout) << " rank "
                << ranks.data[flat] << " dim " << d << ": box ("
                << box->offset[d] << ", " << box->localShape[d]
                << "), DTensor holds " << bf::str(list);
          }
        }
        // Each view axis that splits a dim (size > 1) is one level of it,
        // whatever the order; size-1 axes leave no level.
        for (int d = 0; d < rank; ++d) {
          std::vector<AxisRefList> expected, got;
          for (size_t a = 0; a < placements.size(); ++a)
            if (isSplit(placements[a]) && placements[a].dim == d &&
                axisSizes[a] > 1)
              expected.push_back(rootRefs[a]);
          for (const AxisRefList &level : layout->dims[d])
            got.push_back(level);
          std::sort(expected.begin(), expected.end());
          std::sort(got.begin(), got.end());
          SWEEP_EXPECT(log, got == expected)
              << where << ": dim " << d << " of "
              << formatLayout(*mesh, *layout)
              << " is not one level per splitting view axis";
        }
        // Partial axes and op (size-1 refs dropped by normalization).
        AxisRefList partialRefs;
        for (size_t a = 0; a < placements.size(); ++a)
          if (placements[a].kind == Placement::Kind::Partial)
            partialRefs.insert(partialRefs.end(), rootRefs[a].begin(),
                               rootRefs[a].end());
        AxisRefList got = layout->partial;
        std::sort(got.begin(), got.end());
        std::sort(partialRefs.begin(), partialRefs.end());
        SWEEP_EXPECT(log, got == partialRefs)
            << where << ": partial refs " << formatAxisRefs(*mesh, got)
            << ", expected " << formatAxisRefs(*mesh, partialRefs);
        if (!partialRefs.empty()) {
          ReduceOp op = ReduceOp::Sum;
          for (const Placement &p : placements)
            if (p.kind == Placement::Kind::Partial)
              op = p.op;
          SWEEP_EXPECT(log, layout->reduceOp == op) << where << ": reduce op";
        }
        // And back to placements.
        auto back = placementsFromLayout(view, *layout, shape);
        if (back.ok()) {
          auto again = layoutFromPlacements(view, *back, shape);
          SWEEP_EXPECT(log,
                       again.ok() && equivalentLayouts(view, *layout, *again))
              << where << ": placementsFromLayout gave "
              << formatPlacements(*back) << ", which comes back as "
              << (again.ok() ? formatLayout(*mesh, *again)
                             : again.error().message);
        } else {
          // The list we started from expresses this layout exactly.
          SWEEP_EXPECT(log, false)
              << where << ": layout " << formatLayout(*mesh, *layout)
              << " came from a DTensor list, yet placementsFromLayout says: "
              << back.error().message;
        }
      }
      if (::testing::Test::HasFatalFailure())
        return;
    }
  }
}

void runSweep(const std::vector<ViewCase> &cases, bool onlyNonNesting = false) {
  Stats stats;
  for (const ViewCase &vc : cases) {
    runViewCase(vc, stats, onlyNonNesting);
    if (::testing::Test::HasFatalFailure())
      return;
  }
  std::printf("[sweep] %zu views, %lld placement lists, %lld (list, shape) "
              "evaluations: %lld accepted, %lld rejected (%lld with a "
              "non-contiguous rank)\n",
              cases.size(), (long long)stats.lists,
              (long long)stats.evaluations, (long long)stats.accepted,
              (long long)stats.rejected, (long long)stats.nonContiguous);
  EXPECT_GT(stats.accepted, 0);
  EXPECT_GT(stats.rejected, 0);
  EXPECT_GT(stats.nonContiguous, 0);
}

std::vector<ViewCase> sweepCases() {
  std::vector<ViewCase> cases;
  for (Ints shape : std::vector<Ints>{{2},
                                      {3},
                                      {4},
                                      {2, 2},
                                      {2, 3},
                                      {3, 2},
                                      {4, 2},
                                      {2, 4},
                                      {2, 2, 2},
                                      {1, 2, 3}})
    cases.push_back({"mesh " + bf::str(shape), shape, "", std::nullopt});
  cases.push_back({"mesh [2,3] shuffled", {2, 3}, "", Ints{5, 3, 1, 4, 0, 2}});
  cases.push_back(
      {"mesh [2,2,2] view slice(c,a)", {2, 2, 2}, "slice(c,a)", std::nullopt});
  return cases;
}

TEST(PlacementSweep, LayoutFromPlacementsMatchesDTensor) {
  runSweep(sweepCases());
}

// Accepted iff DTensor's boxes are some layout's boxes (one box per rank,
// the view axes nested in some order), on the lists whose split factors
// correspond to no nesting order. E.g. on (a=2, b=2) "S(0),SS(0,2)" with 2
// rows gives ranks [0], [], [1], [] -- the boxes of [{a, b}].
TEST(PlacementSweep, StrictExactnessOnNonNestingFactors) {
  runSweep(sweepCases(), /*onlyNonNesting=*/true);
}

// DTensor on a flattened mesh dim chunks by the dim's size once: the view
// axis is one level.
TEST(PlacementSweep, FlattenedViewAxes) {
  runSweep({{"mesh [2,2,2] view flatten(c,a as ca)",
             {2, 2, 2},
             "flatten(c,a as ca)",
             std::nullopt},
            {"mesh [2,3] view flatten(a,b as ab)",
             {2, 3},
             "flatten(a,b as ab)",
             std::nullopt}});
}

// Lists whose split factors match no nesting order are accepted when, for
// the given shape, DTensor's boxes are one nested box per rank.
TEST(Placement, DegenerateStridedListsWithOneBoxEach) {
  auto mesh = testutil::makeMesh({2, 2}, {"a", "b"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  // 2 rows: a chunks [0] | [1]; SS(0,2) over b gives b=0 the whole chunk.
  auto l = layoutFromPlacements(
      root, {Placement::shard(0), Placement::strided(0, 2)}, {2});
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(testutil::rowsOf(root, *l, 2),
            (std::vector<Ints>{{0}, {}, {1}, {}}));
  auto ab = parseLayout(root, ns, "[{a, b}]");
  ASSERT_TRUE(ab.ok());
  EXPECT_TRUE(equivalentLayouts(root, *l, *ab)) << formatLayout(*mesh, *l);
  // 4 rows: ranks (a, 0) hold both rows of their a-chunk and (a, 1) none;
  // one box each, but no nesting of a and b gives them: rejected, naming
  // the rank.
  auto four = layoutFromPlacements(
      root, {Placement::shard(0), Placement::strided(0, 2)}, {4});
  ASSERT_FALSE(four.ok());
  EXPECT_NE(four.error().message.find("rank 0"), std::string::npos)
      << four.error().message;
  // SS on a size-1 axis leaves the dim whole.
  auto unit = testutil::makeMesh({1, 2}, {"u", "x"});
  View unitRoot = View::root(unit);
  auto ul = layoutFromPlacements(
      unitRoot, {Placement::strided(0, 2), Placement::replicate()}, {5});
  ASSERT_TRUE(ul.ok()) << ul.error().message;
  EXPECT_TRUE(equivalentLayouts(unitRoot, *ul, replicatedLayout(1)))
      << formatLayout(*unit, *ul);
}

TEST(Placement, NegativeDimAndTorchSpellings) {
  auto mesh = testutil::makeMesh({2, 2}, {"dp", "tp"});
  View root = View::root(mesh);
  auto p = parsePlacements(
      "[Replicate(), Shard(dim=-1)]"); // -1 is the last dim, as in torch
  ASSERT_TRUE(p.ok()) << p.error().message;
  auto l = layoutFromPlacements(root, *p, {4, 6});
  ASSERT_TRUE(l.ok()) << l.error().message;
  AxisNamespace ns(mesh);
  auto expected = parseLayout(root, ns, "[{}, {tp}]");
  ASSERT_TRUE(expected.ok());
  EXPECT_TRUE(equivalentLayouts(root, *l, *expected))
      << formatLayout(*mesh, *l);
  auto partial = parsePlacements("P(max),R");
  ASSERT_TRUE(partial.ok());
  auto pl = layoutFromPlacements(root, *partial, {4});
  ASSERT_TRUE(pl.ok());
  EXPECT_EQ(pl->reduceOp, ReduceOp::Max);
  auto short_ = parsePlacements("R, P(avg)");
  ASSERT_TRUE(short_.ok());
  EXPECT_EQ((*short_)[1].op, ReduceOp::Avg);
  // One trailing comma, as in a Python tuple, and nothing else empty.
  auto tuple = parsePlacements("(Shard(dim=0),)");
  ASSERT_TRUE(tuple.ok()) << tuple.error().message;
  EXPECT_EQ(*tuple, std::vector<Placement>{Placement::shard(0)});
  EXPECT_FALSE(parsePlacements("S(0),,").ok());
}

} // namespace
