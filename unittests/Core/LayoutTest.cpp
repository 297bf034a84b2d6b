//===- LayoutTest.cpp - Shard boxes of every small layout -----------------===//
//
// For every layout of 1-D and 2-D tensors (dim sizes 0..13) on small meshes
// (every assignment of each axis, sub-axis or flattened view axis to
// replicated / partial / dim 0 / dim 1, every order within a dim, and every
// grouping of a dim's units into levels: `{a, b}` is two nested levels,
// `{(a, b)}` and a flattened view axis one level), each rank's element index
// set is computed by torch.chunk on explicit index lists, once per level, and
// compared with shardOf; a block's shards must tile the tensor. Text and
// DTensor round trips are checked on the same layouts, and equivalentLayouts
// must hold exactly when two layouts put the same data on every rank.
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

std::string levelText(const MeshCase &mc, const std::vector<int> &level) {
  if (level.size() == 1)
    return mc.units[level[0]].text;
  std::string out = "(";
  for (size_t i = 0; i < level.size(); ++i)
    out += (i ? ", " : "") + mc.units[level[i]].text;
  return out + ")";
}

std::string layoutText(const MeshCase &mc, const LayoutSpec &spec,
                       const std::string &op = "sum") {
  std::string out = "[";
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    out += d ? ", {" : "{";
    for (size_t l = 0; l < spec.dims[d].size(); ++l)
      out += (l ? ", " : "") + levelText(mc, spec.dims[d][l]);
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

AxisRefList unitRefs(const MeshCase &mc, int unit) {
  AxisRefList out;
  for (const RefSpec &r : mc.units[unit].refs)
    out.push_back(AxisRef{r.axis, r.pre, r.size});
  return out;
}

/// The layout built directly from the spec (not normalized).
Layout directLayout(const MeshCase &mc, const LayoutSpec &spec) {
  Layout l;
  l.dims.resize(spec.dims.size());
  for (size_t d = 0; d < spec.dims.size(); ++d)
    for (const std::vector<int> &level : spec.dims[d]) {
      AxisRefList refs;
      for (int u : level) {
        AxisRefList more = unitRefs(mc, u);
        refs.insert(refs.end(), more.begin(), more.end());
      }
      l.dims[d].push_back(refs);
    }
  for (int u : spec.partial) {
    AxisRefList more = unitRefs(mc, u);
    l.partial.insert(l.partial.end(), more.begin(), more.end());
  }
  return l;
}

/// True when some level holds two or more units of size > 1 (a level that
/// is not one view axis when units are view axes).
bool hasMultiAxisLevel(const MeshCase &mc, const LayoutSpec &spec) {
  for (const auto &levels : spec.dims)
    for (const auto &level : levels) {
      int nontrivial = 0;
      for (int u : level)
        nontrivial += mc.units[u].size() > 1;
      if (nontrivial > 1)
        return true;
    }
  return false;
}

struct Stats {
  int64_t layouts = 0, multiUnitLayouts = 0, boxChecks = 0, shapes = 0,
          placementOk = 0, placementRejected = 0, candidateSearches = 0,
          multiAxisRejected = 0;
};

/// Brute-force placement candidates for a layout whose units are whole view
/// axes, one per level: does any DTensor list (Shard / _StridedShard(sf) per
/// splitting axis) give exactly the nested boxes on every rank?
bool someDTensorListMatches(const MeshCase &mc, const LayoutSpec &spec,
                            const Ints &shape,
                            const std::vector<Ints> &unitDigits,
                            const std::vector<std::vector<Ints>> &nested) {
  int numAxes = static_cast<int>(mc.units.size());
  std::vector<int> dimOf(numAxes, -1);
  for (size_t d = 0; d < spec.dims.size(); ++d)
    for (int u : spec.dimUnits(d))
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

/// Brute-force facts about a mesh case: every rank's digit along every unit
/// and every view axis, and its block.
struct Ranks {
  int64_t world = 0;
  Ints rankIds, blockOf;
  std::vector<Ints> unitDigits, coords;
  std::vector<Ints> viewDigits; // per rank, per view axis
  Ints viewSizes;
};

Ranks bruteRanks(const MeshCase &mc, const View &view) {
  Ranks out;
  bf::NDArray ranks = testutil::rankArray(mc.shape, mc.order);
  out.world = ranks.numel();
  std::map<Ints, int64_t> blockIds;
  for (const ViewAxis &axis : view.axes()) {
    int64_t size = 1;
    for (const AxisRef &ref : axis.refs)
      size *= ref.size;
    out.viewSizes.push_back(size);
  }
  for (int64_t flat = 0; flat < out.world; ++flat) {
    out.rankIds.push_back(ranks.data[flat]);
    Ints coord = ranks.unravel(flat);
    out.coords.push_back(coord);
    Ints digits;
    for (int u = 0; u < static_cast<int>(mc.units.size()); ++u) {
      int64_t digit = 0;
      for (const AxisRef &ref : unitRefs(mc, u))
        digit = digit * ref.size + testutil::refDigit(mc.shape, coord, ref);
      digits.push_back(digit);
    }
    out.unitDigits.push_back(digits);
    Ints vd;
    for (const ViewAxis &axis : view.axes()) {
      int64_t digit = 0;
      for (const AxisRef &ref : axis.refs)
        digit = digit * ref.size + testutil::refDigit(mc.shape, coord, ref);
      vd.push_back(digit);
    }
    out.viewDigits.push_back(vd);
    Ints outside;
    for (int a = 0; a < static_cast<int>(mc.shape.size()); ++a)
      if (std::find(mc.viewAxes.begin(), mc.viewAxes.end(), a) ==
          mc.viewAxes.end())
        outside.push_back(coord[a]);
    out.blockOf.push_back(
        blockIds.emplace(outside, blockIds.size()).first->second);
  }
  return out;
}

/// Brute-force index lists of every dim of the rank at `flat`.
std::vector<Ints> bruteLists(const MeshCase &mc, const Ranks &rk,
                             const LayoutSpec &spec, const Ints &shape,
                             int64_t flat) {
  std::vector<Ints> lists;
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<bf::LevelDigits> levels;
    for (const auto &level : spec.dims[d]) {
      bf::LevelDigits ld;
      for (int u : level) {
        ld.sizes.push_back(mc.units[u].size());
        ld.digits.push_back(rk.unitDigits[flat][u]);
      }
      levels.push_back(ld);
    }
    lists.push_back(bf::levelChunk(shape[d], levels));
  }
  return lists;
}

struct Built {
  std::shared_ptr<const Mesh> mesh;
  std::unique_ptr<AxisNamespace> ns;
  std::optional<View> view;
};

Built build(const MeshCase &mc) {
  Built b;
  b.mesh = testutil::makeMesh(mc.shape, mc.names, mc.order);
  if (!b.mesh)
    return b;
  b.ns = std::make_unique<AxisNamespace>(b.mesh);
  View root = View::root(b.mesh);
  auto viewR = mc.viewExpr.empty() ? Result<View>(root)
                                   : evaluateViewExpr(root, mc.viewExpr, *b.ns);
  EXPECT_TRUE(viewR.ok()) << mc.desc << ": " << testutil::errorOf(viewR);
  if (viewR.ok())
    b.view = *viewR;
  return b;
}

void runMeshCase(const MeshCase &mc, Stats &stats) {
  Built b = build(mc);
  ASSERT_TRUE(b.mesh && b.view) << mc.desc;
  const Mesh &mesh = *b.mesh;
  const View &view = *b.view;
  AxisNamespace &ns = *b.ns;
  if (mc.unitsAreViewAxes) {
    ASSERT_EQ(view.numAxes(), static_cast<int>(mc.units.size())) << mc.desc;
  }

  testutil::FailureLog log(mc.desc);
  Ranks rk = bruteRanks(mc, view);
  int64_t world = rk.world;

  std::vector<Ints> shapes;
  for (int64_t n = 0; n <= 13; ++n)
    shapes.push_back({n});
  for (int64_t n0 = 0; n0 <= 13; ++n0)
    for (int64_t n1 = 0; n1 <= 13; ++n1)
      shapes.push_back({n0, n1});

  for (int rank : {1, 2}) {
    for (const LayoutSpec &spec :
         enumerateLayouts(static_cast<int>(mc.units.size()), rank,
                          /*multiUnitLevels=*/true)) {
      ++stats.layouts;
      stats.multiUnitLayouts += spec.hasMultiUnitLevel();
      bool multiAxisLevel = hasMultiAxisLevel(mc, spec);
      std::string text = layoutText(mc, spec);
      std::string where = mc.desc + " layout " + text;
      auto parsed = parseLayout(view, ns, text);
      ASSERT_TRUE(parsed.ok()) << where << ": " << parsed.error().message;
      Layout direct = directLayout(mc, spec);
      // parseLayout normalizes: canonical refs within a level, size-1 levels
      // dropped (the tests' own canonical form).
      Layout canonical;
      for (const SplitLevels &levels : direct.dims)
        canonical.dims.push_back(testutil::canonicalLevels(levels));
      canonical.partial = testutil::canonicalRefs(direct.partial);
      SWEEP_EXPECT(log, parsed->dims == canonical.dims &&
                            parsed->partial == canonical.partial)
          << where << ": parsed as " << formatLayout(mesh, *parsed);
      SWEEP_EXPECT(log, equivalentLayouts(view, *parsed, direct)) << where;
      Layout normalized = normalizeLayout(mesh, direct);
      SWEEP_EXPECT(log, normalized.dims == canonical.dims &&
                            normalized.partial == canonical.partial)
          << where << ": normalizeLayout gives "
          << formatLayout(mesh, normalized);
      const Layout &layout = *parsed;
      // Text round trip: formatLayout's text parses back to the same layout.
      std::string formatted = formatLayout(mesh, layout);
      auto reparsed = parseLayout(view, ns, formatted);
      ASSERT_TRUE(reparsed.ok()) << where << ": formatted as " << formatted
                                 << ": " << reparsed.error().message;
      SWEEP_EXPECT(log, reparsed->dims == layout.dims &&
                            reparsed->partial == layout.partial &&
                            equivalentLayouts(view, layout, *reparsed))
          << where << " vs " << formatted << ", parsed back as "
          << formatLayout(mesh, *reparsed);
      // Replicated refs: what the layout does not use.
      int64_t used = 1;
      for (size_t d = 0; d < spec.dims.size(); ++d)
        for (int u : spec.dimUnits(d))
          used *= mc.units[u].size();
      for (int u : spec.partial)
        used *= mc.units[u].size();
      SWEEP_EXPECT(log,
                   refsSize(replicatedRefs(view, layout)) * used == view.size())
          << where << ": replicated refs "
          << formatAxisRefs(mesh, replicatedRefs(view, layout));

      for (const Ints &shape : shapes) {
        if (static_cast<int>(shape.size()) != rank)
          continue;
        ++stats.shapes;
        std::string sw = where + " shape " + bf::str(shape);
        Ints padded;
        for (int d = 0; d < rank; ++d) {
          Ints levelSizes;
          for (const auto &level : spec.dims[d]) {
            int64_t k = 1;
            for (int u : level)
              k *= mc.units[u].size();
            levelSizes.push_back(k);
          }
          padded.push_back(bf::levelPadded(shape[d], levelSizes));
        }
        SWEEP_EXPECT(log, paddedShapeOf(layout, shape) == padded)
            << sw << ": padded " << bf::str(paddedShapeOf(layout, shape))
            << ", expected " << bf::str(padded);
        int64_t numel = bf::prod(shape);
        std::map<std::pair<int64_t, Ints>, Ints> held; // (block, split) -> set
        std::vector<std::vector<Ints>> nested(world);
        for (int64_t flat = 0; flat < world; ++flat) {
          ++stats.boxChecks;
          int64_t r = rk.rankIds[flat];
          auto box = shardOf(view, layout, shape, r);
          ASSERT_TRUE(box.ok()) << sw << " rank " << r;
          Ints split;
          for (int d = 0; d < rank; ++d)
            for (int u : spec.dimUnits(d))
              split.push_back(rk.unitDigits[flat][u]);
          std::vector<Ints> lists = bruteLists(mc, rk, spec, shape, flat);
          for (int d = 0; d < rank; ++d) {
            const Ints &list = lists[d];
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
              held.emplace(std::make_pair(rk.blockOf[flat], split), elements);
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
        SWEEP_EXPECT(log, !cover.empty()) << sw << ": no block";
        for (const auto &[block, seen] : cover)
          for (int64_t e = 0; e < numel; ++e)
            SWEEP_EXPECT(log, seen[e] == 1)
                << sw << " block " << block << " element " << e << " held by "
                << seen[e] << " shards";

        // DTensor round trip. Every level must be exactly one view axis.
        auto placements = placementsFromLayout(view, layout, shape);
        if (placements.ok()) {
          ++stats.placementOk;
          ASSERT_EQ(static_cast<int>(placements->size()), view.numAxes());
          SWEEP_EXPECT(log, !(mc.unitsAreViewAxes && multiAxisLevel))
              << sw << ": a level of several view axes exported as "
              << formatPlacements(*placements);
          for (int64_t flat = 0; flat < world; ++flat)
            for (int d = 0; d < rank; ++d) {
              std::vector<bf::DimPlacement> splits;
              for (int a = 0; a < view.numAxes(); ++a) {
                const Placement &p = (*placements)[a];
                if (p.kind == Placement::Kind::Partial && mc.unitsAreViewAxes) {
                  SWEEP_EXPECT(log, std::count(spec.partial.begin(),
                                               spec.partial.end(), a))
                      << sw << ": Partial on a non-partial axis";
                }
                if ((p.kind == Placement::Kind::Shard ||
                     p.kind == Placement::Kind::StridedShard) &&
                    p.dim == d)
                  splits.push_back(
                      {p.splitFactor, rk.viewSizes[a], rk.viewDigits[flat][a]});
              }
              SWEEP_EXPECT(log,
                           bf::dtensorRule(shape[d], splits) == nested[flat][d])
                  << sw << " placements " << formatPlacements(*placements)
                  << " rank " << rk.rankIds[flat] << " dim " << d
                  << ": DTensor gives "
                  << bf::str(bf::dtensorRule(shape[d], splits))
                  << ", the layout " << bf::str(nested[flat][d]);
            }
          auto back = layoutFromPlacements(view, *placements, shape);
          ASSERT_TRUE(back.ok())
              << sw << " placements " << formatPlacements(*placements) << ": "
              << back.error().message;
          SWEEP_EXPECT(log, equivalentLayouts(view, layout, *back))
              << sw << " placements " << formatPlacements(*placements)
              << " came back as " << formatLayout(mesh, *back);
        } else {
          ++stats.placementRejected;
          if (mc.unitsAreViewAxes && multiAxisLevel) {
            ++stats.multiAxisRejected; // DTensor has no such level
          } else if (mc.unitsAreViewAxes) {
            ++stats.candidateSearches;
            SWEEP_EXPECT(log, !someDTensorListMatches(mc, spec, shape,
                                                      rk.unitDigits, nested))
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
    mc.desc = "mesh (x=8) as x:(1)2, x:(2)2, x:(4)2";
    mc.shape = {8};
    mc.names = {"x"};
    mc.units = {{"\"x\":(1)2", {{0, 1, 2}}},
                {"x:(2)2", {{0, 2, 2}}},
                {"\"x\":(4)2", {{0, 4, 2}}}};
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
  {
    MeshCase mc = simple({2, 3, 2});
    mc.desc = "mesh (2,3,2) view flatten(a,b as ab)";
    mc.viewExpr = "flatten(a,b as ab)";
    mc.flattened = true;
    mc.units = {{"ab", {{0, 1, 2}, {1, 1, 3}}}, whole("c", 2, 2)};
    mc.viewAxes = {0, 1, 2};
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
  std::printf(
      "[sweep] %zu meshes/views, %lld layouts (%lld with a level of "
      "several units), %lld (layout, shape) pairs, %lld rank boxes; "
      "placementsFromLayout ok %lld, rejected %lld (%lld for a level "
      "of several view axes, %lld checked by brute-force candidate "
      "search)\n",
      cases.size(), (long long)stats.layouts, (long long)stats.multiUnitLayouts,
      (long long)stats.shapes, (long long)stats.boxChecks,
      (long long)stats.placementOk, (long long)stats.placementRejected,
      (long long)stats.multiAxisRejected, (long long)stats.candidateSearches);
  // Every branch of the sweep ran.
  EXPECT_GT(stats.multiUnitLayouts, 0);
  EXPECT_GT(stats.boxChecks, 0);
  EXPECT_GT(stats.placementOk, 0);
  EXPECT_GT(stats.multiAxisRejected, 0);
  EXPECT_GT(stats.candidateSearches, 0);
}

TEST(LayoutSweep, ShardBoxesTilingAndRoundTrips) { runSweep(false); }

// A flattened view axis is one level: Shard(d) on it, and the layout that
// names it, chunk once by the axis's size, not by its root axes in turn.
TEST(LayoutSweep, FlattenedViewAxesChunkByTheirProduct) { runSweep(true); }

/// Everything a layout puts on the ranks, by brute force from its refs, over
/// several shapes: each rank's index list of every dim (torch.chunk once per
/// level), and which ranks' values reduce together (the partial group).
Ints dataSignature(const MeshCase &mc, const Ranks &rk, const Layout &layout) {
  Ints sig;
  for (int64_t n = 0; n <= 13; ++n)
    for (int64_t flat = 0; flat < rk.world; ++flat)
      for (const SplitLevels &levels : layout.dims) {
        std::vector<bf::LevelDigits> lds;
        for (const AxisRefList &level : levels) {
          bf::LevelDigits ld;
          for (const AxisRef &ref : level) {
            ld.sizes.push_back(ref.size);
            ld.digits.push_back(
                testutil::refDigit(mc.shape, rk.coords[flat], ref));
          }
          lds.push_back(ld);
        }
        Ints list = bf::levelChunk(n, lds);
        sig.push_back(-1 - static_cast<int64_t>(list.size()));
        sig.insert(sig.end(), list.begin(), list.end());
      }
  std::map<Ints, int64_t> groupIds;
  for (int64_t flat = 0; flat < rk.world; ++flat) {
    Ints key = rk.coords[flat];
    for (const AxisRef &ref : layout.partial)
      key[ref.axis] -= testutil::refDigit(mc.shape, rk.coords[flat], ref) *
                       (mc.shape[ref.axis] / (ref.pre * ref.size));
    sig.push_back(groupIds.emplace(key, groupIds.size()).first->second);
  }
  return sig;
}

/// Splits a ref of composite size into two sub-axes (major, minor).
std::optional<std::pair<AxisRef, AxisRef>> splitRef(const AxisRef &ref) {
  for (int64_t p = 2; p < ref.size; ++p)
    if (ref.size % p == 0)
      return std::make_pair(AxisRef{ref.axis, ref.pre, p},
                            AxisRef{ref.axis, ref.pre * p, ref.size / p});
  return std::nullopt;
}

/// Other spellings of a layout: canonical refs (and the partial refs in
/// reverse order); the first composite ref cut into two sub-axes within its
/// level; the same cut into two levels; a composite partial ref cut.
std::vector<Layout> respellings(const Layout &l) {
  std::vector<Layout> out;
  Layout canonical = l;
  for (SplitLevels &levels : canonical.dims)
    levels = testutil::canonicalLevels(levels);
  canonical.partial = testutil::canonicalRefs(l.partial);
  std::reverse(canonical.partial.begin(), canonical.partial.end());
  out.push_back(canonical);
  bool cut = false;
  for (size_t d = 0; d < l.dims.size() && !cut; ++d)
    for (size_t v = 0; v < l.dims[d].size() && !cut; ++v)
      for (size_t i = 0; i < l.dims[d][v].size() && !cut; ++i) {
        auto parts = splitRef(l.dims[d][v][i]);
        if (!parts)
          continue;
        cut = true;
        Layout within = l;
        AxisRefList &level = within.dims[d][v];
        level[i] = parts->first;
        level.insert(level.begin() + i + 1, parts->second);
        out.push_back(within);
        Layout twoLevels = l;
        AxisRefList major(l.dims[d][v].begin(), l.dims[d][v].begin() + i);
        AxisRefList minor(l.dims[d][v].begin() + i + 1, l.dims[d][v].end());
        major.push_back(parts->first);
        minor.insert(minor.begin(), parts->second);
        twoLevels.dims[d][v] = major;
        twoLevels.dims[d].insert(twoLevels.dims[d].begin() + v + 1, minor);
        out.push_back(twoLevels);
      }
  for (size_t i = 0; i < l.partial.size(); ++i)
    if (auto parts = splitRef(l.partial[i])) {
      Layout p = l;
      p.partial[i] = parts->second;
      p.partial.push_back(parts->first);
      out.push_back(p);
      break;
    }
  return out;
}

// equivalentLayouts promises "the same data on every rank": for every pair of
// layouts of the sweep (levels included, spelled without normalization, and
// respelled with sub-axes) it must say so exactly when the brute-force data
// agree for every shape.
TEST(LayoutSweep, EquivalentExactlyWhenTheSameData) {
  std::vector<MeshCase> cases = sweepCases(false);
  for (const MeshCase &mc : sweepCases(true))
    cases.push_back(mc);
  int64_t layoutsChecked = 0, pairs = 0, equivalentPairs = 0,
          respelledEquivalent = 0;
  for (const MeshCase &mc : cases) {
    Built b = build(mc);
    ASSERT_TRUE(b.mesh && b.view) << mc.desc;
    const Mesh &mesh = *b.mesh;
    const View &view = *b.view;
    Ranks rk = bruteRanks(mc, view);
    testutil::FailureLog log("equivalence on " + mc.desc);
    for (int rank : {1, 2}) {
      std::vector<Layout> layouts;
      std::vector<size_t> origin; // the enumerated layout it respells
      for (const LayoutSpec &spec :
           enumerateLayouts(static_cast<int>(mc.units.size()), rank, true)) {
        size_t first = layouts.size();
        layouts.push_back(directLayout(mc, spec));
        origin.push_back(first);
        for (const Layout &other : respellings(layouts[first])) {
          layouts.push_back(other);
          origin.push_back(first);
        }
      }
      std::map<Ints, int64_t> sigIds;
      Ints sig;
      for (const Layout &l : layouts)
        sig.push_back(sigIds.emplace(dataSignature(mc, rk, l), sigIds.size())
                          .first->second);
      layoutsChecked += static_cast<int64_t>(layouts.size());
      for (size_t i = 0; i < layouts.size(); ++i)
        for (size_t j = i; j < layouts.size(); ++j) {
          ++pairs;
          bool same = sig[i] == sig[j];
          bool equivalent = equivalentLayouts(view, layouts[i], layouts[j]);
          if (equivalent && i != j) {
            ++equivalentPairs;
            respelledEquivalent += origin[i] == origin[j];
          }
          SWEEP_EXPECT(log, equivalent == same)
              << mc.desc << ": " << formatLayout(mesh, layouts[i]) << " and "
              << formatLayout(mesh, layouts[j]) << ": equivalentLayouts says "
              << equivalent << ", but the brute-force data are "
              << (same ? "the same" : "different");
        }
    }
  }
  std::printf("[sweep] %lld layouts (with respellings), %lld pairs, %lld "
              "equivalent pairs of different spellings (%lld respellings of "
              "one layout)\n",
              (long long)layoutsChecked, (long long)pairs,
              (long long)equivalentPairs, (long long)respelledEquivalent);
  EXPECT_GT(respelledEquivalent, 0);
  EXPECT_GT(equivalentPairs, respelledEquivalent);
}

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

// Regression (was MergedSubAxesEquivalenceRepro): on x=4, two nested levels
// x:(1)2 then x:(2)2 are not one level over x: for 5 rows they give rank 1
// row 2 alone and rows 2, 3 respectively. One level over both sub-axes, in
// their order, is the whole axis.
TEST(Layout, NestedSubAxesAreNotOneLevel) {
  auto mesh = testutil::makeMesh({4}, {"x"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  auto nested = parseLayout(root, ns, "[{\"x\":(1)2, \"x\":(2)2}]");
  auto grouped = parseLayout(root, ns, "[{(\"x\":(1)2, \"x\":(2)2)}]");
  auto reversed = parseLayout(root, ns, "[{(\"x\":(2)2, \"x\":(1)2)}]");
  auto whole = parseLayout(root, ns, "[{x}]");
  ASSERT_TRUE(nested.ok() && grouped.ok() && reversed.ok() && whole.ok());
  // By hand: torch.chunk(5, 2) = [0..2], [3, 4], each chunked by 2 again;
  // torch.chunk(5, 4) = [0, 1], [2, 3], [4], [].
  EXPECT_EQ(testutil::rowsOf(root, *nested, 5),
            (std::vector<Ints>{{0, 1}, {2}, {3}, {4}}));
  EXPECT_EQ(testutil::rowsOf(root, *whole, 5),
            (std::vector<Ints>{{0, 1}, {2, 3}, {4}, {}}));
  EXPECT_EQ(testutil::rowsOf(root, *grouped, 5),
            testutil::rowsOf(root, *whole, 5));
  // Reversed: rank r sits at chunk (r % 2) * 2 + r / 2.
  EXPECT_EQ(testutil::rowsOf(root, *reversed, 5),
            (std::vector<Ints>{{0, 1}, {4}, {2, 3}, {}}));
  EXPECT_FALSE(equivalentLayouts(root, *nested, *whole))
      << "different boxes for 5 rows, yet reported equivalent";
  EXPECT_TRUE(equivalentLayouts(root, *grouped, *whole));
  EXPECT_FALSE(equivalentLayouts(root, *reversed, *whole));
  EXPECT_FALSE(equivalentLayouts(root, *reversed, *nested));
  // Normalization merges the sub-axes of one level only.
  EXPECT_EQ(grouped->dims, whole->dims);
  EXPECT_EQ(nested->dims.size(), 1u);
  EXPECT_EQ(nested->dims[0].size(), 2u);
  EXPECT_EQ(formatLayout(*mesh, *grouped), "[{x}]");
  EXPECT_EQ(formatLayout(*mesh, *nested), "[{x:(1)2,x:(2)2}]");
  EXPECT_EQ(formatLayout(*mesh, *reversed), "[{(x:(2)2,x:(1)2)}]");
}

// Regression: FSDP2 over a flattened dp mesh of 4 ranks chunks 5 rows as
// torch.chunk(5, 4) = [2, 2, 1, 0], whether the layout names the flattened
// axis, groups its root axes into one level, or comes from Shard(0).
TEST(Layout, ShardOverFlattenedAxisIsOneTorchChunk) {
  auto mesh = testutil::makeMesh({2, 2}, {"a", "b"});
  AxisNamespace ns(mesh);
  View root = View::root(mesh);
  auto view = evaluateViewExpr(root, "flatten(a,b as ab)", ns);
  ASSERT_TRUE(view.ok());
  std::vector<Ints> rows = {{0, 1}, {2, 3}, {4}, {}};
  auto fromText = parseLayout(*view, ns, "[{ab}]");
  auto fromGroup = parseLayout(root, ns, "[{(a, b)}]");
  auto fromName = parseLayout(root, ns, "[{ab}]");
  auto fromDTensor = layoutFromPlacements(*view, {Placement::shard(0)}, {5});
  ASSERT_TRUE(fromText.ok()) << fromText.error().message;
  ASSERT_TRUE(fromGroup.ok()) << fromGroup.error().message;
  ASSERT_TRUE(fromName.ok()) << fromName.error().message;
  ASSERT_TRUE(fromDTensor.ok()) << fromDTensor.error().message;
  for (const Layout *layout :
       {&*fromText, &*fromGroup, &*fromName, &*fromDTensor})
    EXPECT_EQ(testutil::rowsOf(*view, *layout, 5), rows)
        << formatLayout(*mesh, *layout);
  EXPECT_EQ(formatLayout(*mesh, *fromDTensor), "[{(a,b)}]");
  // Two levels, a then b: 5 -> 3, 2 -> 2, 1, 1, 1.
  auto nested = parseLayout(root, ns, "[{a, b}]");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(testutil::rowsOf(root, *nested, 5),
            (std::vector<Ints>{{0, 1}, {2}, {3}, {4}}));
  EXPECT_FALSE(equivalentLayouts(root, *nested, *fromGroup));
  // And back to DTensor: the one level is the flattened axis.
  auto back = placementsFromLayout(*view, *fromText, {5});
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(formatPlacements(*back), "S(0)");
  // Two levels on a root view are two mesh dims.
  auto nestedBack = placementsFromLayout(root, *nested, {8});
  ASSERT_TRUE(nestedBack.ok()) << nestedBack.error().message;
  EXPECT_EQ(formatPlacements(*nestedBack), "S(0),S(0)");
  // One level over two mesh dims has no DTensor form.
  EXPECT_FALSE(placementsFromLayout(root, *fromGroup, {8}).ok());
}

TEST(Layout, EquivalenceAcrossRefGranularity) {
  auto mesh = testutil::makeMesh({4, 2}, {"dp", "tp"});
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  auto a = parseLayout(root, ns, "[{dp, tp}]");
  auto b = parseLayout(root, ns, "[{\"dp\":(1)2, \"dp\":(2)2, tp}]");
  auto c = parseLayout(root, ns, "[{\"dp\":(2)2, \"dp\":(1)2, tp}]");
  auto d = parseLayout(root, ns, "[{(\"dp\":(1)2, \"dp\":(2)2), tp}]");
  auto e = parseLayout(root, ns, "[{(\"dp\":(2)2, \"dp\":(1)2), tp}]");
  auto f = parseLayout(root, ns, "[{(dp, tp)}]");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok() && e.ok() && f.ok());
  // Two levels of sub-axes are not the one level dp.
  EXPECT_FALSE(equivalentLayouts(root, *a, *b));
  EXPECT_FALSE(equivalentLayouts(root, *a, *c));
  // One level of both sub-axes, in order, is dp.
  EXPECT_TRUE(equivalentLayouts(root, *a, *d));
  EXPECT_FALSE(equivalentLayouts(root, *a, *e));
  // One level over dp and tp is neither.
  EXPECT_FALSE(equivalentLayouts(root, *a, *f));
  EXPECT_FALSE(equivalentLayouts(root, *b, *f));
  // Brute force: 9 rows, rank 2 (dp=1, tp=0).
  EXPECT_EQ(bf::levelChunk(9, {{{4}, {1}}, {{2}, {0}}}), (Ints{3, 4}));
  EXPECT_EQ(bf::levelChunk(9, {{{2}, {0}}, {{2}, {1}}, {{2}, {0}}}), (Ints{3}));
  EXPECT_EQ(bf::levelChunk(9, {{{4, 2}, {1, 0}}}), (Ints{4, 5}));
  for (const auto &[layout, rows] :
       std::vector<std::pair<const Layout *, Ints>>{
           {&*a, {3, 4}}, {&*b, {3}}, {&*f, {4, 5}}}) {
    auto box = shardOf(root, *layout, {9}, 2);
    ASSERT_TRUE(box.ok());
    EXPECT_EQ(box->offset[0], rows[0]) << formatLayout(*mesh, *layout);
    EXPECT_EQ(box->localShape[0], static_cast<int64_t>(rows.size()))
        << formatLayout(*mesh, *layout);
  }
}

// The text forms of the spec: each braced name is a level, `(a, b)` one
// level, a flattened name one level; formatLayout prints a multi-ref level as
// `(a,b)`, and size-1 levels disappear.
TEST(Layout, LevelTextForms) {
  auto mesh = testutil::makeMesh({2, 2, 2, 1}, {"r", "s", "tp", "u"});
  AxisNamespace ns(mesh);
  View root = View::root(mesh);
  auto view = evaluateViewExpr(root, "flatten(r,s as dp_all)", ns);
  ASSERT_TRUE(view.ok()) << view.error().message;
  AxisRef r{0, 1, 2}, s{1, 1, 2}, tp{2, 1, 2};
  struct Case {
    const View *view;
    std::string text;
    SplitLevels dim0;
    std::string formatted;
  };
  std::vector<Case> cases = {
      {&root, "[{tp, r}, {}]", {{tp}, {r}}, "[{tp,r}, {}]"},
      {&root, "[{(r, s)}, {}]", {{r, s}}, "[{(r,s)}, {}]"},
      {&root, "[{(s, r), tp}, {}]", {{s, r}, {tp}}, "[{(s,r),tp}, {}]"},
      {&*view, "[{dp_all}, {}]", {{r, s}}, "[{(r,s)}, {}]"},
      {&*view, "[{tp, dp_all}, {}]", {{tp}, {r, s}}, "[{tp,(r,s)}, {}]"},
      {&*view, "[{(dp_all, tp)}, {}]", {{r, s, tp}}, "[{(r,s,tp)}, {}]"},
      {&root, "[{u, tp, r}, {}]", {{tp}, {r}}, "[{tp,r}, {}]"},
      {&root, "[{(tp, u), r}, {}]", {{tp}, {r}}, "[{tp,r}, {}]"},
  };
  for (const Case &c : cases) {
    auto l = parseLayout(*c.view, ns, c.text);
    ASSERT_TRUE(l.ok()) << c.text << ": " << l.error().message;
    ASSERT_EQ(l->rank(), 2) << c.text;
    EXPECT_EQ(l->dims[0], c.dim0) << c.text;
    EXPECT_TRUE(l->dims[1].empty()) << c.text;
    AxisRefList all;
    for (const AxisRefList &level : c.dim0)
      all.insert(all.end(), level.begin(), level.end());
    EXPECT_EQ(l->dimRefs(0), all) << c.text;
    EXPECT_EQ(formatLayout(*mesh, *l), c.formatted) << c.text;
    auto again = parseLayout(*c.view, ns, c.formatted);
    ASSERT_TRUE(again.ok()) << c.formatted << ": " << again.error().message;
    EXPECT_EQ(again->dims, l->dims) << c.formatted;
  }
}

} // namespace
