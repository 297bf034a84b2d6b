//===- SpecTest.cpp - Parallelism specs: examples and located errors ------===//
//
// Every shipped example loads and means what it says; every class of bad
// input yields an error that starts with the JSON pointer of the offending
// value; a table of mutations of one valid spec checks each pointer exactly;
// random mutations (deleted keys, changed types, inserted garbage) never crash
// and always give either success or a located error.
//
//===----------------------------------------------------------------------===//

#include "FrontendTestHelpers.h"

#include "meshplan/Frontend/Presets.h"
#include "meshplan/Frontend/Spec.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

using namespace meshplan;
using namespace meshplan::frontend;
using testutil::failsWith;
using testutil::succeeds;
using Json = nlohmann::ordered_json;

namespace {

const std::string kExamples = testutil::sourcePath("examples/specs");

Result<ResolvedSpec> loadExample(const std::string &name) {
  return loadSpecFile(kExamples + "/" + name);
}

const ParamAssignment *param(const ResolvedSpec &r, const std::string &name) {
  for (const ParamAssignment &p : r.params)
    if (p.name == name)
      return &p;
  ADD_FAILURE() << "no parameter " << name;
  return nullptr;
}

//===----------------------------------------------------------------------===//
// Examples
//===----------------------------------------------------------------------===//

TEST(Examples, EveryExampleLoads) {
  std::set<std::string> names;
  for (const auto &entry : std::filesystem::directory_iterator(kExamples)) {
    if (entry.path().extension() != ".json")
      continue;
    names.insert(entry.path().filename().string());
    auto resolved = loadSpecFile(entry.path().string());
    EXPECT_TRUE(succeeds(resolved)) << entry.path();
  }
  for (const char *required :
       {"fsdp-fp8-3d.json", "hsdp-managed.json", "fsdp-tp.json",
        "fsdp-sr-adamw.json", "llama3-405b-4d.json"})
    EXPECT_TRUE(names.count(required)) << required;
}

TEST(Examples, Fsdp8Fp8ThreeD) {
  auto r = loadExample("fsdp-fp8-3d.json");
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->mesh->str().substr(0, 20), "ddp=2,fsdp=2,abcd=2");
  EXPECT_EQ(r->mesh->size(), 8);
  EXPECT_EQ(r->spec.dataParallel.replicateAxes,
            std::vector<std::string>{"ddp"});
  EXPECT_EQ(r->spec.dataParallel.shardAxes, std::vector<std::string>{"fsdp"});
  EXPECT_EQ(r->spec.extraAxes, std::vector<std::string>{"abcd"});
  ASSERT_TRUE(r->spec.float8.has_value());
  EXPECT_TRUE(r->spec.float8->allGather);
  EXPECT_TRUE(r->spec.float8->powerOf2Scales);
  EXPECT_EQ(r->spec.mixedPrecision.paramDtype, DType::BFloat16);
  // Every linear weight of every layer is float8; embeddings, norms and the
  // output projection are not.
  int fp8 = 0;
  for (const ParamAssignment &p : r->params)
    fp8 += p.float8;
  EXPECT_EQ(fp8, 32 * 7);
  EXPECT_TRUE(param(*r, "layers.5.feed_forward.w2.weight")->float8);
  EXPECT_FALSE(param(*r, "output.weight")->float8);
  EXPECT_FALSE(param(*r, "layers.5.ffn_norm.weight")->float8);
}

TEST(Examples, HsdpManaged) {
  auto r = loadExample("hsdp-managed.json");
  ASSERT_TRUE(succeeds(r));
  ASSERT_EQ(r->mesh->numAxes(), 2);
  EXPECT_TRUE(r->mesh->axis(0).managed);
  EXPECT_FALSE(r->mesh->axis(1).managed);
  EXPECT_EQ(r->spec.optimizer.seed, 1u);
  EXPECT_FALSE(r->spec.float8.has_value());
}

TEST(Examples, FsdpTp) {
  auto r = loadExample("fsdp-tp.json");
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->mesh->size(), 8);
  EXPECT_EQ(param(*r, "tok_embeddings.weight")->tpDim, 0); // rowwise
  EXPECT_EQ(param(*r, "layers.0.attention.wq.weight")->tpDim, 0);
  EXPECT_EQ(param(*r, "layers.0.attention.wk.weight")->tpDim, 0);
  EXPECT_EQ(param(*r, "layers.0.attention.wo.weight")->tpDim, 1);
  EXPECT_EQ(param(*r, "layers.9.feed_forward.w1.weight")->tpDim, 0);
  EXPECT_EQ(param(*r, "layers.9.feed_forward.w2.weight")->tpDim, 1);
  EXPECT_EQ(param(*r, "layers.9.feed_forward.w3.weight")->tpDim, 0);
  EXPECT_EQ(param(*r, "layers.9.ffn_norm.weight")->tpDim, -1);
  EXPECT_EQ(param(*r, "norm.weight")->tpDim, -1);
  EXPECT_EQ(param(*r, "output.weight")->tpDim, 0); // colwise
  int sequenceParallel = 0;
  for (const ModuleAssignment &a : r->assignments)
    sequenceParallel += a.tpStyle == TPStyle::SequenceParallel;
  EXPECT_EQ(sequenceParallel, 2 * 32 + 1);
}

TEST(Examples, FsdpSrAdamwUsesAModelFile) {
  auto r = loadExample("fsdp-sr-adamw.json");
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->spec.model, "../models/tiny.json");
  EXPECT_EQ(modelToJson(*r->model), modelToJson(*presetModel("tiny")));
  EXPECT_EQ(r->spec.optimizer.paramDtype, DType::BFloat16);
  EXPECT_TRUE(r->spec.optimizer.stochasticRounding);
  EXPECT_EQ(r->spec.optimizer.seed, 1234u);
  EXPECT_DOUBLE_EQ(r->spec.optimizer.beta2, 0.999);
  // The boolean false reads as the policy "never".
  EXPECT_EQ(r->spec.dataParallel.reshardAfterForward, ReshardPolicy::Never);
  EXPECT_EQ(r->spec.gradientAccumulationSteps, 4);
}

TEST(Examples, Llama405bFourD) {
  auto r = loadExample("llama3-405b-4d.json");
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->mesh->numAxes(), 4);
  EXPECT_EQ(r->mesh->size(), 1024);
  EXPECT_EQ(r->params.size(), 2u + 126u * 9u + 1u);
  // "layers.**" selects the linear modules under layers, not the norms.
  EXPECT_TRUE(param(*r, "layers.125.attention.wk.weight")->float8);
  EXPECT_FALSE(param(*r, "layers.125.attention_norm.weight")->float8);
  EXPECT_FALSE(param(*r, "output.weight")->float8);
}

