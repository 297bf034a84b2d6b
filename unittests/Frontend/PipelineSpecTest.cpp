//===- PipelineSpecTest.cpp - "pipeline_parallel": resolution and errors --===//
//
// The spec frontend of pipeline parallelism: every schedule with every kind
// of split resolves on the tiny model and on llama3-8b into stages that cover
// the model once, in forward order, placed on ranks as core places them;
// split "torchtitan" equals torchtitan's generate_llm_fqn_per_model_part
// (exact lists for llama3-8b with pp 4 and pp 8, and a reference written
// here from torchtitan's loop for every preset and stage count); split
// "auto" reaches the smallest possible largest stage; and every bad input is
// one located error with its message.
//
//===----------------------------------------------------------------------===//

#include "FrontendTestHelpers.h"

#include "meshplan/Frontend/Presets.h"
#include "meshplan/Frontend/Spec.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <random>

using namespace meshplan;
using namespace meshplan::frontend;
using testutil::failsWith;
using testutil::succeeds;
using Json = nlohmann::ordered_json;

namespace {

/// `model` on the mesh (dp=2, pp=ppSize) with FSDP over dp and
/// pipeline_parallel = `pp`.
Json baseSpec(const std::string &model, int64_t ppSize, Json pp) {
  Json doc = Json::object();
  doc["model"] = model;
  doc["mesh"]["axes"] = Json::array(
      {{{"name", "dp"}, {"size", 2}}, {{"name", "pp"}, {"size", ppSize}}});
  doc["data_parallel"]["shard_axes"] = Json::array({"dp"});
  doc["pipeline_parallel"] = std::move(pp);
  return doc;
}

Json pipeline(const std::string &schedule, int64_t microbatches,
              Json split = nullptr) {
  Json pp = Json::object();
  pp["axis"] = "pp";
  pp["schedule"] = schedule;
  pp["microbatches"] = microbatches;
  if (!split.is_null())
    pp["split"] = std::move(split);
  return pp;
}

Result<ResolvedSpec> load(const Json &doc) { return loadSpec(doc.dump(), "."); }

std::vector<std::string> layers(int from, int to) {
  std::vector<std::string> out;
  for (int i = from; i <= to; ++i)
    out.push_back("layers." + std::to_string(i));
  return out;
}

std::vector<std::string> concat(std::vector<std::string> a,
                                const std::vector<std::string> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::vector<std::string>> stageModules(const ResolvedSpec &r) {
  std::vector<std::vector<std::string>> out;
  for (const PipelineStageAssignment &stage : r.pipeline->stages)
    out.push_back(stage.modules);
  return out;
}

/// The pieces a stage may take, in forward order, for the Llama presets.
std::vector<std::string> llamaPieces(int numLayers) {
  return concat(concat({"tok_embeddings"}, layers(0, numLayers - 1)),
                {"norm", "output"});
}

/// An explicit split of a Llama preset into `stages` stages: its pieces,
/// with norm and output as one, dealt out as evenly as possible.
Json evenSplit(int numLayers, int stages) {
  std::vector<std::vector<std::string>> groups = {{"tok_embeddings"}};
  for (const std::string &layer : layers(0, numLayers - 1))
    groups.push_back({layer});
  groups.push_back({"norm", "output"});
  const int n = static_cast<int>(groups.size());
  Json split = Json::array();
  for (int s = 0; s < stages; ++s) {
    Json stage = Json::array();
    for (int g = s * n / stages; g < (s + 1) * n / stages; ++g)
      for (const std::string &name : groups[g])
        stage.push_back(name);
    split.push_back(stage);
  }
  return split;
}

/// The invariants every resolved pipeline keeps: each parameter on exactly
/// one stage, stages contiguous in forward order and non-empty, ranks and
/// per-rank stage lists as core places them.
void expectWellFormed(const ResolvedSpec &r) {
  ASSERT_TRUE(r.pipeline.has_value());
  const ResolvedPipeline &pp = *r.pipeline;
  const int64_t p = pp.config.ranks, v = pp.config.stagesPerRank;
  ASSERT_EQ(pp.numStages(), p * v);
  EXPECT_EQ(pp.placement, placementOf(pp.config.kind));
  EXPECT_EQ(r.mesh->axis(pp.axisIndex).name, pp.axis);
  EXPECT_EQ(r.mesh->axis(pp.axisIndex).size, p);
  EXPECT_TRUE(succeeds(checkPipelineScheduleConfig(pp.config)));
  ASSERT_EQ(pp.stageOfParam.size(), r.params.size());
  int expected = 0;
  for (int64_t s = 0; s < pp.numStages(); ++s) {
    const PipelineStageAssignment &stage = pp.stages[s];
    EXPECT_FALSE(stage.modules.empty()) << "stage " << s;
    EXPECT_EQ(stage.rank, rankOfStage(pp.placement, p, s));
    ASSERT_EQ(stage.params.size(), stage.paramNames.size());
    int64_t count = 0;
    for (size_t i = 0; i < stage.params.size(); ++i) {
      // Ascending, and continuing where the previous stage stopped.
      EXPECT_EQ(stage.params[i], expected++);
      EXPECT_EQ(stage.paramNames[i], r.params[stage.params[i]].name);
      EXPECT_EQ(pp.stageOfParam[stage.params[i]], s);
      int64_t elements = 1;
      for (int64_t d : r.params[stage.params[i]].shape)
        elements *= d;
      count += elements;
      // The parameter belongs to one of the stage's pieces.
      const std::string &name = stage.paramNames[i];
      EXPECT_TRUE(std::any_of(
          stage.modules.begin(), stage.modules.end(),
          [&](const std::string &m) { return name.rfind(m + ".", 0) == 0; }))
          << name << " on stage " << s;
    }
    EXPECT_EQ(stage.numParameters, count);
  }
  EXPECT_EQ(expected, static_cast<int>(r.params.size()));
  ASSERT_EQ(static_cast<int64_t>(pp.stagesOfRank.size()), p);
  for (int64_t rank = 0; rank < p; ++rank) {
    EXPECT_EQ(pp.stagesOfRank[rank], stagesOfRank(pp.placement, p, v, rank));
    for (int64_t s : pp.stagesOfRank[rank])
      EXPECT_EQ(pp.stages[s].rank, rank);
  }
  // The embedding on the first stage, the final norm and output on the last.
  EXPECT_EQ(pp.stages.front().modules.front(), "tok_embeddings");
  EXPECT_EQ(pp.stages.back().modules.back(), "output");
}

//===----------------------------------------------------------------------===//
// Valid specs
//===----------------------------------------------------------------------===//

TEST(PipelineSpec, EveryScheduleAndSplitResolves) {
  struct Preset {
    const char *name;
    int layers;
  };
  for (Preset model : {Preset{"tiny", 2}, Preset{"llama3-8b", 32}})
    for (const char *schedule : {"gpipe", "1f1b", "interleaved_1f1b", "zbv"})
      for (const char *split : {"auto", "torchtitan", "explicit", "default"}) {
        SCOPED_TRACE(std::string(model.name) + " " + schedule + " " + split);
        bool multi = std::string(schedule) == "interleaved_1f1b" ||
                     std::string(schedule) == "zbv";
        int stages = multi ? 4 : 2;
        Json splitValue = std::string(split) == "explicit"
                              ? evenSplit(model.layers, stages)
                          : std::string(split) == "default" ? Json(nullptr)
                                                            : Json(split);
        auto r =
            load(baseSpec(model.name, 2, pipeline(schedule, 4, splitValue)));
        ASSERT_TRUE(succeeds(r));
        expectWellFormed(*r);
        const ResolvedPipeline &pp = *r->pipeline;
        EXPECT_EQ(pipelineScheduleKindName(pp.config.kind), schedule);
        EXPECT_EQ(pp.config.ranks, 2);
        EXPECT_EQ(pp.config.microbatches, 4);
        // The default stages per rank: torchtitan's, 2 for the multi-stage
        // schedules.
        EXPECT_EQ(pp.config.stagesPerRank, multi ? 2 : 1);
        EXPECT_EQ(pp.split, std::string(split) == "explicit"
                                ? PipelineSplit::Explicit
                            : std::string(split) == "torchtitan"
                                ? PipelineSplit::Torchtitan
                                : PipelineSplit::Auto);
        if (std::string(split) == "explicit") {
          std::vector<std::vector<std::string>> want;
          for (const Json &stage : splitValue)
            want.push_back(stage.get<std::vector<std::string>>());
          EXPECT_EQ(stageModules(*r), want);
        }
      }
}

TEST(PipelineSpec, StagesPerRankAsWritten) {
  Json pp = pipeline("interleaved_1f1b", 4, "auto");
  pp["stages_per_rank"] = 3;
  auto r = load(baseSpec("llama3-8b", 2, pp));
  ASSERT_TRUE(succeeds(r));
  expectWellFormed(*r);
  EXPECT_TRUE(r->spec.pipelineParallel->stagesPerRankGiven);
  EXPECT_EQ(r->pipeline->numStages(), 6);
  EXPECT_EQ(r->pipeline->stagesOfRank,
            (std::vector<std::vector<int64_t>>{{0, 2, 4}, {1, 3, 5}}));
  EXPECT_EQ(pipelineSplitName(r->pipeline->split), "auto");
  auto defaulted = load(baseSpec("tiny", 2, pipeline("1f1b", 2)));
  ASSERT_TRUE(succeeds(defaulted));
  EXPECT_FALSE(defaulted->spec.pipelineParallel->stagesPerRankGiven);
  EXPECT_EQ(defaulted->pipeline->split, PipelineSplit::Auto);
  EXPECT_EQ(pipelineSplitName(PipelineSplit::Explicit), "explicit");
  EXPECT_EQ(pipelineSplitName(PipelineSplit::Torchtitan), "torchtitan");
}

TEST(PipelineSpec, TinySplits) {
  // Two stages: torchtitan and auto agree.
  for (const char *split : {"auto", "torchtitan"}) {
    auto r = load(baseSpec("tiny", 2, pipeline("1f1b", 2, split)));
    ASSERT_TRUE(succeeds(r));
    EXPECT_EQ(stageModules(*r), (std::vector<std::vector<std::string>>{
                                    {"tok_embeddings", "layers.0"},
                                    {"layers.1", "norm", "output"}}));
    EXPECT_EQ(r->pipeline->stages[0].numParameters, 16384 + 36992);
    EXPECT_EQ(r->pipeline->stages[1].numParameters, 36992 + 64 + 16384);
    EXPECT_EQ(r->pipeline->stages[0].paramNames.front(),
              "tok_embeddings.weight");
    EXPECT_EQ(r->pipeline->stages[1].paramNames.back(), "output.weight");
  }
  // zbv on 2 ranks: 4 stages, one piece each (norm and output together), on
  // ranks 0 1 1 0 (the V).
  for (const char *split : {"auto", "torchtitan"}) {
    auto r = load(baseSpec("tiny", 2, pipeline("zbv", 3, split)));
    ASSERT_TRUE(succeeds(r));
    EXPECT_EQ(stageModules(*r),
              (std::vector<std::vector<std::string>>{{"tok_embeddings"},
                                                     {"layers.0"},
                                                     {"layers.1"},
                                                     {"norm", "output"}}));
    std::vector<int64_t> ranks;
    for (const PipelineStageAssignment &s : r->pipeline->stages)
      ranks.push_back(s.rank);
    EXPECT_EQ(ranks, (std::vector<int64_t>{0, 1, 1, 0}));
    EXPECT_EQ(r->pipeline->stagesOfRank,
              (std::vector<std::vector<int64_t>>{{0, 3}, {1, 2}}));
    EXPECT_EQ(r->pipeline->placement, StagePlacement::V);
  }
}

TEST(PipelineSpec, TorchtitanLlama3_8b) {
  // generate_llm_fqn_per_model_part(4, 32): 34 effective layers, 8 per
  // stage and 2 left over for stages 0 and 1.
  auto r4 = load(baseSpec("llama3-8b", 4, pipeline("1f1b", 8, "torchtitan")));
  ASSERT_TRUE(succeeds(r4));
  EXPECT_EQ(stageModules(*r4), (std::vector<std::vector<std::string>>{
                                   concat({"tok_embeddings"}, layers(0, 7)),
                                   layers(8, 16),
                                   layers(17, 24),
                                   concat(layers(25, 31), {"norm", "output"}),
                               }));
  // (8, 32): 4 per stage and 2 left over.
  const std::vector<std::vector<std::string>> eight = {
      concat({"tok_embeddings"}, layers(0, 3)),
      layers(4, 8),
      layers(9, 12),
      layers(13, 16),
      layers(17, 20),
      layers(21, 24),
      layers(25, 28),
      concat(layers(29, 31), {"norm", "output"}),
  };
  auto r8 = load(baseSpec("llama3-8b", 8, pipeline("1f1b", 8, "torchtitan")));
  ASSERT_TRUE(succeeds(r8));
  EXPECT_EQ(stageModules(*r8), eight);
  // pp 4 with 2 stages per rank cuts the same 8 stages; loop places stage s
  // on rank s mod 4, the V puts the last stage back on rank 0.
  Json interleaved = pipeline("interleaved_1f1b", 8, "torchtitan");
  auto ri = load(baseSpec("llama3-8b", 4, interleaved));
  ASSERT_TRUE(succeeds(ri));
  EXPECT_EQ(stageModules(*ri), eight);
  EXPECT_EQ(ri->pipeline->stagesOfRank[0], (std::vector<int64_t>{0, 4}));
  auto rv = load(baseSpec("llama3-8b", 4, pipeline("zbv", 8, "torchtitan")));
  ASSERT_TRUE(succeeds(rv));
  EXPECT_EQ(stageModules(*rv), eight);
  EXPECT_EQ(rv->pipeline->stagesOfRank[0], (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(rv->pipeline->stages[7].rank, 0);
  EXPECT_EQ(rv->pipeline->stages[4].rank, 3);
}

/// torchtitan's generate_llm_fqn_per_model_part with input_weight =
/// output_weight = 1, written out here as torchtitan's loop is written
/// (torchtitan/distributed/pipeline_parallel.py), independently of
/// lib/Frontend: an empty optional where torchtitan raises.
std::optional<std::vector<std::vector<std::string>>>
torchtitanReference(int numStages, int numLayers) {
  if (numStages == 1)
    return std::vector<std::vector<std::string>>{llamaPieces(numLayers)};
  int effective = numLayers + 2;
  if (numStages > effective)
    return std::nullopt;
  int perStage = effective / numStages, extra = effective % numStages;
  if (perStage == 0) // "would result in empty stages"
    return std::nullopt;
  if (1 > perStage) // input_weight / output_weight > layers_per_stage
    return std::nullopt;
  std::vector<std::vector<std::string>> out;
  int current = 0;
  for (int s = 0; s < numStages; ++s) {
    std::vector<std::string> stage;
    int mine = perStage + (s < extra ? 1 : 0);
    if (s == 0) {
      stage.push_back("tok_embeddings");
      for (int k = 0; k < mine - 1; ++k)
        if (current < numLayers)
          stage.push_back("layers." + std::to_string(current++));
    } else if (s == numStages - 1) {
      for (int k = 0; k < mine - 1; ++k)
        if (current < numLayers)
          stage.push_back("layers." + std::to_string(current++));
      stage.push_back("norm");
      stage.push_back("output");
    } else {
      for (int k = 0; k < mine; ++k)
        if (current < numLayers)
          stage.push_back("layers." + std::to_string(current++));
    }
    out.push_back(stage);
  }
  return out;
}

TEST(PipelineSpec, TorchtitanMatchesReferenceForEveryPresetAndStageCount) {
  for (const TransformerConfig &config : presetConfigs()) {
    int numLayers = static_cast<int>(config.nLayers);
    for (int stages = 1; stages <= numLayers + 3; ++stages) {
      SCOPED_TRACE(std::string(config.name) + " stages " +
                   std::to_string(stages));
      // One rank per stage: gpipe takes any number of microbatches.
      auto r = load(baseSpec(std::string(config.name), stages,
                             pipeline("gpipe", 1, "torchtitan")));
      auto want = torchtitanReference(stages, numLayers);
      if (!want) {
        EXPECT_TRUE(failsWith(r, "/pipeline_parallel/split: split "
                                 "\"torchtitan\": torchtitan refuses"));
        continue;
      }
      ASSERT_TRUE(succeeds(r));
      expectWellFormed(*r);
      EXPECT_EQ(stageModules(*r), *want);
    }
  }
}

/// The smallest possible largest stage (parameter count) over every cut of
/// `costs` into `stages` contiguous non-empty parts: a plain DP.
int64_t bestLargestStage(const std::vector<int64_t> &costs, int stages) {
  const int n = static_cast<int>(costs.size());
  const int64_t inf = INT64_MAX;
  // best[s][i]: the first i costs in s parts.
  std::vector<std::vector<int64_t>> best(stages + 1,
                                         std::vector<int64_t>(n + 1, inf));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int i = s; i <= n; ++i) {
      int64_t sum = 0;
      for (int j = i - 1; j >= s - 1; --j) {
        sum += costs[j];
        if (best[s - 1][j] != inf)
          best[s][i] = std::min(best[s][i], std::max(best[s - 1][j], sum));
      }
    }
  return best[stages][n];
}

TEST(PipelineSpec, AutoIsOptimalAndKeepsEndsTogether) {
  for (const char *model : {"tiny", "llama3-8b", "llama3-70b"}) {
    const TransformerConfig *config = findPreset(model);
    int numLayers = static_cast<int>(config->nLayers);
    // The groups auto places: the embedding, each block, norm+output.
    auto whole = load(baseSpec(model, 1, pipeline("gpipe", 1, "auto")));
    ASSERT_TRUE(succeeds(whole));
    std::vector<int64_t> costs;
    {
      std::map<std::string, int64_t> byPiece;
      for (const ParamAssignment &p : whole->params) {
        std::string piece = p.name.substr(0, p.name.find('.'));
        if (piece == "layers")
          piece = p.name.substr(0, p.name.find('.', 7));
        if (piece == "norm")
          piece = "output";
        int64_t n = 1;
        for (int64_t d : p.shape)
          n *= d;
        byPiece[piece] += n;
      }
      costs.push_back(byPiece["tok_embeddings"]);
      for (int l = 0; l < numLayers; ++l)
        costs.push_back(byPiece["layers." + std::to_string(l)]);
      costs.push_back(byPiece["output"]);
    }
    for (int stages = 1; stages <= std::min(numLayers + 2, 24); ++stages) {
      SCOPED_TRACE(std::string(model) + " stages " + std::to_string(stages));
      auto r = load(baseSpec(model, stages, pipeline("gpipe", 1, "auto")));
      ASSERT_TRUE(succeeds(r));
      expectWellFormed(*r);
      int64_t largest = 0;
      for (const PipelineStageAssignment &s : r->pipeline->stages)
        largest = std::max(largest, s.numParameters);
      EXPECT_EQ(largest, bestLargestStage(costs, stages));
      // norm and output together on the last stage.
      const std::vector<std::string> &last = r->pipeline->stages.back().modules;
      ASSERT_GE(last.size(), 2u);
      EXPECT_EQ(last[last.size() - 2], "norm");
    }
  }
  // llama3-8b on 4 stages: the embedding and the output are each worth
  // about 2.4 blocks (128256 x 4096 against 218M), so the ends take 7
  // blocks and the middle stages 9.
  auto r = load(baseSpec("llama3-8b", 4, pipeline("1f1b", 4, "auto")));
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(stageModules(*r), (std::vector<std::vector<std::string>>{
                                  concat({"tok_embeddings"}, layers(0, 6)),
                                  layers(7, 15),
                                  layers(16, 24),
                                  concat(layers(25, 31), {"norm", "output"}),
                              }));
}

TEST(PipelineSpec, ExplicitSplitWithPerModuleUnitsMayCutNormFromOutput) {
  Json doc = baseSpec(
      "tiny", 2,
      pipeline("1f1b", 2, Json::parse(R"([["tok_embeddings", "layers.0",
                                  "layers.1", "norm"], ["output"]])")));
  doc["data_parallel"]["units"] = "per_module";
  auto r = load(doc);
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->pipeline->stages[1].paramNames,
            std::vector<std::string>{"output.weight"});
}

TEST(PipelineSpec, OneRankWithSeveralStagesIsTheSchedulesCall) {
  // pp of size 1: interleaved_1f1b and zbv hold two stages on the one rank;
  // gpipe refuses v > 1 whatever the size (core decides both).
  auto interleaved = load(baseSpec("tiny", 1, pipeline("interleaved_1f1b", 1)));
  ASSERT_TRUE(succeeds(interleaved));
  expectWellFormed(*interleaved);
  EXPECT_EQ(interleaved->pipeline->stagesOfRank,
            (std::vector<std::vector<int64_t>>{{0, 1}}));
  auto zbv = load(baseSpec("tiny", 1, pipeline("zbv", 1)));
  ASSERT_TRUE(succeeds(zbv));
  EXPECT_EQ(zbv->pipeline->stagesOfRank,
            (std::vector<std::vector<int64_t>>{{0, 1}}));
  Json gpipe = pipeline("gpipe", 1);
  gpipe["stages_per_rank"] = 2;
  EXPECT_TRUE(failsWith(load(baseSpec("tiny", 1, gpipe)),
                        "/pipeline_parallel/stages_per_rank: schedule gpipe "
                        "runs one stage per rank, got stages_per_rank 2; "
                        "interleaved_1f1b runs several"));
}

TEST(PipelineSpec, GradientAccumulationReduceModeIsKept) {
  Json doc = baseSpec("tiny", 2, pipeline("1f1b", 4));
  doc["gradient_accumulation"]["reduce"] = "last_microbatch";
  auto r = load(doc);
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->spec.accumulationReduce, AccumulationReduce::LastMicrobatch);
  doc["gradient_accumulation"]["steps"] = 1;
  EXPECT_TRUE(succeeds(load(doc)));
}

TEST(PipelineSpec, WithoutTheSectionThereIsNoPipeline) {
  Json doc = baseSpec("tiny", 2, nullptr);
  doc.erase("pipeline_parallel");
  doc["extra_axes"] = Json::array({"pp"});
  auto r = load(doc);
  ASSERT_TRUE(succeeds(r));
  EXPECT_FALSE(r->pipeline.has_value());
  EXPECT_FALSE(r->spec.pipelineParallel.has_value());
}

//===----------------------------------------------------------------------===//
// Bad input
//===----------------------------------------------------------------------===//

/// A model that is no Llama as torchtitan names it.
const char *kOtherModel = R"({"name": "other", "modules": [
  {"name": "embed", "kind": "embedding",
   "parameters": [{"name": "weight", "shape": [16, 8]}]},
  {"name": "blocks", "kind": "block", "children": [
    {"name": "0", "kind": "block", "children": [
      {"name": "proj", "kind": "linear",
       "parameters": [{"name": "weight", "shape": [8, 8]}]}]},
    {"name": "1", "kind": "block", "children": [
      {"name": "proj", "kind": "linear",
       "parameters": [{"name": "weight", "shape": [8, 8]}]}]}]},
  {"name": "head", "kind": "output",
   "parameters": [{"name": "weight", "shape": [16, 8]}]}]})";

