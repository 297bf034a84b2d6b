//===- ErrorsTest.cpp - Bad input gives an Error, never a crash -----------===//
//
// Every user-facing entry point of core, fed malformed or inconsistent input,
// must return an Error with a message (naming the offending item where the
// input has one), and random token soup must never crash a parser.
//
//===----------------------------------------------------------------------===//

#include "TestHelpers.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Placement.h"
#include "meshplan/Core/Redistribute.h"

#include <gtest/gtest.h>

#include <climits>

using namespace meshplan;
using bf::Ints;

namespace {

/// Expects an error whose message contains `needle` (when given).
template <typename T>
void expectError(const Result<T> &r, const std::string &what,
                 const std::string &needle = "") {
  ASSERT_FALSE(r.ok()) << what << ": expected an error";
  EXPECT_FALSE(r.error().message.empty()) << what;
  if (!needle.empty()) {
    EXPECT_NE(r.error().message.find(needle), std::string::npos)
        << what << ": message \"" << r.error().message << "\" should mention \""
        << needle << "\"";
  }
}

Result<Mesh> mesh(std::vector<MeshAxis> axes,
                  std::optional<Ints> order = std::nullopt) {
  return Mesh::create(std::move(axes), std::move(order));
}

TEST(Errors, MeshCreation) {
  expectError(mesh({{"dp", 2}, {"dp", 4}}), "duplicate axis", "dp");
  expectError(mesh({{"dp", 0}}), "size 0", "dp");
  expectError(mesh({{"dp", -3}}), "negative size", "dp");
  expectError(mesh({}), "no axes");
  expectError(mesh({{"", 2}}), "empty name");
  expectError(mesh({{"1dp", 2}}), "name starting with a digit", "1dp");
  expectError(mesh({{"d-p", 2}}), "name with a dash", "d-p");
  expectError(mesh({{"a", int64_t(1) << 30}, {"b", int64_t(1) << 30}}),
              "more than 2^31 ranks at axis \"b\"");
  // One axis beyond the limit is named with its size (issue 12).
  expectError(mesh({{"a", int64_t(1) << 32}}),
              "axis \"a\" has size 4294967296; meshes have at most 2^31 ranks "
              "(docs/limits.md)");
  EXPECT_TRUE(mesh({{"a", int64_t(1) << 31}}).ok())
      << "2^31 ranks is the limit";
  // Products that overflow int64 are caught, not wrapped.
  expectError(mesh({{"a", int64_t(1) << 31},
                    {"b", int64_t(1) << 31},
                    {"c", int64_t(1) << 31}}),
              "more than 2^31 ranks");
  expectError(mesh(std::vector<MeshAxis>(65, MeshAxis{"x", 1})),
              "meshes have at most 64");
  expectError(mesh({{"dp", 2}, {"tp", 2}}, Ints{0, 1, 2}), "short order");
  expectError(mesh({{"dp", 2}}, Ints{1, 1}), "rank twice", "1");
  expectError(mesh({{"dp", 2}}, Ints{0, -1}), "negative rank", "-1");
  EXPECT_TRUE(mesh({{"dp", 1}}).ok()) << "size-1 axes are fine";

  expectError(parseMeshAxes(""), "empty --mesh");
  expectError(parseMeshAxes("dp=2,tp"), "entry without size", "tp");
  expectError(parseMeshAxes("dp=two"), "non-integer size", "dp=two");
  expectError(parseMeshAxes("dp=99999999999999999999"), "overflowing size");
  auto dup = parseMeshAxes("dp=2,dp=4");
  ASSERT_TRUE(dup.ok());
  expectError(Mesh::create(*dup), "duplicate parsed axis", "dp");
  auto zero = parseMeshAxes("dp=0");
  ASSERT_TRUE(zero.ok());
  expectError(Mesh::create(*zero), "parsed size 0", "dp");
  expectError(parseIntList("0,x,2", "device order"), "bad int list", "x");
  expectError(parseIntList("", "device order"), "empty int list");
}

TEST(Errors, RankOutOfRange) {
  auto m = testutil::makeMesh({2, 2}, {"dp", "tp"});
  View root = View::root(m);
  for (int64_t bad : {int64_t(-1), int64_t(4), int64_t(1) << 50}) {
    std::string what = "rank " + std::to_string(bad);
    expectError(m->coordinate(bad), what, std::to_string(bad));
    expectError(m->positionOf(bad), what);
    expectError(root.coordinate(bad), what);
    expectError(root.group(bad, {0}), what);
    expectError(root.split(bad, {1}), what);
    expectError(root.localRank(bad, {0, 1}), what);
    expectError(groupOf(*m, root.refs(), bad), what);
    expectError(groupIndexOf(*m, root.refs(), bad), what);
    expectError(splitKeyOf(*m, root.refs(), bad), what);
    expectError(shardOf(root, replicatedLayout(1), {4}, bad), what);
    EXPECT_FALSE(m->contains(bad));
  }
  // With a device order, a rank id that is not listed.
  auto ordered = testutil::makeMesh({2}, {"x"}, Ints{10, 20});
  expectError(ordered->coordinate(0), "unlisted rank 0", "0");
  expectError(View::root(ordered).group(15, {0}), "unlisted rank 15");
  EXPECT_TRUE(View::root(ordered).group(20, {0}).ok());
}

TEST(Errors, ViewExpressions) {
  auto m = testutil::makeMesh({2, 4}, {"dp", "tp"});
  auto bad = [&](const std::string &expr, const std::string &needle = "") {
    AxisNamespace ns(m);
    expectError(evaluateViewExpr(View::root(m), expr, ns),
                "expr \"" + expr + "\"", needle);
  };
  bad("", "");
  bad("   ");
  bad("reshape(dp)", "reshape");
  bad("slice(zz)", "zz");
  bad("slice(dp).slice(tp)", "tp");
  bad("slice()");
  bad("slice(dp,dp)", "dp");
  bad("slice(dp");
  bad("slice dp");
  bad(".slice(dp)");
  bad("slice(dp)..slice(dp)");
  bad("slice(dp).");
  bad("flatten()");
  bad("flatten(zz,tp)", "zz");
  bad("flatten(dp,tp as )");
  bad("flatten(dp,tp as tp)", "tp");
  bad("unflatten(tp)");
  bad("unflatten(tp as a:3,b:2)");        // 6 != 4
  bad("unflatten(tp as a:2,b:x)", "b:x"); // not an integer
  bad("unflatten(tp as a:2,b)", "b");
  bad("unflatten(tp as a:0,b:4)");
  bad("unflatten(tp as a:-2,b:-2)");
  bad("unflatten(tp as a:2,a:2)", "a");
  bad("unflatten(tp as dp:2,b:2)", "dp"); // clashes with a view axis
  bad("unflatten(zz as a:2,b:2)", "zz");
  // Errors name the column of the offending step.
  {
    AxisNamespace ns(m);
    auto r = evaluateViewExpr(View::root(m), "slice(dp,tp).slice(zz)", ns);
    expectError(r, "column", "column 14");
  }
  // Not aligned: (a=2, b=3) flattened to 6 cannot be cut 3 x 2.
  auto m23 = testutil::makeMesh({2, 3}, {"a", "b"});
  AxisNamespace ns(m23);
  expectError(evaluateViewExpr(View::root(m23),
                               "flatten(a,b as ab).unflatten(ab as x:3,y:2)",
                               ns),
              "unaligned unflatten");
  // Direct API, empty lists.
  AxisNamespace ns2(m);
  expectError(sliceView(View::root(m), {}, ns2), "empty slice");
  expectError(flattenView(View::root(m), {}, std::nullopt, ns2),
              "empty flatten");
  expectError(unflattenView(View::root(m), "tp", {}, ns2), "empty unflatten");
  {
    auto defined = ns2.define("", AxisRefList{AxisRef{0, 1, 2}});
    EXPECT_FALSE(defined.ok()) << "empty name";
  }
}

TEST(Errors, SubAxes) {
  auto m = testutil::makeMesh({4, 2}, {"dp", "tp"});
  expectError(makeAxisRef(*m, 0, 1, 3), "size 3 of 4", "dp");
  expectError(makeAxisRef(*m, 0, 2, 4), "pre*size 8 of 4", "dp");
  expectError(makeAxisRef(*m, 0, 0, 2), "pre 0");
  expectError(makeAxisRef(*m, 0, 3, 1), "pre 3 of 4");
  View root = View::root(m);
  AxisNamespace ns(m);
  expectError(parseLayout(root, ns, "[{\"dp\":(1)3}]"), "layout dp:(1)3", "dp");
  expectError(parseLayout(root, ns, "[{\"dp\":(3)1}]"), "layout dp:(3)1");
  expectError(parseLayout(root, ns, "[{\"zz\":(1)2}]"), "unknown sub-axis",
              "zz");
  expectError(parseLayout(root, ns, "[{\"dp\":(x)2}]"), "malformed sub-axis");
  expectError(parseLayout(root, ns, "[{\"dp\":(1)2, \"dp\":(1)4}]"),
              "overlapping sub-axes", "dp");
  // Sub-axes whose boundaries do not nest: x:(1)2 and x:(3)2 on x=12.
  auto m12 = testutil::makeMesh({12}, {"x"});
  AxisNamespace ns12(m12);
  expectError(
      parseLayout(View::root(m12), ns12, "[{\"x\":(1)2}, {\"x\":(3)2}]"),
      "non-nesting sub-axes", "x");
  // A managed axis cannot be split into sub-axes or split a tensor dim.
  auto managed =
      testutil::makeMesh({4, 2}, {"r", "s"}, std::nullopt, {true, false});
  expectError(makeAxisRef(*managed, 0, 1, 2), "sub-axis of managed", "r");
  AxisNamespace nsm(managed);
  expectError(parseLayout(View::root(managed), nsm, "[{r}]"),
              "managed axis splitting a dim", "r");
  EXPECT_TRUE(
      parseLayout(View::root(managed), nsm, "[{s}] partial(sum)={r}").ok());
}

TEST(Errors, Layouts) {
  auto m = testutil::makeMesh({2, 2, 2}, {"dp", "tp", "cp"});
  View root = View::root(m);
  AxisNamespace ns(m);
  auto bad = [&](const View &view, const std::string &text,
                 const std::string &needle = "") {
    expectError(parseLayout(view, ns, text), "layout " + text, needle);
  };
  bad(root, "[{dp}, {dp}]", "dp");
  bad(root, "[{dp, dp}]", "dp");
  bad(root, "[{dp}] partial(sum)={dp}", "dp");
  bad(root, "[{zz}]", "zz");
  bad(root, "");
  bad(root, "{dp}");
  bad(root, "[{dp}");
  bad(root, "[dp]");
  bad(root, "[{dp}] partial(foo)={tp}", "foo");
  bad(root, "[{dp}] partial(sum)=tp");
  bad(root, "[{dp}] partial(sum)={tp");
  bad(root, "[{dp}] extra");
  // Levels: `(a, b)` groups refs into one level; a ref is still used once.
  bad(root, "[{(dp, dp)}]", "dp");
  bad(root, "[{(dp, tp), tp}]", "tp");
  bad(root, "[{(dp, tp)}, {(cp, dp)}]", "dp");
  bad(root, "[{(dp, tp}]");
  bad(root, "[{(dp, zz)}]", "zz");
  bad(root, "[{(dp, tp)}] partial(sum)={(tp)}", "tp");
  // A flattened name expands to its axes: using one of them again is twice.
  AxisNamespace ns2(m);
  auto flat = evaluateViewExpr(root, "flatten(dp,tp as dt)", ns2);
  ASSERT_TRUE(flat.ok());
  expectError(parseLayout(*flat, ns2, "[{dt}, {dp}]"), "dt then dp", "dp");
  // An axis outside the view.
  auto sliced = evaluateViewExpr(root, "slice(dp,tp)", ns2);
  ASSERT_TRUE(sliced.ok());
  expectError(parseLayout(*sliced, ns2, "[{cp}]"), "cp outside the view", "cp");
  // shardOf with the wrong tensor rank.
  auto l = parseLayout(root, ns, "[{dp}, {}]");
  ASSERT_TRUE(l.ok());
  expectError(shardOf(root, *l, {4}, 0), "rank mismatch");
  expectError(parseShape("4,-1"), "negative dim", "-1");
  expectError(parseShape("4,x"), "bad dim", "x");
  expectError(parseShape(""), "empty shape");
  // Shapes are bounded (2^50 elements) wherever they enter.
  int64_t big = int64_t(1) << 26;
  expectError(parseShape("1125899906842625"), "2^50 + 1 elements", "2^50");
  EXPECT_TRUE(parseShape("1125899906842624").ok()) << "2^50 elements";
  expectError(shardOf(root, *l, {big, big}, 0), "shardOf on 2^52 elements",
              "2^50");
  expectError(shardOf(root, *l, {4, -1}, 0), "shardOf on a negative dim");
  expectError(layoutFromPlacements(root,
                                   {Placement::shard(0), Placement::replicate(),
                                    Placement::replicate()},
                                   {big, big}),
              "placements on 2^52 elements", "2^50");
  expectError(parseReduceOp("median"), "unknown op", "median");
}

TEST(Errors, Placements) {
  auto m = testutil::makeMesh({2, 2}, {"dp", "tp"});
  View root = View::root(m);
  // Count mismatch.
  expectError(layoutFromPlacements(root, {Placement::shard(0)}, {4}),
              "1 placement for 2 axes", "2");
  expectError(layoutFromPlacements(root,
                                   {Placement::shard(0), Placement::shard(0),
                                    Placement::replicate()},
                                   {4}),
              "3 placements for 2 axes");
  // Shard dim out of range.
  expectError(layoutFromPlacements(
                  root, {Placement::shard(2), Placement::replicate()}, {4, 4}),
              "Shard(2) of a 2-d tensor", "2");
  expectError(layoutFromPlacements(
                  root, {Placement::shard(-3), Placement::replicate()}, {4, 4}),
              "Shard(-3) of a 2-d tensor");
  expectError(layoutFromPlacements(
                  root, {Placement::strided(1, 2), Placement::shard(0)}, {8}),
              "SS(1,2) of a 1-d tensor");
  // Mixed Partial ops.
  expectError(layoutFromPlacements(root,
                                   {Placement::partial(ReduceOp::Sum),
                                    Placement::partial(ReduceOp::Max)},
                                   {4}),
              "mixed partial ops", "max");
  // Text.
  for (const char *text :
       {"", "[]", "S", "S()", "S(x)", "S(0,1)", "SS(0)", "SS(0,0)", "SS(0,-2)",
        "SS(a,b)", "Q(0)", "Shard(dim=0", "P(median)", "P(sum,max)", "R(0)",
        "Replicate(1)",
        // Found by fuzz-placement: lists of commas alone were read as empty
        // lists, which print back as "" (fuzz/corpus/placement/regress-*).
        ",", ",,", "[,]", "(,)", "S(0),,R", ",S(0)", "S(0),,"})
    expectError(parsePlacements(text),
                std::string("placements \"") + text + "\"");
  // The layout is not expressible as whole-axis placements.
  auto m4 = testutil::makeMesh({4}, {"x"});
  AxisNamespace ns4(m4);
  auto sub = parseLayout(View::root(m4), ns4, "[{\"x\":(1)2}]");
  ASSERT_TRUE(sub.ok());
  expectError(placementsFromLayout(View::root(m4), *sub, {8}),
              "sub-axis layout to placements", "x");
  auto whole = parseLayout(View::root(m4), ns4, "[{x}]");
  ASSERT_TRUE(whole.ok());
  expectError(placementsFromLayout(View::root(m4), *whole, {8, 8}),
              "shape rank mismatch");
}

TEST(Errors, Redistribute) {
  auto m = testutil::makeMesh({2, 2, 2}, {"dp", "tp", "cp"});
  View root = View::root(m);
  AxisNamespace ns(m);
  auto a = parseLayout(root, ns, "[{dp}, {}]");
  auto b = parseLayout(root, ns, "[{}, {tp}]");
  ASSERT_TRUE(a.ok() && b.ok());
  expectError(planRedistribute(root, *a, *b, {4}), "shape rank mismatch");
  expectError(planRedistribute(root, *a, *b, {4, 4}, 0), "element bytes 0");
  expectError(planRedistribute(root, *a, *b, {4, 4}, 65), "element bytes 65");
  expectError(
      planRedistribute(root, *a, *b, {int64_t(1) << 26, int64_t(1) << 26}),
      "2^52 elements", "2^50");
  auto sliced = evaluateViewExpr(root, "slice(tp,cp)", ns);
  ASSERT_TRUE(sliced.ok());
  expectError(planRedistribute(*sliced, *a, *b, {4, 4}),
              "layout outside the view", "dp");
  Layout twice;
  twice.dims = {{{AxisRef{0, 1, 2}}}, {{AxisRef{0, 1, 2}}}};
  expectError(planRedistribute(root, twice, *b, {4, 4}), "source uses dp twice",
              "dp");
  expectError(planRedistribute(root, *b, twice, {4, 4}), "target uses dp twice",
              "dp");
  Layout outOfMesh;
  outOfMesh.dims = {{{AxisRef{0, 2, 2}}}, {}}; // dp has size 2: (2)2 is bad
  expectError(planRedistribute(root, outOfMesh, *b, {4, 4}),
              "ref beyond its axis");
  // permutePeers on a step that is not a permute.
  auto plan = planRedistribute(root, *a, *b, {4, 4});
  ASSERT_TRUE(plan.ok());
  ASSERT_FALSE(plan->steps.empty());
  for (const RedistributeStep &s : plan->steps)
    if (s.kind != StepKind::Permute)
      expectError(permutePeers(*m, s, 0), "permutePeers on a non-permute");
}

// Hostile sizes (issue 12): every product of sizes is overflow-checked and
// every size is bounded (Limits.h) before anything is allocated.
TEST(Errors, Limits) {
  // A sub-axis whose pre-size * size overflows int64 ((2^32)(2^63-1) wraps to
  // -2^32) used to pass validation and crash every later query.
  auto m3 = testutil::makeMesh({3}, {"pp"});
  expectError(makeAxisRef(*m3, 0, int64_t(1) << 32, INT64_MAX),
              "overflowing sub-axis", "pre-size * size (more than 2^63)");
  expectError(makeAxisRef(*m3, 0, INT64_MAX, INT64_MAX), "overflowing sub-axis",
              "more than 2^63");
  View root3 = View::root(m3);
  AxisNamespace ns3(m3);
  expectError(
      parseLayout(root3, ns3, "[{\"pp\":(4294967296)9223372036854775807}]"),
      "layout with an overflowing sub-axis", "must divide the size of pp");
  auto to = parseLayout(root3, ns3, "[{}]");
  ASSERT_TRUE(to.ok());
  // Saturating sizes: a list that is not validated yet never wraps.
  EXPECT_EQ(refsSize({AxisRef{0, 1, int64_t(1) << 40},
                      AxisRef{0, 1, int64_t(1) << 40}}),
            INT64_MAX);

  // Groups listed member by member are bounded: refused before allocating.
  auto huge = testutil::makeMesh({int64_t(1) << 31}, {"dp"});
  AxisRefList dp{AxisRef{0, 1, int64_t(1) << 31}};
  expectError(groupOf(*huge, dp, 1), "group of 2^31 members",
              "the group over [dp] has 2147483648 members; groups that are "
              "listed member by member have at most 2^20 (docs/limits.md)");
  EXPECT_EQ(groupSizeOf(*huge, dp), int64_t(1) << 31) << "sizes stay O(axes)";
  auto index = groupIndexOf(*huge, dp, (int64_t(1) << 31) - 1);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(*index, (int64_t(1) << 31) - 1);
  // Traffic estimates never overflow: an all-reduce over 2^31 ranks of 2^50
  // float64 elements moves about 2^54 bytes per rank, but 2 * (g - 1) *
  // bytes overflowed before the division by g (found by fuzz-spec); a
  // padded all-gather can exceed int64 and saturates.
  {
    View view = View::root(huge);
    AxisNamespace hugeNs(huge);
    std::vector<int64_t> shape = {int64_t(1) << 25, int64_t(1) << 25};
    auto partial = parseLayout(view, hugeNs, "[{}, {}] partial(sum)={dp}");
    auto sharded = parseLayout(view, hugeNs, "[{dp}, {}]");
    auto replicated = parseLayout(view, hugeNs, "[{}, {}]");
    ASSERT_TRUE(partial.ok() && sharded.ok() && replicated.ok());
    auto reduce = planRedistribute(view, *partial, *replicated, shape, 8);
    ASSERT_TRUE(reduce.ok()) << reduce.error().message;
    ASSERT_EQ(reduce->steps.size(), 1u);
    EXPECT_EQ(reduce->steps[0].bytesPerRank,
              2 * ((int64_t(1) << 31) - 1) * (int64_t(1) << 22));
    // Gathering a dim of 1 over 2^31 ranks pads every shard to a whole row:
    // 2^31 - 1 rows of 2^49 float64 elements each to receive.
    auto gather =
        planRedistribute(view, *sharded, *replicated, {1, int64_t(1) << 49}, 8);
    ASSERT_TRUE(gather.ok()) << gather.error().message;
    ASSERT_EQ(gather->steps.size(), 1u);
    EXPECT_EQ(gather->steps[0].bytesPerRank, INT64_MAX);
  }

  auto limit = testutil::makeMesh({kMaxGroupMembers, 2}, {"dp", "tp"});
  auto atLimit = groupOf(*limit, {AxisRef{0, 1, kMaxGroupMembers}}, 1);
  ASSERT_TRUE(atLimit.ok()) << atLimit.error().message;
  EXPECT_EQ(static_cast<int64_t>(atLimit->size()), kMaxGroupMembers);

  // Tensor rank is bounded.
  std::string dims = "1";
  for (int i = 0; i < kMaxTensorRank; ++i)
    dims += ",1";
  expectError(parseShape(dims), "65 dims", "tensors have at most 64");

  // Exhaustive placement checks are bounded, including the pieces a large
  // _StridedShard split factor makes (this ran for minutes).
  auto m2 = testutil::makeMesh({2}, {"dp"});
  expectError(layoutFromPlacements(View::root(m2),
                                   {Placement::strided(0, int64_t(1) << 31)},
                                   {int64_t(1) << 31}),
              "split factor 2^31", "too many pieces to check exactly");
  expectError(layoutFromPlacements(View::root(huge), {Placement::shard(0)},
                                   {int64_t(1) << 31}),
              "2^31-way split", "too many to check exactly");
}

TEST(Errors, ViewCreate) {
  auto m = testutil::makeMesh({4, 2}, {"dp", "tp"});
  expectError(
      View::create(m, {{"x", {AxisRef{0, 1, 4}}}, {"x", {AxisRef{1, 1, 2}}}}),
      "two view axes named x", "x");
  expectError(View::create(m, {{"", {AxisRef{0, 1, 4}}}}), "empty view axis");
  expectError(
      View::create(m, {{"x", {AxisRef{0, 1, 4}}}, {"y", {AxisRef{0, 1, 2}}}}),
      "overlapping refs", "dp");
}

/// Random token soup into every parser: any result is fine, a crash is not.
TEST(Errors, ParsersSurviveTokenSoup) {
  auto m = testutil::makeMesh({2, 4}, {"dp", "tp"});
  View root = View::root(m);
  std::vector<std::string> tokens = {
      "slice", "flatten",     "unflatten", "(",
      ")",     "{",           "}",         "[",
      "]",     ",",           ".",         " as ",
      ":",     "dp",          "tp",        "\"",
      "dp_tp", "x",           "2",         "4",
      "-1",    "0",           "=",         "partial",
      "sum",   "max",         "S",         "SS",
      "R",     "P",           "dim",       "99999999999999999999",
      " ",     "(1)",         "(2)",       "_StridedShard",
      "Shard", "split_factor"};
  std::mt19937_64 rng(4242);
  int64_t parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k)
      text += tokens[rng() % tokens.size()];
    AxisNamespace ns(m);
    parsed += evaluateViewExpr(root, text, ns).ok();
    parsed += parseLayout(root, ns, text).ok();
    parsed += parseLayout(root, ns, "[" + text + "]").ok();
    parsed += parsePlacements(text).ok();
    parsed += parseMeshAxes(text).ok();
    parsed += parseShape(text).ok();
  }
  std::printf("[soup] 20000 random inputs x 6 parsers, %lld accepted\n",
              (long long)parsed);
}

} // namespace