//===----------------------------------------------------------------------===//
// One valid spec exercising every section, and mutations of it
//===----------------------------------------------------------------------===//

const char *kBase = R"json({
  "model": "tiny",
  "world_size": 16,
  "mesh": {
    "axes": [
      {"name": "ddp", "size": 2},
      {"name": "fsdp", "size": 2},
      {"name": "cp", "size": 2},
      {"name": "tp", "size": 2}
    ],
    "managed_axes": ["ddp"]
  },
  "data_parallel": {
    "replicate_axes": ["ddp"],
    "shard_axes": ["fsdp"],
    "reshard_after_forward": true
  },
  "tensor_parallel": {
    "axis": "tp",
    "plan": [
      {"pattern": "tok_embeddings", "style": "rowwise"},
      {"pattern": "layers.*.attention_norm", "style": "sequence_parallel"},
      {"pattern": "layers.*.attention.wq", "style": "colwise"},
      {"pattern": "layers.*.attention.wk", "style": "colwise"},
      {"pattern": "layers.*.attention.wv", "style": "colwise"},
      {"pattern": "layers.*.attention.wo", "style": "rowwise"},
      {"pattern": "layers.*.feed_forward.w1", "style": "colwise"},
      {"pattern": "layers.*.feed_forward.w2.weight", "style": "rowwise"},
      {"pattern": "layers.*.feed_forward.w3", "style": "colwise"}
    ]
  },
  "extra_axes": ["cp"],
  "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
  "float8": {
    "all_gather": true,
    "modules": ["layers.*.attention.*", "layers.*.feed_forward.*"],
    "exclude": ["layers.0.attention.wk"],
    "scaling": "tensorwise",
    "power_of_2_scales": true
  },
  "optimizer": {
    "name": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
    "weight_decay": 0.1, "param_dtype": "bfloat16",
    "stochastic_rounding": true, "seed": 42
  },
  "gradient_accumulation_steps": 2
})json";

TEST(BaseSpec, AccumulationModesAndActivationCheckpointing) {
  // The short key keeps FSDP2's default: reduce every microbatch.
  auto plain = parseSpec(kBase);
  ASSERT_TRUE(succeeds(plain));
  EXPECT_EQ(plain->gradientAccumulationSteps, 2);
  EXPECT_EQ(plain->accumulationReduce, AccumulationReduce::EveryMicrobatch);
  EXPECT_EQ(plain->activationCheckpointing, ActivationCheckpointing::None);
  Json doc = Json::parse(kBase);
  doc.erase("gradient_accumulation_steps");
  doc["gradient_accumulation"] = {{"steps", 3}, {"reduce", "last_microbatch"}};
  doc["activation_checkpointing"] = "selective";
  auto spec = parseSpec(doc.dump());
  ASSERT_TRUE(succeeds(spec));
  EXPECT_EQ(spec->gradientAccumulationSteps, 3);
  EXPECT_EQ(spec->accumulationReduce, AccumulationReduce::LastMicrobatch);
  EXPECT_EQ(spec->activationCheckpointing, ActivationCheckpointing::Selective);
  // "reduce" alone keeps the step count of the short key.
  doc = Json::parse(kBase);
  doc["gradient_accumulation"] = {{"reduce", "last_microbatch"}};
  spec = parseSpec(doc.dump());
  ASSERT_TRUE(succeeds(spec));
  EXPECT_EQ(spec->gradientAccumulationSteps, 2);
  EXPECT_EQ(spec->accumulationReduce, AccumulationReduce::LastMicrobatch);
}

TEST(BaseSpec, BatchSplitsOverDataParallelRanksAndMicrobatches) {
  // kBase: ddp 2 (replicate) x fsdp 2 (shard) read different data; cp and
  // tp split sequences and layers; 2 accumulation steps. 1024 tokens of
  // sequences of 64 are 128 tokens (2 sequences) per rank and microbatch.
  Json doc = Json::parse(kBase);
  doc["batch"] = {{"global_tokens", 1024}, {"sequence_length", 64}};
  auto spec = parseSpec(doc.dump());
  ASSERT_TRUE(succeeds(spec));
  ASSERT_TRUE(spec->batch.has_value());
  EXPECT_EQ(spec->batch->globalTokens, 1024);
  EXPECT_EQ(spec->batch->sequenceLength, 64);
  auto shape = batchPerMicrobatch(*spec, 1024, 64);
  ASSERT_TRUE(succeeds(shape));
  EXPECT_EQ(shape->dataParallelRanks, 4);
  EXPECT_EQ(shape->microbatches, 2);
  EXPECT_EQ(shape->tokensPerRank, 128);
  // Half a sequence per rank and microbatch is refused, located.
  doc["batch"]["global_tokens"] = 256;
  EXPECT_TRUE(failsWith(parseSpec(doc.dump()),
                        "/batch/global_tokens: 256 tokens do not split into "
                        "whole sequences of 64 tokens over 4 data-parallel "
                        "ranks x 2 microbatches: the global batch must be a "
                        "multiple of 512 tokens"));
  doc["batch"] = {{"global_tokens", 1024}};
  EXPECT_FALSE(succeeds(parseSpec(doc.dump())));
  doc["batch"] = {{"global_tokens", 0}, {"sequence_length", 64}};
  EXPECT_FALSE(succeeds(parseSpec(doc.dump())));
  // Without "batch" the spec states no batch.
  EXPECT_FALSE(parseSpec(kBase)->batch.has_value());
}

