//===- LayoutTest.cpp - Shard boxes of every small layout -----------------===//
//
// For every layout of 1-D and 2-D tensors (dim sizes 0..13) on small meshes
// (every assignment of each axis, sub-axis or flattened view axis to
// replicated / partial / dim 0 / dim 1, every order within a dim), each rank's
// element index set is computed by nested torch.chunk on explicit index lists
// and compared with shardOf; a block's shards must tile the tensor. Text and
// DTensor round trips are checked on the same layouts.
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

struct RefSpec {
  int axis;
  int64_t pre, size;
};

/// What a layout may name: a root axis, a sub-axis or a flattened view axis.
struct Unit {
  std::string text;
  std::vector<RefSpec> refs; // major to minor
  int64_t size() const {
    int64_t s = 1;
    for (const RefSpec &r : refs)
      s *= r.size;
    return s;
  }
};

struct MeshCase {
  std::string desc;
  Ints shape;
  std::vector<std::string> names;
  std::vector<Unit> units;
  std::string viewExpr;         // "" for the root view
  std::vector<int> viewAxes;    // root axes inside the view (for blocks)
  bool unitsAreViewAxes = true; // unit i is view axis i
  bool flattened = false;       // some unit is a flattened view axis
  std::optional<Ints> order;
};

using LayoutSpec = bf::LayoutSpec;
using bf::enumerateLayouts;

std::string layoutText(const MeshCase &mc, const LayoutSpec &spec,
                       const std::string &op = "sum") {
  std::string out = "[";
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    out += d ? ", {" : "{";
    for (size_t i = 0; i < spec.dims[d].size(); ++i)
      out += (i ? ", " : "") + mc.units[spec.dims[d][i]].text;
    out += "}";
  }
  out += "]";
  if (!spec.partial.empty()) {
    out += " partial(" + op + ")={";
    for (size_t i = 0; i < spec.partial.size(); ++i)
      out += (i ? ", " : "") + mc.units[spec.partial[i]].text;
    out += "}";
  }
  return out;
}

Layout directLayout(const MeshCase &mc, const LayoutSpec &spec) {
  Layout l;
  l.dims.resize(spec.dims.size());
  auto add = [&](AxisRefList &list, int unit) {
    for (const RefSpec &r : mc.units[unit].refs)
      list.push_back(AxisRef{r.axis, r.pre, r.size});
  };
  for (size_t d = 0; d < spec.dims.size(); ++d)
    for (int u : spec.dims[d])
      add(l.dims[d], u);
  for (int u : spec.partial)
    add(l.partial, u);
  return l;
}

struct Stats {
  int64_t layouts = 0, boxChecks = 0, shapes = 0, placementOk = 0,
          placementRejected = 0, candidateSearches = 0;
};

/// Brute-force placement candidates for a layout whose units are whole view
/// axes: does any DTensor list (Shard / _StridedShard(sf) per splitting axis)
/// give exactly the nested boxes on every rank?
bool someDTensorListMatches(const MeshCase &mc, const LayoutSpec &spec,
                            const Ints &shape,
                            const std::vector<Ints> &unitDigits,
                            const std::vector<std::vector<Ints>> &nested) {
  int numAxes = static_cast<int>(mc.units.size());
  std::vector<int> dimOf(numAxes, -1);
  for (size_t d = 0; d < spec.dims.size(); ++d)
    for (int u : spec.dims[d])
      dimOf[u] = static_cast<int>(d);
  // Split-factor options per axis.
  std::vector<Ints> options(numAxes, Ints{1});
  for (int a = 0; a < numAxes; ++a) {
    if (dimOf[a] < 0)
      continue;
    std::set<int64_t> sfs = {1};
    for (int mask = 1; mask < (1 << numAxes); ++mask) {
      if (mask & (1 << a))
        continue;
      int64_t p = 1;
      for (int b = 0; b < numAxes; ++b)
        if (mask & (1 << b))
          p *= mc.units[b].size();
      sfs.insert(p);
    }
    options[a] = Ints(sfs.begin(), sfs.end());
  }
  Ints choice(numAxes, 0);
  while (true) {
    bool all = true;
    for (size_t r = 0; r < unitDigits.size() && all; ++r)
      for (size_t d = 0; d < shape.size() && all; ++d) {
        std::vector<bf::DimPlacement> splits;
        for (int a = 0; a < numAxes; ++a)
          if (dimOf[a] == static_cast<int>(d))
            splits.push_back(
                {options[a][choice[a]], mc.units[a].size(), unitDigits[r][a]});
        all = bf::dtensorRule(shape[d], splits) == nested[r][d];
      }
    if (all)
      return true;
    int a = 0;
    while (a < numAxes &&
           ++choice[a] == static_cast<int64_t>(options[a].size()))
      choice[a++] = 0;
    if (a == numAxes)
      return false;
  }
}

