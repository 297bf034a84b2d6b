//===- PlanFormatTest.cpp - Plan reader, validator and writer -------------===//

#include "PlanTestHelpers.h"

// White-box: reading into a reused plan (what readPlanDirectory does).
#include "../../lib/Plan/PlanRead.h"

#include <nlohmann/json.hpp>

using namespace plantest;
using Json = nlohmann::ordered_json;

namespace {

// Rank 1 = (dp 0, tp 1) of a 2x2 mesh. Buffers 0-2 and instructions 0-3 are
// the original small plan; the rest adds what version 2 introduced: the
// optimizer's state and gradient shard, a float32 parameter cast to float8
// with a scale read from a MAX-reduced amax buffer and gathered as float8,
// and a fused AdamW update.
const char *kSmallPlan = R"json({
 "format": "meshplan.plan",
 "version": 2,
 "mesh": {"axes":[{"name":"dp","size":2},{"name":"tp","size":2}]},
 "rank": 1,
 "communicators": [
  {"id":"tp","ranks":[0,1],"color":0,"key":1,"axes":["tp"],"view":"slice(tp)","fault_tolerant":false},
  {"id":"dp","ranks":[1,3],"color":1,"key":0,"axes":["dp"],"view":null,"fault_tolerant":false}
 ],
 "buffers": [
  {"id":"w","kind":"param_shard","dtype":"bfloat16","global_shape":[8,4],"local_shape":[4,4],"offset":[0,0],"layout":"[{dp}, {}]","tensor":"layers.0.w","tensor_id":0},
  {"id":"w.full","kind":"gathered","dtype":"bfloat16","global_shape":[8,4],"local_shape":[8,4],"offset":[0,0],"layout":"[{}, {}]","tensor":"layers.0.w"},
  {"id":"g","kind":"gradient","dtype":"float32","global_shape":[8,4],"local_shape":[4,4],"offset":[4,0],"layout":"[{tp}, {}] partial(avg)={dp}"},
  {"id":"w.grad","kind":"gradient","dtype":"float32","global_shape":[8,4],"local_shape":[4,4],"offset":[0,0],"layout":"[{dp}, {}]","tensor":"layers.0.w"},
  {"id":"w.exp_avg","kind":"optimizer_state","dtype":"float32","global_shape":[8,4],"local_shape":[4,4],"offset":[0,0],"layout":"[{dp}, {}]","tensor":"layers.0.w"},
  {"id":"w.exp_avg_sq","kind":"optimizer_state","dtype":"float32","global_shape":[8,4],"local_shape":[4,4],"offset":[0,0],"layout":"[{dp}, {}]","tensor":"layers.0.w"},
  {"id":"x","kind":"param_shard","dtype":"float32","global_shape":[8],"local_shape":[4],"offset":[4],"layout":"[{tp}]","tensor":"layers.0.x","tensor_id":1},
  {"id":"amax","kind":"scratch","dtype":"float32","global_shape":[2],"local_shape":[2],"offset":[0],"layout":"[{}]"},
  {"id":"x.fp8","kind":"scratch","dtype":"float8_e4m3fn","global_shape":[8],"local_shape":[4],"offset":[4],"layout":"[{tp}]","tensor":"layers.0.x","scale":{"amax":"amax","index":1,"power_of_2":true}},
  {"id":"x.full","kind":"gathered","dtype":"float8_e4m3fn","global_shape":[8],"local_shape":[8],"offset":[0],"layout":"[{}]","tensor":"layers.0.x","scale":{"amax":"amax","index":1,"power_of_2":true}}
 ],
 "streams": ["compute","comm"],
 "program": [
  {"id":"ag","stream":"comm","op":"all_gather","comm":"tp","dtype":"bfloat16","count":16,"inputs":["w"],"outputs":["w.full"],"label":"all-gather w"},
  {"id":"fwd","stream":"compute","op":"compute","inputs":["w.full"],"deps":["ag"],"label":"forward layers.0","phase":"forward","unit":"layers.0","microbatch":0},
  {"id":"free","stream":"compute","op":"free","inputs":["w.full"]},
  {"id":"ar","stream":"comm","op":"all_reduce","comm":"dp","dtype":"float32","count":16,"reduce":"avg","inputs":["g"],"outputs":["g"],"deps":["fwd"]},
  {"id":"amax.x","stream":"compute","op":"fp8_amax","dtype":"float32","inputs":["x"],"outputs":["amax"]},
  {"id":"ar.amax","stream":"comm","op":"all_reduce","comm":"tp","dtype":"float32","count":2,"reduce":"max","inputs":["amax"],"outputs":["amax"],"deps":["amax.x"]},
  {"id":"cast.x","stream":"compute","op":"fp8_cast","dtype":"float8_e4m3fn","inputs":["x","amax"],"outputs":["x.fp8"],"deps":["ar.amax"]},
  {"id":"ag.x","stream":"comm","op":"all_gather","comm":"tp","dtype":"float8_e4m3fn","count":4,"inputs":["x.fp8"],"outputs":["x.full"],"deps":["cast.x"]},
  {"id":"bwd","stream":"compute","op":"compute","inputs":["x.full","w.grad"],"outputs":["w.grad"],"deps":["ag.x"],"label":"backward layers.0 (microbatch 1)","phase":"backward","unit":"layers.0","microbatch":1},
  {"id":"opt","stream":"compute","op":"optimizer_update","inputs":["w","w.grad","w.exp_avg","w.exp_avg_sq"],"outputs":["w","w.exp_avg","w.exp_avg_sq"],"label":"adamw layers.0"}
 ],
 "optimizer": {"name":"adamw","lr":0.001,"beta1":0.9,"beta2":0.95,"eps":1e-08,"weight_decay":0.1,"stochastic_rounding":true,"seed":7},
 "estimates": {"peak_memory_bytes":{"gathered":64,"param_shard":32},"bytes_per_step_per_comm":{"dp":64,"tp":32}}
}
)json";