TEST(BaseSpec, MicrobatchWorkFollowsOneRule) {
  // frontend::microbatchWork, shared by `meshplan plan`/`explain` and
  // meshplan.plan: the request, else the spec's batch, else 8192.
  Json doc = Json::parse(kBase);
  auto plain = parseSpec(doc.dump());
  ASSERT_TRUE(succeeds(plain));
  doc["batch"] = {{"global_tokens", 1024}, {"sequence_length", 64}};
  auto batched = parseSpec(doc.dump());
  ASSERT_TRUE(succeeds(batched));
  auto work = [](const Spec &spec, std::optional<int64_t> perRank,
                 std::optional<int64_t> global, std::optional<int64_t> seq) {
    WorkRequest request;
    request.tokensPerRank = perRank;
    request.globalBatchTokens = global;
    request.sequenceLength = seq;
    return microbatchWork(spec, request);
  };
  auto is = [](const Result<MicrobatchWork> &w, int64_t tokens, int64_t seq) {
    return w && w->tokensPerRank == tokens && w->sequenceLength == seq;
  };
  EXPECT_TRUE(is(work(*plain, {}, {}, {}), 8192, 8192));
  EXPECT_TRUE(is(work(*plain, {}, {}, 128), 8192, 128));
  EXPECT_TRUE(is(work(*batched, {}, {}, {}), 128, 64));
  EXPECT_TRUE(is(work(*batched, 40, {}, {}), 40, 64));
  // 4 dp ranks x 2 microbatches: 4096 tokens are 512 per rank.
  EXPECT_TRUE(is(work(*batched, {}, 4096, {}), 512, 64));
  EXPECT_TRUE(is(work(*plain, {}, 4096, 256), 512, 256));
  EXPECT_TRUE(is(work(*batched, {}, {}, 32), 128, 32));
  // Errors name the input at fault, as the caller spells it.
  EXPECT_TRUE(failsWith(work(*plain, 0, {}, {}),
                        "tokens_per_rank: must be > 0, not 0"));
  EXPECT_TRUE(failsWith(work(*plain, {}, -5, {}),
                        "global_batch_tokens: must be > 0, not -5"));
  EXPECT_TRUE(
      failsWith(work(*plain, {}, {}, 0), "seq_len: must be > 0, not 0"));
  EXPECT_TRUE(failsWith(work(*plain, 8, 64, {}),
                        "tokens_per_rank: give it or global_batch_tokens, "
                        "not both"));
  EXPECT_TRUE(failsWith(work(*plain, {}, 1000, 64),
                        "global_batch_tokens: 1000 tokens do not split"));
  // The spec's batch split into sequences the request cannot hold.
  EXPECT_TRUE(failsWith(work(*batched, {}, {}, 1000),
                        "seq_len (with the spec's batch.global_tokens): 1024 "
                        "tokens do not split"));
  WorkRequest named;
  named.tokensPerRank = -1;
  named.tokensPerRankName = "--tokens-per-rank";
  EXPECT_TRUE(failsWith(microbatchWork(*plain, named),
                        "--tokens-per-rank: must be > 0, not -1"));
}

TEST(BaseSpec, IsValid) {
  auto r = loadSpec(kBase, "");
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->mesh->size(), 16);
  EXPECT_TRUE(param(*r, "layers.0.attention.wq.weight")->float8);
  EXPECT_FALSE(param(*r, "layers.0.attention.wk.weight")->float8);
  EXPECT_TRUE(param(*r, "layers.1.attention.wk.weight")->float8);
  EXPECT_EQ(param(*r, "layers.1.feed_forward.w2.weight")->tpDim, 1);
}

struct Edit {
  enum Kind { Set, Remove, Rename } kind;
  std::string pointer;
  std::string value; ///< JSON for Set, the new key for Rename
};

Edit set(std::string pointer, std::string value) {
  return {Edit::Set, std::move(pointer), std::move(value)};
}
Edit remove(std::string pointer) {
  return {Edit::Remove, std::move(pointer), ""};
}
Edit rename(std::string pointer, std::string key) {
  return {Edit::Rename, std::move(pointer), std::move(key)};
}

std::string applyEdits(const std::string &text,
                       const std::vector<Edit> &edits) {
  Json doc = Json::parse(text);
  for (const Edit &e : edits) {
    Json::json_pointer ptr(e.pointer);
    switch (e.kind) {
    case Edit::Set:
      doc[ptr] = Json::parse(e.value);
      break;
    case Edit::Remove: {
      Json &parent = doc[ptr.parent_pointer()];
      if (parent.is_array())
        parent.erase(std::stoul(ptr.back()));
      else
        parent.erase(ptr.back());
      break;
    }
    case Edit::Rename: {
      Json &parent = doc[ptr.parent_pointer()];
      Json value = parent[ptr.back()];
      parent.erase(ptr.back());
      parent[e.value] = value;
      break;
    }
    }
  }
  return doc.dump(2);
}

struct BadSpec {
  std::vector<Edit> edits;
  std::string expected; ///< the error message's beginning
};