struct BadCase {
  std::function<void(Json &)> edit;
  std::string message; ///< the start of the error
};

TEST(PipelineSpec, BadInputIsALocatedError) {
  auto setPP = [](const std::string &key, Json value) {
    return [key, value](Json &doc) { doc["pipeline_parallel"][key] = value; };
  };
  auto mesh3 = [](const std::string &third, int64_t size) {
    return [third, size](Json &doc) {
      doc["mesh"]["axes"].push_back({{"name", third}, {"size", size}});
    };
  };
  auto both = [](std::function<void(Json &)> a, std::function<void(Json &)> b) {
    return [a, b](Json &doc) {
      a(doc);
      b(doc);
    };
  };
  const std::vector<BadCase> cases = {
      // Keys and types.
      {setPP("axis", "ppp"), "/pipeline_parallel/axis: unknown axis \"ppp\"; "
                             "the mesh has dp, pp (did you mean \"pp\"?)"},
      {setPP("schedule", "1f1f"),
       "/pipeline_parallel/schedule: unknown schedule \"1f1f\"; expected one "
       "of gpipe, 1f1b, interleaved_1f1b, zbv (did you mean \"1f1b\"?)"},
      {[](Json &doc) { doc["pipeline_parallel"].erase("microbatches"); },
       "/pipeline_parallel/microbatches: missing required key"},
      {setPP("microbatches", "4"),
       "/pipeline_parallel/microbatches: expected an integer, got string "
       "\"4\""},
      {setPP("microbatches", 2.5),
       "/pipeline_parallel/microbatches: expected an integer, got number 2.5"},
      {setPP("stages", 2),
       "/pipeline_parallel/stages: unknown key; expected one of axis, "
       "schedule, microbatches, stages_per_rank, split"},
      {setPP("split", "even"),
       "/pipeline_parallel/split: unknown split \"even\"; expected one of "
       "auto, torchtitan or an array of stages"},
      {setPP("split", 3), "/pipeline_parallel/split: expected an array or a "
                          "string, got integer 3"},
      {setPP("split", Json::array()),
       "/pipeline_parallel/split: expected at least one stage (an array of "
       "module names), or \"auto\" or \"torchtitan\""},
      {setPP("split", Json::parse(R"([["tok_embeddings"], []])")),
       "/pipeline_parallel/split/1: expected at least one module; every stage "
       "runs some of the model"},
      {setPP("split", Json::parse(R"([["tok_embeddings"], [3]])")),
       "/pipeline_parallel/split/1/0: expected a string, got integer 3"},
      // Axis roles.
      {setPP("axis", "dp"),
       "/pipeline_parallel/axis: axis \"dp\" is already used as a shard axis "
       "(/data_parallel/shard_axes/0); each mesh axis has exactly one role"},
      {[](Json &doc) {
         doc["data_parallel"]["replicate_axes"] = Json::array({"pp"});
       },
       "/pipeline_parallel/axis: axis \"pp\" is already used as a replicate "
       "axis (/data_parallel/replicate_axes/0); each mesh axis has exactly "
       "one role"},
      {both(
           mesh3("tp", 2),
           [](Json &doc) {
             doc["tensor_parallel"] = Json::parse(
                 R"({"axis": "pp", "plan": [{"pattern": "layers.*.attention.wq", "style": "colwise"}]})");
             doc["extra_axes"] = Json::array({"tp"});
           }),
       "/pipeline_parallel/axis: axis \"pp\" is already used as the "
       "tensor-parallel axis (/tensor_parallel/axis); each mesh axis has "
       "exactly one role"},
      // A context-parallel axis is an extra axis: it cannot run the pipeline.
      {both(mesh3("cp", 2),
            [](Json &doc) {
              doc["extra_axes"] = Json::array({"cp"});
              doc["pipeline_parallel"]["axis"] = "cp";
              doc["data_parallel"]["shard_axes"] = Json::array({"dp", "pp"});
            }),
       "/pipeline_parallel/axis: axis \"cp\" is already used as an extra axis "
       "(/extra_axes/0); each mesh axis has exactly one role"},
      {[](Json &doc) { doc["mesh"]["managed_axes"] = Json::array({"pp"}); },
       "/pipeline_parallel/axis: axis \"pp\" is managed (its live size is "
       "known only at run time), so it cannot be the pipeline-parallel axis; "
       "managed axes replicate"},
      {[](Json &doc) { doc.erase("pipeline_parallel"); },
       "/mesh/axes/1/name: axis \"pp\" has no role; name it in data_parallel "
       "(replicate_axes or shard_axes), tensor_parallel.axis, "
       "pipeline_parallel.axis or extra_axes"},
      // The schedule's rules, from core.
      {setPP("microbatches", 0),
       "/pipeline_parallel/microbatches: microbatches must be at least 1, got "
       "0"},
      {setPP("microbatches", 3),
       "/pipeline_parallel/microbatches: schedule 1f1b needs at least as many "
       "microbatches as pp ranks (torch's Schedule1F1B requires microbatches "
       ">= stages), got 3 microbatches for 4 ranks"},
      {both(setPP("schedule", "interleaved_1f1b"), setPP("microbatches", 9)),
       "/pipeline_parallel/microbatches: schedule interleaved_1f1b needs the "
       "microbatches to be a multiple of the number of rounds max(1, "
       "microbatches / pp ranks) (torch's ScheduleInterleaved1F1B), got 9 "
       "microbatches for 4 ranks (2 rounds); 8 or 10 would do"},
      {setPP("stages_per_rank", 2),
       "/pipeline_parallel/stages_per_rank: schedule 1f1b runs one stage per "
       "rank, got stages_per_rank 2; interleaved_1f1b runs several"},
      {both(setPP("schedule", "zbv"), setPP("stages_per_rank", 3)),
       "/pipeline_parallel/stages_per_rank: schedule zbv places exactly 2 "
       "stages on each rank (a V), got stages_per_rank 3"},
      {setPP("stages_per_rank", 0),
       "/pipeline_parallel/stages_per_rank: stages_per_rank must be at least "
       "1, got 0"},
      {setPP("microbatches", 1 << 20),
       "/pipeline_parallel: 4 pp ranks x 1 stages per rank x 1048576 "
       "microbatches is more than 2^20 (stage, microbatch) pairs "
       "(docs/limits.md)"},
      // Accumulation comes from the pipeline.
      {[](Json &doc) { doc["gradient_accumulation_steps"] = 4; },
       "/gradient_accumulation_steps: gradient accumulation (4 steps) cannot "
       "be combined with pipeline_parallel: the pipeline already splits each "
       "step's batch into 8 microbatches (/pipeline_parallel/microbatches) "
       "and accumulates their gradients; raise microbatches instead and leave "
       "this at 1"},
      {[](Json &doc) { doc["gradient_accumulation"]["steps"] = 2; },
       "/gradient_accumulation/steps: gradient accumulation (2 steps) cannot "
       "be combined with pipeline_parallel"},
      // Explicit splits.
      {setPP("split", Json::parse(R"([["tok_embeddings"], ["layers.0"],
                                      ["layers.1", "norm", "output"]])")),
       "/pipeline_parallel/split: expected 4 stages (pp axis \"pp\" of size 4 "
       "x 1 stages per rank), got 3"},
      {setPP("split", Json::parse(R"([["tok_embeddings"], ["layers.0"],
                                      ["layers.1"], ["output"]])")),
       "/pipeline_parallel/split: module \"norm\" is in no stage (it runs "
       "after \"layers.1\", /pipeline_parallel/split/2/0); every top-level "
       "module and block runs on exactly one stage"},
      {setPP("split", Json::parse(R"([["layers.0"], ["layers.1"],
                                      ["norm"], ["output"]])")),
       "/pipeline_parallel/split: module \"tok_embeddings\" is in no stage "
       "(it runs first, before \"layers.0\", /pipeline_parallel/split/0/0)"},
      {setPP("split", Json::parse(R"([["tok_embeddings", "layers.0"],
                                      ["layers.0"], ["layers.1"],
                                      ["norm", "output"]])")),
       "/pipeline_parallel/split/1/0: module \"layers.0\" is listed twice "
       "(also at /pipeline_parallel/split/0/1); each module runs on exactly "
       "one stage"},
      {setPP("split", Json::parse(R"([["tok_embeddings"], ["layers.1"],
                                      ["layers.0"], ["norm", "output"]])")),
       "/pipeline_parallel/split/2/0: module \"layers.0\" is out of forward "
       "order: it runs before \"layers.1\" (/pipeline_parallel/split/1/0), "
       "which is listed earlier; stages list the model's modules in forward "
       "order"},
      {setPP("split", Json::parse(R"([["tok_embeddings"], ["layers.0"],
                                      ["layers.7"], ["norm", "output"]])")),
       "/pipeline_parallel/split/2/0: unknown module \"layers.7\" of model "
       "\"tiny\"; stages list tok_embeddings, layers.0, layers.1, norm, "
       "output (did you mean \"layers.0\"?)"},
      {setPP("split", Json::parse(R"([["tok_embeddings"], ["layers"],
                                      ["norm"], ["output"]])")),
       "/pipeline_parallel/split/1/0: module \"layers\" is cut into its "
       "blocks; list them (\"layers.0\" ... \"layers.1\") in the stages "
       "instead"},
      {setPP("split", Json::parse(R"([["tok_embeddings"],
                                      ["layers.0.attention"], ["layers.1"],
                                      ["norm", "output"]])")),
       "/pipeline_parallel/split/1/0: module \"layers.0.attention\" is part "
       "of \"layers.0\"; a stage takes whole blocks and top-level modules"},
      {setPP("split", Json::parse(R"([["tok_embeddings"], ["layers.0"],
                                      ["layers.1", "norm"], ["output"]])")),
       "/pipeline_parallel/split: FSDP unit \"norm+output\" holds "
       "\"norm.weight\" on stage 2 and \"output.weight\" on stage 3; a unit "
       "is gathered and run as one, so it lies within one stage (put its "
       "modules on one stage, or choose data_parallel.units that stages do "
       "not cut)"},
      // More stages than the model has pieces.
      {both(setPP("schedule", "zbv"), setPP("split", "auto")),
       "/pipeline_parallel/split: split \"auto\" cannot cut model \"tiny\" "
       "into 8 non-empty stages: it has 4 pieces to place (tok_embeddings, "
       "layers.0, layers.1, norm+output; what comes before the first block "
       "and after the last stays together); use fewer stages"},
      {both(setPP("schedule", "zbv"), setPP("split", "torchtitan")),
       "/pipeline_parallel/split: split \"torchtitan\": torchtitan refuses 8 "
       "stages for 2 layers (generate_llm_fqn_per_model_part allows at most "
       "layers + 2 = 4 stages, counting tok_embeddings and norm+output as one "
       "layer each)"},
  };
  for (const BadCase &c : cases) {
    SCOPED_TRACE(c.message);
    Json doc = baseSpec("tiny", 4, pipeline("1f1b", 8));
    c.edit(doc);
    auto r = load(doc);
    EXPECT_TRUE(failsWith(r, c.message));
  }
}