std::string errorOf(const std::string &text) {
  Result<Plan> p = parsePlan(text);
  return p.ok() ? std::string("<ok>") : p.error().message;
}

/// Applies `edit` to the small plan's JSON and returns the reader's error.
template <typename F> std::string mutated(F edit) {
  Json j = Json::parse(kSmallPlan);
  edit(j);
  return errorOf(j.dump());
}

TEST(PlanFormat, SmallPlanReads) {
  Result<Plan> p = parsePlan(kSmallPlan);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->rank, 1);
  ASSERT_EQ(p->program.size(), 10u);
  EXPECT_EQ(p->program[3].reduce, ReduceOp::Avg);
  EXPECT_EQ(p->communicators[0].view, std::optional<std::string>("slice(tp)"));
  EXPECT_FALSE(p->communicators[1].view.has_value());
  // Version 2's fields.
  ASSERT_EQ(p->buffers.size(), 10u);
  EXPECT_EQ(p->buffers[0].layout, "[{dp}, {}]");
  EXPECT_EQ(p->buffers[0].tensor, "layers.0.w");
  EXPECT_EQ(p->buffers[0].tensorId, std::optional<int64_t>(0));
  EXPECT_EQ(p->buffers[2].layout, "[{tp}, {}] partial(avg)={dp}");
  EXPECT_EQ(p->buffers[2].tensor, "");
  EXPECT_FALSE(p->buffers[2].tensorId.has_value());
  EXPECT_FALSE(p->buffers[2].scale.has_value());
  EXPECT_EQ(p->buffers[8].scale, (Fp8Scale{"amax", 1, true}));
  EXPECT_EQ(p->program[1].phase, "forward");
  EXPECT_EQ(p->program[1].unit, "layers.0");
  EXPECT_EQ(p->program[1].microbatch, 0);
  EXPECT_EQ(p->program[8].phase, "backward");
  EXPECT_EQ(p->program[8].microbatch, 1);
  EXPECT_EQ(p->program[0].phase, "");
  OptimizerConfig adamw{"adamw", 1e-3, 0.9, 0.95, 1e-8, 0.1, true, 7};
  EXPECT_EQ(p->optimizer, adamw);
  // Writer output reads back to the same plan and is a fixed point.
  std::string text = writePlan(*p);
  Result<Plan> q = parsePlan(text);
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(*p, *q);
  EXPECT_EQ(writePlan(*q), text);
}

TEST(PlanFormat, SynthesizedPlansRoundTripExactly) {
  std::vector<SynthOptions> cases = {
      mixedOptions(2, 2, 2), mixedOptions(4, 4, 4), mixedOptions(2, 4, 2, 3)};
  SynthOptions ordered = mixedOptions(2, 2, 4);
  ordered.order = std::vector<int64_t>{};
  for (int64_t i = 0; i < 16; ++i)
    ordered.order->push_back((i * 5) % 16);
  cases.push_back(ordered);
  SynthOptions sparse = mixedOptions(2, 2, 2);
  sparse.order = std::vector<int64_t>{64, 65, 66, 67, 68, 69, 70, 71};
  sparse.dtype = DType::BFloat16;
  cases.push_back(sparse);
  for (const SynthOptions &o : cases) {
    std::vector<Plan> plans = synthesize(o);
    for (const Plan &p : plans) {
      ASSERT_TRUE(validatePlan(p).ok())
          << "rank " << p.rank << ": " << validatePlan(p).error().message;
      std::string text = writePlan(p);
      Result<Plan> q = parsePlan(text);
      ASSERT_TRUE(q.ok()) << q.error().message;
      EXPECT_EQ(*q, p) << "rank " << p.rank;
      EXPECT_EQ(writePlan(*q), text);
    }
  }
}

TEST(PlanFormat, MalformedDocuments) {
  EXPECT_EQ(errorOf("{\"format\": \"meshplan.plan\",\n \"version\": }"),
            "line 2, column 13: syntax error while parsing value - unexpected "
            "'}'; expected '[', '{', or a literal");
  EXPECT_EQ(errorOf("[1]"), "/: expected a plan object, got an array");
  EXPECT_EQ(errorOf("{\"format\":\"meshplan.plan\",\"format\":\"x\"}"),
            "/format: duplicate key");
  std::string deepPointer;
  for (int i = 0; i < 32; ++i)
    deepPointer += "/0";
  EXPECT_EQ(errorOf(std::string(100, '[') + std::string(100, ']')),
            deepPointer + ": nested deeper than 32 levels");
  EXPECT_EQ(errorOf("{\"version\":1}"),
            "/: missing required key \"format\" (a meshplan plan starts with "
            "\"format\": \"meshplan.plan\")");
  EXPECT_EQ(mutated([](Json &j) { j["format"] = "meshplan.spec"; }),
            "/format: expected \"meshplan.plan\", got string "
            "\"meshplan.spec\"");
  // Version 1 plans (no layouts, callbacks or optimizer) are refused by
  // their version, before anything else is read.
  EXPECT_EQ(mutated([](Json &j) { j["version"] = 1; }),
            "/version: unsupported plan version 1; this meshplan reads "
            "version 2");
  EXPECT_EQ(mutated([](Json &j) { j["version"] = 3; }),
            "/version: unsupported plan version 3; this meshplan reads "
            "version 2");
  EXPECT_EQ(mutated([](Json &j) {
              j["version"] = 1;
              for (Json &b : j["buffers"])
                b.erase("layout");
            }),
            "/version: unsupported plan version 1; this meshplan reads "
            "version 2");
  EXPECT_EQ(mutated([](Json &j) { j["extra"] = 1; }),
            "/extra: unknown key; expected one of format, version, mesh, "
            "rank, communicators, buffers, streams, program, optimizer, "
            "estimates");
  EXPECT_EQ(mutated([](Json &j) { j.erase("streams"); }),
            "/streams: missing required key; expected an array of strings");
}

