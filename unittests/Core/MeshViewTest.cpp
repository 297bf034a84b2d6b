//===- MeshViewTest.cpp - Mesh coordinates, groups and view chains --------===//
//
// Sweep 1: every mesh shape with up to 4 axes of sizes {1,2,3,4} and at most
// 64 devices, with the default device order and with shuffled orders: every
// rank's coordinate, and for every ordered subset of axes the group, split
// key, local rank and partition key, against numpy-style transposes of the
// explicit rank array.
//
// Sweep 2: every chain of up to 3 view operations (slice / flatten / unflatten)
// on small meshes, against a torch-like model that keeps one explicit rank
// array per block.
//
//===----------------------------------------------------------------------===//

#include "BruteForce.h"
#include "TestHelpers.h"

#include "meshplan/Core/MeshView.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>

using namespace meshplan;
using bf::Ints;
using testutil::axisName;

namespace {

std::vector<Ints> allShapes(int maxAxes, int64_t maxDevices) {
  std::vector<Ints> out;
  std::function<void(Ints)> rec = [&](Ints cur) {
    if (!cur.empty())
      out.push_back(cur);
    if (static_cast<int>(cur.size()) == maxAxes)
      return;
    for (int64_t s = 1; s <= 4; ++s) {
      Ints next = cur;
      next.push_back(s);
      if (bf::prod(next) <= maxDevices)
        rec(next);
    }
  };
  rec({});
  return out;
}

struct SweepStats {
  int64_t meshes = 0, subsets = 0, groupChecks = 0, keyPairs = 0;
};

void checkMeshAndSubsets(const Ints &shape, const std::optional<Ints> &order,
                         SweepStats &stats) {
  int n = static_cast<int>(shape.size());
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i)
    names.push_back(axisName(i));
  auto mesh = testutil::makeMesh(shape, names, order);
  ASSERT_TRUE(mesh);
  ++stats.meshes;
  bf::NDArray ranks = testutil::rankArray(shape, order);
  std::string where = "mesh " + bf::str(shape) +
                      (order ? " order " + bf::str(*order) : std::string());
  ASSERT_EQ(mesh->size(), ranks.numel()) << where;

  View root = View::root(mesh);
  // Coordinates.
  for (int64_t flat = 0; flat < ranks.numel(); ++flat) {
    int64_t rank = ranks.data[flat];
    Ints expected = ranks.unravel(flat);
    auto coord = mesh->coordinate(rank);
    ASSERT_TRUE(coord.ok()) << where << " rank " << rank;
    EXPECT_EQ(*coord, expected) << where << " rank " << rank;
    auto vcoord = root.coordinate(rank);
    ASSERT_TRUE(vcoord.ok());
    EXPECT_EQ(*vcoord, expected) << where << " rank " << rank;
    EXPECT_TRUE(mesh->contains(rank));
  }

