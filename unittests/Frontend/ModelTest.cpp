//===- ModelTest.cpp - Presets, model JSON, name patterns -----------------===//
//
// Presets have torchtitan's names and the published shapes (parameter totals
// within 1% of the published model sizes); model JSON round-trips; every
// malformed model gives an error at the pointer of the offending value; random
// mutations of a model document never crash the parser.
//
//===----------------------------------------------------------------------===//

#include "FrontendTestHelpers.h"

#include "meshplan/Frontend/Model.h"
#include "meshplan/Frontend/Presets.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <random>

using namespace meshplan;
using namespace meshplan::frontend;
using testutil::failsWith;
using testutil::succeeds;
using Json = nlohmann::ordered_json;

namespace {

const Parameter *findParam(const Model &model, const std::string &fullName) {
  const Parameter *found = nullptr;
  forEachModule(model, [&](const std::string &path, const Module &module) {
    for (const Parameter &p : module.params)
      if (path + "." + p.name == fullName)
        found = &p;
  });
  return found;
}

std::vector<int64_t> shapeOf(const Model &model, const std::string &name) {
  const Parameter *p = findParam(model, name);
  EXPECT_NE(p, nullptr) << name;
  return p ? p->shape : std::vector<int64_t>{};
}

using Shape = std::vector<int64_t>;

TEST(Presets, ParameterCountsMatchPublishedSizes) {
  struct Expected {
    const char *name;
    double params;
  } expected[] = {
      {"llama3-8b", 8.03e9}, {"llama3-70b", 70.6e9}, {"llama3-405b", 405.9e9}};
  for (const Expected &e : expected) {
    auto model = presetModel(e.name);
    ASSERT_TRUE(succeeds(model));
    double count = static_cast<double>(countParameters(*model));
    EXPECT_LT(std::abs(count - e.params) / e.params, 0.01)
        << e.name << ": " << count;
  }
  // tiny, by hand: embeddings and output 256*64 each, final norm 64, per
  // layer wq, wo 64*64, wk, wv 32*64, w1, w2, w3 128*64, two norms of 64.
  auto tiny = presetModel("tiny");
  ASSERT_TRUE(succeeds(tiny));
  int64_t layer = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64 + 2 * 64;
  EXPECT_EQ(countParameters(*tiny), 2 * 256 * 64 + 64 + 2 * layer);
}

TEST(Presets, TorchtitanNamesAndShapes) {
  auto model = presetModel("llama3-8b");
  ASSERT_TRUE(succeeds(model));
  EXPECT_EQ(shapeOf(*model, "tok_embeddings.weight"), (Shape{128256, 4096}));
  EXPECT_EQ(shapeOf(*model, "layers.0.attention.wq.weight"),
            (Shape{4096, 4096}));
  EXPECT_EQ(shapeOf(*model, "layers.31.attention.wk.weight"),
            (Shape{1024, 4096}));
  EXPECT_EQ(shapeOf(*model, "layers.7.attention.wv.weight"),
            (Shape{1024, 4096}));
  EXPECT_EQ(shapeOf(*model, "layers.7.attention.wo.weight"),
            (Shape{4096, 4096}));
  EXPECT_EQ(shapeOf(*model, "layers.3.feed_forward.w1.weight"),
            (Shape{14336, 4096}));
  EXPECT_EQ(shapeOf(*model, "layers.3.feed_forward.w2.weight"),
            (Shape{4096, 14336}));
  EXPECT_EQ(shapeOf(*model, "layers.3.feed_forward.w3.weight"),
            (Shape{14336, 4096}));
  EXPECT_EQ(shapeOf(*model, "layers.3.attention_norm.weight"), (Shape{4096}));
  EXPECT_EQ(shapeOf(*model, "layers.3.ffn_norm.weight"), (Shape{4096}));
  EXPECT_EQ(shapeOf(*model, "norm.weight"), (Shape{4096}));
  EXPECT_EQ(shapeOf(*model, "output.weight"), (Shape{128256, 4096}));
  EXPECT_EQ(findParam(*model, "layers.32.attention.wq.weight"), nullptr);

  auto big = presetModel("llama3-405b");
  ASSERT_TRUE(succeeds(big));
  EXPECT_EQ(shapeOf(*big, "layers.125.attention.wk.weight"),
            (Shape{1024, 16384}));
  EXPECT_EQ(shapeOf(*big, "layers.0.feed_forward.w2.weight"),
            (Shape{16384, 53248}));
  // tok_embeddings, layers, 126 blocks of 12 modules, norm, output.
  EXPECT_EQ(flattenModules(*big).size(), 4u + 126u * 12u);
}

TEST(Presets, ForwardOrder) {
  auto model = presetModel("tiny");
  ASSERT_TRUE(succeeds(model));
  std::vector<std::string> paths;
  for (const ModuleEntry &entry : flattenModules(*model))
    paths.push_back(entry.path);
  std::vector<std::string> expected = {"tok_embeddings", "layers", "layers.0"};
  for (std::string layer : {"layers.0", "layers.1"}) {
    if (layer != "layers.0")
      expected.push_back(layer);
    for (const char *suffix :
         {".attention_norm", ".attention", ".attention.wq", ".attention.wk",
          ".attention.wv", ".attention.wo", ".ffn_norm", ".feed_forward",
          ".feed_forward.w1", ".feed_forward.w3", ".feed_forward.w2"})
      expected.push_back(layer + suffix);
  }
  expected.push_back("norm");
  expected.push_back("output");
  EXPECT_EQ(paths, expected);

  std::vector<ModuleEntry> flat = flattenModules(*model);
  EXPECT_EQ(flat[0].parent, -1);
  EXPECT_EQ(flat[2].parent, 1); // layers.0 in layers
  EXPECT_EQ(flat[5].parent, 4); // wq in attention
  EXPECT_EQ(flat[4].module->kind, ModuleKind::Attention);
  EXPECT_EQ(flat[4].module->nHeads, 4);
  EXPECT_EQ(flat[4].module->nKvHeads, 2);
}

TEST(Presets, UnknownPresetSuggests) {
  EXPECT_TRUE(failsWith(presetModel("llama3-7b"),
                        "unknown preset \"llama3-7b\"; expected one of tiny, "
                        "llama3-8b, llama3-70b, llama3-405b (did you mean "
                        "\"llama3-8b\"?)"));
}

TEST(ModelJson, PresetsRoundTrip) {
  for (const TransformerConfig &config : presetConfigs()) {
    Model model = buildTransformer(config);
    std::string text = modelToJson(model, -1);
    auto parsed = parseModel(text);
    ASSERT_TRUE(succeeds(parsed)) << config.name;
    EXPECT_EQ(modelToJson(*parsed, -1), text) << config.name;
    EXPECT_EQ(countParameters(*parsed), countParameters(model));
  }
}

TEST(ModelJson, ExampleModelFileIsTheTinyPreset) {
  auto fromFile =
      loadModelFile(testutil::sourcePath("examples/models/tiny.json"));
  ASSERT_TRUE(succeeds(fromFile));
  auto preset = presetModel("tiny");
  ASSERT_TRUE(succeeds(preset));
  EXPECT_EQ(modelToJson(*fromFile), modelToJson(*preset));
}

TEST(ModelJson, MissingFile) {
  EXPECT_TRUE(failsWith(loadModelFile("/nonexistent/model.json"),
                        "cannot read \"/nonexistent/model.json\""));
}

//===----------------------------------------------------------------------===//
// Patterns
//===----------------------------------------------------------------------===//

TEST(Patterns, Glob) {
  EXPECT_TRUE(globMatch("layers.*.attention.wq", "layers.3.attention.wq"));
  EXPECT_TRUE(globMatch("layers.*.attention.wq", "layers.125.attention.wq"));
  EXPECT_FALSE(globMatch("layers.*.attention.wq", "layers.3.attention.wqx"));
  EXPECT_FALSE(globMatch("layers.*.wq", "layers.3.attention.wq"))
      << "* does not cross dots";
  EXPECT_TRUE(globMatch("layers.**.wq", "layers.3.attention.wq"));
  EXPECT_TRUE(globMatch("**", "layers.3.attention.wq"));
  EXPECT_TRUE(globMatch("*", "output"));
  EXPECT_FALSE(globMatch("*", "layers.0"));
  EXPECT_TRUE(globMatch("layers.*.attention.w?", "layers.0.attention.wk"));
  EXPECT_FALSE(globMatch("w?", "w."));
  EXPECT_TRUE(globMatch("layers.1*.ffn_norm", "layers.12.ffn_norm"));
  EXPECT_FALSE(globMatch("layers.1*.ffn_norm", "layers.2.ffn_norm"));
  EXPECT_TRUE(globMatch("output", "output"));
  EXPECT_FALSE(globMatch("output", "output.weight"));
  EXPECT_TRUE(globMatch("*a*a*a*a*a*a*a*a*b", std::string(40, 'a') + "b"));
  EXPECT_FALSE(globMatch("*a*a*a*a*a*a*a*a*b", std::string(200, 'a')))
      << "no exponential backtracking";
}

TEST(Patterns, Syntax) {
  EXPECT_TRUE(succeeds(checkPattern("layers.*.attention.wq")));
  EXPECT_TRUE(failsWith(checkPattern(""), "empty pattern"));
  EXPECT_TRUE(failsWith(checkPattern("layers.[0-3]"),
                        "invalid character '[' in pattern"));
  EXPECT_TRUE(failsWith(checkPattern(std::string(300, 'a')),
                        "pattern longer than 256"));
}

TEST(Patterns, MatchModulesAndParameters) {
  auto model = presetModel("tiny");
  ASSERT_TRUE(succeeds(model));
  std::vector<ModuleEntry> modules = flattenModules(*model);
  auto paths = [&](const std::string &pattern) {
    std::vector<std::string> out;
    for (int i : matchModules(modules, pattern))
      out.push_back(modules[i].path);
    return out;
  };
  EXPECT_EQ(paths("layers.*.attention.wq"),
            (std::vector<std::string>{"layers.0.attention.wq",
                                      "layers.1.attention.wq"}));
  EXPECT_EQ(paths("layers.*.attention.wq.weight"),
            (std::vector<std::string>{"layers.0.attention.wq",
                                      "layers.1.attention.wq"}));
  EXPECT_EQ(paths("*.weight"),
            (std::vector<std::string>{"tok_embeddings", "norm", "output"}));
  EXPECT_EQ(paths("layers.1.feed_forward.*").size(), 3u);
  EXPECT_TRUE(paths("layers.2.*").empty());
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

std::string tinyText() {
  auto model = presetModel("tiny");
  return modelToJson(*model);
}

struct ModelMutation {
  std::string pointer;  ///< where to change
  std::string value;    ///< new JSON value; "" removes the key
  std::string expected; ///< the error's beginning
};

TEST(ModelErrors, EachMutationIsLocated) {
  const char *wq = "/modules/1/children/0/children/1/children/0";
  const char *att = "/modules/1/children/0/children/1";
  std::vector<ModelMutation> table = {
      {"/modules/0/kind", "\"embeding\"",
       "/modules/0/kind: unknown kind \"embeding\"; expected one of "
       "embedding, linear, norm, attention, feed_forward, output, block (did "
       "you mean \"embedding\"?)"},
      {"/modules/0/paramters", "[]",
       "/modules/0/paramters: unknown key; expected one of name, kind, "
       "parameters, children, n_heads, n_kv_heads (did you mean "
       "\"parameters\"?)"},
      {"/modules/0/parameters/0/shape", "[256]",
       "/modules/0/parameters/0/shape: expected 2 dims for an embedding "
       "weight [num_embeddings, embedding_dim], got [256]"},
      {"/modules/0/parameters/0/shape/0", "0",
       "/modules/0/parameters/0/shape/0: expected an integer in [1, "},
      {"/modules/0/parameters/0/shape/1", "\"64\"",
       "/modules/0/parameters/0/shape/1: expected an integer, got string "
       "\"64\""},
      {"/modules/0/parameters/0/shape", "[]",
       "/modules/0/parameters/0/shape: expected at least one dim"},
      {"/modules/0/parameters/0/shape", "[1048576, 1048576, 1048576]",
       "/modules/0/parameters/0/shape: shape dim 2 (1048576) makes the tensor "
       "larger than 2^50 elements (docs/limits.md)"},
      {"/modules/0/parameters/0/dtype", "\"fp32\"",
       "/modules/0/parameters/0/dtype: unknown dtype \"fp32\"; expected one "
       "of float32, bfloat16, float16"},
      {"/modules/0/parameters/0/name", "\"bias\"",
       "/modules/0/parameters/0/name: unknown parameter \"bias\" of an "
       "embedding module; expected one of weight"},
      {"/modules/0/parameters/0/name", "\"we ight\"",
       "/modules/0/parameters/0/name: invalid parameter name"},
      {"/modules/0/parameters", "",
       "/modules/0/parameters: an embedding module needs a \"weight\" "
       "parameter"},
      {"/modules/0/parameters/0", "42",
       "/modules/0/parameters/0: expected an object, got integer 42"},
      {"/modules/1/children/1/name", "\"0\"",
       "/modules/1/children/1/name: duplicate module name \"0\" (also at "
       "/modules/1/children/0)"},
      {"/modules/0/name", "\"tok.embeddings\"",
       "/modules/0/name: invalid module name \"tok.embeddings\""},
      {"/modules/0/name", "", "/modules/0/name: missing required key"},
      {std::string(att) + "/n_heads", "3",
       std::string(att) +
           "/n_kv_heads: n_kv_heads 2 does not divide n_heads 3"},
      {std::string(att) + "/n_heads", "",
       std::string(att) + "/n_heads: missing required key for an attention "
                          "module"},
      {std::string(att) + "/n_kv_heads", "0",
       std::string(att) + "/n_kv_heads: expected an integer in [1, "},
      {"/modules/0/n_heads", "4",
       "/modules/0/n_heads: only attention modules have n_heads; this is an "
       "embedding module"},
      {"/modules/0/children", "[]",
       "/modules/0/children: an embedding module has no children"},
      {"/modules/1/parameters", "[]",
       "/modules/1/parameters: a block module has no parameters of its own"},
      {"/modules/1/children", "[]",
       "/modules/1/children: a block module needs at least one child module"},
      {std::string(wq) + "/parameters/1",
       "{\"name\": \"bias\", \"shape\": [63]}",
       std::string(wq) + "/parameters/1/shape: bias [63] does not match "
                         "weight [64, 64] (expected [64])"},
      {"/modules", "[]", "/modules: expected at least one module"},
      {"/name", "\"\"", "/name: expected a non-empty model name"},
      {"/name", "", "/name: missing required key; expected a string"},
      {"/modules/3/kind", "\"linear\"", ""}, // output -> linear: still valid
  };
  for (const ModelMutation &m : table) {
    Json doc = Json::parse(tinyText());
    Json::json_pointer ptr(m.pointer);
    if (m.value.empty())
      doc[ptr.parent_pointer()].erase(ptr.back());
    else
      doc[ptr] = Json::parse(m.value);
    auto result = parseModel(doc.dump());
    if (m.expected.empty())
      EXPECT_TRUE(succeeds(result)) << m.pointer;
    else
      EXPECT_TRUE(failsWith(result, m.expected)) << m.pointer;
  }
}

TEST(ModelErrors, MalformedJson) {
  EXPECT_TRUE(failsWith(parseModel(""), "line 1, column 1: syntax error"));
  EXPECT_TRUE(failsWith(parseModel("{\"name\": \"x\",\n  \"modules\": [}"),
                        "line 2, column 15: syntax error"));
  EXPECT_TRUE(failsWith(parseModel("[]"), "/: expected an object, got an "
                                          "array"));
  EXPECT_TRUE(failsWith(
      parseModel("{\"name\": \"a\", \"name\": \"b\", \"modules\": []}"),
      "/name: duplicate key"));
  std::string deep(100, '[');
  // The root object and "modules" are two levels; the 63rd "[" inside is
  // the 65th.
  std::string expected = "/modules";
  for (int i = 0; i < 63; ++i)
    expected += "/0";
  EXPECT_TRUE(failsWith(parseModel("{\"modules\": " + deep),
                        expected + ": nested deeper than 64 levels"));
}

//===----------------------------------------------------------------------===//
// Random mutations never crash
//===----------------------------------------------------------------------===//

TEST(ModelErrors, RandomMutationsNeverCrash) {
  const std::string base = tinyText();
  const Json doc = Json::parse(base);
  std::vector<std::string> pointers;
  testutil::collectPointers(doc, "", pointers);
  const std::vector<Json> values = {
      nullptr,
      true,
      0,
      -1,
      1.5,
      1e300,
      "x",
      "weight",
      "linear",
      "attention",
      Json::array(),
      Json::object(),
      Json::array({1, 2}),
      static_cast<uint64_t>(18446744073709551615ull),
      "0",
      "bias"};
  std::mt19937 rng(7);
  int failures = 0, successes = 0;
  for (int iter = 0; iter < 600; ++iter) {
    Json mutated = doc;
    std::string where = pointers[rng() % pointers.size()];
    Json::json_pointer ptr(where);
    switch (rng() % 3) {
    case 0: // delete
      if (!where.empty()) {
        Json &parent = mutated[ptr.parent_pointer()];
        if (parent.is_object())
          parent.erase(ptr.back());
        else
          parent.erase(std::stoul(ptr.back()));
      }
      break;
    case 1: // change the value
      mutated[ptr] = values[rng() % values.size()];
      break;
    case 2: // insert a key or element
      if (mutated[ptr].is_object())
        mutated[ptr]["n_heads"] = values[rng() % values.size()];
      else if (mutated[ptr].is_array())
        mutated[ptr].push_back(values[rng() % values.size()]);
      break;
    }
    std::string text = mutated.dump();
    if (iter % 4 == 3) // raw text damage
      text.insert(rng() % (text.size() + 1),
                  std::string(1, "{}[],:\"x0"[rng() % 9]));
    auto result = parseModel(text);
    if (result.ok()) {
      ++successes;
      continue;
    }
    ++failures;
    EXPECT_TRUE(testutil::isLocated(result.error().message))
        << result.error().message;
  }
  EXPECT_GT(failures, 100);
  EXPECT_GT(successes, 10);
}

} // namespace