void runMeshCase(const MeshCase &mc, Stats &stats) {
  auto mesh = testutil::makeMesh(mc.shape, mc.names, mc.order);
  ASSERT_TRUE(mesh);
  AxisNamespace ns(mesh);
  View root = View::root(mesh);
  auto viewR = mc.viewExpr.empty() ? Result<View>(root)
                                   : evaluateViewExpr(root, mc.viewExpr, ns);
  ASSERT_TRUE(viewR.ok()) << mc.desc << ": " << viewR.error().message;
  const View &view = *viewR;
  if (mc.unitsAreViewAxes) {
    ASSERT_EQ(view.numAxes(), static_cast<int>(mc.units.size())) << mc.desc;
  }

  // Brute-force digits of every rank along every unit, and its block.
  testutil::FailureLog log(mc.desc);
  bf::NDArray ranks = testutil::rankArray(mc.shape, mc.order);
  int64_t world = ranks.numel();
  std::vector<Ints> unitDigits(world);
  Ints rankIds(world), blockOf(world);
  std::map<Ints, int64_t> blockIds;
  for (int64_t flat = 0; flat < world; ++flat) {
    rankIds[flat] = ranks.data[flat];
    Ints coord = ranks.unravel(flat);
    for (const Unit &u : mc.units) {
      int64_t digit = 0;
      for (const RefSpec &r : u.refs) {
        int64_t post = mc.shape[r.axis] / (r.pre * r.size);
        digit = digit * r.size + (coord[r.axis] / post) % r.size;
      }
      unitDigits[flat].push_back(digit);
    }
    Ints outside;
    for (int a = 0; a < static_cast<int>(mc.shape.size()); ++a)
      if (std::find(mc.viewAxes.begin(), mc.viewAxes.end(), a) ==
          mc.viewAxes.end())
        outside.push_back(coord[a]);
    blockOf[flat] = blockIds.emplace(outside, blockIds.size()).first->second;
  }

  std::vector<Ints> shapes;
  for (int64_t n = 0; n <= 13; ++n)
    shapes.push_back({n});
  for (int64_t n0 = 0; n0 <= 13; ++n0)
    for (int64_t n1 = 0; n1 <= 13; ++n1)
      shapes.push_back({n0, n1});

  for (int rank : {1, 2}) {
    for (const LayoutSpec &spec :
         enumerateLayouts(static_cast<int>(mc.units.size()), rank)) {
      ++stats.layouts;
      std::string text = layoutText(mc, spec);
      std::string where = mc.desc + " layout " + text;
      auto parsed = parseLayout(view, ns, text);
      ASSERT_TRUE(parsed.ok()) << where << ": " << parsed.error().message;
      Layout direct = directLayout(mc, spec);
      SWEEP_EXPECT(log, parsed->dims == direct.dims &&
                            parsed->partial == direct.partial)
          << where << ": parsed as " << formatLayout(*mesh, *parsed);
      SWEEP_EXPECT(log, equivalentLayouts(view, *parsed, direct)) << where;
      const Layout &layout = *parsed;
      // Text round trip.
      std::string formatted = formatLayout(*mesh, layout);
      auto reparsed = parseLayout(view, ns, formatted);
      ASSERT_TRUE(reparsed.ok()) << where << ": formatted as " << formatted
                                 << ": " << reparsed.error().message;
      SWEEP_EXPECT(log, equivalentLayouts(view, layout, *reparsed))
          << where << " vs " << formatted;
      // Replicated refs: what the layout does not use.
      int64_t used = 1;
      for (const auto &d : spec.dims)
        for (int u : d)
          used *= mc.units[u].size();
      for (int u : spec.partial)
        used *= mc.units[u].size();
      SWEEP_EXPECT(log,
                   refsSize(replicatedRefs(view, layout)) * used == view.size())
          << where << ": replicated refs "
          << formatAxisRefs(*mesh, replicatedRefs(view, layout));

      for (const Ints &shape : shapes) {
        if (static_cast<int>(shape.size()) != rank)
          continue;
        ++stats.shapes;
        std::string sw = where + " shape " + bf::str(shape);
        Ints padded;
        for (int d = 0; d < rank; ++d) {
          int64_t p = shape[d];
          for (int u : spec.dims[d])
            p = (p + mc.units[u].size() - 1) / mc.units[u].size();
          padded.push_back(p);
        }
        SWEEP_EXPECT(log, paddedShapeOf(layout, shape) == padded)
            << sw << ": padded " << bf::str(paddedShapeOf(layout, shape))
            << ", expected " << bf::str(padded);
        int64_t numel = bf::prod(shape);
        std::map<std::pair<int64_t, Ints>, Ints> held; // (block, split) -> set
        std::vector<std::vector<Ints>> nested(world);
        for (int64_t flat = 0; flat < world; ++flat) {
          ++stats.boxChecks;
          int64_t r = rankIds[flat];
          auto box = shardOf(view, layout, shape, r);
          ASSERT_TRUE(box.ok()) << sw << " rank " << r;
          Ints split;
          std::vector<Ints> lists;
          for (int d = 0; d < rank; ++d) {
            Ints sizes, coords;
            for (int u : spec.dims[d]) {
              sizes.push_back(mc.units[u].size());
              coords.push_back(unitDigits[flat][u]);
              split.push_back(unitDigits[flat][u]);
            }
            Ints list = bf::nestedChunk(shape[d], sizes, coords);
            int64_t offset = list.empty() ? shape[d] : list[0];
            SWEEP_EXPECT(log, box->offset[d] == offset &&
                                  box->localShape[d] ==
                                      static_cast<int64_t>(list.size()))
                << sw << " rank " << r << " dim " << d << ": shardOf gives ("
                << box->offset[d] << ", " << box->localShape[d]
                << "), brute force holds " << bf::str(list);
            SWEEP_EXPECT(log, bf::isRange(list, offset,
                                          static_cast<int64_t>(list.size())))
                << sw << " rank " << r << ": nested chunk is not a box";
            SWEEP_EXPECT(log, box->paddedShape[d] == padded[d] &&
                                  box->paddedShape[d] >= box->localShape[d])
                << sw << " rank " << r << " dim " << d << ": padded "
                << box->paddedShape[d] << ", expected " << padded[d];
            lists.push_back(list);
          }
          nested[flat] = lists;
          Ints elements = {0};
          for (int d = 0; d < rank; ++d) {
            Ints next;
            for (int64_t e : elements)
              for (int64_t i : lists[d])
                next.push_back(e * shape[d] + i);
            elements = next;
          }
          SWEEP_EXPECT(log, box->numElements() ==
                                    static_cast<int64_t>(elements.size()) &&
                                box->empty() == elements.empty())
              << sw << " rank " << r << ": numElements/empty";
          auto [it, fresh] =
              held.emplace(std::make_pair(blockOf[flat], split), elements);
          if (!fresh) {
            SWEEP_EXPECT(log, it->second == elements)
                << sw << " rank " << r << ": replicas hold different data";
          }
        }
        // Within each block the distinct shards tile the tensor.
        std::map<int64_t, std::vector<int>> cover;
        for (const auto &[key, elements] : held) {
          auto &seen = cover[key.first];
          seen.resize(numel, 0);
          for (int64_t e : elements)
            ++seen[e];
        }
        for (const auto &[block, seen] : cover)
          for (int64_t e = 0; e < numel; ++e)
            SWEEP_EXPECT(log, seen[e] == 1)
                << sw << " block " << block << " element " << e << " held by "
                << seen[e] << " shards";

        // DTensor round trip.
        auto placements = placementsFromLayout(view, layout, shape);
        if (placements.ok()) {
          ++stats.placementOk;
          ASSERT_EQ(static_cast<int>(placements->size()), view.numAxes());
          if (mc.unitsAreViewAxes) {
            for (int64_t flat = 0; flat < world; ++flat)
              for (int d = 0; d < rank; ++d) {
                std::vector<bf::DimPlacement> splits;
                for (int a = 0; a < view.numAxes(); ++a) {
                  const Placement &p = (*placements)[a];
                  if (p.kind == Placement::Kind::Partial) {
                    SWEEP_EXPECT(log, std::count(spec.partial.begin(),
                                                 spec.partial.end(), a))
                        << sw << ": Partial on a non-partial axis";
                  }
                  if ((p.kind == Placement::Kind::Shard ||
                       p.kind == Placement::Kind::StridedShard) &&
                      p.dim == d)
                    splits.push_back({p.splitFactor, mc.units[a].size(),
                                      unitDigits[flat][a]});
                }
                SWEEP_EXPECT(log, bf::dtensorRule(shape[d], splits) ==
                                      nested[flat][d])
                    << sw << " placements " << formatPlacements(*placements)
                    << " rank " << rankIds[flat] << " dim " << d
                    << ": DTensor gives "
                    << bf::str(bf::dtensorRule(shape[d], splits))
                    << ", the layout " << bf::str(nested[flat][d]);
              }
          }
          auto back = layoutFromPlacements(view, *placements, shape);
          ASSERT_TRUE(back.ok())
              << sw << " placements " << formatPlacements(*placements) << ": "
              << back.error().message;
          SWEEP_EXPECT(log, equivalentLayouts(view, layout, *back))
              << sw << " placements " << formatPlacements(*placements)
              << " came back as " << formatLayout(*mesh, *back);
        } else {
          ++stats.placementRejected;
          if (mc.unitsAreViewAxes) {
            ++stats.candidateSearches;
            SWEEP_EXPECT(log, !someDTensorListMatches(mc, spec, shape,
                                                      unitDigits, nested))
                << sw << ": a DTensor placement list gives these boxes, but "
                << "placementsFromLayout says: " << placements.error().message;
          }
        }
      }
      if (::testing::Test::HasFatalFailure())
        return;
    }
  }
}