TEST(PipelineSpec, TorchtitanSplitNeedsTorchtitansNames) {
  auto model = parseModel(kOtherModel);
  ASSERT_TRUE(succeeds(model));
  auto shared = std::make_shared<const Model>(std::move(*model));
  Json doc = baseSpec("other.json", 2, pipeline("1f1b", 2, "torchtitan"));
  auto spec = parseSpec(doc.dump());
  ASSERT_TRUE(succeeds(spec));
  EXPECT_TRUE(failsWith(
      resolveSpec(*spec, shared),
      "/pipeline_parallel/split: split \"torchtitan\" reproduces torchtitan's "
      "generate_llm_fqn_per_model_part, which places tok_embeddings, "
      "layers.0 ... layers.N-1, norm and output; model \"other\" has embed, "
      "blocks.0, blocks.1, head; use \"auto\" or list the stages"));
  // auto and explicit splits work on any model.
  doc["pipeline_parallel"]["split"] = "auto";
  auto autoSpec = parseSpec(doc.dump());
  ASSERT_TRUE(succeeds(autoSpec));
  auto r = resolveSpec(*autoSpec, shared);
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(stageModules(*r),
            (std::vector<std::vector<std::string>>{{"embed", "blocks.0"},
                                                   {"blocks.1", "head"}}));
}