TEST(PlanFormat, ErrorsNameTheJsonPointer) {
  struct Case {
    std::function<void(Json &)> edit;
    std::string error;
  };
  std::vector<Case> cases = {
      {[](Json &j) { j["program"][3]["comm"] = "c9"; },
       "/program/3/comm: unknown communicator \"c9\""},
      {[](Json &j) { j["program"][1]["deps"][0] = "nope"; },
       "/program/1/deps/0: unknown instruction \"nope\""},
      {[](Json &j) { j["program"][1]["deps"][0] = "fwd"; },
       "/program/1/deps/0: instruction \"fwd\" depends on itself"},
      {[](Json &j) { j["program"][2]["id"] = "ag"; },
       "/program/2/id: duplicate instruction id \"ag\" (also /program/0)"},
      {[](Json &j) { j["program"][0]["stream"] = "comm2"; },
       "/program/0/stream: unknown stream \"comm2\" (streams: compute, "
       "comm)"},
      {[](Json &j) { j["program"][0]["inputs"][0] = "v"; },
       "/program/0/inputs/0: unknown buffer \"v\""},
      {[](Json &j) { j["program"][0]["op"] = "allgather"; },
       "/program/0/op: unknown op \"allgather\"; expected one of "
       "all_gather, reduce_scatter, all_reduce, all_to_all, permute, "
       "broadcast, send, recv, fp8_amax, fp8_cast, cast, sum, accumulate, "
       "compute, "
       "optimizer_update, free, wait, grad_norm, clip_grad (did you mean "
       "\"all_gather\"?)"},
      {[](Json &j) { j["program"][0].erase("count"); },
       "/program/0: all_gather needs \"count\""},
      {[](Json &j) { j["program"][0]["count"] = -1; },
       "/program/0/count: expected an integer in [0, 1125899906842624], "
       "got -1"},
      {[](Json &j) { j["program"][0]["count"] = "16"; },
       "/program/0/count: expected an integer, got string \"16\""},
      {[](Json &j) { j["program"][0]["reduce"] = "sum"; },
       "/program/0/reduce: all_gather takes no reduce op (only "
       "reduce_scatter and all_reduce do)"},
      {[](Json &j) { j["program"][3].erase("reduce"); },
       "/program/3: all_reduce needs \"reduce\""},
      {[](Json &j) { j["program"][3]["reduce"] = "median"; },
       "/program/3/reduce: unknown reduce op \"median\"; expected one of sum, "
       "avg, max, min, product"},
      {[](Json &j) { j["program"][1]["comm"] = "tp"; },
       "/program/1/comm: compute is not a collective and takes no comm"},
      {[](Json &j) { j["program"][0]["dtype"] = "fp32"; },
       "/program/0/dtype: unknown dtype \"fp32\"; expected one of float32, "
       "bfloat16, float16, float8_e4m3fn, float8_e5m2, float64, int8, "
       "uint8, int32, int64"},
      {[](Json &j) { j["rank"] = 4; },
       "/rank: rank 4 is not in the mesh (ranks 0..3)"},
      {[](Json &j) { j["communicators"][1]["id"] = "tp"; },
       "/communicators/1/id: duplicate communicator id \"tp\" (also "
       "/communicators/0)"},
      {[](Json &j) {
         j["communicators"][1]["ranks"] = {0, 2};
       },
       "/communicators/1/ranks: this plan's rank 1 is not a member of "
       "communicator \"dp\""},
      {[](Json &j) {
         j["communicators"][1]["ranks"] = {1, 7};
       },
       "/communicators/1/ranks/1: rank 7 is not in the mesh (ranks 0..3)"},
      {[](Json &j) {
         j["communicators"][1]["ranks"] = {1, 1};
       },
       "/communicators/1/ranks/1: rank 1 is listed twice"},
      {[](Json &j) { j["communicators"][1]["key"] = 1; },
       "/communicators/1/key: key 1 but rank 1 is at index 0 of ranks"},
      {[](Json &j) {
         j["communicators"][1]["ranks"] = {3, 1};
         j["communicators"][1]["key"] = 1;
       },
       "/communicators/1/ranks: [3,1] but axes [dp] give rank 1 the group "
       "[1,3]"},
      {[](Json &j) { j["communicators"][1]["color"] = 0; },
       "/communicators/1/color: color 0 but the axes give color 1"},
      {[](Json &j) { j["communicators"][1]["axes"] = {"dp:(2)2"}; },
       "/communicators/1/axes: /0: sub-axis \"dp\":(2)2: pre-size * size "
       "(4) must divide the size of dp (2)"},
      {[](Json &j) { j["communicators"][1]["axes"] = {"pp"}; },
       "/communicators/1/axes: /0: axis \"pp\" is not in the mesh (axes: "
       "dp, tp)"},
      {[](Json &j) {
         j["buffers"][2]["offset"] = {6, 0};
       },
       "/buffers/2/local_shape: dim 0: [6, +4) does not fit in the global "
       "size 8"},
      {[](Json &j) { j["buffers"][2]["offset"] = {6}; },
       "/buffers/2/offset: has 1 dims but global_shape has 2"},
      {[](Json &j) { j["buffers"][1]["kind"] = "weights"; },
       "/buffers/1/kind: unknown buffer kind \"weights\"; expected one of "
       "param_shard, gathered, gradient, optimizer_state, activation, "
       "scratch"},
      {[](Json &j) {
         j["streams"] = {"comm", "comm"};
       },
       "/streams/1: duplicate stream \"comm\""},
      {[](Json &j) { j["mesh"]["axes"][1]["size"] = 0; },
       "/mesh/axes/1/size: expected an integer >= 1, got 0"},
      {[](Json &j) { j["mesh"]["managed"] = {"pp"}; },
       "/mesh/managed/0: axis \"pp\" is not in the mesh"},
      {[](Json &j) { j["mesh"]["pipeline"] = "pp"; },
       "/mesh/pipeline: axis \"pp\" is not in the mesh"},
      {[](Json &j) {
         j["mesh"]["managed"] = {"dp"};
         j["mesh"]["pipeline"] = "dp";
       },
       "/mesh/pipeline: axis \"dp\" is managed; a pipeline axis cannot be"},
      {[](Json &j) { j["mesh"]["pipeline"] = 1; },
       "/mesh/pipeline: expected a string, got integer 1"},
      {[](Json &j) {
         j["mesh"]["device_order"] = {0, 1, 2};
       },
       "/mesh: device order lists 3 ranks but the mesh has 4 devices"},
      {[](Json &j) { j["estimates"]["bytes_per_step_per_comm"]["c9"] = 1; },
       "/estimates/bytes_per_step_per_comm/c9: unknown communicator \"c9\""},
      {[](Json &j) { j["communicators"][0]["colour"] = 1; },
       "/communicators/0/colour: unknown key; expected one of id, ranks, "
       "color, key, axes, view, fault_tolerant (did you mean \"color\"?)"},
      {[](Json &j) { j["program"][0]["op"] = "broadcast"; },
       "/program/0: broadcast needs \"root\""},
      {[](Json &j) {
         j["program"][0]["op"] = "broadcast";
         j["program"][0]["root"] = 2;
       },
       "/program/0/root: root 2 is not a key of communicator \"tp\" (size "
       "2)"},
  };
  for (const Case &c : cases)
    EXPECT_EQ(mutated(c.edit), c.error);
}

