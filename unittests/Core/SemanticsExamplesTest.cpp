//===- SemanticsExamplesTest.cpp - SEMANTICS.md's worked examples ---------===//
//
// Each example of SEMANTICS.md as an explicit test with the expected values
// written out by hand, plus the regressions that motivated meshplan: slicing
// a slice (torchtitan's "Cannot create a submesh from a submesh"), flattening
// a managed (torchft) replicate axis, and FSDP2+TP strided layouts with even
// and uneven sizes (pytorch#168134).
//
//===----------------------------------------------------------------------===//

#include "BruteForce.h"
#include "TestHelpers.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/MeshView.h"
#include "meshplan/Core/Placement.h"

#include <gtest/gtest.h>

using namespace meshplan;
using bf::Ints;

namespace {

using Groups = std::vector<Ints>;

std::shared_ptr<const Mesh> dpCpTp() {
  return testutil::makeMesh({2, 3, 2}, {"dp", "cp", "tp"});
}

/// Every group of `axes` of the view, by asking each rank, deduplicated and
/// sorted by first member.
Groups groupsByRank(const View &view, const std::vector<int> &axes) {
  Groups out;
  for (int64_t r = 0; r < view.mesh().size(); ++r) {
    auto g = view.group(view.mesh().rankAt(r), axes);
    EXPECT_TRUE(g.ok());
    if (g.ok() && std::find(out.begin(), out.end(), *g) == out.end())
      out.push_back(*g);
  }
  std::sort(out.begin(), out.end());
  return out;
}

//===----------------------------------------------------------------------===//
// Device mesh
//===----------------------------------------------------------------------===//

TEST(Semantics, CpGroupsOf2x3x2) {
  auto mesh = dpCpTp();
  View root = View::root(mesh);
  Groups expected = {{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}};
  EXPECT_EQ(groupsByRank(root, {1}), expected);
  EXPECT_EQ(listGroupsOf(*mesh, root.axes()[1].refs), expected);
  // local_rank(d) == coordinate[d]
  for (int64_t r = 0; r < 12; ++r) {
    auto coord = mesh->coordinate(r);
    ASSERT_TRUE(coord.ok());
    EXPECT_EQ(*coord, (Ints{r / 6, (r / 2) % 3, r % 2}));
    for (int d = 0; d < 3; ++d) {
      auto lr = root.localRank(r, {d});
      ASSERT_TRUE(lr.ok());
      EXPECT_EQ(*lr, (*coord)[d]);
    }
  }
}

TEST(Semantics, FlattenDpTpOf2x3x2) {
  auto mesh = dpCpTp();
  AxisNamespace ns(mesh);
  auto v = evaluateViewExpr(View::root(mesh), "flatten(dp,tp)", ns);
  ASSERT_TRUE(v.ok()) << v.error().message;
  // Default name joins with "_"; placed where dp was; cp keeps its place.
  ASSERT_EQ(v->numAxes(), 2);
  EXPECT_EQ(v->axes()[0].name, "dp_tp");
  EXPECT_EQ(v->axes()[1].name, "cp");
  Groups expected = {{0, 1, 6, 7}, {2, 3, 8, 9}, {4, 5, 10, 11}};
  EXPECT_EQ(groupsByRank(*v, {0}), expected);
  // Flattening the same axes twice under one name returns the same view,
  // also from another path (a slice first).
  auto again = evaluateViewExpr(View::root(mesh), "flatten(dp,tp)", ns);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->axes()[0].refs, v->axes()[0].refs);
  auto viaSlice =
      evaluateViewExpr(View::root(mesh), "slice(dp,tp).flatten(dp,tp)", ns);
  ASSERT_TRUE(viaSlice.ok()) << viaSlice.error().message;
  EXPECT_EQ(groupsByRank(*viaSlice, {0}), expected);
  // The flattened name can then be sliced from the root.
  auto sliced = evaluateViewExpr(View::root(mesh), "slice(dp_tp)", ns);
  ASSERT_TRUE(sliced.ok()) << sliced.error().message;
  EXPECT_EQ(groupsByRank(*sliced, {0}), expected);
}