  AxisNamespace ns(mesh);
  auto subsets = bf::orderedSubsets(n);
  std::vector<std::vector<Ints>> partitions;
  std::vector<std::string> keys;
  for (const auto &subset : subsets) {
    ++stats.subsets;
    std::vector<std::string> subsetNames;
    for (int a : subset)
      subsetNames.push_back(names[a]);
    std::string sw = where + " subset " + testutil::joinNames(subsetNames);
    std::vector<Ints> rows = bf::groupsOver(ranks, subset);
    partitions.push_back(bf::canonicalPartition(rows));
    keys.push_back(root.partitionKey(subset));

    auto sliced = sliceView(root, subsetNames, ns);
    ASSERT_TRUE(sliced.ok()) << sw << ": " << testutil::errorOf(sliced);
    ASSERT_EQ(sliced->numAxes(), static_cast<int>(subset.size()));
    std::vector<int> allSliced(subset.size());
    std::iota(allSliced.begin(), allSliced.end(), 0);
    auto flat = evaluateViewExpr(
        root, "flatten(" + testutil::joinNames(subsetNames) + ")", ns);
    ASSERT_TRUE(flat.ok()) << sw << ": " << testutil::errorOf(flat);
    auto flatIndex = flat->findAxis(testutil::joinNames(subsetNames, "_"));
    ASSERT_TRUE(flatIndex.has_value()) << sw << " " << flat->str();

    // The listing and the group size agree with the brute-force rows.
    AxisRefList refs = root.refsOf(subset);
    EXPECT_EQ(bf::canonicalPartition(listGroupsOf(*mesh, refs)),
              partitions.back())
        << sw;
    EXPECT_EQ(groupSizeOf(*mesh, refs),
              static_cast<int64_t>(rows.front().size()))
        << sw;

    std::map<int64_t, Ints> rowOfColor;
    std::map<Ints, int64_t> colorOfRow;
    for (const Ints &row : rows) {
      for (size_t i = 0; i < row.size(); ++i) {
        int64_t rank = row[i];
        ++stats.groupChecks;
        auto g = root.group(rank, subset);
        ASSERT_TRUE(g.ok()) << sw;
        EXPECT_EQ(*g, row) << sw << " rank " << rank;
        auto gs = sliced->group(rank, allSliced);
        ASSERT_TRUE(gs.ok());
        EXPECT_EQ(*gs, row) << sw << " (sliced) rank " << rank;
        auto gf = flat->group(rank, {*flatIndex});
        ASSERT_TRUE(gf.ok());
        EXPECT_EQ(*gf, row) << sw << " (flattened) rank " << rank;
        auto lr = root.localRank(rank, subset);
        ASSERT_TRUE(lr.ok());
        EXPECT_EQ(*lr, static_cast<int64_t>(i)) << sw << " rank " << rank;
        auto key = root.split(rank, subset);
        ASSERT_TRUE(key.ok());
        EXPECT_EQ(key->key, static_cast<int64_t>(i)) << sw << " rank " << rank;
        auto [it, fresh] = rowOfColor.emplace(key->color, row);
        EXPECT_EQ(it->second, row)
            << sw << ": color " << key->color << " shared by two groups";
        auto [it2, fresh2] = colorOfRow.emplace(row, key->color);
        EXPECT_EQ(it2->second, key->color)
            << sw << ": one group has two colors, rank " << rank;
        (void)fresh;
        (void)fresh2;
      }
    }
    EXPECT_EQ(static_cast<int64_t>(rowOfColor.size()),
              static_cast<int64_t>(rows.size()))
        << sw;
  }
  for (size_t i = 0; i < subsets.size(); ++i)
    for (size_t j = 0; j < subsets.size(); ++j) {
      ++stats.keyPairs;
      EXPECT_EQ(keys[i] == keys[j], partitions[i] == partitions[j])
          << where << ": partition keys " << keys[i] << " vs " << keys[j];
    }
}

TEST(MeshViewSweep, GroupsSplitKeysAndPartitionKeys) {
  std::mt19937_64 rng(12345);
  SweepStats stats;
  auto shapes = allShapes(4, 64);
  for (const Ints &shape : shapes) {
    int64_t n = bf::prod(shape);
    checkMeshAndSubsets(shape, std::nullopt, stats);
    Ints perm = bf::iota(n);
    std::shuffle(perm.begin(), perm.end(), rng);
    checkMeshAndSubsets(shape, perm, stats);
    // Sparse, non-zero-based rank ids (a mesh over ranks 64..).
    Ints sparse = perm;
    for (int64_t &r : sparse)
      r = 64 + 3 * r;
    checkMeshAndSubsets(shape, sparse, stats);
    if (HasFatalFailure())
      return;
  }
  std::printf("[sweep] %zu shapes, %lld meshes, %lld ordered subsets, %lld "
              "group checks, %lld partition-key pairs\n",
              shapes.size(), (long long)stats.meshes, (long long)stats.subsets,
              (long long)stats.groupChecks, (long long)stats.keyPairs);
}

//===----------------------------------------------------------------------===//
// View chains against a torch-like block model
//===----------------------------------------------------------------------===//

/// A view as torch sees it: named axes and, per block, the explicit rank
/// array. `segments` keeps each axis's root digit sizes (major to minor), used
/// only to decide when an unflatten is expressible as sub-axes.
struct BlockView {
  std::vector<std::string> names;
  std::vector<bf::NDArray> blocks;
  std::vector<Ints> segments;
};

BlockView rootBlocks(const Ints &shape, const std::optional<Ints> &order) {
  BlockView v;
  for (size_t i = 0; i < shape.size(); ++i) {
    v.names.push_back(axisName(static_cast<int>(i)));
    v.segments.push_back(shape[i] > 1 ? Ints{shape[i]} : Ints{});
  }
  v.blocks.push_back(testutil::rankArray(shape, order));
  return v;
}