TEST(SpecErrors, MutationTable) {
  const std::string plan = "/tensor_parallel/plan";
  std::vector<BadSpec> table = {
      // Keys, types and closed sets.
      {{set(plan + "/3/style", "\"colwsie\"")},
       "/tensor_parallel/plan/3/style: unknown style \"colwsie\"; expected "
       "one of colwise, rowwise, sequence_parallel (did you mean "
       "\"colwise\"?)"},
      {{rename("/data_parallel/shard_axes", "shrad_axes")},
       "/data_parallel/shrad_axes: unknown key; expected one of "
       "replicate_axes, shard_axes, reshard_after_forward, units (did you "
       "mean \"shard_axes\"?)"},
      // FSDP units and the reshard policy.
      {{set("/data_parallel/reshard_after_forward", "\"alwasy\"")},
       "/data_parallel/reshard_after_forward: unknown policy \"alwasy\"; "
       "expected one of default, always, never (did you mean \"always\"?)"},
      {{set("/data_parallel/reshard_after_forward", "1")},
       "/data_parallel/reshard_after_forward: expected a string or a boolean, "
       "got integer 1"},
      {{set("/data_parallel/units", "\"torchtitna\"")},
       "/data_parallel/units: unknown units \"torchtitna\"; expected one of "
       "torchtitan, per_module or an array of units (did you mean "
       "\"torchtitan\"?)"},
      {{set("/data_parallel/units", "{}")},
       "/data_parallel/units: expected an array or a string, got an object"},
      {{set("/data_parallel/units", "[]")},
       "/data_parallel/units: expected at least one unit"},
      {{set("/data_parallel/units", "[[]]")},
       "/data_parallel/units/0: expected at least one pattern"},
      {{set("/data_parallel/units", "[\"norm\"]")},
       "/data_parallel/units/0: expected an array, got string \"norm\""},
      {{set("/data_parallel/units", "[[\"norm\", 3]]")},
       "/data_parallel/units/0/1: expected a string, got integer 3"},
      {{set("/data_parallel/units", "[[\"no-rm\"]]")},
       "/data_parallel/units/0/0: "},
      {{set("/data_parallel/units",
            R"([["tok_embeddings"], ["layers.*"], ["norm", "outptu"]])")},
       "/data_parallel/units/2/1: pattern \"outptu\" matches no module or "
       "parameter of model \"tiny\" (did you mean \"output\"?)"},
      {{set("/data_parallel/units",
            R"([["tok_embeddings"], ["layers.*"], ["norm"]])")},
       "/data_parallel/units: parameter \"output.weight\" is in no unit; "
       "every parameter belongs to exactly one unit (add a pattern for it, "
       "e.g. \"output\")"},
      {{set(
           "/data_parallel/units",
           R"([["tok_embeddings"], ["layers.*"], ["layers.1.ffn_norm", "norm", "output"]])")},
       "/data_parallel/units/2/0: pattern \"layers.1.ffn_norm\" puts parameter "
       "\"layers.1.ffn_norm.weight\" in a second unit; it is already in "
       "/data_parallel/units/1; every parameter belongs to exactly one unit"},
      {{rename("/mixed_precision", "mixed_precison")},
       "/mixed_precison: unknown key; expected one of $schema, description, "
       "model, world_size, mesh, data_parallel, tensor_parallel, extra_axes, "
       "pipeline_parallel, mixed_precision, float8, optimizer, "
       "gradient_accumulation_steps, "
       "gradient_accumulation, activation_checkpointing, batch (did you mean "
       "\"mixed_precision\"?)"},
      {{set("/a~1b", "1")}, "/a~1b: unknown key; expected one of"},
      {{set(plan + "/0/extra", "1")},
       "/tensor_parallel/plan/0/extra: unknown key; expected one of pattern, "
       "style"},
      {{remove("/model")}, "/model: missing required key; expected a string"},
      {{remove("/mesh/axes")},
       "/mesh/axes: missing required key; expected an array of objects"},
      {{remove(plan + "/0/style")},
       "/tensor_parallel/plan/0/style: missing required key; expected a "
       "string"},
      {{set("/model", "42")}, "/model: expected a string, got integer 42"},
      {{set("/mesh", "[]")}, "/mesh: expected an object, got an array"},
      {{set("/mesh/axes/0", "\"ddp\"")},
       "/mesh/axes/0: expected an object, got string \"ddp\""},
      {{set("/mesh/axes/1/size", "\"2\"")},
       "/mesh/axes/1/size: expected an integer, got string \"2\""},
      {{set("/mesh/axes/1/size", "2.5")},
       "/mesh/axes/1/size: expected an integer, got number 2.5"},
      {{set("/mesh/axes/1/size", "0")},
       "/mesh/axes/1/size: expected an integer in [1, 2147483648], got 0"},
      {{set("/float8/all_gather", "\"yes\"")},
       "/float8/all_gather: expected a boolean, got string \"yes\""},
      {{set("/optimizer/weight_decay", "null")},
       "/optimizer/weight_decay: expected a number, got null"},
      {{set("/extra_axes/0", "7")},
       "/extra_axes/0: expected a string, got integer 7"},
      {{set("/mixed_precision/param_dtype", "\"bf16\"")},
       "/mixed_precision/param_dtype: unknown dtype \"bf16\"; expected one of "
       "float32, bfloat16, float16"},
      {{set("/float8/scaling", "\"rowwise\"")},
       "/float8/scaling: unknown scaling \"rowwise\"; expected one of "
       "tensorwise"},
      {{set("/optimizer/name", "\"adam\"")},
       "/optimizer/name: unknown optimizer \"adam\"; expected one of adamw "
       "(did you mean \"adamw\"?)"},
      // Values.
      {{set("/model", "\"llama3-7b\"")},
       "/model: unknown model \"llama3-7b\"; expected a preset (tiny, "
       "llama3-8b, llama3-70b, llama3-405b) or a path to a model JSON file "
       "(did you mean \"llama3-8b\"?)"},
      {{set("/model", "\"missing/model.json\"")},
       "/model: cannot read \"missing/model.json\""},
      {{set("/mesh/axes", "[]")}, "/mesh/axes: expected at least one axis"},
      {{set("/mesh/axes/1/name", "\"ddp\"")},
       "/mesh/axes/1/name: duplicate axis \"ddp\" (also at "
       "/mesh/axes/0/name)"},
      {{set("/mesh/axes/1/name", "\"f-sdp\"")},
       "/mesh/axes/1/name: invalid axis name \"f-sdp\""},
      {{set("/mesh/axes/0/size", "2097152"),
        set("/mesh/axes/1/size", "2097152")},
       "/mesh/axes/1/size: the mesh would have more than 2^31 ranks "
       "(docs/limits.md)"},
      {{set("/mesh/device_order", "[0, 1, 2]")},
       "/mesh/device_order: expected 16 rank ids (one per mesh position), got "
       "3"},
      {{set("/mesh/device_order",
            "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 3]")},
       "/mesh/device_order/15: rank 3 appears twice (also at "
       "/mesh/device_order/3)"},
      {{set("/mesh/device_order",
            "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -15]")},
       "/mesh/device_order/15: expected an integer >= 0, got -15"},
      {{set("/mesh/managed_axes", "[\"dpp\"]")},
       "/mesh/managed_axes/0: unknown axis \"dpp\"; the mesh has ddp, fsdp, "
       "cp, tp (did you mean \"ddp\"?)"},
      {{set("/mesh/managed_axes", "[\"ddp\", \"ddp\"]")},
       "/mesh/managed_axes/1: axis \"ddp\" is listed twice"},
      {{set("/world_size", "8")},
       "/world_size: world size 8 does not match the mesh, which has 16 "
       "devices (ddp=2 x fsdp=2 x cp=2 x tp=2)"},
      {{set("/optimizer/betas", "[0.9]")},
       "/optimizer/betas: expected 2 elements, got 1"},
      {{set("/optimizer/betas/1", "1.0")},
       "/optimizer/betas/1: expected a beta in [0, 1), got number 1.0"},
      {{set("/optimizer/lr", "-1")},
       "/optimizer/lr: expected a learning rate > 0, got integer -1"},
      {{set("/optimizer/seed", "-5")},
       "/optimizer/seed: expected an integer in [0, 2^64), got integer -5"},
      {{set("/optimizer/param_dtype", "\"float32\"")},
       "/optimizer/stochastic_rounding: stochastic rounding rounds updates to "
       "bfloat16 parameters"},
      // Found by fuzz-spec: planned into optimizer updates that the plan
      // reader refuses. fuzz/corpus/spec/regress-bf16-params-no-sr.json.
      {{set("/optimizer/stochastic_rounding", "false")},
       "/optimizer/param_dtype: bfloat16 parameters are updated with "
       "stochastic rounding only; set stochastic_rounding to true, or "
       "param_dtype to \"float32\""},
      // Found by fuzz-spec: planned as an invalid bfloat16 -> float16 cast
      // (exit 3). fuzz/corpus/spec/regress-bf16-params-f16-compute.json.
      {{set("/mixed_precision/param_dtype", "\"float16\"")},
       "/mixed_precision/param_dtype: float16 compute from bfloat16 "
       "parameters (/optimizer/param_dtype) is not supported"},
      {{set("/gradient_accumulation_steps", "0")},
       "/gradient_accumulation_steps: expected an integer in [1, 1073741824], "
       "got 0"},
      {{set("/gradient_accumulation", R"({"steps": 4})")},
       "/gradient_accumulation/steps: gradient_accumulation_steps is given as "
       "well; keep one of the two"},
      {{remove("/gradient_accumulation_steps"),
        set("/gradient_accumulation", R"({"steps": 0})")},
       "/gradient_accumulation/steps: expected an integer in [1, 1073741824], "
       "got 0"},
      {{set("/gradient_accumulation", R"({"reduce": "every_step"})")},
       "/gradient_accumulation/reduce: unknown mode \"every_step\"; expected "
       "one of every_microbatch, last_microbatch"},
      {{set("/gradient_accumulation", R"({"reduce": "last"})")},
       "/gradient_accumulation/reduce: unknown mode \"last\""},
      {{set("/gradient_accumulation", R"({"stpes": 2})")},
       "/gradient_accumulation/stpes: unknown key; expected one of steps, "
       "reduce (did you mean \"steps\"?)"},
      {{set("/activation_checkpointing", R"("partial")")},
       "/activation_checkpointing: unknown policy \"partial\"; expected one "
       "of none, full, selective"},
      {{set("/activation_checkpointing", "true")},
       "/activation_checkpointing: expected a string"},
      {{set(plan, "[]")}, "/tensor_parallel/plan: expected at least one rule"},
      {{set(plan + "/0/pattern", "\"tok-embeddings\"")},
       "/tensor_parallel/plan/0/pattern: invalid character '-' in pattern"},
      {{set("/float8/modules", "[]")},
       "/float8/modules: expected at least one pattern"},
      // Axis roles.
      {{set("/data_parallel/shard_axes/0", "\"fsdq\"")},
       "/data_parallel/shard_axes/0: unknown axis \"fsdq\"; the mesh has ddp, "
       "fsdp, cp, tp (did you mean \"fsdp\"?)"},
      {{set("/tensor_parallel/axis", "\"fsdp\"")},
       "/tensor_parallel/axis: axis \"fsdp\" is already used as a shard axis "
       "(/data_parallel/shard_axes/0); each mesh axis has exactly one role"},
      {{set("/extra_axes", "[\"cp\", \"tp\"]")},
       "/extra_axes/1: axis \"tp\" is already used as the tensor-parallel "
       "axis (/tensor_parallel/axis)"},
      {{set("/data_parallel/replicate_axes", "[\"ddp\", \"ddp\"]")},
       "/data_parallel/replicate_axes/1: axis \"ddp\" is already used as a "
       "replicate axis (/data_parallel/replicate_axes/0)"},
      {{set("/extra_axes", "[]")},
       "/mesh/axes/2/name: axis \"cp\" has no role"},
      {{set("/mesh/managed_axes", "[\"fsdp\"]")},
       "/data_parallel/shard_axes/0: axis \"fsdp\" is managed"},
      {{set("/data_parallel", R"({"replicate_axes": ["ddp", "fsdp"]})")},
       "/float8/all_gather: float8 all-gather needs FSDP"},
      // Against the model.
      {{set("/mesh/axes/3/size", "3"), set("/world_size", "24")},
       "/tensor_parallel/plan/0: rowwise over \"tp\" (size 3) splits dim 0 of "
       "\"tok_embeddings.weight\" (shape [256, 64]), but 3 does not divide "
       "256"},
      {{set("/mesh/axes/3/size", "4"), set("/world_size", "32")},
       "/tensor_parallel/plan/2: colwise over \"tp\" (size 4) on "
       "\"layers.0.attention.wq\" splits the heads of \"layers.0.attention\", "
       "but 4 does not divide its n_kv_heads 2"},
      {{set(plan + "/2/pattern", "\"layers.*.attention.wqq\"")},
       "/tensor_parallel/plan/2/pattern: pattern \"layers.*.attention.wqq\" "
       "matches no module or parameter of model \"tiny\" (did you mean "
       "\"layers.*.attention.wq\"?)"},
      {{set(plan + "/2/pattern", "\"layers.*.attention\"")},
       "/tensor_parallel/plan/2/style: colwise applies to linear, output and "
       "embedding modules, but pattern \"layers.*.attention\" selects "
       "attention module \"layers.0.attention\""},
      {{set(plan + "/1/style", "\"colwise\"")},
       "/tensor_parallel/plan/1/style: colwise applies to linear, output and "
       "embedding modules, but pattern \"layers.*.attention_norm\" selects "
       "norm module \"layers.0.attention_norm\""},
      {{set(plan + "/2/style", "\"sequence_parallel\"")},
       "/tensor_parallel/plan/2/style: sequence_parallel applies to norm "
       "modules, but pattern"},
      {{set(plan + "/2/pattern", "\"layers.*.attention.w?\"")},
       "/tensor_parallel/plan/3/pattern: module \"layers.0.attention.wk\" is "
       "already planned by /tensor_parallel/plan/2 (colwise)"},
      {{set("/float8/modules/0", "\"tok_embeddings\"")},
       "/float8/modules/0: pattern \"tok_embeddings\" selects embedding "
       "module \"tok_embeddings\"; float8 applies to linear modules only"},
      {{set("/float8/modules/0", "\"layers.*.attention_norm\"")},
       "/float8/modules/0: pattern \"layers.*.attention_norm\" selects norm "
       "module \"layers.0.attention_norm\" and no linear module; float8 "
       "applies to linear modules only"},
      {{set("/float8/modules/0", "\"output.weight\"")},
       "/float8/modules/0: pattern \"output.weight\" selects output module "
       "\"output\"; float8 applies to linear modules only (the output "
       "projection stays in high precision, as in torchtitan)"},
      {{set("/float8/exclude/0", "\"layers.9.attention.wk\"")},
       "/float8/exclude/0: pattern \"layers.9.attention.wk\" matches no "
       "module or parameter of model \"tiny\""},
      {{set("/float8/exclude",
            R"(["layers.*.attention.*", "layers.*.feed_forward.*"])")},
       "/float8: float8 selects no linear module of model \"tiny\""},
  };
  for (size_t i = 0; i < table.size(); ++i) {
    const BadSpec &bad = table[i];
    std::string text = applyEdits(kBase, bad.edits);
    auto result = loadSpec(text, "");
    EXPECT_TRUE(failsWith(result, bad.expected))
        << "entry " << i << " (" << bad.edits.front().pointer << ")";
  }
  EXPECT_GE(table.size(), 40u);
}