/// Version 2: what a runtime needs to execute a plan without deriving
/// anything. One located error per check.
TEST(PlanFormat, Version2ErrorsNameTheJsonPointer) {
  struct Case {
    std::function<void(Json &)> edit;
    std::string error;
  };
  Json scale = {{"amax", "amax"}, {"index", 0}, {"power_of_2", false}};
  std::vector<Case> cases = {
      // Layouts: required, parsed over the root mesh, this rank's box.
      {[](Json &j) { j["buffers"][1].erase("layout"); },
       "/buffers/1/layout: missing required key; expected a string"},
      {[](Json &j) { j["buffers"][1]["layout"] = "{}, {}"; },
       "/buffers/1/layout: layout \"{}, {}\" must start with '[' as in [{tp, "
       "dp}, {}]"},
      {[](Json &j) { j["buffers"][1]["layout"] = "[{pp}, {}]"; },
       "/buffers/1/layout: layout dim 0: axis \"pp\" is not in the view "
       "(axes: dp, tp)"},
      {[](Json &j) { j["buffers"][1]["layout"] = "[{}]"; },
       "/buffers/1/layout: the layout has 1 dims but global_shape has 2"},
      {[](Json &j) { j["buffers"][0]["layout"] = "[{tp}, {}]"; },
       "/buffers/0/layout: gives rank 1 the box [4,0] + [4,4], but the "
       "buffer says [0,0] + [4,4]"},
      {[](Json &j) { j["buffers"][1]["layout"] = "[{}, {dp}]"; },
       "/buffers/1/layout: gives rank 1 the box [0,0] + [8,2], but the "
       "buffer says [0,0] + [8,4]"},
      // Tensor ids: on every param_shard, unique, nowhere else.
      {[](Json &j) { j["buffers"][0].erase("tensor_id"); },
       "/buffers/0: a param_shard needs \"tensor_id\""},
      {[](Json &j) { j["buffers"][6]["tensor_id"] = 0; },
       "/buffers/6/tensor_id: tensor_id 0 is also /buffers/0"},
      {[](Json &j) { j["buffers"][3]["tensor_id"] = 5; },
       "/buffers/3/tensor_id: only a param_shard has a tensor_id"},
      {[](Json &j) { j["buffers"][0]["tensor_id"] = -1; },
       "/buffers/0/tensor_id: expected an integer >= 0, got -1"},
      {[](Json &j) { j["buffers"][0]["tensor"] = 3; },
       "/buffers/0/tensor: expected a string, got integer 3"},
      // Float8 scales: on every float8 buffer, nowhere else; the amax is a
      // 1-D float32 buffer with the element they read.
      {[](Json &j) { j["buffers"][8].erase("scale"); },
       "/buffers/8: a float8 buffer needs \"scale\""},
      {[&](Json &j) { j["buffers"][7]["scale"] = scale; },
       "/buffers/7/scale: only a float8 buffer has a scale"},
      {[](Json &j) { j["buffers"][9]["scale"]["amax"] = "nope"; },
       "/buffers/9/scale/amax: unknown buffer \"nope\""},
      {[](Json &j) { j["buffers"][9]["scale"]["amax"] = "w.exp_avg"; },
       "/buffers/9/scale/amax: \"w.exp_avg\" is not a 1-D float32 buffer"},
      {[](Json &j) { j["buffers"][9]["scale"]["index"] = 2; },
       "/buffers/9/scale/index: index 2 but \"amax\" has 2 elements"},
      {[](Json &j) { j["buffers"][9]["scale"].erase("power_of_2"); },
       "/buffers/9/scale/power_of_2: missing required key; expected a "
       "boolean"},
      {[](Json &j) { j["buffers"][9]["scale"]["scaling"] = "rowwise"; },
       "/buffers/9/scale/scaling: unknown key; expected one of amax, index, "
       "power_of_2"},
      // Compute callbacks: phase, unit and microbatch on compute only.
      {[](Json &j) { j["program"][1].erase("phase"); },
       "/program/1: compute needs \"phase\""},
      {[](Json &j) { j["program"][1].erase("unit"); },
       "/program/1: compute needs \"unit\""},
      {[](Json &j) { j["program"][8].erase("microbatch"); },
       "/program/8: compute needs \"microbatch\""},
      {[](Json &j) { j["program"][1]["phase"] = "sideways"; },
       "/program/1/phase: phase must be \"forward\", \"backward\", "
       "\"backward_input\" or \"backward_weight\", not \"sideways\""},
      {[](Json &j) { j["program"][1]["unit"] = ""; },
       "/program/1/unit: unit is empty"},
      {[](Json &j) { j["program"][8]["microbatch"] = -1; },
       "/program/8/microbatch: expected an integer >= 0, got -1"},
      {[](Json &j) { j["program"][0]["phase"] = "forward"; },
       "/program/0/phase: all_gather takes no phase (only compute does)"},
      {[](Json &j) { j["program"][9]["unit"] = "layers.0"; },
       "/program/9/unit: optimizer_update takes no unit (only compute does)"},
      {[](Json &j) { j["program"][2]["microbatch"] = 0; },
       "/program/2/microbatch: free takes no microbatch (only compute does)"},
      // optimizer_update: (param, grad, exp_avg, exp_avg_sq) per parameter,
      // updated in place, one shard, float32 state and gradient, the
      // parameter bf16 exactly when stochastically rounded.
      {[](Json &j) { j["program"][9]["inputs"].erase(3); },
       "/program/9: optimizer_update needs inputs (param, grad, exp_avg, "
       "exp_avg_sq) per parameter and outputs (param, exp_avg, exp_avg_sq)"},
      {[](Json &j) { j["program"][9]["outputs"].erase(2); },
       "/program/9: optimizer_update needs inputs (param, grad, exp_avg, "
       "exp_avg_sq) per parameter and outputs (param, exp_avg, exp_avg_sq)"},
      {[](Json &j) { j["program"][9]["outputs"][1] = "w.grad"; },
       "/program/9/outputs/0: optimizer_update updates in place: outputs "
       "must be the param, exp_avg and exp_avg_sq inputs"},
      {[](Json &j) { j["program"][9]["inputs"][0] = "w.grad"; },
       "/program/9/inputs/0: \"w.grad\" is not a param_shard"},
      {[](Json &j) { j["program"][9]["inputs"][1] = "g"; },
       "/program/9/inputs/1: \"g\" is not the same shard as \"w\""},
      {[](Json &j) { j["buffers"][4]["dtype"] = "bfloat16"; },
       "/program/9/inputs/2: \"w.exp_avg\" is not float32"},
      {[](Json &j) { j["buffers"][3]["dtype"] = "bfloat16"; },
       "/program/9/inputs/1: \"w.grad\" is not float32"},
      {[](Json &j) { j["optimizer"]["stochastic_rounding"] = false; },
       "/program/9/inputs/0: AdamW without stochastic rounding needs "
       "float32 parameters, \"w\" is bfloat16"},
      {[](Json &j) {
         for (int b : {0, 1})
           j["buffers"][b]["dtype"] = "float32";
         j["program"][0]["dtype"] = "float32";
       },
       "/program/9/inputs/0: stochastic rounding needs bfloat16 parameters, "
       "\"w\" is float32"},
      // fp8_cast: the sources parallel to the outputs, then the amax
      // buffers their scales read.
      {[](Json &j) {
         j["program"][6]["inputs"] = {"amax", "x"};
       },
       "/program/6/inputs/0: \"amax\" and \"x.fp8\" have different local "
       "shapes"},
      {[](Json &j) { j["program"][6]["inputs"] = {"x"}; },
       "/program/6/outputs/0: the scale of \"x.fp8\" reads \"amax\", which "
       "is not an input"},
      {[](Json &j) { j["program"][6]["inputs"] = Json::array(); },
       "/program/6: fp8_cast needs one source input per output, then the "
       "amax buffers"},
      {[](Json &j) { j["program"][6]["outputs"] = {"w.grad"}; },
       "/program/6/outputs/0: \"w.grad\" is not a float8 buffer"},
      // Cast, sum and collectives: one input per output.
      {[](Json &j) { j["program"][0]["outputs"].push_back("g"); },
       "/program/0: all_gather needs one input per output"},
      {[](Json &j) { j["program"][3]["inputs"].push_back("w.grad"); },
       "/program/3: all_reduce needs one input per output"},
      {[](Json &j) {
         j["program"][4]["op"] = "cast";
         j["program"][4]["inputs"].push_back("w");
       },
       "/program/4: cast needs one input per output"},
      // The optimizer: required with an optimizer_update, closed, in range.
      {[](Json &j) { j.erase("optimizer"); },
       "/program/9: optimizer_update, but the plan has no \"optimizer\""},
      {[](Json &j) { j["optimizer"]["name"] = "sgd"; },
       "/optimizer/name: unknown optimizer \"sgd\" (this runtime has adamw)"},
      {[](Json &j) { j["optimizer"]["lr"] = -1; },
       "/optimizer/lr: lr must be in [0, 1e6]"},
      {[](Json &j) { j["optimizer"]["beta1"] = 1; },
       "/optimizer/beta1: beta1 must be in [0, 1)"},
      {[](Json &j) { j["optimizer"]["beta2"] = -0.5; },
       "/optimizer/beta2: beta2 must be in [0, 1)"},
      {[](Json &j) { j["optimizer"]["eps"] = 0; },
       "/optimizer/eps: eps must be in (0, 1e6]"},
      {[](Json &j) { j["optimizer"]["weight_decay"] = -0.1; },
       "/optimizer/weight_decay: weight_decay must be in [0, 1e6]"},
      {[](Json &j) { j["optimizer"].erase("seed"); },
       "/optimizer/seed: missing required key; expected an integer"},
      {[](Json &j) { j["optimizer"]["seed"] = 1.5; },
       "/optimizer/seed: expected an integer, got number 1.5"},
      {[](Json &j) { j["optimizer"]["stochastic_rounding"] = "yes"; },
       "/optimizer/stochastic_rounding: expected a boolean, got string "
       "\"yes\""},
      {[](Json &j) { j["optimizer"]["momentum"] = 0.9; },
       "/optimizer/momentum: unknown key; expected one of name, lr, beta1, "
       "beta2, eps, weight_decay, stochastic_rounding, seed, lr_schedule, "
       "max_norm, norm_type, no_decay"},
      {[](Json &j) { j["optimizer"] = "adamw"; },
       "/optimizer: expected an object, got string \"adamw\""},
  };
  for (const Case &c : cases)
    EXPECT_EQ(mutated(c.edit), c.error);
}

