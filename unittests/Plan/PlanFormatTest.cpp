//===- PlanFormatTest.cpp - Plan reader, validator and writer -------------===//

#include "PlanTestHelpers.h"

#include <nlohmann/json.hpp>

using namespace plantest;
using Json = nlohmann::ordered_json;

namespace {

const char *kSmallPlan = R"json({
 "format": "meshplan.plan",
 "version": 1,
 "mesh": {"axes":[{"name":"dp","size":2},{"name":"tp","size":2}]},
 "rank": 1,
 "communicators": [
  {"id":"tp","ranks":[0,1],"color":0,"key":1,"axes":["tp"],"view":"slice(tp)","fault_tolerant":false},
  {"id":"dp","ranks":[1,3],"color":1,"key":0,"axes":["dp"],"view":null,"fault_tolerant":false}
 ],
 "buffers": [
  {"id":"w","kind":"param_shard","dtype":"bfloat16","global_shape":[8,4],"local_shape":[4,4],"offset":[0,0]},
  {"id":"w.full","kind":"gathered","dtype":"bfloat16","global_shape":[8,4],"local_shape":[8,4],"offset":[0,0]},
  {"id":"g","kind":"gradient","dtype":"float32","global_shape":[8,4],"local_shape":[4,4],"offset":[4,0]}
 ],
 "streams": ["compute","comm"],
 "program": [
  {"id":"ag","stream":"comm","op":"all_gather","comm":"tp","dtype":"bfloat16","count":16,"inputs":["w"],"outputs":["w.full"],"label":"all-gather w"},
  {"id":"fwd","stream":"compute","op":"compute","inputs":["w.full"],"deps":["ag"],"label":"forward layers.0"},
  {"id":"free","stream":"compute","op":"free","inputs":["w.full"]},
  {"id":"ar","stream":"comm","op":"all_reduce","comm":"dp","dtype":"float32","count":16,"reduce":"avg","inputs":["g"],"outputs":["g"],"deps":["fwd"]}
 ],
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
  ASSERT_EQ(p->program.size(), 4u);
  EXPECT_EQ(p->program[3].reduce, ReduceOp::Avg);
  EXPECT_EQ(p->communicators[0].view, std::optional<std::string>("slice(tp)"));
  EXPECT_FALSE(p->communicators[1].view.has_value());
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
  EXPECT_EQ(mutated([](Json &j) { j["version"] = 2; }),
            "/version: unsupported plan version 2; this meshplan reads "
            "version 1");
  EXPECT_EQ(mutated([](Json &j) { j["extra"] = 1; }),
            "/extra: unknown key; expected one of format, version, mesh, "
            "rank, communicators, buffers, streams, program, estimates");
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
       "broadcast, fp8_amax, fp8_cast, cast, sum, compute, optimizer_update, "
       "free, "
       "wait (did you mean \"all_gather\"?)"},
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

TEST(PlanFormat, NeverThrowsOnGarbage) {
  // Truncations of a valid plan: every prefix is an error, never a crash.
  std::string text = kSmallPlan;
  for (size_t n = 0; n < text.size(); n += 7) {
    Result<Plan> p = parsePlan(text.substr(0, n));
    EXPECT_FALSE(p.ok());
  }
}

} // namespace