//===----------------------------------------------------------------------===//
// The optimizer step: schedule, clipping, weight-decay groups
//===----------------------------------------------------------------------===//

const char *kStep = R"({"lr_schedule": {"warmup_steps": 3, "decay_ratio": 0.5,
  "decay_type": "cosine", "min_lr_factor": 0.1, "total_steps": 20},
  "max_norm": 1.0, "no_decay": ["**norm", "tok_embeddings"]})";

TEST(OptimizerStep, ScheduleClippingAndNoDecayResolve) {
  Json doc = Json::parse(kBase);
  const Json step = Json::parse(kStep);
  for (auto &[key, value] : step.items())
    doc["optimizer"][key] = value;
  auto r = loadSpec(doc.dump(), "");
  ASSERT_TRUE(succeeds(r));
  const OptimizerSpec &o = r->spec.optimizer;
  ASSERT_TRUE(o.schedule);
  EXPECT_EQ(o.schedule->warmupSteps, 3);
  EXPECT_EQ(o.schedule->totalSteps, 20);
  EXPECT_EQ(o.schedule->decayType, LrDecayType::Cosine);
  EXPECT_EQ(o.schedule->decayRatio, 0.5);
  EXPECT_EQ(o.maxNorm, 1.0);
  EXPECT_EQ(o.normType, GradNormType::L2);
  int noDecay = 0;
  for (const ParamAssignment &p : r->params) {
    bool norm = p.name.find("norm") != std::string::npos ||
                p.name == "tok_embeddings.weight";
    EXPECT_EQ(p.noDecay, norm) << p.name;
    noDecay += p.noDecay;
  }
  EXPECT_EQ(noDecay, 6); // 2 blocks x 2 norms, the final norm, embedding
  // The run's length from the caller when the spec gives none.
  doc["optimizer"]["lr_schedule"].erase("total_steps");
  SpecOptions options;
  options.totalSteps = 7;
  auto parsed = parseSpec(doc.dump(), options);
  ASSERT_TRUE(succeeds(parsed));
  EXPECT_EQ(parsed->optimizer.schedule->totalSteps, 7);
  doc["optimizer"]["norm_type"] = "inf";
  parsed = parseSpec(doc.dump(), options);
  ASSERT_TRUE(succeeds(parsed));
  EXPECT_EQ(parsed->optimizer.normType, GradNormType::Inf);
}