BlockView bruteSlice(const BlockView &v, const std::vector<int> &keep) {
  BlockView out;
  for (int a : keep) {
    out.names.push_back(v.names[a]);
    out.segments.push_back(v.segments[a]);
  }
  for (const bf::NDArray &block : v.blocks) {
    std::vector<int> perm;
    for (int i = 0; i < block.ndim(); ++i)
      if (std::find(keep.begin(), keep.end(), i) == keep.end())
        perm.push_back(i);
    Ints subShape;
    for (int a : keep) {
      perm.push_back(a);
      subShape.push_back(block.shape[a]);
    }
    bf::NDArray t = block.transpose(perm);
    int64_t g = bf::prod(subShape);
    for (int64_t r = 0; r < t.numel() / g; ++r)
      out.blocks.emplace_back(
          subShape, Ints(t.data.begin() + r * g, t.data.begin() + (r + 1) * g));
  }
  return out;
}

BlockView bruteFlatten(const BlockView &v, const std::vector<int> &axes,
                       const std::string &name) {
  int first = *std::min_element(axes.begin(), axes.end());
  std::vector<int> perm;
  for (int i = 0; i < first; ++i)
    if (std::find(axes.begin(), axes.end(), i) == axes.end())
      perm.push_back(i);
  perm.insert(perm.end(), axes.begin(), axes.end());
  for (int i = first + 1; i < static_cast<int>(v.names.size()); ++i)
    if (std::find(axes.begin(), axes.end(), i) == axes.end())
      perm.push_back(i);
  BlockView out;
  Ints merged;
  for (int a : axes)
    merged.insert(merged.end(), v.segments[a].begin(), v.segments[a].end());
  for (int i = 0; i < static_cast<int>(v.names.size()); ++i) {
    if (i == first) {
      out.names.push_back(name);
      out.segments.push_back(merged);
    } else if (std::find(axes.begin(), axes.end(), i) == axes.end()) {
      out.names.push_back(v.names[i]);
      out.segments.push_back(v.segments[i]);
    }
  }
  for (const bf::NDArray &block : v.blocks) {
    bf::NDArray t = block.transpose(perm);
    Ints shape;
    int64_t g = 1;
    for (int a : axes)
      g *= block.shape[a];
    for (size_t i = 0; i < perm.size(); ++i) {
      int a = perm[i];
      if (a == axes[0])
        shape.push_back(g);
      else if (std::find(axes.begin(), axes.end(), a) == axes.end())
        shape.push_back(block.shape[a]);
    }
    out.blocks.push_back(t.reshape(shape));
  }
  return out;
}

/// Cuts a digit-size list into a major part of size p and the rest; false
/// when p does not fall on a digit boundary (or a divisor of one digit).
bool cutSegments(const Ints &segs, int64_t p, Ints &major, Ints &minor) {
  major.clear();
  minor.clear();
  int64_t want = p;
  size_t i = 0;
  Ints rest = segs;
  while (want > 1) {
    if (i >= rest.size())
      return false;
    int64_t s = rest[i];
    if (s <= want) {
      if (want % s)
        return false;
      major.push_back(s);
      want /= s;
      ++i;
    } else {
      if (s % want)
        return false;
      major.push_back(want);
      rest[i] = s / want;
      want = 1;
    }
  }
  minor.assign(rest.begin() + i, rest.end());
  return true;
}

BlockView bruteUnflatten(const BlockView &v, int axis, int64_t p, int64_t q,
                         const std::string &n1, const std::string &n2,
                         bool &expressible) {
  BlockView out;
  Ints major, minor;
  expressible = cutSegments(v.segments[axis], p, major, minor);
  for (size_t i = 0; i < v.names.size(); ++i) {
    if (static_cast<int>(i) == axis) {
      out.names.push_back(n1);
      out.names.push_back(n2);
      out.segments.push_back(major);
      out.segments.push_back(minor);
    } else {
      out.names.push_back(v.names[i]);
      out.segments.push_back(v.segments[i]);
    }
  }
  for (const bf::NDArray &block : v.blocks) {
    Ints shape;
    for (int i = 0; i < block.ndim(); ++i) {
      if (i == axis) {
        shape.push_back(p);
        shape.push_back(q);
      } else {
        shape.push_back(block.shape[i]);
      }
    }
    out.blocks.push_back(block.reshape(shape));
  }
  return out;
}

struct ChainStats {
  int64_t chains = 0, unexpressible = 0, rankChecks = 0;
};