TEST(PipelineSpec, LoadedFromAFileTheErrorNamesTheFile) {
  std::string path = ::testing::TempDir() + "/pp-bad.json";
  {
    std::ofstream out(path);
    out << baseSpec("tiny", 4, pipeline("1f1b", 3)).dump(2);
  }
  EXPECT_TRUE(failsWith(loadSpecFile(path),
                        path + ": /pipeline_parallel/microbatches: schedule "
                               "1f1b needs at least as many microbatches"));
}

/// Random edits of a valid pipeline spec never crash: each gives a resolved
/// spec or one located error.
TEST(PipelineSpec, RandomEditsGiveResultsOrLocatedErrors) {
  std::mt19937 rng(16);
  const std::vector<Json> values = {
      nullptr,
      true,
      0,
      1,
      -1,
      2,
      3,
      4,
      8,
      2.5,
      "",
      "pp",
      "dp",
      "auto",
      "torchtitan",
      "zbv",
      "gpipe",
      "layers.0",
      "norm",
      Json::array(),
      Json::array({Json::array({"tok_embeddings"})}),
      Json::object(),
      static_cast<int64_t>(1) << 40};
  Json base =
      baseSpec("tiny", 2, pipeline("interleaved_1f1b", 4, evenSplit(2, 4)));
  std::vector<std::string> pointers;
  testutil::collectPointers(base, "", pointers);
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    Json doc = base;
    for (int edits = 1 + rng() % 2; edits > 0; --edits) {
      Json::json_pointer ptr(pointers[rng() % pointers.size()]);
      if (!doc.contains(ptr))
        continue;
      doc[ptr] = values[rng() % values.size()];
    }
    auto r = load(doc);
    if (r.ok()) {
      ++ok;
      if (r->pipeline)
        expectWellFormed(*r);
      continue;
    }
    EXPECT_TRUE(testutil::isLocated(r.error().message))
        << r.error().message << "\n"
        << doc.dump();
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  }
  EXPECT_GT(ok, 0);
}

} // namespace