TEST(OptimizerStep, BadInputIsALocatedError) {
  struct Bad {
    std::string pointer, value, expected;
    std::optional<int64_t> totalSteps = std::nullopt;
  };
  const std::string s = "/optimizer/lr_schedule";
  std::vector<Bad> table = {
      {"/optimizer/max_norm", "0",
       "/optimizer/max_norm: expected a finite max_norm > 0, got integer 0"},
      {"/optimizer/max_norm", "-1.5",
       "/optimizer/max_norm: expected a finite max_norm > 0, got number -1.5"},
      {"/optimizer/norm_type", "3",
       "/optimizer/norm_type: norm_type integer 3 is not supported; expected "
       "2 or \"inf\""},
      {"/optimizer/norm_type", "\"fro\"",
       "/optimizer/norm_type: unknown norm_type \"fro\"; expected one of inf "
       "or a number"},
      {s + "/decay_type", "\"exp\"",
       s + "/decay_type: unknown decay type \"exp\"; expected one of "
           "linear, sqrt, cosine"},
      {s + "/warmup_steps", "30",
       s + "/warmup_steps: warmup_steps 30 is beyond the run's 20 steps"},
      {s + "/min_lr_factor", "1.5",
       s + "/min_lr_factor: expected a number in [0, 1], got number 1.5"},
      {s + "/decay_ratio", "-0.1",
       s + "/decay_ratio: expected a number in [0, 1], got number -0.1"},
      {s + "/total_steps", "0",
       s + "/total_steps: expected an integer in [1, 1099511627776], got 0"},
      {"/optimizer/no_decay/1", "\"layers.*.attn_norm\"",
       "/optimizer/no_decay/1: pattern \"layers.*.attn_norm\" matches no "
       "module or parameter of model \"tiny\""},
      {s + "/warmup", "3", s + "/warmup: unknown key"},
  };
  for (const Bad &bad : table) {
    Json doc = Json::parse(kBase);
    const Json step = Json::parse(kStep);
    for (auto &[key, value] : step.items())
      doc["optimizer"][key] = value;
    doc[Json::json_pointer(bad.pointer)] = Json::parse(bad.value);
    auto result = loadSpec(doc.dump(), "");
    EXPECT_TRUE(failsWith(result, bad.expected)) << bad.pointer;
  }
  // No total_steps in the spec and none from the caller.
  Json doc = Json::parse(kBase);
  doc["optimizer"]["lr_schedule"] = {{"warmup_steps", 2}};
  EXPECT_TRUE(failsWith(parseSpec(doc.dump()),
                        s + "/total_steps: the schedule needs the run's "
                            "length"));
  // The caller's run shorter than the warmup.
  SpecOptions options;
  options.totalSteps = 1;
  EXPECT_TRUE(failsWith(parseSpec(doc.dump(), options),
                        s + "/warmup_steps: warmup_steps 2 is beyond the "
                            "run's 1 steps"));
  // norm_type without max_norm would clip nothing.
  doc = Json::parse(kBase);
  doc["optimizer"]["norm_type"] = 2;
  EXPECT_TRUE(failsWith(parseSpec(doc.dump()),
                        "/optimizer/norm_type: norm_type without max_norm"));
}

//===----------------------------------------------------------------------===//
// FSDP units and the reshard policy
//===----------------------------------------------------------------------===//