/// The small plan with clipping: grad_norm over its one gradient, the
/// all_reduce of the norm buffer over dp, clip_grad before the update; a
/// schedule and a no-decay parameter in the optimizer record.
void addClipping(Json &j) {
  j["buffers"].push_back(Json::parse(
      R"({"id":"norm","kind":"scratch","dtype":"int64","global_shape":[21],"local_shape":[21],"offset":[0],"layout":"[{}]"})"));
  Json &program = j["program"];
  Json update = program[9];
  program.erase(9);
  program.push_back(Json::parse(
      R"({"id":"gn","stream":"compute","op":"grad_norm","inputs":["w.grad"],"outputs":["norm"]})"));
  program.push_back(Json::parse(
      R"({"id":"ar.norm","stream":"comm","op":"all_reduce","comm":"dp","dtype":"int64","count":21,"reduce":"sum","inputs":["norm"],"outputs":["norm"],"deps":["gn"]})"));
  program.push_back(Json::parse(
      R"({"id":"clip","stream":"compute","op":"clip_grad","inputs":["norm","w.grad"],"outputs":["w.grad"],"deps":["ar.norm"]})"));
  program.push_back(update);
  j["optimizer"]["max_norm"] = 1.0;
  j["optimizer"]["norm_type"] = "2";
  j["optimizer"]["lr_schedule"] = Json::parse(
      R"({"warmup_steps":2,"decay_type":"cosine","min_lr_factor":0.1,"total_steps":10})");
  j["optimizer"]["no_decay"] = Json::array({"layers.0.x"});
}