TEST(Semantics, FlattenNameClashes) {
  auto mesh = dpCpTp();
  AxisNamespace ns(mesh);
  ASSERT_TRUE(evaluateViewExpr(View::root(mesh), "flatten(dp,tp as x)", ns));
  // One name for different axes is an error.
  auto other = evaluateViewExpr(View::root(mesh), "flatten(dp,cp as x)", ns);
  EXPECT_FALSE(other.ok());
  // Another order of the same axes is a different group structure.
  auto reordered =
      evaluateViewExpr(View::root(mesh), "flatten(tp,dp as x)", ns);
  EXPECT_FALSE(reordered.ok());
  // A name that clashes with a root axis is an error.
  auto clash = evaluateViewExpr(View::root(mesh), "flatten(dp,tp as cp)", ns);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.error().message.find("cp"), std::string::npos)
      << clash.error().message;
  auto clash2 = evaluateViewExpr(View::root(mesh), "flatten(dp,tp as dp)", ns);
  EXPECT_FALSE(clash2.ok());
  // Flattening one axis under its own name is that axis: fine.
  auto self = evaluateViewExpr(View::root(mesh), "flatten(dp as dp)", ns);
  EXPECT_TRUE(self.ok()) << testutil::errorOf(self);
}

//===----------------------------------------------------------------------===//
// torch.chunk shards
//===----------------------------------------------------------------------===//

void expectChunks(int64_t n, int64_t k, const Ints &sizes,
                  int64_t emptyOffsetExpected) {
  auto mesh = testutil::makeMesh({k}, {"x"});
  AxisNamespace ns(mesh);
  View root = View::root(mesh);
  auto layout = parseLayout(root, ns, "[{x}]");
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  Ints got;
  int64_t offset = 0;
  for (int64_t r = 0; r < k; ++r) {
    auto box = shardOf(root, *layout, {n}, r);
    ASSERT_TRUE(box.ok());
    got.push_back(box->localShape[0]);
    EXPECT_EQ(box->paddedShape[0], (n + k - 1) / k);
    if (box->localShape[0] == 0)
      EXPECT_EQ(box->offset[0], emptyOffsetExpected) << "rank " << r;
    else
      EXPECT_EQ(box->offset[0], offset) << "rank " << r;
    offset += box->localShape[0];
    DimShard s = chunkNested(n, {k}, {r});
    EXPECT_EQ(s.size, box->localShape[0]);
    EXPECT_EQ(s.offset, box->offset[0]);
  }
  EXPECT_EQ(got, sizes);
}

TEST(Semantics, TorchChunkSizes) {
  expectChunks(7, 3, {3, 3, 1}, 7);
  expectChunks(7, 5, {2, 2, 2, 1, 0}, 7);
  // The brute-force reference agrees with the hand-written sizes.
  Ints sizes;
  for (const Ints &c : bf::torchChunk(bf::iota(7), 5))
    sizes.push_back(static_cast<int64_t>(c.size()));
  EXPECT_EQ(sizes, (Ints{2, 2, 2, 1, 0}));
}

TEST(Semantics, StridedShardTenBySfTwoOverThree) {
  EXPECT_EQ(bf::stridedChunk(bf::iota(10), 2, 3, 0), (Ints{0, 1, 5, 6}));
  EXPECT_EQ(bf::stridedChunk(bf::iota(10), 2, 3, 1), (Ints{2, 3, 7, 8}));
  EXPECT_EQ(bf::stridedChunk(bf::iota(10), 2, 3, 2), (Ints{4, 9}));
  // Not one box per rank: a single-axis SS(0,2) must be rejected.
  auto mesh = testutil::makeMesh({3}, {"x"});
  View root = View::root(mesh);
  auto layout = layoutFromPlacements(root, {Placement::strided(0, 2)}, {10});
  ASSERT_FALSE(layout.ok()) << testutil::joinNames({});
  EXPECT_NE(layout.error().message.find("rank"), std::string::npos)
      << layout.error().message;
}

//===----------------------------------------------------------------------===//
// FSDP2 + TP
//===----------------------------------------------------------------------===//