/// The units of a spec as "name[: reshard]" strings with their parameters.
std::vector<std::string> unitNames(const ResolvedSpec &r) {
  std::vector<std::string> out;
  for (const UnitAssignment &unit : r.units)
    out.push_back(unit.name + (unit.reshardAfterForward ? " R" : " K"));
  return out;
}

std::string withDataParallel(const std::string &dp) {
  return applyEdits(kBase, {set("/data_parallel", dp)});
}

TEST(Units, DefaultIsTorchtitanWithDefaultPolicy) {
  auto r =
      loadSpec(withDataParallel(
                   R"({"replicate_axes": ["ddp"], "shard_axes": ["fsdp"]})"),
               "");
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->spec.dataParallel.units, UnitGrouping::Torchtitan);
  EXPECT_EQ(r->spec.dataParallel.reshardAfterForward, ReshardPolicy::Default);
  EXPECT_EQ(unitNames(*r),
            (std::vector<std::string>{"tok_embeddings R", "layers.0 R",
                                      "layers.1 R", "norm+output K"}));
  std::vector<std::string> last;
  for (int p : r->units.back().params)
    last.push_back(r->params[p].name);
  EXPECT_EQ(last, (std::vector<std::string>{"norm.weight", "output.weight"}));
}

TEST(Units, PolicyStringsAndBooleans) {
  auto units = [](const std::string &dp) {
    auto r = loadSpec(withDataParallel(dp), "");
    EXPECT_TRUE(succeeds(r));
    return r ? unitNames(*r) : std::vector<std::string>{};
  };
  std::vector<std::string> always = {"tok_embeddings R", "layers.0 R",
                                     "layers.1 R", "norm+output R"};
  std::vector<std::string> never = {"tok_embeddings K", "layers.0 K",
                                    "layers.1 K", "norm+output K"};
  const std::string axes =
      R"("replicate_axes": ["ddp"], "shard_axes": ["fsdp"], )";
  EXPECT_EQ(units("{" + axes + R"("reshard_after_forward": "always"})"),
            always);
  EXPECT_EQ(units("{" + axes + R"("reshard_after_forward": true})"), always);
  EXPECT_EQ(units("{" + axes + R"("reshard_after_forward": "never"})"), never);
  EXPECT_EQ(units("{" + axes + R"("reshard_after_forward": false})"), never);
  // per_module: each top-level module and block; default keeps the last.
  EXPECT_EQ(units("{" + axes + R"("units": "per_module"})"),
            (std::vector<std::string>{"tok_embeddings R", "layers.0 R",
                                      "layers.1 R", "norm R", "output K"}));
}

TEST(Units, ExplicitGrouping) {
  auto r = loadSpec(
      withDataParallel(
          R"({"replicate_axes": ["ddp"], "shard_axes": ["fsdp"], "units": [
            ["layers.1", "norm.weight"], ["output"],
            ["tok_embeddings", "layers.0"]]})"),
      "");
  ASSERT_TRUE(succeeds(r));
  EXPECT_EQ(r->spec.dataParallel.units, UnitGrouping::Explicit);
  // Forward order of each unit's first parameter; default policy keeps the
  // last unit gathered.
  EXPECT_EQ(unitNames(*r),
            (std::vector<std::string>{"tok_embeddings+layers.0 R",
                                      "layers.1+norm.weight R", "output K"}));
  EXPECT_EQ(r->units[0].params.size(), 1u + 9u);
  EXPECT_EQ(r->units[1].params.size(), 9u + 1u);
}

TEST(SpecErrors, TpNotDividingAWeightDim) {
  // A model whose ffn dim (4000) is not divisible by tp=64 but whose heads
  // are.
  auto model = std::make_shared<Model>(
      buildTransformer({"odd", 4096, 1, 64, 64, 4000, 1024}));
  auto spec = parseSpec(R"({
    "model": "odd",
    "mesh": {"axes": [{"name": "tp", "size": 64}]},
    "tensor_parallel": {"axis": "tp", "plan": [
      {"pattern": "layers.*.attention.w?", "style": "colwise"},
      {"pattern": "layers.*.feed_forward.w1", "style": "colwise"}]}
  })");
  ASSERT_TRUE(succeeds(spec));
  EXPECT_TRUE(failsWith(
      resolveSpec(*spec, model),
      "/tensor_parallel/plan/1: colwise over \"tp\" (size 64) splits dim 0 of "
      "\"layers.0.feed_forward.w1.weight\" (shape [4000, 4096]), but 64 does "
      "not divide 4000"));
}

TEST(SpecErrors, Float8NeedsDimsDivisibleBy16) {
  auto model =
      std::make_shared<Model>(buildTransformer({"odd", 64, 1, 4, 2, 120, 256}));
  auto spec = parseSpec(R"({
    "model": "odd",
    "mesh": {"axes": [{"name": "fsdp", "size": 2}]},
    "data_parallel": {"shard_axes": ["fsdp"]},
    "float8": {"all_gather": true}
  })");
  ASSERT_TRUE(succeeds(spec));
  EXPECT_TRUE(failsWith(resolveSpec(*spec, model),
                        "/float8: linear \"layers.0.feed_forward.w1\" has "
                        "weight shape [120, 64]; float8 matmuls need both "
                        "dims divisible by 16"));
}

TEST(SpecErrors, WorldSizeOption) {
  SpecOptions options;
  options.worldSize = 32;
  EXPECT_TRUE(failsWith(parseSpec(kBase, options),
                        "/mesh/axes: the mesh has 16 devices (ddp=2 x fsdp=2 "
                        "x cp=2 x tp=2), but the world size is 32"));
  options.worldSize = 16;
  EXPECT_TRUE(succeeds(parseSpec(kBase, options)));
}