TEST(PlanFormat, ClippingScheduleAndNoDecay) {
  Json j = Json::parse(kSmallPlan);
  addClipping(j);
  Result<Plan> p = parsePlan(j.dump());
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_TRUE(p->optimizer->maxNorm);
  EXPECT_EQ(*p->optimizer->maxNorm, 1.0);
  EXPECT_EQ(p->optimizer->weightDecayOf("layers.0.x"), 0.0);
  EXPECT_EQ(p->optimizer->weightDecayOf("layers.0.w"), 0.1);
  EXPECT_EQ(p->optimizer->lrAt(1), 0.001 * 0.5);
  EXPECT_EQ(p->program[9].op, OpKind::GradNorm);
  // Written and read back unchanged.
  Result<Plan> again = parsePlan(writePlan(*p));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(*again, *p);

  struct Case {
    std::function<void(Json &)> edit;
    std::string error;
  };
  std::vector<Case> cases = {
      {[](Json &j) { j["optimizer"].erase("max_norm"); },
       "/program/9: grad_norm, but the plan's optimizer has no max_norm"},
      {[](Json &j) { j["optimizer"]["max_norm"] = 0; },
       "/optimizer/max_norm: max_norm must be finite and > 0"},
      {[](Json &j) { j["optimizer"]["norm_type"] = "inf"; },
       "/program/9/outputs: \"norm\" is not a norm buffer: norm_type inf "
       "needs int64 [2]"},
      {[](Json &j) { j["optimizer"]["norm_type"] = "1"; },
       "/optimizer/norm_type: unknown norm_type \"1\"; expected \"2\" or "
       "\"inf\""},
      {[](Json &j) { j["program"][9]["inputs"][0] = "w"; },
       "/program/9/inputs/0: \"w\" is not a float32 gradient"},
      {[](Json &j) { j["program"][11]["outputs"][0] = "g"; },
       "/program/11/outputs/0: clip_grad scales in place: output 0 must be "
       "input 1"},
      {[](Json &j) { j["optimizer"]["no_decay"][0] = "layers.9.x"; },
       "/optimizer/no_decay/0: \"layers.9.x\" is not a parameter of this "
       "plan"},
      {[](Json &j) {
         j["optimizer"]["no_decay"] = Json::array({"layers.0.x", "layers.0.w"});
       },
       "/optimizer/no_decay/1: no_decay must be sorted and unique"},
      {[](Json &j) { j["optimizer"]["lr_schedule"]["warmup_steps"] = 11; },
       "/optimizer/lr_schedule: warmup_steps 11 is beyond the run's 10 "
       "steps (torchtitan would shorten it silently)"},
      {[](Json &j) { j["optimizer"]["lr_schedule"]["decay_type"] = "exp"; },
       "/optimizer/lr_schedule/decay_type: unknown decay_type \"exp\"; "
       "expected linear, sqrt or cosine"},
  };
  for (const Case &c : cases)
    EXPECT_EQ(mutated([&](Json &j) {
                addClipping(j);
                c.edit(j);
              }),
              c.error);
}

/// A plan without an optimizer_update needs no optimizer; with one it may
/// still carry it.
TEST(PlanFormat, OptimizerIsOptionalWithoutAnUpdate) {
  EXPECT_EQ(mutated([](Json &j) {
              j["program"].erase(9);
              j.erase("optimizer");
            }),
            "<ok>");
  EXPECT_EQ(mutated([](Json &j) { j["program"].erase(9); }), "<ok>");
}