Unit whole(const std::string &name, int axis, int64_t size) {
  return {name, {{axis, 1, size}}};
}

/// The meshes and views of the sweep; `flattened` selects the views whose
/// units are flattened view axes (several root axes in one unit).
std::vector<MeshCase> sweepCases(bool flattened) {
  std::vector<MeshCase> cases;
  auto simple = [&](Ints shape) {
    MeshCase mc;
    mc.shape = shape;
    for (size_t i = 0; i < shape.size(); ++i) {
      mc.names.push_back(testutil::axisName(static_cast<int>(i)));
      mc.units.push_back(whole(mc.names.back(), static_cast<int>(i), shape[i]));
      mc.viewAxes.push_back(static_cast<int>(i));
    }
    mc.desc = "mesh " + bf::str(shape);
    return mc;
  };
  for (Ints shape : std::vector<Ints>{
           {1}, {2}, {3}, {4}, {2, 2}, {2, 3}, {4, 2}, {2, 2, 2}, {1, 2, 3}})
    cases.push_back(simple(shape));
  {
    MeshCase mc = simple({2, 3});
    mc.order = Ints{4, 1, 5, 0, 3, 2};
    mc.desc += " shuffled";
    cases.push_back(mc);
  }
  {
    MeshCase mc;
    mc.desc = "mesh (x=4) as x:(1)2, x:(2)2";
    mc.shape = {4};
    mc.names = {"x"};
    mc.units = {{"\"x\":(1)2", {{0, 1, 2}}}, {"\"x\":(2)2", {{0, 2, 2}}}};
    mc.viewAxes = {0};
    mc.unitsAreViewAxes = false;
    cases.push_back(mc);
  }
  {
    MeshCase mc;
    mc.desc = "mesh (dp=4, tp=2) as dp:(1)2, dp:(2)2, tp";
    mc.shape = {4, 2};
    mc.names = {"dp", "tp"};
    mc.units = {{"\"dp\":(1)2", {{0, 1, 2}}},
                {"dp:(2)2", {{0, 2, 2}}},
                whole("tp", 1, 2)};
    mc.viewAxes = {0, 1};
    mc.unitsAreViewAxes = false;
    cases.push_back(mc);
  }
  {
    MeshCase mc;
    mc.desc = "mesh (a=2, b=4) as a, b:(2)2 (b:(1)2 replicated)";
    mc.shape = {2, 4};
    mc.names = {"a", "b"};
    mc.units = {whole("a", 0, 2), {"b:(2)2", {{1, 2, 2}}}};
    mc.viewAxes = {0, 1};
    mc.unitsAreViewAxes = false;
    cases.push_back(mc);
  }
  {
    MeshCase mc = simple({2, 2, 2});
    mc.desc = "mesh (2,2,2) view slice(c,a)";
    mc.viewExpr = "slice(c,a)";
    mc.units = {whole("c", 2, 2), whole("a", 0, 2)};
    mc.viewAxes = {0, 2};
    cases.push_back(mc);
  }
  {
    MeshCase mc = simple({2, 2, 2});
    mc.desc = "mesh (2,2,2) view flatten(c,a as ca)";
    mc.viewExpr = "flatten(c,a as ca)";
    mc.flattened = true;
    mc.units = {{"ca", {{2, 1, 2}, {0, 1, 2}}}, whole("b", 1, 2)};
    mc.viewAxes = {0, 1, 2};
    cases.push_back(mc);
  }
  {
    MeshCase mc = simple({2, 3, 2});
    mc.desc = "mesh (2,3,2) view slice(b,c).flatten(c,b as cb)";
    mc.viewExpr = "slice(b,c).flatten(c,b as cb)";
    mc.flattened = true;
    mc.units = {{"cb", {{2, 1, 2}, {1, 1, 3}}}};
    mc.viewAxes = {1, 2};
    cases.push_back(mc);
  }
  std::vector<MeshCase> out;
  for (const MeshCase &mc : cases)
    if (mc.flattened == flattened)
      out.push_back(mc);
  return out;
}