/// Compares every rank's block, coordinate and per-axis / per-pair / whole
/// groups.
void checkViewAgainstBlocks(const View &view, const BlockView &bv,
                            const std::string &where, ChainStats &stats) {
  ASSERT_EQ(view.numAxes(), static_cast<int>(bv.names.size())) << where;
  for (int i = 0; i < view.numAxes(); ++i)
    ASSERT_EQ(view.axes()[i].name, bv.names[i]) << where;
  std::vector<int> all(view.numAxes());
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int>> pairs;
  for (int i = 0; i < view.numAxes(); ++i)
    for (int j = 0; j < view.numAxes(); ++j)
      if (i != j)
        pairs.push_back({i, j});
  for (const bf::NDArray &block : bv.blocks) {
    ASSERT_EQ(view.size(), block.numel()) << where;
    std::vector<std::vector<Ints>> axisRows, pairRows;
    for (int i = 0; i < view.numAxes(); ++i)
      axisRows.push_back(bf::groupsOver(block, {i}));
    for (const auto &pr : pairs)
      pairRows.push_back(bf::groupsOver(block, pr));
    for (int64_t flat = 0; flat < block.numel(); ++flat) {
      int64_t rank = block.data[flat];
      ++stats.rankChecks;
      std::string rw = where + " rank " + std::to_string(rank);
      auto coord = view.coordinate(rank);
      ASSERT_TRUE(coord.ok()) << rw;
      EXPECT_EQ(*coord, block.unravel(flat)) << rw;
      for (int i = 0; i < view.numAxes(); ++i) {
        auto g = view.group(rank, {i});
        ASSERT_TRUE(g.ok()) << rw;
        EXPECT_EQ(*g, bf::rowContaining(axisRows[i], rank))
            << rw << " axis " << bv.names[i];
      }
      for (size_t p = 0; p < pairs.size(); ++p) {
        auto g = view.group(rank, pairs[p]);
        ASSERT_TRUE(g.ok()) << rw;
        EXPECT_EQ(*g, bf::rowContaining(pairRows[p], rank))
            << rw << " axes " << bv.names[pairs[p][0]] << ","
            << bv.names[pairs[p][1]];
      }
      auto whole = view.group(rank, all);
      ASSERT_TRUE(whole.ok());
      EXPECT_EQ(*whole, block.data) << rw << " whole block";
    }
  }
}

struct ChainCtx {
  std::shared_ptr<const Mesh> mesh;
  std::string meshDesc;
  ChainStats stats;
  int maxDepth = 3;
};

void exploreChains(ChainCtx &ctx, const View &view, const AxisNamespace &ns,
                   const BlockView &bv, const std::string &expr, int depth) {
  std::string where = ctx.meshDesc + " expr \"" + expr + "\"";
  ++ctx.stats.chains;
  checkViewAgainstBlocks(view, bv, where, ctx.stats);
  if (::testing::Test::HasFatalFailure())
    return;
  if (!expr.empty()) {
    // The same chain through the expression evaluator, from a fresh
    // namespace, must give the same view.
    AxisNamespace freshNs(ctx.mesh);
    auto again = evaluateViewExpr(View::root(ctx.mesh), expr, freshNs);
    ASSERT_TRUE(again.ok()) << where << ": " << again.error().message;
    ASSERT_EQ(again->numAxes(), view.numAxes()) << where;
    for (int i = 0; i < view.numAxes(); ++i) {
      EXPECT_EQ(again->axes()[i].name, view.axes()[i].name) << where;
      EXPECT_EQ(again->axes()[i].refs, view.axes()[i].refs) << where;
    }
  }
  if (depth == ctx.maxDepth)
    return;
  int n = view.numAxes();
  std::string sep = expr.empty() ? "" : ".";
  auto subsets = bf::orderedSubsets(n);
  for (const auto &subset : subsets) {
    std::vector<std::string> names;
    for (int a : subset)
      names.push_back(bv.names[a]);
    // Slice.
    {
      AxisNamespace nsCopy = ns;
      auto next = sliceView(view, names, nsCopy);
      std::string e = expr + sep + "slice(" + testutil::joinNames(names) + ")";
      ASSERT_TRUE(next.ok())
          << ctx.meshDesc << " " << e << ": " << next.error().message;
      exploreChains(ctx, *next, nsCopy, bruteSlice(bv, subset), e, depth + 1);
      if (::testing::Test::HasFatalFailure())
        return;
    }
    // Flatten.
    {
      AxisNamespace nsCopy = ns;
      std::string name = "f" + std::to_string(depth + 1);
      auto next = flattenView(view, names, name, nsCopy);
      std::string e = expr + sep + "flatten(" + testutil::joinNames(names) +
                      " as " + name + ")";
      ASSERT_TRUE(next.ok())
          << ctx.meshDesc << " " << e << ": " << next.error().message;
      exploreChains(ctx, *next, nsCopy, bruteFlatten(bv, subset, name), e,
                    depth + 1);
      if (::testing::Test::HasFatalFailure())
        return;
    }
  }
  // Unflatten each axis into two factors.
  for (int a = 0; a < n; ++a) {
    int64_t size = view.axes()[a].size();
    for (int64_t p = 2; p < size; ++p) {
      if (size % p)
        continue;
      int64_t q = size / p;
      std::string n1 = "u" + std::to_string(depth + 1) + "x";
      std::string n2 = "u" + std::to_string(depth + 1) + "y";
      AxisNamespace nsCopy = ns;
      auto next = unflattenView(view, bv.names[a], {{n1, p}, {n2, q}}, nsCopy);
      std::string e = expr + sep + "unflatten(" + bv.names[a] + " as " + n1 +
                      ":" + std::to_string(p) + "," + n2 + ":" +
                      std::to_string(q) + ")";
      bool expressible = false;
      BlockView bv2 = bruteUnflatten(bv, a, p, q, n1, n2, expressible);
      if (!expressible) {
        ++ctx.stats.unexpressible;
        EXPECT_FALSE(next.ok())
            << ctx.meshDesc << " " << e
            << ": not expressible as sub-axes, yet accepted";
        continue;
      }
      ASSERT_TRUE(next.ok())
          << ctx.meshDesc << " " << e << ": " << next.error().message;
      exploreChains(ctx, *next, nsCopy, bv2, e, depth + 1);
      if (::testing::Test::HasFatalFailure())
        return;
    }
  }
}