/// Every version 2 field survives writePlan and parsePlan, also on a plan
/// built in memory, and the writer's output is a fixed point.
TEST(PlanFormat, Version2FieldsRoundTrip) {
  Result<Plan> p = parsePlan(kSmallPlan);
  ASSERT_TRUE(p.ok()) << p.error().message;
  Plan plan = *p;
  // Non-default values everywhere.
  plan.buffers[6].tensorId = 41;
  plan.buffers[8].scale = Fp8Scale{"amax", 0, false};
  plan.buffers[9].scale = Fp8Scale{"amax", 0, false};
  plan.program[8].microbatch = 3;
  plan.program[8].unit = "layers.0.attention";
  plan.optimizer =
      OptimizerConfig{"adamw", 3e-4, 0.5, 0.875, 1e-6, 0, true, 1234567890123};
  plan.mesh.pipelineAxis = "dp";
  ASSERT_TRUE(validatePlan(plan).ok()) << validatePlan(plan).error().message;
  std::string text = writePlan(plan);
  EXPECT_NE(text.find("\"pipeline\":\"dp\""), std::string::npos) << text;
  Result<Plan> q = parsePlan(text);
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(*q, plan);
  EXPECT_EQ(writePlan(*q), text);
  // One buffer, instruction and optimizer per line, as version 1 wrote.
  EXPECT_NE(text.find("\n  {\"id\":\"x.fp8\",\"kind\":\"scratch\",\"dtype\":"
                      "\"float8_e4m3fn\",\"global_shape\":[8],\"local_shape\":"
                      "[4],\"offset\":[4],\"layout\":\"[{tp}]\",\"tensor\":"
                      "\"layers.0.x\",\"scale\":{\"amax\":\"amax\",\"index\":0,"
                      "\"power_of_2\":false}},\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"label\":\"backward layers.0 (microbatch 1)\","
                      "\"phase\":\"backward\",\"unit\":\"layers.0.attention\","
                      "\"microbatch\":3},\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\n \"optimizer\": {\"name\":\"adamw\",\"lr\":0.0003,"
                      "\"beta1\":0.5,\"beta2\":0.875,\"eps\":1e-06,"
                      "\"weight_decay\":0.0,\"stochastic_rounding\":true,"
                      "\"seed\":1234567890123},\n"),
            std::string::npos)
      << text;
  // Optional keys are written only when set.
  plan.mesh.pipelineAxis.reset();
  plan.buffers[0].tensor.clear();
  plan.optimizer.reset();
  plan.program.pop_back();
  text = writePlan(plan);
  EXPECT_EQ(text.find("\"optimizer\""), std::string::npos);
  EXPECT_EQ(text.find("\"pipeline\""), std::string::npos);
  q = parsePlan(text);
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(*q, plan);
}

/// validatePlan checks plans built in memory (templates instantiated per
/// rank) by the same rules.
TEST(PlanFormat, ValidatesPlansBuiltInMemory) {
  Result<Plan> p = parsePlan(kSmallPlan);
  ASSERT_TRUE(p.ok()) << p.error().message;
  Plan plan = *p;
  plan.buffers[8].scale->index = -1;
  EXPECT_EQ(validatePlan(plan).error().message,
            "/buffers/8/scale/index: index -1 but \"amax\" has 2 elements");
  plan = *p;
  plan.program[1].phase.clear();
  EXPECT_EQ(validatePlan(plan).error().message,
            "/program/1/phase: phase must be \"forward\", \"backward\", "
            "\"backward_input\" or \"backward_weight\", not \"\"");
  plan = *p;
  plan.buffers[0].layout.clear();
  EXPECT_EQ(
      validatePlan(plan).error().message,
      "/buffers/0/layout: layout \"\" must start with '[' as in [{tp, dp}, "
      "{}]");
}

TEST(PlanFormat, NeverThrowsOnGarbage) {
  // Truncations of a valid plan: every prefix is an error, never a crash.
  std::string text = kSmallPlan;
  for (size_t n = 0; n < text.size(); n += 7) {
    Result<Plan> p = parsePlan(text.substr(0, n));
    EXPECT_FALSE(p.ok());
  }
}