void runSweep(bool flattened) {
  std::vector<MeshCase> cases = sweepCases(flattened);
  Stats stats;
  for (const MeshCase &mc : cases) {
    runMeshCase(mc, stats);
    if (::testing::Test::HasFatalFailure())
      return;
  }
  std::printf("[sweep] %zu meshes/views, %lld layouts, %lld (layout, shape) "
              "pairs, %lld rank boxes; placementsFromLayout ok %lld, rejected "
              "%lld (%lld checked by brute-force candidate search)\n",
              cases.size(), (long long)stats.layouts, (long long)stats.shapes,
              (long long)stats.boxChecks, (long long)stats.placementOk,
              (long long)stats.placementRejected,
              (long long)stats.candidateSearches);
}

TEST(LayoutSweep, ShardBoxesTilingAndRoundTrips) { runSweep(false); }

// A flattened view axis is one mesh dim to DTensor: Shard(d) on it is one
// torch.chunk by the axis's size, not nested chunks by its root axes.
TEST(LayoutSweep, FlattenedViewAxesChunkByTheirProduct) { runSweep(true); }

TEST(Layout, ReduceOpsRoundTripThroughText) {
  auto mesh = testutil::makeMesh({2, 2}, {"dp", "tp"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  for (const char *op : {"sum", "avg", "max", "min", "product"}) {
    auto l = parseLayout(root, ns,
                         std::string("[{tp}, {}] partial(") + op + ")={dp}");
    ASSERT_TRUE(l.ok()) << op << ": " << l.error().message;
    EXPECT_EQ(reduceOpName(l->reduceOp), op);
    auto again = parseLayout(root, ns, formatLayout(*mesh, *l));
    ASSERT_TRUE(again.ok()) << formatLayout(*mesh, *l);
    EXPECT_EQ(again->reduceOp, l->reduceOp);
    EXPECT_TRUE(equivalentLayouts(root, *l, *again));
  }
  // Different ops are different layouts.
  auto s = parseLayout(root, ns, "[{tp}, {}] partial(sum)={dp}");
  auto m = parseLayout(root, ns, "[{tp}, {}] partial(max)={dp}");
  ASSERT_TRUE(s.ok() && m.ok());
  EXPECT_FALSE(equivalentLayouts(root, *s, *m));
}

/// Merges adjacent refs that form one larger (sub-)axis: b:(1)2,b:(2)2 -> b.
AxisRefList mergeAdjacent(const AxisRefList &refs) {
  AxisRefList out;
  for (const AxisRef &r : refs) {
    if (!out.empty() && out.back().axis == r.axis &&
        out.back().pre * out.back().size == r.pre) {
      out.back().size *= r.size;
      continue;
    }
    out.push_back(r);
  }
  return out;
}

// equivalentLayouts promises "the same data on every rank". Whenever it says
// so for a layout and the same layout with adjacent sub-axes merged, every
// rank's box must be the same for every shape.
TEST(LayoutSweep, EquivalentLayoutsHoldTheSameBoxes) {
  struct Case {
    Ints shape;
    std::vector<std::string> names;
    AxisRefList units;
  };
  std::vector<Case> cases = {
      {{4}, {"x"}, {AxisRef{0, 1, 2}, AxisRef{0, 2, 2}}},
      {{8}, {"x"}, {AxisRef{0, 1, 2}, AxisRef{0, 2, 2}, AxisRef{0, 4, 2}}},
      {{4, 2},
       {"dp", "tp"},
       {AxisRef{0, 1, 2}, AxisRef{0, 2, 2}, AxisRef{1, 1, 2}}},
  };
  int64_t merges = 0;
  for (const Case &c : cases) {
    auto mesh = testutil::makeMesh(c.shape, c.names);
    View root = View::root(mesh);
    testutil::FailureLog log("sub-axes of mesh " + bf::str(c.shape));
    for (int rank : {1, 2})
      for (const bf::LayoutSpec &spec :
           bf::enumerateLayouts(static_cast<int>(c.units.size()), rank)) {
        Layout split;
        split.dims.resize(rank);
        for (int d = 0; d < rank; ++d)
          for (int u : spec.dims[d])
            split.dims[d].push_back(c.units[u]);
        for (int u : spec.partial)
          split.partial.push_back(c.units[u]);
        Layout joined = split;
        for (AxisRefList &dim : joined.dims)
          dim = mergeAdjacent(dim);
        if (joined.dims == split.dims)
          continue;
        ++merges;
        bool equivalent = equivalentLayouts(root, split, joined);
        for (int64_t n0 = 0; n0 <= 13; ++n0)
          for (int64_t n1 : {1, 5}) {
            Ints shape = rank == 1 ? Ints{n0} : Ints{n0, n1};
            bool same = true;
            std::string diff;
            for (int64_t r = 0; r < mesh->size() && same; ++r) {
              auto a = shardOf(root, split, shape, r);
              auto b = shardOf(root, joined, shape, r);
              same = a.ok() && b.ok() && a->offset == b->offset &&
                     a->localShape == b->localShape;
              if (!same && a.ok() && b.ok())
                diff = "rank " + std::to_string(r) + ": " + bf::str(a->offset) +
                       "+" + bf::str(a->localShape) + " vs " +
                       bf::str(b->offset) + "+" + bf::str(b->localShape);
            }
            SWEEP_EXPECT(log, !equivalent || same)
                << formatLayout(*mesh, split) << " and "
                << formatLayout(*mesh, joined) << " are 'equivalent' but "
                << "differ for shape " << bf::str(shape) << ", " << diff;
            if (rank == 1)
              break;
          }
      }
  }
  std::printf("[sweep] %lld layouts with mergeable sub-axes\n",
              (long long)merges);
}

// Minimal repro: on x=4, [{x:(1)2, x:(2)2}] (nested chunks 2 then 2) and
// [{x}] (one chunk by 4) are reported equivalent, yet for 5 rows they give
// rank 1 one row (offset 2) and two rows (offset 2) respectively.
TEST(Layout, MergedSubAxesEquivalenceRepro) {
  auto mesh = testutil::makeMesh({4}, {"x"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  auto split = parseLayout(root, ns, "[{\"x\":(1)2, \"x\":(2)2}]");
  auto joined = parseLayout(root, ns, "[{x}]");
  ASSERT_TRUE(split.ok() && joined.ok());
  // Brute force: nested torch.chunk vs one torch.chunk.
  EXPECT_EQ(bf::nestedChunk(5, {2, 2}, {0, 1}), (Ints{2}));
  EXPECT_EQ(bf::nestedChunk(5, {4}, {1}), (Ints{2, 3}));
  auto a = shardOf(root, *split, {5}, 1);
  auto b = shardOf(root, *joined, {5}, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->localShape[0], 1);
  EXPECT_EQ(b->localShape[0], 2);
  EXPECT_FALSE(equivalentLayouts(root, *split, *joined))
      << "different boxes for 5 rows, yet reported equivalent";
}

// Minimal repro of the flattened-axis sweep failure: FSDP2 over a flattened
// dp mesh of 4 ranks chunks 5 rows as torch.chunk(5, 4) = [2, 2, 1, 0].
TEST(Layout, ShardOverFlattenedAxisIsOneTorchChunk) {
  auto mesh = testutil::makeMesh({2, 2}, {"a", "b"});
  AxisNamespace ns(mesh);
  auto view = evaluateViewExpr(View::root(mesh), "flatten(a,b as ab)", ns);
  ASSERT_TRUE(view.ok());
  std::vector<Ints> rows = {{0, 1}, {2, 3}, {4}, {}};
  auto fromText = parseLayout(*view, ns, "[{ab}]");
  auto fromDTensor = layoutFromPlacements(*view, {Placement::shard(0)}, {5});
  ASSERT_TRUE(fromText.ok()) << fromText.error().message;
  for (const Result<Layout> *layout : {&fromText, &fromDTensor}) {
    if (!layout->ok())
      continue; // rejecting the import would be acceptable; a wrong box not
    for (int64_t r = 0; r < 4; ++r) {
      auto box = shardOf(*view, **layout, {5}, r);
      ASSERT_TRUE(box.ok());
      int64_t offset = rows[r].empty() ? 5 : rows[r][0];
      EXPECT_EQ(box->offset[0], offset)
          << "rank " << r << " of " << formatLayout(*mesh, **layout);
      EXPECT_EQ(box->localShape[0], static_cast<int64_t>(rows[r].size()))
          << "rank " << r << " of " << formatLayout(*mesh, **layout);
    }
  }
}

TEST(Layout, EquivalenceAcrossRefGranularity) {
  auto mesh = testutil::makeMesh({4, 2}, {"dp", "tp"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  auto a = parseLayout(root, ns, "[{dp, tp}]");
  auto b = parseLayout(root, ns, "[{\"dp\":(1)2, \"dp\":(2)2, tp}]");
  auto c = parseLayout(root, ns, "[{\"dp\":(2)2, \"dp\":(1)2, tp}]");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(equivalentLayouts(root, *a, *b));
  EXPECT_FALSE(equivalentLayouts(root, *a, *c));
}

} // namespace