TEST(Semantics, Fsdp2TpTwelveRows) {
  auto mesh = testutil::makeMesh({3, 2}, {"dp", "tp"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  auto placements = parsePlacements("SS(0,2),S(0)");
  ASSERT_TRUE(placements.ok()) << placements.error().message;
  auto layout = layoutFromPlacements(root, *placements, {12, 4});
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  std::vector<Ints> rows = {{0, 1}, {6, 7}, {2, 3}, {8, 9}, {4, 5}, {10, 11}};
  for (int64_t r = 0; r < 6; ++r) {
    auto box = shardOf(root, *layout, {12, 4}, r);
    ASSERT_TRUE(box.ok());
    EXPECT_EQ(box->offset[0], rows[r][0]) << "rank " << r;
    EXPECT_EQ(box->localShape[0], 2) << "rank " << r;
    EXPECT_EQ(box->offset[1], 0);
    EXPECT_EQ(box->localShape[1], 4);
  }
  auto canonical = parseLayout(root, ns, "[{tp, dp}, {}]");
  ASSERT_TRUE(canonical.ok()) << canonical.error().message;
  EXPECT_TRUE(equivalentLayouts(root, *layout, *canonical))
      << formatLayout(*mesh, *layout);
  // The torch-style spelling parses to the same list.
  auto torchStyle =
      parsePlacements("(_StridedShard(dim=0, split_factor=2), Shard(dim=0))");
  ASSERT_TRUE(torchStyle.ok()) << torchStyle.error().message;
  EXPECT_EQ(*torchStyle, *placements);
  // And back: the layout's DTensor placements are SS(0,2),S(0).
  auto back = placementsFromLayout(root, *canonical, {12, 4});
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, *placements) << formatPlacements(*back);
}

TEST(Semantics, ShardThenStridedIsRejectedNamingARank) {
  auto mesh = testutil::makeMesh({3, 2}, {"dp", "tp"});
  View root = View::root(mesh);
  // DTensor gives rank 0 rows {0, 2}: not one box.
  Ints rank0;
  for (int64_t i :
       bf::stridedChunk(bf::torchChunk(bf::iota(12), 3)[0], 2, 2, 0))
    rank0.push_back(i);
  EXPECT_EQ(rank0, (Ints{0, 2}));
  auto placements = parsePlacements("S(0),SS(0,2)");
  ASSERT_TRUE(placements.ok());
  auto layout = layoutFromPlacements(root, *placements, {12});
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.error().message.find("rank 0"), std::string::npos)
      << layout.error().message;
}

TEST(Semantics, Fsdp2PaddingOfUnevenShards) {
  // FSDP2: 7 rows over 5 ranks, every shard padded to the size of chunk 0.
  auto mesh = testutil::makeMesh({5}, {"dp"});
  View root = View::root(mesh);
  Layout layout;
  layout.dims = {{{AxisRef{0, 1, 5}}}, {}};
  EXPECT_EQ(paddedShapeOf(layout, {7, 3}), (Ints{2, 3}));
  for (int64_t r = 0; r < 5; ++r) {
    auto box = shardOf(root, layout, {7, 3}, r);
    ASSERT_TRUE(box.ok());
    EXPECT_EQ(box->paddedShape, (Ints{2, 3}));
  }
}

//===----------------------------------------------------------------------===//
// Levels
//===----------------------------------------------------------------------===//

/// Row counts of ranks 0..3 and the padded size for 5 rows.
std::pair<Ints, int64_t> fiveRowCounts(const View &view, const Layout &layout) {
  Ints counts;
  int64_t padded = -1;
  for (int64_t r = 0; r < view.mesh().size(); ++r) {
    auto box = shardOf(view, layout, {5}, r);
    EXPECT_TRUE(box.ok());
    if (!box.ok())
      return {};
    counts.push_back(box->localShape[0]);
    padded = box->paddedShape[0];
  }
  return {counts, padded};
}