/// The reader's own checks at the edges of what it accepts: the depth
/// limit, duplicate keys anywhere, numbers that overflow, and huge integers.
TEST(PlanFormat, ReaderLimits) {
  std::string deep = "{\"format\": \"meshplan.plan\", \"version\": 2, "
                     "\"x\": " +
                     std::string(40, '[') + std::string(40, ']') + "}";
  std::string pointer = "/x";
  for (int i = 0; i < 31; ++i) // the root is the first of 32 levels
    pointer += "/0";
  EXPECT_EQ(errorOf(deep), pointer + ": nested deeper than 32 levels");
  // A repeated key deep inside is found before anything is read.
  std::string text = kSmallPlan;
  text.replace(text.find("\"tensor_id\":1"), 13,
               "\"tensor_id\":1,\"tensor_id\":1");
  EXPECT_EQ(errorOf(text), "/buffers/6/tensor_id: duplicate key");
  EXPECT_EQ(mutated([](Json &j) { j["optimizer"]["lr"] = 1; }).substr(0, 4),
            "<ok>");
  text = kSmallPlan;
  text.replace(text.find("\"lr\":0.001"), 10, "\"lr\":1e999");
  EXPECT_EQ(errorOf(text), "line 35, column 40: "
                           "[json.exception.out_of_range.406] number overflow "
                           "parsing '1e999'");
  text = kSmallPlan;
  text.replace(text.find("\"count\":16"), 10, "\"count\":99999999999999999999");
  EXPECT_EQ(errorOf(text), "/program/0/count: expected an integer in [0, "
                           "1125899906842624], got 1e+20");
  text = kSmallPlan;
  text.replace(text.find("\"rank\": 1"), 9, "\"rank\": -1");
  EXPECT_EQ(errorOf(text), "/rank: expected an integer >= 0, got -1");
  // A communicator listing more members than any group may have is
  // refused by its count (docs/limits.md).
  std::string ranks = "[1";
  for (int64_t r = 0; r < kMaxGroupMembers; ++r)
    ranks += ",0";
  ranks += "]";
  text = kSmallPlan;
  text.replace(text.find("\"ranks\":[1,3]"), 13, "\"ranks\":" + ranks);
  EXPECT_EQ(errorOf(text),
            "/communicators/1/ranks: lists 1048577 members; groups that are "
            "listed member by member have at most 2^20 (docs/limits.md)");

  // Every stream becomes an executor thread: a plan naming more than
  // kMaxPlanStreams is refused by the count, before any is read.
  EXPECT_EQ(mutated([](Json &j) {
              for (int i = 0; i < kMaxPlanStreams - 1; ++i)
                j["streams"].push_back("s" + std::to_string(i));
            }),
            "/streams: 65 streams; a plan has at most 64 (docs/limits.md)");
  // Instructions, buffers and communicators by their counts too (the
  // elements are not even looked at).
  auto longArray = [](int64_t n, const char *element = "0") {
    std::string a = "[";
    for (int64_t i = 0; i < n; ++i)
      (a += i ? "," : "") += element;
    return a + "]";
  };
  struct ArrayCase {
    const char *key;
    int64_t max;
    std::string error;
  };
  for (const ArrayCase &c :
       {ArrayCase{"program", kMaxPlanInstructions,
                  "/program: 4194305 instructions; a plan has at most 2^22"},
        ArrayCase{"buffers", kMaxPlanBuffers,
                  "/buffers: 4194305 buffers; a plan has at most 2^22"},
        ArrayCase{"communicators", kMaxPlanCommunicators,
                  "/communicators: 65537 communicators; a plan has at most "
                  "2^16"}}) {
    text = kSmallPlan;
    size_t at = text.find(std::string("\"") + c.key + "\":");
    size_t open = text.find('[', at), close = text.find("\n ]", open) + 3;
    text.replace(open, close - open, longArray(c.max + 1, "{}"));
    EXPECT_EQ(errorOf(text), c.error + " (docs/limits.md)") << c.key;
  }
  // The whole document: at most kMaxPlanJsonValues values, refused where
  // the limit is passed (the tape stays within 16 bytes per value and key).
  text = kSmallPlan;
  text.replace(text.find("\"rank\": 1"), 9,
               "\"x\": " + longArray(kMaxPlanJsonValues) + ", \"rank\": 1");
  std::string error = errorOf(text);
  EXPECT_EQ(error.substr(0, 3), "/x/") << error;
  EXPECT_TRUE(error.ends_with(
      ": the document has more than 2^24 values (docs/limits.md)"))
      << error;
  // Strings (ids, labels, names) are at most 64 KiB.
  EXPECT_EQ(mutated([](Json &j) {
              j["program"][1]["label"] =
                  std::string(kMaxJsonStringBytes + 1, 'L');
            }),
            "/program/1/label: a string of 65537 bytes or more; strings are "
            "at most 64 KiB (docs/limits.md)");
}

/// Reading into a plan that held another one must give exactly what a fresh
/// read gives: every optional field of the earlier plan is reset, and no
/// stale value hides an error of the later one.
TEST(PlanFormat, ReadingIntoAReusedPlan) {
  std::vector<std::string> variants = {
      kSmallPlan,
      // Fewer buffers and instructions; no optimizer, no estimates.
      [] {
        Json j = Json::parse(kSmallPlan);
        j["program"].erase(9);
        j.erase("optimizer");
        j.erase("estimates");
        return j.dump();
      }(),
      // Optional fields absent or null where the first has them.
      [] {
        Json j = Json::parse(kSmallPlan);
        j["communicators"][0]["view"] = nullptr;
        j["communicators"][0].erase("axes");
        j["communicators"][0].erase("fault_tolerant");
        for (Json &b : j["buffers"])
          b.erase("tensor");
        for (Json &in : j["program"]) {
          in.erase("label");
          in.erase("deps");
        }
        return j.dump();
      }(),
      // Other values in the same places.
      [] {
        Json j = Json::parse(kSmallPlan);
        j["program"][3]["reduce"] = "sum";
        j["program"][8]["microbatch"] = 3;
        j["program"][4]["count"] = 7;
        j["buffers"][9]["scale"]["power_of_2"] = false;
        j["estimates"]["peak_memory_bytes"] = Json::object();
        return j.dump();
      }(),
  };
  for (size_t a = 0; a < variants.size(); ++a) {
    for (size_t b = 0; b < variants.size(); ++b) {
      Plan reused;
      ASSERT_TRUE(parsePlanInto(variants[a], reused).ok());
      Result<void> ok = parsePlanInto(variants[b], reused);
      ASSERT_TRUE(ok.ok()) << ok.error().message;
      Result<Plan> fresh = parsePlan(variants[b]);
      ASSERT_TRUE(fresh.ok()) << fresh.error().message;
      EXPECT_EQ(reused, *fresh) << "variant " << b << " after " << a;
    }
  }
  // Stale values must not hide errors: a param_shard without tensor_id, a
  // float8 buffer without scale, a compute without a phase, after a plan
  // that had them at the same index.
  for (auto edit : std::vector<std::function<void(Json &)>>{
           [](Json &j) { j["buffers"][0].erase("tensor_id"); },
           [](Json &j) { j["buffers"][8].erase("scale"); },
           [](Json &j) { j["program"][1].erase("phase"); },
           [](Json &j) { j["program"][3].erase("reduce"); },
       }) {
    Json j = Json::parse(kSmallPlan);
    edit(j);
    Plan reused;
    ASSERT_TRUE(parsePlanInto(kSmallPlan, reused).ok());
    Result<void> ok = parsePlanInto(j.dump(), reused);
    ASSERT_FALSE(ok.ok());
    EXPECT_EQ(ok.error().message, errorOf(j.dump()));
  }
}

} // namespace