TEST(MeshViewSweep, ViewChainsUpToDepth3) {
  std::mt19937_64 rng(777);
  struct Case {
    Ints shape;
    bool shuffled;
    int depth;
  };
  std::vector<Case> cases = {
      {{4}, false, 3},       {{8}, true, 3},        {{2, 3}, false, 3},
      {{4, 2}, true, 3},     {{4, 4}, false, 3},    {{2, 2, 2}, false, 3},
      {{2, 2, 2}, true, 3},  {{2, 1, 4}, false, 3}, {{3, 1, 2}, true, 3},
      {{2, 3, 2}, false, 3}, {{4, 2, 2}, true, 3},
  };
  int64_t totalChains = 0, totalUnexpressible = 0, totalRanks = 0;
  for (const Case &c : cases) {
    std::optional<Ints> order;
    if (c.shuffled) {
      Ints perm = bf::iota(bf::prod(c.shape));
      std::shuffle(perm.begin(), perm.end(), rng);
      order = perm;
    }
    std::vector<std::string> names;
    for (size_t i = 0; i < c.shape.size(); ++i)
      names.push_back(axisName(static_cast<int>(i)));
    ChainCtx ctx;
    ctx.mesh = testutil::makeMesh(c.shape, names, order);
    ASSERT_TRUE(ctx.mesh);
    ctx.meshDesc = "mesh " + bf::str(c.shape) +
                   (order ? " order " + bf::str(*order) : std::string());
    ctx.maxDepth = c.depth;
    AxisNamespace ns(ctx.mesh);
    exploreChains(ctx, View::root(ctx.mesh), ns, rootBlocks(c.shape, order), "",
                  0);
    if (HasFatalFailure())
      return;
    totalChains += ctx.stats.chains;
    totalUnexpressible += ctx.stats.unexpressible;
    totalRanks += ctx.stats.rankChecks;
  }
  std::printf("[sweep] %zu meshes, %lld view chains checked (%lld rank "
              "checks), %lld unflattens correctly rejected\n",
              cases.size(), (long long)totalChains, (long long)totalRanks,
              (long long)totalUnexpressible);
}

//===----------------------------------------------------------------------===//
// Slicing a flattened axis's components through the namespace
//===----------------------------------------------------------------------===//

TEST(MeshView, SliceRootAxisOutOfFlattenedAxis) {
  // (a=2, b=3, c=2): flatten(a,c as ac) then slice(a) must give the a-groups
  // of the root mesh (a lies within ac).
  auto mesh = testutil::makeMesh({2, 3, 2});
  AxisNamespace ns(mesh);
  auto v =
      evaluateViewExpr(View::root(mesh), "flatten(a,c as ac).slice(a)", ns);
  ASSERT_TRUE(v.ok()) << v.error().message;
  bf::NDArray ranks = bf::NDArray::arange({2, 3, 2});
  auto rows = bf::groupsOver(ranks, {0});
  for (int64_t r = 0; r < 12; ++r) {
    auto g = v->group(r, {0});
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(*g, bf::rowContaining(rows, r)) << "rank " << r;
  }
  // b is not within ac: slicing it from the flattened view is an error.
  auto bad = evaluateViewExpr(View::root(mesh), "slice(b,c).slice(a)", ns);
  EXPECT_FALSE(bad.ok());
}

} // namespace