TEST(SpecErrors, MalformedJson) {
  EXPECT_TRUE(
      failsWith(parseSpec("{\n  \"model\": \"tiny\",\n  \"mesh\": {,\n}"),
                "line 3, column 12: syntax error while parsing object "
                "key"));
  EXPECT_TRUE(failsWith(parseSpec("{\"model\": \"tiny\"} trailing"),
                        "line 1, column 21: syntax error"));
  // A raw newline inside a string is reported where it is, at the end of
  // line 1 (nlohmann alone would say "line 2, column 0").
  EXPECT_TRUE(failsWith(parseSpec("{\"model\": \"ti\nny\"}"),
                        "line 1, column 14: syntax error while parsing value "
                        "- invalid string: control character U+000A (LF)"));
  // Invalid UTF-8 is quoted as hex escapes, so messages stay valid text.
  auto bad = parseSpec("{\"model\": \"\xff\xfe\"}");
  EXPECT_TRUE(failsWith(bad, "line 1, column 12: syntax error"));
  EXPECT_NE(bad.error().message.find("\\xFF"), std::string::npos)
      << bad.error().message;
  EXPECT_EQ(bad.error().message.find('\xff'), std::string::npos);
  EXPECT_TRUE(failsWith(parseSpec("\xff"), "line 1, column 1: syntax error"));
  EXPECT_TRUE(
      failsWith(parseSpec("[1, 2]"), "/: expected an object, got an array"));
  EXPECT_TRUE(failsWith(
      parseSpec(R"({"model": "tiny", "mesh": {"axes": [], "axes": []}})"),
      "/mesh/axes: duplicate key"));
}

TEST(SpecErrors, FileErrorsNameTheFile) {
  EXPECT_TRUE(failsWith(loadSpecFile("/nonexistent/spec.json"),
                        "cannot read \"/nonexistent/spec.json\""));
  // An error inside a model file names that file, not the spec.
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "meshplan-frontend-test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "model.json") << R"({"name": "m", "modules": [
      {"name": "x", "kind": "lineer", "parameters": []}]})";
    std::ofstream(dir / "spec.json") << R"({"model": "model.json",
      "mesh": {"axes": [{"name": "dp", "size": 2}]},
      "data_parallel": {"shard_axes": ["dp"]}})";
    std::ofstream(dir / "bad-spec.json") << R"({"model": "model.json",
      "mesh": {"axes": [{"name": "dp", "size": 2}]}})";
  }
  std::string d = dir.string();
  EXPECT_TRUE(failsWith(loadSpecFile(d + "/spec.json"),
                        d + "/model.json: /modules/0/kind: unknown kind "
                            "\"lineer\""));
  EXPECT_TRUE(failsWith(loadSpecFile(d + "/bad-spec.json"),
                        d + "/bad-spec.json: /mesh/axes/0/name: axis \"dp\" "
                            "has no role"));
  std::filesystem::remove_all(dir);
}

//===----------------------------------------------------------------------===//
// Random mutations
//===----------------------------------------------------------------------===//

/// Applies one random structural edit and maybe damages the text.
std::string mutate(const Json &doc, const std::vector<std::string> &pointers,
                   std::mt19937 &rng) {
  static const std::vector<Json> values = {
      nullptr,
      true,
      false,
      0,
      1,
      -1,
      2,
      3,
      1.5,
      1e300,
      -1e300,
      "",
      "x",
      "tp",
      "fsdp",
      "ddp",
      "colwise",
      "bfloat16",
      "layers.*",
      "**",
      "output",
      "tiny",
      "llama3-8b",
      Json::array(),
      Json::object(),
      Json::array({"tp"}),
      Json::array({1, 2}),
      Json::object({{"name", "tp"}, {"size", 2}}),
      static_cast<uint64_t>(18446744073709551615ull),
      static_cast<int64_t>(INT64_MIN)};
  static const std::vector<std::string> keys = {
      "model",   "mesh",  "axes",   "name",    "size", "shard_axes", "plan",
      "pattern", "style", "float8", "modules", "seed", "betas",      "bogus"};
  Json mutated = doc;
  const std::string &where = pointers[rng() % pointers.size()];
  Json::json_pointer ptr(where);
  Json &target = mutated[ptr];
  switch (rng() % 4) {
  case 0: // delete a key or element
    if (!where.empty()) {
      Json &parent = mutated[ptr.parent_pointer()];
      if (parent.is_object())
        parent.erase(ptr.back());
      else
        parent.erase(std::stoul(ptr.back()));
    }
    break;
  case 1: // change a value (usually its type)
    target = values[rng() % values.size()];
    break;
  case 2: // add a key or element
    if (target.is_object())
      target[keys[rng() % keys.size()]] = values[rng() % values.size()];
    else if (target.is_array())
      target.push_back(values[rng() % values.size()]);
    break;
  case 3: // duplicate an array element
    if (target.is_array() && !target.empty())
      target.push_back(target[rng() % target.size()]);
    break;
  }
  std::string text = mutated.dump(rng() % 2 ? 2 : -1);
  switch (rng() % 6) {
  case 0: { // insert garbage
    static const std::string garbage[] = {
        "{", "}", "[",    "]",  ",",  ":",   "\"",    "\\",    "x",
        "0", "-", "\xff", "\n", "/*", "nul", "1e999", "\"a\":"};
    text.insert(rng() % (text.size() + 1),
                garbage[rng() % (sizeof garbage / sizeof garbage[0])]);
    break;
  }
  case 1: // truncate
    text.resize(rng() % (text.size() + 1));
    break;
  case 2: { // drop a random byte range
    size_t at = rng() % (text.size() + 1);
    text.erase(at, rng() % 8);
    break;
  }
  default:
    break;
  }
  return text;
}

TEST(SpecErrors, RandomMutationsNeverCrash) {
  std::vector<std::string> sources = {kBase};
  for (const char *name :
       {"fsdp-fp8-3d.json", "hsdp-managed.json", "fsdp-tp.json",
        "fsdp-sr-adamw.json", "llama3-405b-4d.json"})
    sources.push_back(testutil::readText(kExamples + "/" + name));
  std::mt19937 rng(20240611);
  int located = 0, accepted = 0;
  for (size_t s = 0; s < sources.size(); ++s) {
    Json doc = Json::parse(sources[s]);
    // The 405b example is the slowest to resolve; mutate it on the tiny
    // model so the sweep stays fast (its structure is what matters).
    if (doc["model"] == "llama3-405b")
      doc["model"] = "tiny";
    std::vector<std::string> pointers;
    testutil::collectPointers(doc, "", pointers);
    for (int iter = 0; iter < 400; ++iter) {
      std::string text = mutate(doc, pointers, rng);
      auto result = loadSpec(text, kExamples);
      if (result.ok()) {
        ++accepted;
        continue;
      }
      const std::string &message = result.error().message;
      ++located;
      EXPECT_TRUE(testutil::isLocated(message))
          << "unlocated error: " << message << "\nfor:\n"
          << text;
    }
  }
  EXPECT_GT(located, 1000);
  EXPECT_GT(accepted, 50);
}

} // namespace
