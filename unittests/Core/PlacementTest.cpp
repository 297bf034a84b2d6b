//===- PlacementTest.cpp - DTensor placement lists -> layouts -------------===//
//
// For every placement list (Replicate, Partial, Shard(d), _StridedShard(d, sf)
// with sf among products of the other axes' sizes) on small views and every
// small 1-D / 2-D shape, DTensor's left-to-right rule is evaluated on explicit
// index lists. layoutFromPlacements must either return a layout whose boxes
// are exactly those lists, or fail; and it must fail exactly when no nesting
// order of the dim's axes reproduces the lists.
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

/// `strict`: layoutFromPlacements must fail exactly when DTensor's lists are
/// not nested boxes. Otherwise a list whose split factors correspond to no
/// nesting order may also be rejected (even where, for tiny or size-1
/// cases, DTensor's rule happens to give nested boxes).
void runViewCase(const ViewCase &vc, Stats &stats, bool strict) {
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
      if (strict) {
        // Only the lists whose factors nest are checked in the main sweep
        // for exactness; here the others.
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

        bool nests = true;
        for (int d = 0; d < rank; ++d)
          nests &= splitFactorsNest(placements, axisSizes, d);

        auto layout = layoutFromPlacements(view, placements, shape);
        if (!layout.ok()) {
          ++stats.rejected;
          SWEEP_EXPECT(log, !expressible || (!strict && !nests))
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
        // Partial axes and op.
        AxisRefList partialRefs;
        for (size_t a = 0; a < placements.size(); ++a)
          if (placements[a].kind == Placement::Kind::Partial)
            for (const AxisRef &ref : view.axes()[a].refs)
              partialRefs.push_back(ref);
        AxisRefList got = layout->partial;
        std::sort(got.begin(), got.end());
        std::sort(partialRefs.begin(), partialRefs.end());
        SWEEP_EXPECT(log, got == partialRefs)
            << where << ": partial refs " << formatAxisRefs(*mesh, got);
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

void runSweep(const std::vector<ViewCase> &cases, bool strict = false) {
  Stats stats;
  for (const ViewCase &vc : cases) {
    runViewCase(vc, stats, strict);
    if (::testing::Test::HasFatalFailure())
      return;
  }
  std::printf("[sweep] %zu views, %lld placement lists, %lld (list, shape) "
              "evaluations: %lld accepted, %lld rejected (%lld with a "
              "non-contiguous rank)\n",
              cases.size(), (long long)stats.lists,
              (long long)stats.evaluations, (long long)stats.accepted,
              (long long)stats.rejected, (long long)stats.nonContiguous);
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

// The strict reading of "fails exactly when some rank's DTensor list is not
// one nested box", on the lists whose split factors correspond to no nesting
// order (the rest are covered above). E.g. on (a=2, b=2) "S(0),SS(0,2)" with
// 2 rows gives ranks [0], [], [1], [] -- the boxes of [{a, b}].
TEST(PlacementSweep, StrictExactnessOnNonNestingFactors) {
  runSweep(sweepCases(), /*strict=*/true);
}

// DTensor on a flattened mesh dim chunks by the dim's size once.
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
}

} // namespace