// semantics.md: five rows on a 2x2 mesh. One level over (a, b) chunks once:
// 2, 2, 1, 0 rows; two levels a then b nest: 3, 2 -> 2, 1, 1, 1.
TEST(Semantics, FiveRowsOneLevelVersusTwo) {
  auto mesh = testutil::makeMesh({2, 2}, {"a", "b"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  auto one = parseLayout(root, ns, "[{(a, b)}]");
  auto two = parseLayout(root, ns, "[{a, b}]");
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(fiveRowCounts(root, *one),
            std::make_pair(Ints{2, 2, 1, 0}, int64_t{2}));
  EXPECT_EQ(fiveRowCounts(root, *two),
            std::make_pair(Ints{2, 1, 1, 1}, int64_t{2}));
  // The last rank of the one-level layout is empty: offset is the dim size.
  auto last = shardOf(root, *one, {5}, 3);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->offset[0], 5);
  // A flattened name is one level too; with 8 rows both agree.
  auto view = evaluateViewExpr(root, "flatten(a,b as dp_all)", ns);
  ASSERT_TRUE(view.ok());
  auto flat = parseLayout(*view, ns, "[{dp_all}]");
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(fiveRowCounts(*view, *flat), fiveRowCounts(root, *one));
  for (int64_t r = 0; r < 4; ++r) {
    auto x = shardOf(root, *one, {8}, r);
    auto y = shardOf(root, *two, {8}, r);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(x->offset, (Ints{2 * r}));
    EXPECT_EQ(y->offset, x->offset);
    EXPECT_EQ(y->localShape, (Ints{2}));
  }
  EXPECT_EQ(chunkNested(5, {4}, {1}).size, 2);
  EXPECT_EQ(chunkNested(5, {2, 2}, {0, 1}).size, 1);
  EXPECT_EQ(chunkNested(5, {2, 2}, {0, 1}).offset, 2);
}

// FSDP2 + TP: [{tp, dp}] gives each TP shard to FSDP2, which chunks it once
// over the (flattened) dp group: 13 rows on (r=2, s=2, tp=2) with dp =
// flatten(r, s) -- tp chunks 7 | 6, then dp chunks 7 as 2,2,2,1.
TEST(Semantics, Fsdp2OverFlattenedDpWithTp) {
  auto mesh = testutil::makeMesh({2, 2, 2}, {"r", "s", "tp"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  auto view = evaluateViewExpr(root, "flatten(r,s as dp)", ns);
  ASSERT_TRUE(view.ok());
  auto layout = parseLayout(*view, ns, "[{tp, dp}]");
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  // Rank = r*4 + s*2 + tp; dp index = r*2 + s.
  std::vector<std::pair<int64_t, int64_t>> rows = {
      {0, 2}, {7, 2}, {2, 2}, {9, 2}, {4, 2}, {11, 2}, {6, 1}, {13, 0}};
  for (int64_t rank = 0; rank < 8; ++rank) {
    auto box = shardOf(*view, *layout, {13}, rank);
    ASSERT_TRUE(box.ok());
    EXPECT_EQ(box->offset[0], rows[rank].first) << "rank " << rank;
    EXPECT_EQ(box->localShape[0], rows[rank].second) << "rank " << rank;
    EXPECT_EQ(box->paddedShape[0], 2);
  }
}

//===----------------------------------------------------------------------===//
// Regressions
//===----------------------------------------------------------------------===//

TEST(Regression, SliceOfASlice) {
  auto mesh = testutil::makeMesh({2, 2, 2}, {"ddp", "fsdp", "abcd"});
  AxisNamespace ns(mesh);
  auto v =
      evaluateViewExpr(View::root(mesh), "slice(ddp,fsdp).slice(fsdp)", ns);
  ASSERT_TRUE(v.ok()) << v.error().message;
  ASSERT_EQ(v->numAxes(), 1);
  EXPECT_EQ(v->axes()[0].name, "fsdp");
  auto rows = bf::groupsOver(bf::NDArray::arange({2, 2, 2}), {1});
  EXPECT_EQ(bf::canonicalPartition(rows),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  for (int64_t r = 0; r < 8; ++r) {
    auto g = v->group(r, {0});
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(*g, bf::rowContaining(rows, r)) << "rank " << r;
    auto key = v->split(r, {0});
    ASSERT_TRUE(key.ok());
    EXPECT_EQ(key->key, (r / 2) % 2);
  }
  // Deeper: a slice of a slice of a flatten.
  auto deep = evaluateViewExpr(
      View::root(mesh), "flatten(ddp,fsdp as dp).slice(dp,abcd).slice(dp)", ns);
  ASSERT_TRUE(deep.ok()) << deep.error().message;
  auto dpRows = bf::groupsOver(bf::NDArray::arange({2, 2, 2}), {0, 1});
  for (int64_t r = 0; r < 8; ++r) {
    auto g = deep->group(r, {0});
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(*g, bf::rowContaining(dpRows, r)) << "rank " << r;
  }
}

/// Checks groups over the flattened dp axis with live replicas {0, 2}.
void checkManagedFlatten(const Ints &shape,
                         const std::vector<std::string> &names,
                         const std::string &expr) {
  auto mesh = testutil::makeMesh(shape, names, std::nullopt, {true, false});
  ASSERT_TRUE(mesh);
  AxisNamespace ns(mesh);
  auto v = evaluateViewExpr(View::root(mesh), expr, ns);
  ASSERT_TRUE(v.ok()) << expr << ": " << v.error().message;
  auto dp = v->findAxis("dp");
  ASSERT_TRUE(dp.has_value()) << v->str();
  EXPECT_EQ(v->axes()[*dp].size(), shape[0] * shape[1]);
  EXPECT_TRUE(touchesManaged(*mesh, v->axes()[*dp].refs));
  LiveMembers live;
  ASSERT_TRUE(live.set(*mesh, 0, {2, 0}).ok());
  EXPECT_EQ(groupSizeOf(*mesh, v->axes()[*dp].refs, &live), 2 * shape[1]);

  bf::NDArray ranks = bf::NDArray::arange(shape);
  auto rows = bf::groupsOver(ranks, {0, 1});
  for (int64_t flat = 0; flat < ranks.numel(); ++flat) {
    int64_t r = ranks.data[flat];
    int64_t replica = ranks.unravel(flat)[0];
    bool alive = replica == 0 || replica == 2;
    Ints expected;
    for (int64_t m : bf::rowContaining(rows, r))
      if (ranks.unravel(ranks.find(m))[0] != 1)
        expected.push_back(m);
    auto g = v->group(r, {*dp}, &live);
    auto key = v->split(r, {*dp}, &live);
    if (!alive) {
      EXPECT_FALSE(g.ok()) << expr << ": dead rank " << r << " got a group";
      EXPECT_FALSE(key.ok()) << expr << ": dead rank " << r << " got a key";
      continue;
    }
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(*g, expected) << expr << " rank " << r;
    ASSERT_TRUE(key.ok());
    auto pos =
        std::find(expected.begin(), expected.end(), r) - expected.begin();
    EXPECT_EQ(key->key, pos) << expr << " rank " << r << ": keys must be dense";
    // Without live members the full group is listed.
    auto full = v->group(r, {*dp});
    ASSERT_TRUE(full.ok());
    EXPECT_EQ(*full, bf::rowContaining(rows, r));
  }
}

TEST(Regression, ManagedReplicateFlatten) {
  checkManagedFlatten({3, 4}, {"dp_replicate", "dp_shard"},
                      "flatten(dp_replicate,dp_shard as dp)");
  checkManagedFlatten({3, 4}, {"dp_replicate", "dp_shard"},
                      "slice(dp_replicate,dp_shard)."
                      "flatten(dp_replicate,dp_shard as dp)");
  // With a tp axis, the slice is a real submesh (torchtitan's crash path).
  checkManagedFlatten({3, 4, 2}, {"dp_replicate", "dp_shard", "tp"},
                      "flatten(dp_replicate,dp_shard as dp)");
  checkManagedFlatten({3, 4, 2}, {"dp_replicate", "dp_shard", "tp"},
                      "slice(dp_replicate,dp_shard)."
                      "flatten(dp_replicate,dp_shard as dp)");
}

TEST(Regression, ManagedLiveMembersOnPlainAxes) {
  auto mesh = testutil::makeMesh({3, 4}, {"dp_replicate", "dp_shard"},
                                 std::nullopt, {true, false});
  View root = View::root(mesh);
  LiveMembers live;
  ASSERT_TRUE(live.set(*mesh, 0, {0, 2}).ok());
  // Groups over the managed axis alone list only live replicas.
  // Rank 5 is at (1, 1): replica 1 is dead.
  EXPECT_FALSE(root.group(5, {0}, &live).ok());
  EXPECT_FALSE(root.split(5, {0}, &live).ok());
  auto g1 = root.group(9, {0}, &live); // (2,1)
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(*g1, (Ints{1, 9}));
  auto key = root.split(9, {0}, &live);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->key, 1);
  // Groups over dp_shard of a live rank are unaffected.
  auto g2 = root.group(9, {1}, &live);
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(*g2, (Ints{8, 9, 10, 11}));
  // Live members on a non-managed axis, out of range, twice, or none.
  EXPECT_FALSE(live.set(*mesh, 1, {0}).ok());
  EXPECT_FALSE(live.set(*mesh, 0, {3}).ok());
  EXPECT_FALSE(live.set(*mesh, 0, {1, 1}).ok());
  EXPECT_FALSE(live.set(*mesh, 0, {}).ok());
}

// groupOf's contract: "A dead rank belongs to no group." A rank of a dead
// replica must not get a group over the other (non-managed) axes either: its
// whole replica is gone, and a communicator split would wait for it.
TEST(Regression, DeadRankHasNoGroupOverOtherAxes) {
  auto mesh = testutil::makeMesh({3, 4}, {"dp_replicate", "dp_shard"},
                                 std::nullopt, {true, false});
  View root = View::root(mesh);
  LiveMembers live;
  ASSERT_TRUE(live.set(*mesh, 0, {0, 2}).ok());
  auto g = root.group(5, {1}, &live);
  EXPECT_FALSE(g.ok()) << "dead rank 5 got group " << bf::str(*g);
  auto key = root.split(5, {1}, &live);
  EXPECT_FALSE(key.ok()) << "dead rank 5 got split color " << key->color;
}

/// DTensor's rows of dim 0 for a (dp, tp) rank under "SS(0,tp),S(0)".
Ints fsdpTpDTensorRows(int64_t n, int64_t dp, int64_t tp, int64_t i,
                       int64_t j) {
  Ints local = bf::stridedChunk(bf::iota(n), tp, dp, i);
  return bf::torchChunk(local, tp)[j];
}

TEST(Regression, FsdpTpStridedEvenAndUneven) {
  for (auto [dp, tp] : {std::pair<int64_t, int64_t>{3, 2}, {4, 2}}) {
    auto mesh = testutil::makeMesh({dp, tp}, {"dp", "tp"});
    View root = View::root(mesh);
    AxisNamespace ns(mesh);
    auto canonical = parseLayout(root, ns, "[{tp, dp}]");
    ASSERT_TRUE(canonical.ok());
    for (int64_t n : {12, 13, 7, 5, 0}) {
      std::string where = "dp=" + std::to_string(dp) +
                          " tp=" + std::to_string(tp) +
                          " n=" + std::to_string(n);
      // The canonical layout: TP shards first, FSDP2 chunks each TP shard.
      bool dtensorAgrees = true;
      for (int64_t i = 0; i < dp; ++i)
        for (int64_t j = 0; j < tp; ++j) {
          int64_t rank = i * tp + j;
          Ints nested =
              bf::torchChunk(bf::torchChunk(bf::iota(n), tp)[j], dp)[i];
          auto box = shardOf(root, *canonical, {n}, rank);
          ASSERT_TRUE(box.ok());
          int64_t off = nested.empty() ? n : nested[0];
          EXPECT_EQ(box->offset[0], off) << where << " rank " << rank;
          EXPECT_TRUE(bf::isRange(nested, box->offset[0], box->localShape[0]))
              << where << " rank " << rank;
          EXPECT_EQ(box->paddedShape[0], ((n + tp - 1) / tp + dp - 1) / dp);
          dtensorAgrees &= fsdpTpDTensorRows(n, dp, tp, i, j) == nested;
        }
      auto layout = layoutFromPlacements(
          root, {Placement::strided(0, tp), Placement::shard(0)}, {n});
      if (dtensorAgrees) {
        ASSERT_TRUE(layout.ok()) << where << ": " << layout.error().message;
        EXPECT_TRUE(equivalentLayouts(root, *layout, *canonical))
            << where << ": got " << formatLayout(*mesh, *layout);
        auto back = placementsFromLayout(root, *canonical, {n});
        ASSERT_TRUE(back.ok()) << where << ": " << back.error().message;
        EXPECT_EQ(formatPlacements(*back),
                  "SS(0," + std::to_string(tp) + "),S(0)");
      } else {
        EXPECT_FALSE(layout.ok())
            << where << ": DTensor disagrees with nested chunking, yet "
            << "accepted as " << formatLayout(*mesh, *layout);
        EXPECT_FALSE(placementsFromLayout(root, *canonical, {n}).ok()) << where;
      }
      // HSDP: Replicate() in front, on a 3-axis mesh.
      auto hsdpMesh = testutil::makeMesh({2, dp, tp}, {"rep", "dp", "tp"});
      View hsdp = View::root(hsdpMesh);
      auto hl =
          layoutFromPlacements(hsdp,
                               {Placement::replicate(),
                                Placement::strided(0, tp), Placement::shard(0)},
                               {n});
      EXPECT_EQ(hl.ok(), dtensorAgrees) << where << " (HSDP)";
    }
  }
}

TEST(Regression, Fsdp2TpUnevenThirteenIsPytorch168134) {
  // Written out by hand: n=13 on (dp=3, tp=2), rank (dp=2, tp=0) holds rows
  // {6, 11} by DTensor's rule but row 6 alone by nested chunking.
  EXPECT_EQ(fsdpTpDTensorRows(13, 3, 2, 2, 0), (Ints{6, 11}));
  auto mesh = testutil::makeMesh({3, 2}, {"dp", "tp"});
  auto layout = layoutFromPlacements(
      View::root(mesh), {Placement::strided(0, 2), Placement::shard(0)}, {13});
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.error().message.find("rank 4"), std::string::npos)
      << layout.error().message;
}

} // namespace
