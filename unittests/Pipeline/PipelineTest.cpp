//===- PipelineTest.cpp - The whole planner against brute-force models ----===//
//
// Property tests of spec -> pipeline::compile -> PreparedTemplate -> one plan
// per rank. Every configuration (a mesh, the roles of its axes and the
// numerics) is compiled, every rank's plan is instantiated, and the set is
// checked against references written here from the docs alone (docs/spec.md,
// docs/plan-format.md, docs/dialect.md "The training step", and
// docs/semantics.md), never asking core:
//
//   - mesh coordinates and communicator groups by enumerating the mesh (the
//     device order is "the rank at each row-major position");
//   - parameter boxes by torch.chunk on index lists (unittests/Core/
//     BruteForce.h): the tensor-parallel chunk of the split dim first, then
//     FSDP's chunk of dim 0 over the flattened shard axes (spec order);
//   - padded shard sizes as ceil(n / parts) per level, hence every count;
//   - FSDP units from the model tree; the schedule from a happens-before
//     relation (stream order plus deps) computed here.
//
// Properties (each names its check in failure messages):
//   verify      verifyPlans passes for the whole set
//   comms       every communicator's members and key as the mesh gives them
//   params      param/optimizer-state boxes; per replica they tile every
//               parameter exactly; replicas hold identical boxes
//   buffers     gathered = the TP-local box; every buffer is a box of its
//               parameter's stored or compute layout
//   counts      all_gather / reduce_scatter / all_reduce counts and dtypes;
//               members' shards concatenate (key order) into the gathered
//               tensor, and reduce-scatter outputs tile its input
//   grads       optimizer updates read only param shards, gradients and
//               state, gradients with the shard's box; reduce-scatter over
//               exactly the shard axes, all-reduce (avg) over exactly the
//               replicate axes (fault tolerant iff managed), once per step.
//               Sequence-parallel weights (style sequence_parallel, TP size
//               > 1) get stacked gradients (docs/semantics.md): backward's
//               row [t, compute box] of [tp] + shape, the same data-parallel
//               reduction on the stacked buffers (into [t, stored box]), then
//               exactly one `sum` into the stored box and one all-reduce
//               (sum) over exactly the TP axis, the only gradient collective
//               spanning tp. The path into each optimizer update is traced
//               back, writer by writer, to backward and must be exactly that.
//   float8      float8 gathers in float8_e4m3fn; one fp8_amax and one MAX
//               all-reduce per distinct split (shard axes + tp if TP splits
//               the weight, mesh order): exactly one when TP splits all or
//               none of the float8 weights (FuseFp8Gather.cpp groups weights
//               by split); every compute of a float8 unit reads the amax
//   computes    forward units in order then backward in reverse, per
//               microbatch; each reads its parameters in the compute box
//   schedule    every read sees the value of the last earlier writer (in
//               program order) and is ordered after it by streams + deps,
//               no free or other write races with it; every temporary is
//               freed after its last reader; the gathered peak respects
//               the prefetch bound (two units) when resharding
//   determinism instantiate twice and compile twice give equal results
//
//===----------------------------------------------------------------------===//

#include "../Core/BruteForce.h"

#include "meshplan/Frontend/Model.h"
#include "meshplan/Frontend/Spec.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/Template.h"
#include "meshplan/Plan/Verify.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>

namespace {

using namespace meshplan;
namespace fe = meshplan::frontend;
namespace pl = meshplan::plan;
using Ints = std::vector<int64_t>;
using nlohmann::json;

//===----------------------------------------------------------------------===//
// Configurations
//===----------------------------------------------------------------------===//

struct Config {
  std::string name;
  bool odd = false; ///< the awkward model below, else the "tiny" preset
  std::vector<std::pair<std::string, int64_t>> axes;
  std::vector<std::string> managed;
  bool shuffle = false; ///< a shuffled device_order
  std::vector<std::string> replicate, shard, extra;
  std::string tpAxis;
  std::vector<std::pair<std::string, std::string>> tpPlan;
  std::string paramDtype = "float32", reduceDtype = "float32";
  /// 0: no float8 section; 1: float8 without all-gather; 2: with.
  int float8 = 0;
  std::vector<std::string> fp8Modules;
  std::string optDtype = "float32";
  bool stochasticRounding = false;
  bool reshard = true;
  int64_t ga = 1;
  /// "gradient_accumulation.reduce"; "" writes the short key
  /// gradient_accumulation_steps (default mode, every_microbatch).
  std::string gaReduce;
  /// Gradients reduce-scattered after each microbatch and accumulated into
  /// the shard (docs/semantics.md, "Gradient accumulation").
  bool everyMicrobatch() const {
    return ga > 1 && gaReduce != "last_microbatch";
  }
};

std::ostream &operator<<(std::ostream &os, const Config &c) {
  return os << c.name;
}

json param(const std::string &name, Ints shape) {
  return {{"name", name}, {"shape", shape}};
}
json leaf(const std::string &name, const std::string &kind, json params) {
  return {{"name", name}, {"kind", kind}, {"parameters", std::move(params)}};
}
json container(const std::string &name, const std::string &kind,
               json children) {
  return {{"name", name}, {"kind", kind}, {"children", std::move(children)}};
}

/// The awkward model: uneven sizes everywhere (1001 = 7 x 11 x 13 divides by
/// no mesh size; 28, 52 and 96 divide by the TP degrees but leave uneven
/// FSDP chunks; a [7, 5] linear and a [13] norm leave empty shards), biases
/// (a rowwise bias stays replicated, a colwise one is split), a top-level
/// leaf unit, and a feed-forward unit whose linears are float8 capable.
std::string oddModelJson() {
  auto layer = [](const std::string &name) {
    json attention = container(
        "attention", "attention",
        json::array(
            {leaf("wq", "linear", json::array({param("weight", {28, 28})})),
             leaf("wk", "linear", json::array({param("weight", {28, 28})})),
             leaf("wv", "linear", json::array({param("weight", {28, 28})})),
             leaf("wo", "linear",
                  json::array(
                      {param("weight", {28, 28}), param("bias", {28})}))}));
    attention["n_heads"] = 4;
    attention["n_kv_heads"] = 4;
    return container(
        name, "block",
        json::array(
            {leaf("attention_norm", "norm",
                  json::array({param("weight", {28}), param("bias", {28})})),
             attention,
             leaf("ffn_norm", "norm", json::array({param("weight", {28})})),
             container(
                 "feed_forward", "feed_forward",
                 json::array(
                     {leaf("w1", "linear",
                           json::array({param("weight", {52, 28}),
                                        param("bias", {52})})),
                      leaf("w3", "linear",
                           json::array({param("weight", {52, 28})})),
                      leaf("w2", "linear",
                           json::array({param("weight", {28, 52})}))}))}));
  };
  json model = {
      {"name", "odd"},
      {"modules",
       json::array(
           {leaf("tok_embeddings", "embedding",
                 json::array({param("weight", {1001, 28})})),
            container("layers", "block", json::array({layer("0"), layer("1")})),
            leaf("adapter", "linear",
                 json::array({param("weight", {7, 5}), param("bias", {7})})),
            container(
                "mlp", "feed_forward",
                json::array({leaf("up", "linear",
                                  json::array({param("weight", {96, 32})})),
                             leaf("down", "linear",
                                  json::array({param("weight", {32, 96})}))})),
            leaf("norm", "norm", json::array({param("weight", {13})})),
            leaf("output", "output",
                 json::array({param("weight", {1001, 28})}))})}};
  return model.dump(1);
}

/// torchtitan's Llama plan for the tiny preset (TP 2: heads 4 and kv heads 2
/// divide by 2).
std::vector<std::pair<std::string, std::string>> tinyFullPlan() {
  return {{"tok_embeddings", "rowwise"},
          {"layers.*.attention_norm", "sequence_parallel"},
          {"layers.*.attention.wq", "colwise"},
          {"layers.*.attention.wk", "colwise"},
          {"layers.*.attention.wv", "colwise"},
          {"layers.*.attention.wo", "rowwise"},
          {"layers.*.ffn_norm", "sequence_parallel"},
          {"layers.*.feed_forward.w1", "colwise"},
          {"layers.*.feed_forward.w2", "rowwise"},
          {"layers.*.feed_forward.w3", "colwise"},
          {"norm", "sequence_parallel"},
          {"output", "colwise"}};
}

/// The odd model's plan: a colwise embedding (dim 1), colwise/rowwise
/// attention and feed-forward, a rowwise output (its vocabulary divides by
/// nothing), sequence-parallel norms; the adapter stays unsplit.
std::vector<std::pair<std::string, std::string>> oddFullPlan() {
  return {{"tok_embeddings", "colwise"},
          {"layers.*.attention_norm", "sequence_parallel"},
          {"layers.*.attention.wq", "colwise"},
          {"layers.*.attention.wk", "colwise"},
          {"layers.*.attention.wv", "colwise"},
          {"layers.*.attention.wo", "rowwise"},
          {"layers.*.ffn_norm", "sequence_parallel"},
          {"layers.*.feed_forward.w1", "colwise"},
          {"layers.*.feed_forward.w3", "colwise"},
          {"layers.*.feed_forward.w2", "rowwise"},
          {"mlp.up", "colwise"},
          {"mlp.down", "rowwise"},
          {"norm", "sequence_parallel"},
          {"output", "rowwise"}};
}

Ints deviceOrder(const Config &c) {
  int64_t n = 1;
  for (auto &[name, size] : c.axes)
    n *= size;
  Ints order = bf::iota(n);
  // A fixed permutation (Fisher-Yates with our own LCG: the same on every
  // standard library).
  uint64_t state = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(n);
  for (int64_t i = n - 1; i > 0; --i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(order[i], order[(state >> 33) % static_cast<uint64_t>(i + 1)]);
  }
  return order;
}

std::string specText(const Config &c) {
  json s;
  s["description"] = c.name;
  s["model"] = c.odd ? "odd.json" : "tiny";
  json axes = json::array();
  for (auto &[name, size] : c.axes)
    axes.push_back({{"name", name}, {"size", size}});
  s["mesh"]["axes"] = axes;
  if (!c.managed.empty())
    s["mesh"]["managed_axes"] = c.managed;
  if (c.shuffle)
    s["mesh"]["device_order"] = deviceOrder(c);
  if (!c.replicate.empty() || !c.shard.empty()) {
    json dp;
    if (!c.replicate.empty())
      dp["replicate_axes"] = c.replicate;
    if (!c.shard.empty())
      dp["shard_axes"] = c.shard;
    dp["reshard_after_forward"] = c.reshard;
    s["data_parallel"] = dp;
  }
  if (!c.tpAxis.empty()) {
    json rules = json::array();
    for (auto &[pattern, style] : c.tpPlan)
      rules.push_back({{"pattern", pattern}, {"style", style}});
    s["tensor_parallel"] = {{"axis", c.tpAxis}, {"plan", rules}};
  }
  if (!c.extra.empty())
    s["extra_axes"] = c.extra;
  s["mixed_precision"] = {{"param_dtype", c.paramDtype},
                          {"reduce_dtype", c.reduceDtype}};
  if (c.float8) {
    json f = {{"all_gather", c.float8 == 2}, {"power_of_2_scales", true}};
    if (!c.fp8Modules.empty())
      f["modules"] = c.fp8Modules;
    s["float8"] = f;
  }
  s["optimizer"] = {{"name", "adamw"},
                    {"param_dtype", c.optDtype},
                    {"stochastic_rounding", c.stochasticRounding},
                    {"seed", 7}};
  if (c.gaReduce.empty())
    s["gradient_accumulation_steps"] = c.ga;
  else
    s["gradient_accumulation"] = {{"steps", c.ga}, {"reduce", c.gaReduce}};
  return s.dump(1);
}

Result<fe::ResolvedSpec> loadConfig(const Config &c) {
  std::string text = specText(c);
  if (!c.odd)
    return fe::loadSpec(text, MESHPLAN_SOURCE_DIR);
  // The odd model is resolved from text (no file to write): the spec's
  // "model" names it only for messages.
  auto spec = fe::parseSpec(text);
  if (!spec)
    return spec.error();
  auto model = fe::parseModel(oddModelJson());
  if (!model)
    return model.error();
  return fe::resolveSpec(std::move(*spec),
                         std::make_shared<const fe::Model>(std::move(*model)));
}

std::vector<Config> configs() {
  std::vector<Config> out;
  auto add = [&](Config c) { out.push_back(std::move(c)); };
  {
    Config c{.name = "tiny_ddp4"};
    c.axes = {{"r", 4}};
    c.replicate = {"r"};
    add(c);
  }
  {
    Config c{.name = "odd_ddp3_bf16_reduce"};
    c.odd = true;
    c.axes = {{"r", 3}};
    c.replicate = {"r"};
    c.paramDtype = "bfloat16";
    c.reduceDtype = "bfloat16";
    add(c);
  }
  {
    // A shard axis of size 1 splits nothing: no collective at all.
    Config c{.name = "tiny_single_rank"};
    c.axes = {{"s", 1}};
    c.shard = {"s"};
    add(c);
  }
  {
    // A size-1 replicate axis (works: no all-reduce over one rank).
    Config c{.name = "tiny_hsdp_1x4"};
    c.axes = {{"r", 1}, {"s", 4}};
    c.replicate = {"r"};
    c.shard = {"s"};
    c.paramDtype = "bfloat16";
    add(c);
  }
  {
    Config c{.name = "tiny_fsdp8_bf16"};
    c.axes = {{"s", 8}};
    c.shard = {"s"};
    c.paramDtype = "bfloat16";
    add(c);
  }
  {
    Config c{.name = "odd_fsdp8_noreshard_ga2"};
    c.odd = true;
    c.axes = {{"s", 8}};
    c.shard = {"s"};
    c.reshard = false;
    c.ga = 2;
    add(c);
    // The same, reducing once after the last microbatch.
    c.name = "odd_fsdp8_noreshard_ga2_last";
    c.gaReduce = "last_microbatch";
    add(c);
  }
  {
    Config c{.name = "odd_fsdp_2x3_flattened"};
    c.odd = true;
    c.axes = {{"a", 2}, {"b", 3}};
    c.shard = {"a", "b"};
    c.paramDtype = "bfloat16";
    add(c);
  }
  {
    // Shard axes listed against mesh order: the flattened coordinate is in
    // the spec's order.
    Config c{.name = "odd_fsdp_3x2_reversed_shuffled"};
    c.odd = true;
    c.axes = {{"a", 3}, {"b", 2}};
    c.shard = {"b", "a"};
    c.shuffle = true;
    add(c);
  }
  {
    Config c{.name = "tiny_hsdp_2x4"};
    c.axes = {{"r", 2}, {"s", 4}};
    c.replicate = {"r"};
    c.shard = {"s"};
    c.paramDtype = "bfloat16";
    add(c);
  }
  {
    Config c{.name = "odd_hsdp_managed_3x4_shuffled_ga2"};
    c.odd = true;
    c.axes = {{"r", 3}, {"s", 4}};
    c.managed = {"r"};
    c.replicate = {"r"};
    c.shard = {"s"};
    c.shuffle = true;
    c.ga = 2;
    c.paramDtype = "bfloat16";
    add(c);
    c.name = "odd_hsdp_managed_3x4_shuffled_ga3_last";
    c.ga = 3;
    c.gaReduce = "last_microbatch";
    add(c);
  }
  {
    Config c{.name = "tiny_fsdp2_tp2_fp8"};
    c.axes = {{"s", 2}, {"tp", 2}};
    c.shard = {"s"};
    c.tpAxis = "tp";
    c.tpPlan = tinyFullPlan();
    c.paramDtype = "bfloat16";
    c.float8 = 2;
    add(c);
  }
  {
    // TP 4 on tiny: n_kv_heads 2 forbids splitting attention.
    Config c{.name = "tiny_fsdp2_tp4_noreshard"};
    c.axes = {{"s", 2}, {"tp", 4}};
    c.shard = {"s"};
    c.tpAxis = "tp";
    c.tpPlan = {{"tok_embeddings", "rowwise"},
                {"layers.*.attention_norm", "sequence_parallel"},
                {"layers.*.ffn_norm", "sequence_parallel"},
                {"layers.*.feed_forward.w1", "colwise"},
                {"layers.*.feed_forward.w2", "rowwise"},
                {"layers.*.feed_forward.w3", "colwise"},
                {"norm", "sequence_parallel"},
                {"output", "colwise"}};
    c.paramDtype = "bfloat16";
    c.reshard = false;
    add(c);
  }
  {
    Config c{.name = "odd_fsdp3_tp4_ga3_every_bf16reduce"};
    c.odd = true;
    c.axes = {{"s", 3}, {"tp", 4}};
    c.shard = {"s"};
    c.tpAxis = "tp";
    c.tpPlan = oddFullPlan();
    c.paramDtype = "bfloat16";
    c.reduceDtype = "bfloat16";
    c.ga = 3;
    c.gaReduce = "every_microbatch";
    add(c);
  }
  {
    Config c{.name = "odd_hsdp_cp_tp2_fp8_sr_shuffled_ga2"};
    c.odd = true;
    c.axes = {{"r", 2}, {"s", 2}, {"cp", 2}, {"tp", 2}};
    c.replicate = {"r"};
    c.shard = {"s"};
    c.extra = {"cp"};
    c.tpAxis = "tp";
    c.tpPlan = oddFullPlan();
    c.shuffle = true;
    c.paramDtype = "bfloat16";
    c.float8 = 2;
    c.fp8Modules = {"mlp.*"};
    c.optDtype = "bfloat16";
    c.stochasticRounding = true;
    c.ga = 2;
    add(c);
  }
  {
    // HSDP x TP on uneven shards (28 and 13 over 3), tp the major axis: the
    // sequence-parallel norms' stacked gradients are reduce-scattered, then
    // all-reduced over the managed replicate axis (fault tolerant), then
    // summed and all-reduced over tp, all in the bf16 reduce dtype.
    Config c{.name = "odd_hsdp_managed_tp2_2x3_bf16_reduce"};
    c.odd = true;
    c.axes = {{"tp", 2}, {"r", 2}, {"s", 3}};
    c.managed = {"r"};
    c.replicate = {"r"};
    c.shard = {"s"};
    c.tpAxis = "tp";
    c.tpPlan = oddFullPlan();
    c.paramDtype = "bfloat16";
    c.reduceDtype = "bfloat16";
    add(c);
  }
  {
    // A TP axis of size 1 splits nothing: sequence-parallel weights get
    // plain (unstacked) gradients, nothing is summed over tp.
    Config c{.name = "tiny_fsdp4_tp1_sequence_parallel"};
    c.axes = {{"s", 4}, {"tp", 1}};
    c.shard = {"s"};
    c.tpAxis = "tp";
    c.tpPlan = tinyFullPlan();
    add(c);
  }
  {
    // The "submesh of a submesh" mesh: HSDP, float8 gather, an extra axis.
    Config c{.name = "tiny_hsdp_extra_fp8"};
    c.axes = {{"ddp", 2}, {"fsdp", 2}, {"abcd", 2}};
    c.replicate = {"ddp"};
    c.shard = {"fsdp"};
    c.extra = {"abcd"};
    c.paramDtype = "bfloat16";
    c.float8 = 2;
    add(c);
  }
  {
    Config c{.name = "tiny_fsdp4_fp8_no_gather"};
    c.axes = {{"s", 4}};
    c.shard = {"s"};
    c.paramDtype = "bfloat16";
    c.float8 = 1;
    add(c);
  }
  {
    Config c{.name = "tiny_fsdp4_bf16_params_sr_noreshard"};
    c.axes = {{"s", 4}};
    c.shard = {"s"};
    c.paramDtype = "bfloat16";
    c.optDtype = "bfloat16";
    c.stochasticRounding = true;
    c.reshard = false;
    add(c);
  }
  {
    // TP splits the attention linears but not the feed-forward ones: two
    // float8 splits, hence two amax reductions.
    Config c{.name = "tiny_hsdp_tp2_mixed_fp8"};
    c.axes = {{"r", 2}, {"s", 2}, {"tp", 2}};
    c.replicate = {"r"};
    c.shard = {"s"};
    c.tpAxis = "tp";
    c.tpPlan = {{"tok_embeddings", "rowwise"},
                {"layers.*.attention.wq", "colwise"},
                {"layers.*.attention.wk", "colwise"},
                {"layers.*.attention.wv", "colwise"},
                {"layers.*.attention.wo", "rowwise"}};
    c.paramDtype = "bfloat16";
    c.float8 = 2;
    add(c);
  }
  {
    Config c{.name = "tiny_managed_tp2_ga2"};
    c.axes = {{"r", 2}, {"s", 2}, {"tp", 2}};
    c.managed = {"r"};
    c.replicate = {"r"};
    c.shard = {"s"};
    c.tpAxis = "tp";
    c.tpPlan = {{"layers.*.feed_forward.w1", "colwise"},
                {"layers.*.feed_forward.w2", "rowwise"},
                {"layers.*.feed_forward.w3", "colwise"},
                {"output", "colwise"}};
    c.paramDtype = "bfloat16";
    c.ga = 2;
    add(c);
  }
  {
    Config c{.name = "odd_fsdp5_tp2_fp8"};
    c.odd = true;
    c.axes = {{"s", 5}, {"tp", 2}};
    c.shard = {"s"};
    c.tpAxis = "tp";
    c.tpPlan = oddFullPlan();
    c.paramDtype = "bfloat16";
    c.float8 = 2;
    c.fp8Modules = {"mlp.up", "mlp.down"};
    add(c);
  }
  {
    // No data parallelism: TP and an extra axis only.
    Config c{.name = "odd_tp2_extra2_no_dp"};
    c.odd = true;
    c.axes = {{"x", 2}, {"tp", 2}};
    c.extra = {"x"};
    c.tpAxis = "tp";
    c.tpPlan = oddFullPlan();
    // No data_parallel ("no DP", valid per docs/spec.md): gradients are
    // already in the stored layout, nothing is reduced.
    add(c);
  }
  {
    Config c{.name = "tiny_hsdp_fp16_reduce_bf16_shuffled"};
    c.axes = {{"r", 2}, {"s", 3}};
    c.replicate = {"r"};
    c.shard = {"s"};
    c.shuffle = true;
    c.paramDtype = "float16";
    c.reduceDtype = "bfloat16";
    add(c);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// The reference model (from the docs; no core)
//===----------------------------------------------------------------------===//

struct Box {
  Ints offset, shape;
  bool operator==(const Box &) const = default;
};

std::string str(const Box &b) {
  return "offset " + bf::str(b.offset) + " shape " + bf::str(b.shape);
}

Box boxOf(const pl::Buffer &b) { return {b.offset, b.localShape}; }

bool intersects(const Box &a, const Box &b) {
  for (size_t d = 0; d < a.shape.size(); ++d) {
    int64_t lo = std::max(a.offset[d], b.offset[d]);
    int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo)
      return false;
  }
  return true;
}

/// torch.chunk(range(start, start + len), parts)[i] as (offset, size). An
/// empty chunk sits where it would start (min(i * ceil, len)), as core's
/// shardOf places empty shards.
std::pair<int64_t, int64_t> chunkRange(int64_t start, int64_t len,
                                       int64_t parts, int64_t i) {
  Ints list(len);
  for (int64_t k = 0; k < len; ++k)
    list[k] = start + k;
  Ints piece = bf::torchChunk(list, parts)[i];
  if (piece.empty()) {
    int64_t c = (len + parts - 1) / parts;
    return {start + std::min(i * c, len), 0};
  }
  EXPECT_TRUE(bf::isContiguous(piece));
  return {piece.front(), static_cast<int64_t>(piece.size())};
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

pl::DType planDType(const std::string &name) {
  auto d = pl::parseDType(name);
  EXPECT_TRUE(d.has_value()) << name;
  return d.value_or(pl::DType::Float32);
}

/// docs/spec.md "Patterns": `*` matches any characters within one name
/// segment, `**` any characters across segments, `?` one character other
/// than `.`; anything else matches itself.
bool globMatch(std::string_view pattern, std::string_view name) {
  if (pattern.empty())
    return name.empty();
  if (pattern.substr(0, 2) == "**") {
    for (size_t i = 0; i <= name.size(); ++i)
      if (globMatch(pattern.substr(2), name.substr(i)))
        return true;
    return false;
  }
  if (pattern[0] == '*') {
    for (size_t i = 0; i <= name.size(); ++i) {
      if (globMatch(pattern.substr(1), name.substr(i)))
        return true;
      if (i < name.size() && name[i] == '.')
        break;
    }
    return false;
  }
  if (name.empty() ||
      (pattern[0] == '?' ? name[0] == '.' : pattern[0] != name[0]))
    return false;
  return globMatch(pattern.substr(1), name.substr(1));
}

struct RefParam {
  std::string name;
  Ints shape;
  int tpDim = -1;
  bool fp8Gather = false; ///< gathered as float8
  /// A sequence-parallel weight under a TP axis of size > 1: its gradient is
  /// stacked ([tp] + shape, each rank its own row), reduced over the
  /// data-parallel axes, summed locally and all-reduced (sum) over tp.
  bool stacked = false;
  std::string unit;
};

struct Ref {
  const Config &c;
  const fe::ResolvedSpec &spec;
  std::vector<std::string> axisNames;
  Ints axisSizes;
  std::set<std::string> managed;
  int64_t world = 1;
  std::vector<Ints> coords; ///< by rank id
  std::vector<RefParam> params;
  std::map<std::string, int> paramIndex;
  std::vector<std::string> units; ///< forward order
  int64_t tpSize = 1, shardSize = 1;
  bool gathers = false; ///< parameters are all-gathered (FSDP)
  pl::DType storeDtype, computeDtype, reduceDtype;

  Ref(const Config &c, const fe::ResolvedSpec &spec) : c(c), spec(spec) {
    for (auto &[name, size] : c.axes) {
      axisNames.push_back(name);
      axisSizes.push_back(size);
      world *= size;
    }
    managed.insert(c.managed.begin(), c.managed.end());
    // "device_order: the rank at each row-major position".
    Ints order = c.shuffle ? deviceOrder(c) : bf::iota(world);
    bf::NDArray positions = bf::NDArray::arange(axisSizes);
    coords.assign(world, {});
    for (int64_t p = 0; p < world; ++p)
      coords[order[p]] = positions.unravel(p);
    if (!c.tpAxis.empty())
      tpSize = axisSize(c.tpAxis);
    for (const std::string &a : c.shard)
      shardSize *= axisSize(a);
    gathers = shardSize > 1;
    storeDtype = planDType(c.optDtype);
    computeDtype = planDType(c.paramDtype);
    reduceDtype = planDType(c.reduceDtype);

    // FSDP units: each top-level module; a top-level container whose
    // children are all containers contributes each child instead.
    for (const fe::Module &m : spec.model->modules) {
      bool split = !m.children.empty();
      for (const fe::Module &child : m.children)
        split &= !fe::isLeafKind(child.kind);
      if (split)
        for (const fe::Module &child : m.children)
          units.push_back(m.name + "." + child.name);
      else
        units.push_back(m.name);
    }
    for (const fe::ParamAssignment &p : spec.params) {
      RefParam r;
      r.name = p.name;
      r.shape = p.shape;
      r.tpDim = expectedTpDim(p);
      EXPECT_EQ(r.tpDim, p.tpDim) << c.name << ": " << p.name;
      bool fp8Gather = c.float8 == 2 && gathers;
      r.fp8Gather = fp8Gather && p.float8;
      // Stacked: the rule selecting the parameter's module (by the module's
      // path or one of its parameters' names) says sequence_parallel, TP
      // leaves the weight whole and the TP axis has more than one rank.
      std::string style = configStyle(p);
      if (p.module >= 0 &&
          static_cast<size_t>(p.module) < spec.assignments.size()) {
        const auto &tpStyle = spec.assignments[p.module].tpStyle;
        EXPECT_EQ(style, tpStyle ? std::string(fe::tpStyleName(*tpStyle)) : "")
            << c.name << ": " << p.name << "'s style";
      }
      r.stacked = style == "sequence_parallel" && r.tpDim < 0 && tpSize > 1;
      if (p.float8) {
        EXPECT_EQ(spec.modules[p.module].module->kind, fe::ModuleKind::Linear)
            << p.name;
      }
      for (const std::string &u : units)
        if (p.name.rfind(u + ".", 0) == 0 && u.size() > r.unit.size())
          r.unit = u;
      EXPECT_FALSE(r.unit.empty()) << p.name;
      // The default units are torchtitan's (torchtitan/models/llama3/infra/
      // parallelize.py, apply_fsdp): fully_shard(tok_embeddings), each
      // transformer block, fully_shard([model.norm, model.output]) when both
      // exist, then the root model for what is left.
      bool hasNorm = false, hasOutput = false;
      for (const fe::Module &m : spec.model->modules) {
        hasNorm |= m.name == "norm";
        hasOutput |= m.name == "output";
      }
      if (r.unit.find('.') == std::string::npos && r.unit != "tok_embeddings")
        r.unit =
            (r.unit == "norm" || r.unit == "output") && hasNorm && hasOutput
                ? "norm+output"
                : "root";
      paramIndex[r.name] = static_cast<int>(params.size());
      params.push_back(std::move(r));
    }
    // Units in forward order of their first parameter.
    units.clear();
    for (const RefParam &r : params)
      if (std::find(units.begin(), units.end(), r.unit) == units.end())
        units.push_back(r.unit);
  }

  /// The tensor-parallel style the config's plan gives `p`'s module ("" if
  /// no rule selects it).
  std::string configStyle(const fe::ParamAssignment &p) const {
    if (c.tpAxis.empty())
      return "";
    std::string module = p.name.substr(0, p.name.rfind('.'));
    std::string style;
    for (auto &[pattern, ruleStyle] : c.tpPlan) {
      bool selects = globMatch(pattern, module);
      for (const fe::ParamAssignment &q : spec.params)
        selects |= q.module == p.module && globMatch(pattern, q.name);
      if (!selects)
        continue;
      EXPECT_TRUE(style.empty()) << c.name << ": two rules select " << module;
      style = ruleStyle;
    }
    return style;
  }

  int axis(const std::string &name) const {
    auto it = std::find(axisNames.begin(), axisNames.end(), name);
    EXPECT_NE(it, axisNames.end()) << name;
    return static_cast<int>(it - axisNames.begin());
  }
  int64_t axisSize(const std::string &name) const {
    return axisSizes[axis(name)];
  }
  /// The axes of size > 1 (a group over size-1 axes is no group).
  std::vector<std::string> nontrivial(const std::vector<std::string> &v) const {
    std::vector<std::string> out;
    for (const std::string &n : v)
      if (axisSize(n) > 1)
        out.push_back(n);
    return out;
  }

  /// docs/spec.md's style table.
  int expectedTpDim(const fe::ParamAssignment &p) const {
    const fe::ModuleAssignment &a = spec.assignments[p.module];
    if (!a.tpStyle)
      return -1;
    fe::ModuleKind kind = spec.modules[p.module].module->kind;
    bool bias =
        p.name.size() >= 5 && p.name.substr(p.name.size() - 5) == ".bias";
    switch (*a.tpStyle) {
    case fe::TPStyle::Colwise:
      return kind == fe::ModuleKind::Embedding ? 1 : 0;
    case fe::TPStyle::Rowwise:
      if (kind == fe::ModuleKind::Embedding)
        return 0;
      return bias ? -1 : 1;
    case fe::TPStyle::SequenceParallel:
      return -1;
    }
    return -1;
  }

  /// Mixed-radix index of a rank over named axes (first = most major).
  int64_t indexOver(int64_t rank, const std::vector<std::string> &names) const {
    int64_t index = 0;
    for (const std::string &n : names)
      index = index * axisSize(n) + coords[rank][axis(n)];
    return index;
  }
  int64_t tpIndex(int64_t rank) const {
    return c.tpAxis.empty() ? 0 : coords[rank][axis(c.tpAxis)];
  }
  int64_t shardIndex(int64_t rank) const { return indexOver(rank, c.shard); }

  /// The group of `rank` along whole axes, in key order: ranks equal on
  /// every other axis, ordered by their mixed-radix index over `names`.
  Ints group(const std::vector<std::string> &names, int64_t rank) const {
    std::set<int> along;
    for (const std::string &n : names)
      along.insert(axis(n));
    std::vector<std::pair<int64_t, int64_t>> members;
    for (int64_t r = 0; r < world; ++r) {
      bool same = true;
      for (int a = 0; a < static_cast<int>(axisNames.size()); ++a)
        if (!along.count(a) && coords[r][a] != coords[rank][a])
          same = false;
      if (same)
        members.push_back({indexOver(r, names), r});
    }
    std::sort(members.begin(), members.end());
    Ints out;
    for (auto &m : members)
      out.push_back(m.second);
    return out;
  }

  /// What a replica is: coordinates on the replicate and extra axes.
  Ints replicaKey(int64_t rank) const {
    Ints key;
    for (const std::string &n : c.replicate)
      key.push_back(coords[rank][axis(n)]);
    for (const std::string &n : c.extra)
      key.push_back(coords[rank][axis(n)]);
    return key;
  }

  /// The compute (gathered) box: the TP chunk of the split dim.
  Box computeBox(const RefParam &p, int64_t rank) const {
    Box b{Ints(p.shape.size(), 0), p.shape};
    if (p.tpDim >= 0) {
      auto [o, n] = chunkRange(0, p.shape[p.tpDim], tpSize, tpIndex(rank));
      b.offset[p.tpDim] = o;
      b.shape[p.tpDim] = n;
    }
    return b;
  }
  /// The stored box: FSDP chunks dim 0 of the TP-local box over the
  /// flattened shard axes.
  Box storedBox(const RefParam &p, int64_t rank) const {
    Box b = computeBox(p, rank);
    if (!c.shard.empty()) {
      auto [o, n] =
          chunkRange(b.offset[0], b.shape[0], shardSize, shardIndex(rank));
      b.offset[0] = o;
      b.shape[0] = n;
    }
    return b;
  }
  Ints paddedCompute(const RefParam &p) const {
    Ints s = p.shape;
    if (p.tpDim >= 0)
      s[p.tpDim] = ceilDiv(s[p.tpDim], tpSize);
    return s;
  }
  Ints paddedStored(const RefParam &p) const {
    Ints s = paddedCompute(p);
    if (!c.shard.empty())
      s[0] = ceilDiv(s[0], shardSize);
    return s;
  }

  //--- gradients (docs/semantics.md, "Sequence-parallel weights")

  /// [tp] + shape: a stacked gradient's global shape.
  Ints stackedShape(const RefParam &p) const {
    Ints s{tpSize};
    s.insert(s.end(), p.shape.begin(), p.shape.end());
    return s;
  }
  /// `b` under the rank's own row of the stacked leading dim: its TP
  /// coordinate.
  Box stacked(Box b, int64_t rank) const {
    b.offset.insert(b.offset.begin(), tpIndex(rank));
    b.shape.insert(b.shape.begin(), 1);
    return b;
  }
  /// The global shape of backward's gradient and of its data-parallel
  /// reductions.
  Ints gradShape(const RefParam &p) const {
    return p.stacked ? stackedShape(p) : p.shape;
  }
  /// Backward's gradient: the compute box (stacked: the rank's row of it).
  Box gradBox(const RefParam &p, int64_t rank) const {
    Box b = computeBox(p, rank);
    return p.stacked ? stacked(b, rank) : b;
  }
  /// The data-parallel reduction's result: the stored box (stacked: the
  /// rank's row of it).
  Box reducedBox(const RefParam &p, int64_t rank) const {
    Box b = storedBox(p, rank);
    return p.stacked ? stacked(b, rank) : b;
  }
  /// The padded shard of the data-parallel reduction (one row when stacked).
  Ints paddedReduced(const RefParam &p) const {
    Ints s = paddedStored(p);
    if (p.stacked)
      s.insert(s.begin(), 1);
    return s;
  }

  /// Axes (mesh order) of the amax reduction of a float8 weight: every axis
  /// splitting its stored layout.
  std::vector<std::string> amaxAxes(const RefParam &p) const {
    std::vector<std::string> out;
    for (const std::string &n : axisNames)
      if ((std::find(c.shard.begin(), c.shard.end(), n) != c.shard.end() &&
           axisSize(n) > 1) ||
          (n == c.tpAxis && p.tpDim >= 0))
        out.push_back(n);
    return out;
  }

  /// The parameter a buffer belongs to: its id, or its id less role
  /// suffixes ("w.gathered", "w.grad.2", ...); null for others (amax).
  const RefParam *rootOf(const std::string &id) const {
    std::string s = id;
    for (;;) {
      auto it = paramIndex.find(s);
      if (it != paramIndex.end())
        return &params[it->second];
      size_t dot = s.rfind('.');
      if (dot == std::string::npos)
        return nullptr;
      s.resize(dot);
    }
  }
};

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

/// Suite-wide totals, printed at the end.
struct Totals {
  int configs = 0;
  int64_t plans = 0;
  int64_t instructions = 0;
  int64_t collectivesChecked = 0;
  int64_t readsChecked = 0;
  int64_t stackedPaths = 0; ///< stacked gradients traced into an update
};
Totals totals;

class Checker {
public:
  Checker(const Config &c, const Ref &ref, const pl::PreparedTemplate &prepared,
          const std::vector<pl::Plan> &plans)
      : c(c), ref(ref), prepared(prepared), plans(plans) {
    for (const pl::BufferTemplate &b : prepared.get().buffers)
      persistent[b.id] = b.persistent;
    for (const pl::Plan &p : plans) {
      auto &bufs = buffers[p.rank];
      for (const pl::Buffer &b : p.buffers)
        bufs[b.id] = &b;
      auto &comms = communicators[p.rank];
      for (const pl::Communicator &cm : p.communicators)
        comms[cm.id] = &cm;
      planOf[p.rank] = &p;
    }
  }

  ~Checker() {
    for (auto &[check, n] : failures)
      if (n > kShown)
        ADD_FAILURE() << c.name << ": " << check << ": " << n - kShown
                      << " more failures not shown";
  }

  void run() {
    for (const pl::Plan &p : plans) {
      checkCommunicators(p);
      checkBuffers(p);
      checkCollectives(p);
      checkOptimizer(p);
      checkFloat8(p);
      checkComputes(p);
      checkSchedule(p);
      checkPeak(p);
    }
    checkParamTiling();
  }

private:
  static constexpr int kShown = 4;
  const Config &c;
  const Ref &ref;
  const pl::PreparedTemplate &prepared;
  const std::vector<pl::Plan> &plans;
  std::map<std::string, bool> persistent;
  std::map<int64_t, std::map<std::string, const pl::Buffer *>> buffers;
  std::map<int64_t, std::map<std::string, const pl::Communicator *>>
      communicators;
  std::map<int64_t, const pl::Plan *> planOf;
  std::map<std::string, int> failures;

  void fail(const std::string &check, int64_t rank, const std::string &what) {
    if (failures[check]++ < kShown)
      ADD_FAILURE() << c.name << ": " << check << ": rank " << rank << ": "
                    << what;
  }

  const pl::Buffer *buffer(int64_t rank, const std::string &id) const {
    auto &m = buffers.at(rank);
    auto it = m.find(id);
    return it == m.end() ? nullptr : it->second;
  }
  const pl::Communicator *comm(int64_t rank, const std::string &id) const {
    auto &m = communicators.at(rank);
    auto it = m.find(id);
    return it == m.end() ? nullptr : it->second;
  }
  static std::string describe(const pl::Instruction &in) {
    std::string s = "\"" + in.id + "\" " + std::string(pl::opKindName(in.op));
    if (!in.label.empty())
      s += " (" + in.label + ")";
    return s;
  }
  static std::string join(const std::vector<std::string> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i)
      s += (i ? "," : "") + v[i];
    return s + "]";
  }
  std::vector<std::string> sorted(std::vector<std::string> v) const {
    std::sort(v.begin(), v.end(),
              [&](const std::string &a, const std::string &b) {
                return ref.axis(a) < ref.axis(b);
              });
    return v;
  }
  bool anyManaged(const std::vector<std::string> &axes) const {
    for (const std::string &a : axes)
      if (ref.managed.count(a))
        return true;
    return false;
  }

  //--- comms ----------------------------------------------------------------

  void checkCommunicators(const pl::Plan &p) {
    for (const pl::Communicator &cm : p.communicators) {
      if (cm.axes.empty()) {
        fail("comms", p.rank, "communicator " + cm.id + " has no axes");
        continue;
      }
      for (const std::string &a : cm.axes)
        if (a.find(':') != std::string::npos)
          fail("comms", p.rank,
               "communicator " + cm.id + " over sub-axis " + a);
      Ints expected = ref.group(cm.axes, p.rank);
      if (cm.ranks != expected)
        fail("comms", p.rank,
             "communicator " + cm.id + " over " + join(cm.axes) + ": ranks " +
                 bf::str(cm.ranks) + ", expected " + bf::str(expected));
      auto it = std::find(expected.begin(), expected.end(), p.rank);
      if (it == expected.end() || cm.key != it - expected.begin())
        fail("comms", p.rank,
             "communicator " + cm.id + ": key " + std::to_string(cm.key));
      if (cm.faultTolerant != anyManaged(cm.axes))
        fail("comms", p.rank,
             "communicator " + cm.id + ": fault_tolerant " +
                 (cm.faultTolerant ? "true" : "false") + " over " +
                 join(cm.axes));
    }
  }

  //--- params and buffers ---------------------------------------------------

  void checkBuffers(const pl::Plan &p) {
    for (const RefParam &rp : ref.params) {
      Box stored = ref.storedBox(rp, p.rank);
      for (std::string id :
           {rp.name, rp.name + ".exp_avg", rp.name + ".exp_avg_sq"}) {
        const pl::Buffer *b = buffer(p.rank, id);
        if (!b) {
          fail("params", p.rank, "no buffer " + id);
          continue;
        }
        bool state = id != rp.name;
        if (b->kind != (state ? pl::BufferKind::OptimizerState
                              : pl::BufferKind::ParamShard))
          fail("params", p.rank,
               id + ": kind " + std::string(pl::bufferKindName(b->kind)));
        pl::DType dt = state ? pl::DType::Float32 : ref.storeDtype;
        if (b->dtype != dt)
          fail("params", p.rank,
               id + ": dtype " + std::string(pl::dtypeName(b->dtype)));
        if (b->globalShape != rp.shape)
          fail("params", p.rank,
               id + ": global shape " + bf::str(b->globalShape));
        if (boxOf(*b) != stored)
          fail("params", p.rank,
               id + ": " + str(boxOf(*b)) + ", expected " + str(stored));
      }
    }
    for (const pl::Buffer &b : p.buffers) {
      const RefParam *rp = ref.rootOf(b.id);
      if (!rp) {
        if (b.id.rfind("fp8.amax", 0) != 0)
          fail("buffers", p.rank,
               "buffer " + b.id + " belongs to no parameter");
        continue;
      }
      // A stacked parameter's gradients are stacked up to the sum over its
      // rows; the sum and the all-reduce over tp hold the stored box.
      bool stackedGrad = rp->stacked && b.kind == pl::BufferKind::Gradient &&
                         b.globalShape == ref.stackedShape(*rp);
      if (b.globalShape != rp->shape && !stackedGrad)
        fail("buffers", p.rank,
             b.id + ": global shape " + bf::str(b.globalShape) +
                 (rp->stacked && b.kind == pl::BufferKind::Gradient
                      ? ", expected " + bf::str(rp->shape) + " or stacked " +
                            bf::str(ref.stackedShape(*rp))
                      : ""));
      // Gradients are in the reduce dtype, except the float32 copy of the
      // reduced one that the optimizer reads (docs/plan-format.md,
      // optimizer_update) when the reduce dtype is another.
      bool widened = b.kind == pl::BufferKind::Gradient &&
                     ref.reduceDtype != pl::DType::Float32 &&
                     b.id == rp->name + ".float32";
      if (b.kind == pl::BufferKind::Gradient && b.dtype != ref.reduceDtype &&
          !(widened && b.dtype == pl::DType::Float32))
        fail("buffers", p.rank,
             "gradient " + b.id + ": dtype " +
                 std::string(pl::dtypeName(b.dtype)) +
                 ", expected the reduce dtype " + c.reduceDtype);
      Box box = boxOf(b), compute = ref.computeBox(*rp, p.rank),
          stored = ref.storedBox(*rp, p.rank);
      if (widened && box != stored)
        fail("buffers", p.rank,
             "float32 gradient " + b.id + ": " + str(box) +
                 ", expected the stored " + str(stored));
      if (stackedGrad) {
        Box grad = ref.gradBox(*rp, p.rank),
            reduced = ref.reducedBox(*rp, p.rank);
        if (box != grad && box != reduced)
          fail("buffers", p.rank,
               "stacked gradient " + b.id + ": " + str(box) +
                   " is neither backward's row " + str(grad) +
                   " nor the stored row " + str(reduced));
      } else if (rp->stacked && b.kind == pl::BufferKind::Gradient) {
        if (box != stored)
          fail("buffers", p.rank,
               "summed gradient " + b.id + ": " + str(box) +
                   ", expected the stored " + str(stored));
      } else if (b.kind == pl::BufferKind::Gathered) {
        if (box != compute)
          fail("buffers", p.rank,
               "gathered " + b.id + ": " + str(box) +
                   ", expected the TP-local " + str(compute));
        pl::DType dt = rp->fp8Gather ? pl::DType::Float8E4M3 : ref.computeDtype;
        if (b.dtype != dt)
          fail("buffers", p.rank,
               "gathered " + b.id + ": dtype " +
                   std::string(pl::dtypeName(b.dtype)));
      } else if (box != compute && box != stored) {
        fail("buffers", p.rank,
             b.id + ": " + str(box) + " is neither the stored " + str(stored) +
                 " nor the compute box " + str(compute));
      }
      if (b.dtype == pl::DType::Float8E4M3 && !rp->fp8Gather)
        fail("float8", p.rank, b.id + " is float8 but not a float8 gather");
    }
  }

  /// Parameters not split by TP are replicated over the TP axis too: the
  /// identity of a box is (TP coordinate when TP splits it, flattened
  /// shard coordinate); ranks with equal identity hold equal boxes, and the
  /// distinct boxes of one replica tile the parameter.
  void checkParamTiling() {
    for (const RefParam &rp : ref.params) {
      int64_t volume = bf::prod(rp.shape);
      std::map<Ints,
               std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, Box>>>
          replicas;
      std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, Box>> byCoord;
      for (const pl::Plan &p : plans) {
        const pl::Buffer *b = buffer(p.rank, rp.name);
        if (!b)
          continue;
        Box box = boxOf(*b);
        auto key = std::make_pair(rp.tpDim >= 0 ? ref.tpIndex(p.rank) : -1,
                                  ref.shardIndex(p.rank));
        replicas[ref.replicaKey(p.rank)].emplace(key,
                                                 std::make_pair(p.rank, box));
        auto [it, inserted] = byCoord.emplace(key, std::make_pair(p.rank, box));
        if (!inserted && it->second.second != box)
          fail("params", p.rank,
               rp.name + ": " + str(box) + " differs from rank " +
                   std::to_string(it->second.first) + "'s " +
                   str(it->second.second) +
                   " though they differ only along replicate/extra axes" +
                   (rp.tpDim < 0 ? " (and tp, which does not split it)" : ""));
      }
      for (auto &[key, byIdentity] : replicas) {
        std::vector<std::pair<int64_t, Box>> boxes;
        for (auto &[identity, rankBox] : byIdentity)
          boxes.push_back(rankBox);
        int64_t sum = 0;
        for (size_t i = 0; i < boxes.size(); ++i) {
          const Box &a = boxes[i].second;
          sum += bf::prod(a.shape);
          for (size_t d = 0; d < a.shape.size(); ++d)
            if (a.offset[d] < 0 || a.offset[d] + a.shape[d] > rp.shape[d])
              fail("params", boxes[i].first,
                   rp.name + ": " + str(a) + " outside " + bf::str(rp.shape));
          for (size_t j = 0; j < i; ++j)
            if (intersects(a, boxes[j].second))
              fail("params", boxes[i].first,
                   rp.name + ": " + str(a) + " overlaps rank " +
                       std::to_string(boxes[j].first) + "'s " +
                       str(boxes[j].second));
        }
        if (sum != volume)
          fail("params", boxes.front().first,
               rp.name + ": the replica " + bf::str(key) + " holds " +
                   std::to_string(sum) + " elements of " +
                   std::to_string(volume));
      }
    }
  }

  //--- collectives ------------------------------------------------------------

  /// Members' boxes of one buffer role concatenate, in key order, along
  /// `dim` into `whole`: FSDP's chunk order (empty chunks last). `dim` is
  /// the parameter's dim 0: 1 under a stacked gradient's rows.
  void checkConcatenation(int64_t rank, const std::string &what,
                          const std::vector<std::pair<int64_t, Box>> &parts,
                          const Box &whole, size_t dim = 0) {
    int64_t next = whole.offset[dim];
    bool emptySeen = false;
    for (auto &[member, b] : parts) {
      if (b.shape.size() != whole.shape.size()) {
        fail("counts", rank,
             what + ": member rank " + std::to_string(member) + " holds " +
                 str(b) + ", of another rank than " + str(whole));
        return;
      }
      if (b.shape[dim] == 0) {
        emptySeen = true;
        continue;
      }
      bool ok = !emptySeen && b.offset[dim] == next;
      for (size_t d = 0; d < b.shape.size(); ++d)
        if (d != dim)
          ok &= b.offset[d] == whole.offset[d] && b.shape[d] == whole.shape[d];
      if (!ok) {
        fail("counts", rank,
             what + ": member rank " + std::to_string(member) + " holds " +
                 str(b) + ", which is not the next chunk of " + str(whole));
        return;
      }
      next += b.shape[dim];
    }
    if (next != whole.offset[dim] + whole.shape[dim])
      fail("counts", rank,
           what + ": the members' shards end at " + std::to_string(next) +
               ", not at the end of " + str(whole));
  }

  /// The member plans' versions of instruction `k` of this rank.
  std::vector<std::pair<int64_t, const pl::Instruction *>>
  members(const pl::Plan &p, size_t k, const pl::Communicator &cm) {
    std::vector<std::pair<int64_t, const pl::Instruction *>> out;
    for (int64_t m : cm.ranks) {
      const pl::Plan *mp = planOf.at(m);
      if (k >= mp->program.size() || mp->program[k].id != p.program[k].id) {
        fail("counts", p.rank,
             "rank " + std::to_string(m) + " has no instruction " +
                 p.program[k].id + " at the same position");
        return {};
      }
      out.push_back({m, &mp->program[k]});
    }
    return out;
  }

  /// The buffer with root `rp` among `ids` on `rank`.
  const pl::Buffer *withRoot(int64_t rank, const std::vector<std::string> &ids,
                             const RefParam *rp) const {
    for (const std::string &id : ids)
      if (ref.rootOf(id) == rp)
        return buffer(rank, id);
    return nullptr;
  }

  void checkCollectives(const pl::Plan &p) {
    for (size_t k = 0; k < p.program.size(); ++k) {
      const pl::Instruction &in = p.program[k];
      if (!pl::isCollective(in.op))
        continue;
      ++totals.collectivesChecked;
      const pl::Communicator *cm = comm(p.rank, in.comm);
      if (!cm) {
        fail("counts", p.rank, describe(in) + ": unknown communicator");
        continue;
      }
      int64_t groupSize = static_cast<int64_t>(cm->ranks.size());
      if (in.op == pl::OpKind::AllReduce && in.reduce == ReduceOp::Max)
        continue; // the float8 amax: checkFloat8
      bool gather = in.op == pl::OpKind::AllGather;
      bool scatter = in.op == pl::OpKind::ReduceScatter;
      bool reduce = in.op == pl::OpKind::AllReduce;
      if (!gather && !scatter && !reduce) {
        fail("counts", p.rank, describe(in) + ": unexpected collective");
        continue;
      }
      if (in.inputs.size() != in.outputs.size() || in.inputs.empty()) {
        fail("counts", p.rank,
             describe(in) + ": " + std::to_string(in.inputs.size()) +
                 " inputs but " + std::to_string(in.outputs.size()) +
                 " outputs");
        continue;
      }
      // Which all-reduce this is follows from what it reads, never from its
      // own op or communicator: the summed (unstacked) gradients of stacked
      // parameters are all-reduced over tp; everything else (plain
      // gradients, stacked rows) is the data-parallel all-reduce.
      size_t summedInputs = 0;
      for (const std::string &id : in.inputs) {
        const RefParam *rp = ref.rootOf(id);
        const pl::Buffer *b = buffer(p.rank, id);
        summedInputs += rp && b && rp->stacked &&
                        b->kind == pl::BufferKind::Gradient &&
                        b->globalShape == rp->shape;
      }
      bool tpReduce = reduce && summedInputs > 0;
      if (summedInputs && (!reduce || summedInputs != in.inputs.size()))
        fail("grads", p.rank,
             describe(in) + " reads " + std::to_string(summedInputs) +
                 " summed sequence-parallel gradients among " +
                 std::to_string(in.inputs.size()) +
                 " inputs (only an all-reduce over tp of summed ones may)");
      // Gathers run over exactly the shard axes, flattened in the spec's
      // order (the order is the chunk order); gradient reductions too. The
      // all-reduce of summed rows runs over exactly the TP axis: the only
      // gradient collective spanning tp.
      std::vector<std::string> expectedAxes =
          gather || scatter ? ref.nontrivial(c.shard)
          : tpReduce        ? std::vector<std::string>{c.tpAxis}
                            : sorted(ref.nontrivial(c.replicate));
      std::vector<std::string> axes = reduce ? sorted(cm->axes) : cm->axes;
      if (axes != expectedAxes)
        fail(gather ? "counts" : "grads", p.rank,
             describe(in) + " over " + join(cm->axes) + ", expected " +
                 join(expectedAxes));
      if (!tpReduce && !c.tpAxis.empty() &&
          std::find(cm->axes.begin(), cm->axes.end(), c.tpAxis) !=
              cm->axes.end())
        fail(gather ? "counts" : "grads", p.rank,
             describe(in) + " spans the TP axis " + c.tpAxis +
                 " (only the all-reduce of summed sequence-parallel "
                 "gradients may)");
      if (reduce && cm->faultTolerant != anyManaged(cm->axes))
        fail("grads", p.rank, describe(in) + ": fault_tolerant is wrong");
      if ((scatter || (reduce && !tpReduce)) && in.reduce != ReduceOp::Avg)
        fail("grads", p.rank, describe(in) + ": reduce op is not avg");
      if (tpReduce && in.reduce != ReduceOp::Sum)
        fail("grads", p.rank,
             describe(in) + ": reduce op is not sum (the rows' contributions "
                            "add up over tp)");
      if ((scatter || reduce) && in.dtype != ref.reduceDtype)
        fail(
            "grads", p.rank,
            describe(in) + ": dtype " +
                std::string(pl::dtypeName(in.dtype.value_or(pl::DType::Int8))) +
                ", expected the reduce dtype " + c.reduceDtype);

      auto mine = members(p, k, *cm);
      int64_t expectedCount = 0;
      for (const std::string &outId : in.outputs) {
        const RefParam *rp = ref.rootOf(outId);
        const pl::Buffer *out = buffer(p.rank, outId);
        const pl::Buffer *inBuf = withRoot(p.rank, in.inputs, rp);
        if (!rp || !out || !inBuf) {
          fail("counts", p.rank,
               describe(in) + ": output " + outId + " has no matching input");
          continue;
        }
        Box stored = ref.storedBox(*rp, p.rank),
            compute = ref.computeBox(*rp, p.rank),
            grad = ref.gradBox(*rp, p.rank),
            reduced = ref.reducedBox(*rp, p.rank);
        int64_t paddedShard = bf::prod(ref.paddedStored(*rp));
        // Gradient reductions of stacked rows count the padded stacked
        // shard ([1] + padded stored shape); the all-reduce over tp the
        // padded stored shard.
        expectedCount +=
            gather || tpReduce ? paddedShard : bf::prod(ref.paddedReduced(*rp));
        if (gather) {
          if (boxOf(*inBuf) != stored || boxOf(*out) != compute)
            fail("counts", p.rank,
                 describe(in) + ": gathers " + inBuf->id + " " +
                     str(boxOf(*inBuf)) + " into " + out->id + " " +
                     str(boxOf(*out)));
          if (groupSize * paddedShard < bf::prod(compute.shape))
            fail("counts", p.rank,
                 describe(in) +
                     ": group size x padded shard < gathered elements of " +
                     rp->name);
          pl::DType dt =
              rp->fp8Gather ? pl::DType::Float8E4M3 : ref.computeDtype;
          if (in.dtype != dt || out->dtype != dt)
            fail(rp->fp8Gather ? "float8" : "counts", p.rank,
                 describe(in) + ": gathers " + rp->name + " as " +
                     std::string(
                         pl::dtypeName(in.dtype.value_or(pl::DType::Int8))) +
                     ", expected " + std::string(pl::dtypeName(dt)));
          std::vector<std::pair<int64_t, Box>> parts;
          for (auto &[m, mi] : mine) {
            const pl::Buffer *mIn = withRoot(m, mi->inputs, rp);
            const pl::Buffer *mOut = withRoot(m, mi->outputs, rp);
            if (!mIn || !mOut)
              continue;
            if (boxOf(*mOut) != compute)
              fail("counts", p.rank,
                   describe(in) + ": member rank " + std::to_string(m) +
                       " gathers " + rp->name + " into " + str(boxOf(*mOut)) +
                       ", this rank into " + str(compute));
            parts.push_back({m, boxOf(*mIn)});
          }
          checkConcatenation(p.rank, describe(in) + " of " + rp->name, parts,
                             compute);
        } else if (scatter) {
          // Stacked rows scatter along the parameter's dim 0 (dim 1), each
          // rank keeping its own row.
          if (boxOf(*inBuf) != grad || boxOf(*out) != reduced)
            fail("grads", p.rank,
                 describe(in) + ": scatters " + inBuf->id + " " +
                     str(boxOf(*inBuf)) + " into " + out->id + " " +
                     str(boxOf(*out)) + ", expected " + str(grad) + " into " +
                     str(reduced));
          std::vector<std::pair<int64_t, Box>> parts;
          for (auto &[m, mi] : mine) {
            const pl::Buffer *mIn = withRoot(m, mi->inputs, rp);
            const pl::Buffer *mOut = withRoot(m, mi->outputs, rp);
            if (mIn && boxOf(*mIn) != grad)
              fail("grads", p.rank,
                   describe(in) + ": member rank " + std::to_string(m) +
                       " scatters " + str(boxOf(*mIn)) + ", this rank " +
                       str(grad));
            if (mOut)
              parts.push_back({m, boxOf(*mOut)});
          }
          checkConcatenation(p.rank, describe(in) + " of " + rp->name, parts,
                             grad, rp->stacked ? 1 : 0);
        } else {
          // The all-reduced buffer is the stored shard (the compute box
          // without FSDP: they are the same then); over the data-parallel
          // axes, the rank's row of it when stacked. Members hold the same
          // box: replicas the same row, TP ranks the same (unsplit) shard.
          Box expected = tpReduce ? stored : reduced;
          if (boxOf(*inBuf) != expected || boxOf(*out) != expected)
            fail("grads", p.rank,
                 describe(in) + ": all-reduces " + inBuf->id + " " +
                     str(boxOf(*inBuf)) + " into " + str(boxOf(*out)) +
                     ", expected the shard " + str(expected));
          for (auto &[m, mi] : mine) {
            const pl::Buffer *mIn = withRoot(m, mi->inputs, rp);
            if (mIn && boxOf(*mIn) != expected)
              fail("grads", p.rank,
                   describe(in) + ": member rank " + std::to_string(m) +
                       " all-reduces " + str(boxOf(*mIn)) + ", this rank " +
                       str(expected));
          }
        }
      }
      if (in.count != expectedCount)
        fail("counts", p.rank,
             describe(in) + ": count " + std::to_string(in.count) +
                 ", expected " + std::to_string(expectedCount) +
                 " (padded shards)");
      for (auto &[m, mi] : mine)
        if (mi->count != in.count || mi->dtype != in.dtype || mi->op != in.op)
          fail("counts", p.rank,
               describe(in) + ": member rank " + std::to_string(m) +
                   " issues count " + std::to_string(mi->count));
    }
  }

  //--- gradients and the optimizer --------------------------------------------

  /// A gradient buffer is a summed (unstacked) gradient of a stacked
  /// parameter: what the sum writes and the all-reduce over tp reads.
  bool summedGradient(const pl::Buffer &b, const RefParam &rp) const {
    return rp.stacked && b.kind == pl::BufferKind::Gradient &&
           b.globalShape == rp.shape;
  }

  /// A step of a gradient's path as the checks compare it: the op, its
  /// reduce op, and the axes of its communicator (all-reduces: mesh order).
  std::string step(const pl::Plan &p, const pl::Instruction &in) const {
    std::string s(pl::opKindName(in.op));
    if (in.reduce)
      s += "(" + std::string(reduceOpName(*in.reduce)) + ")";
    if (pl::isCollective(in.op)) {
      const pl::Communicator *cm = comm(p.rank, in.comm);
      std::vector<std::string> axes =
          cm ? cm->axes : std::vector<std::string>{"?"};
      s += " over " +
           join(in.op == pl::OpKind::AllReduce && cm ? sorted(axes) : axes);
    }
    return s;
  }

  /// docs/semantics.md: the steps from backward's gradient to the optimizer
  /// update, in order.
  std::vector<std::string> expectedPath(const RefParam &rp) const {
    std::vector<std::string> out;
    if (ref.shardSize > 1)
      out.push_back("reduce_scatter(avg) over " +
                    join(ref.nontrivial(c.shard)));
    // "every_microbatch": microbatch 0's reduced shard is the accumulator,
    // each later microbatch's reduced shard is added into it; the replicate
    // all-reduce runs once, on the sum.
    if (c.everyMicrobatch())
      for (int64_t mb = 1; mb < c.ga; ++mb)
        out.push_back("accumulate");
    if (!ref.nontrivial(c.replicate).empty())
      out.push_back("all_reduce(avg) over " +
                    join(sorted(ref.nontrivial(c.replicate))));
    if (rp.stacked) {
      out.push_back("sum");
      out.push_back("all_reduce(sum) over " + join({c.tpAxis}));
    }
    // The update reads a float32 gradient: a reduced bf16 or fp16 one is
    // widened last.
    if (ref.reduceDtype != pl::DType::Float32)
      out.push_back("cast");
    return out;
  }

  /// Microbatches whose reduced shard was added into an accumulator, per
  /// parameter (each of 1..ga-1 exactly once).
  mutable std::map<std::string, std::multiset<int64_t>> addedMicrobatches;

  /// One accumulate's addend: written by a reduce-scatter over the shard
  /// axes (or, without sharding, by backward itself) of a backward of `rp`'s
  /// unit for a later microbatch.
  bool checkAddend(const pl::Plan &p, size_t at, const std::string &id,
                   const RefParam &rp, std::string &error) const {
    std::string current = id;
    for (size_t reader = at;;) {
      size_t w = reader;
      for (size_t i = 0; i < reader; ++i) {
        const pl::Instruction &x = p.program[i];
        if (x.op != pl::OpKind::Free &&
            std::find(x.outputs.begin(), x.outputs.end(), current) !=
                x.outputs.end())
          w = i;
      }
      if (w == reader) {
        error = "nothing writes the addend " + current;
        return false;
      }
      const pl::Instruction &in = p.program[w];
      if (in.op == pl::OpKind::Compute) {
        std::string prefix = "backward " + rp.unit + " (microbatch ";
        if (in.label.rfind(prefix, 0) != 0) {
          error = describe(in) + " writes the addend " + current;
          return false;
        }
        int64_t mb = std::stoll(in.label.substr(prefix.size()));
        addedMicrobatches[rp.name].insert(mb);
        if (ref.shardSize > 1 && current == id) {
          error = "the addend " + id + " is not reduce-scattered";
          return false;
        }
        return true;
      }
      std::string expected =
          "reduce_scatter(avg) over " + join(ref.nontrivial(c.shard));
      if (current != id || step(p, in) != expected) {
        error = "the addend " + id + " is made by " + step(p, in) +
                ", expected " + expected + " of one backward";
        return false;
      }
      std::string next;
      for (size_t k = 0; k < in.outputs.size(); ++k)
        if (in.outputs[k] == current && k < in.inputs.size())
          next = in.inputs[k];
      current = next;
      reader = w;
    }
  }

  /// The path of the gradient `id` of `rp` that instruction `at` reads:
  /// from each reader to the last earlier writer of what it reads (program
  /// order: the version the program means), back to the backward compute
  /// that wrote it. Empty with `error` set when the trail breaks.
  std::vector<std::string> gradientPath(const pl::Plan &p, size_t at,
                                        std::string id, const RefParam &rp,
                                        std::string &error) const {
    std::vector<std::string> path;
    for (;;) {
      size_t w = at;
      for (size_t i = 0; i < at; ++i) {
        const pl::Instruction &x = p.program[i];
        if (x.op != pl::OpKind::Free &&
            std::find(x.outputs.begin(), x.outputs.end(), id) !=
                x.outputs.end())
          w = i;
      }
      if (w == at) {
        error = "nothing writes " + id + " before " + describe(p.program[at]);
        return {};
      }
      const pl::Instruction &in = p.program[w];
      if (in.op == pl::OpKind::Compute) {
        // The accumulator comes from microbatch 0 when every microbatch is
        // reduced, else the last backward holds the accumulated gradient.
        std::string expected = "backward " + rp.unit;
        if (c.ga > 1)
          expected += " (microbatch " +
                      std::to_string(c.everyMicrobatch() ? 0 : c.ga - 1) + ")";
        if (in.label != expected) {
          error = describe(in) + " writes " + id + ", expected " + expected;
          return {};
        }
        std::reverse(path.begin(), path.end());
        return path;
      }
      path.push_back(step(p, in));
      std::string next;
      if (in.op == pl::OpKind::Accumulate) {
        // Output k is input 2k (in place); input 2k + 1 is one later
        // microbatch's reduced shard: reduced from backward as microbatch 0's
        // was, by a reduce-scatter over exactly the shard axes.
        for (size_t k = 0; k < in.outputs.size(); ++k)
          if (in.outputs[k] == id && 2 * k + 1 < in.inputs.size() &&
              ref.rootOf(in.inputs[2 * k]) == &rp) {
            next = in.inputs[2 * k];
            std::string addend = in.inputs[2 * k + 1];
            if (!checkAddend(p, w, addend, rp, error))
              return {};
          }
        if (next.empty()) {
          error = describe(in) + " accumulates into " + id +
                  " from no gradient of " + rp.name;
          return {};
        }
        id = next;
        at = w;
        continue;
      }
      for (size_t k = 0; k < in.outputs.size(); ++k)
        if (in.outputs[k] == id && k < in.inputs.size() &&
            ref.rootOf(in.inputs[k]) == &rp)
          next = in.inputs[k];
      if (next.empty()) {
        error = describe(in) + " writes " + id + " from no gradient of " +
                rp.name + " at the same position";
        return {};
      }
      id = next;
      at = w;
    }
  }

  /// `sum` (docs/plan-format.md): the local sum of a stacked gradient's
  /// rows, from the data-parallel reduction's stored row to the stored box.
  void checkSum(const pl::Plan &p, const pl::Instruction &in) {
    if (in.inputs.empty() || in.inputs.size() != in.outputs.size()) {
      fail("grads", p.rank,
           describe(in) + ": " + std::to_string(in.inputs.size()) +
               " inputs but " + std::to_string(in.outputs.size()) + " outputs");
      return;
    }
    if (in.dtype != ref.reduceDtype)
      fail("grads", p.rank,
           describe(in) + ": dtype " +
               std::string(pl::dtypeName(in.dtype.value_or(pl::DType::Int8))) +
               ", expected the reduce dtype " + c.reduceDtype);
    if (!in.comm.empty())
      fail("grads", p.rank, describe(in) + " names a communicator");
    for (size_t k = 0; k < in.inputs.size(); ++k) {
      const RefParam *rp = ref.rootOf(in.inputs[k]);
      const pl::Buffer *from = buffer(p.rank, in.inputs[k]);
      const pl::Buffer *to = buffer(p.rank, in.outputs[k]);
      if (!rp || !from || !to || ref.rootOf(in.outputs[k]) != rp) {
        fail("grads", p.rank,
             describe(in) + " sums " + in.inputs[k] + " into " + in.outputs[k]);
        continue;
      }
      if (!rp->stacked) {
        fail("grads", p.rank,
             describe(in) + " sums the gradient of " + rp->name +
                 ", which is not stacked (not sequence-parallel under TP)");
        continue;
      }
      Box reduced = ref.reducedBox(*rp, p.rank),
          stored = ref.storedBox(*rp, p.rank);
      if (from->kind != pl::BufferKind::Gradient ||
          from->globalShape != ref.stackedShape(*rp) || boxOf(*from) != reduced)
        fail("grads", p.rank,
             describe(in) + " sums " + from->id + " " +
                 bf::str(from->globalShape) + " " + str(boxOf(*from)) +
                 ", expected the stacked " + bf::str(ref.stackedShape(*rp)) +
                 " " + str(reduced));
      if (!summedGradient(*to, *rp) || boxOf(*to) != stored)
        fail("grads", p.rank,
             describe(in) + " sums into " + to->id + " " +
                 bf::str(to->globalShape) + " " + str(boxOf(*to)) +
                 ", expected the gradient " + bf::str(rp->shape) + " " +
                 str(stored));
    }
  }

  void checkOptimizer(const pl::Plan &p) {
    std::map<std::string, int> updates, scatters, reduces, sums, tpReduces;
    for (size_t k = 0; k < p.program.size(); ++k) {
      const pl::Instruction &in = p.program[k];
      if (in.op == pl::OpKind::ReduceScatter)
        for (const std::string &id : in.inputs)
          if (const RefParam *rp = ref.rootOf(id))
            ++scatters[rp->name];
      // All-reduces of summed rows are the TP ones (checkCollectives checks
      // they run over tp and sum); the others the data-parallel ones.
      if (in.op == pl::OpKind::AllReduce && in.reduce != ReduceOp::Max)
        for (const std::string &id : in.inputs)
          if (const RefParam *rp = ref.rootOf(id)) {
            const pl::Buffer *b = buffer(p.rank, id);
            ++(b && summedGradient(*b, *rp) ? tpReduces : reduces)[rp->name];
          }
      if (in.op == pl::OpKind::Sum) {
        checkSum(p, in);
        for (const std::string &id : in.inputs)
          if (const RefParam *rp = ref.rootOf(id))
            ++sums[rp->name];
      }
      if (in.op != pl::OpKind::OptimizerUpdate)
        continue;
      std::set<std::string> outputs(in.outputs.begin(), in.outputs.end());
      for (const std::string &id : in.inputs) {
        const pl::Buffer *b = buffer(p.rank, id);
        const RefParam *rp = ref.rootOf(id);
        if (!b || !rp) {
          fail("grads", p.rank, describe(in) + " reads " + id);
          continue;
        }
        switch (b->kind) {
        case pl::BufferKind::ParamShard:
          ++updates[rp->name];
          if (!outputs.count(id))
            fail("grads", p.rank, describe(in) + " does not write " + id);
          break;
        case pl::BufferKind::OptimizerState:
          if (!outputs.count(id))
            fail("grads", p.rank, describe(in) + " does not write " + id);
          break;
        case pl::BufferKind::Gradient: {
          Box stored = ref.storedBox(*rp, p.rank);
          if (b->globalShape != rp->shape || boxOf(*b) != stored)
            fail("grads", p.rank,
                 describe(in) + " reads gradient " + id + " " +
                     bf::str(b->globalShape) + " " + str(boxOf(*b)) +
                     ", but the shard of " + rp->name + " is " +
                     bf::str(rp->shape) + " " + str(stored));
          // AdamW reads a float32 gradient, whatever the reduce dtype.
          if (b->dtype != pl::DType::Float32)
            fail("grads", p.rank,
                 describe(in) + " reads gradient " + id + " in " +
                     std::string(pl::dtypeName(b->dtype)) +
                     ", expected float32");
          bool ownParam = std::find(in.inputs.begin(), in.inputs.end(),
                                    rp->name) != in.inputs.end();
          if (!ownParam)
            fail("grads", p.rank,
                 describe(in) + " reads " + id + " without its parameter");
          std::string error;
          std::vector<std::string> path = gradientPath(p, k, id, *rp, error);
          std::vector<std::string> expected = expectedPath(*rp);
          if (!error.empty())
            fail("grads", p.rank, describe(in) + " reads " + id + ": " + error);
          else if (rp->stacked)
            ++totals.stackedPaths;
          if (error.empty() && path != expected)
            fail("grads", p.rank,
                 describe(in) + " reads " + id + " made by " + join(path) +
                     " from backward, expected " + join(expected) +
                     (rp->stacked ? " (a stacked sequence-parallel gradient)"
                                  : ""));
          break;
        }
        default:
          fail("grads", p.rank,
               describe(in) + " reads " + id + " of kind " +
                   std::string(pl::bufferKindName(b->kind)));
        }
      }
    }
    int64_t replicaCount = 1;
    for (const std::string &a : c.replicate)
      replicaCount *= ref.axisSize(a);
    bool shards = ref.shardSize > 1, replicas = replicaCount > 1;
    for (const RefParam &rp : ref.params) {
      if (updates[rp.name] != 1)
        fail("grads", p.rank,
             rp.name + " is updated " + std::to_string(updates[rp.name]) +
                 " times");
      // Once per microbatch with "every_microbatch", else once per step.
      int64_t scattersPerStep = c.everyMicrobatch() ? c.ga : 1;
      if (scatters[rp.name] != (shards ? scattersPerStep : 0))
        fail("grads", p.rank,
             rp.name + "'s gradient is reduce-scattered " +
                 std::to_string(scatters[rp.name]) + " times");
      if (reduces[rp.name] != (replicas ? 1 : 0))
        fail("grads", p.rank,
             rp.name + "'s gradient is all-reduced over the replicate axes " +
                 std::to_string(reduces[rp.name]) + " times");
      if (sums[rp.name] != (rp.stacked ? 1 : 0))
        fail("grads", p.rank,
             rp.name + "'s gradient rows are summed " +
                 std::to_string(sums[rp.name]) + " times" +
                 (rp.stacked ? "" : " (it is not stacked)"));
      if (c.everyMicrobatch()) {
        std::multiset<int64_t> expected;
        for (int64_t mb = 1; mb < c.ga; ++mb)
          expected.insert(mb);
        if (addedMicrobatches[rp.name] != expected)
          fail("grads", p.rank,
               rp.name + "'s accumulator adds " +
                   std::to_string(addedMicrobatches[rp.name].size()) +
                   " microbatches' reduced shards, expected microbatches "
                   "1.." +
                   std::to_string(c.ga - 1) + " once each");
        addedMicrobatches[rp.name].clear();
      }
      if (tpReduces[rp.name] != (rp.stacked ? 1 : 0))
        fail("grads", p.rank,
             rp.name + "'s summed gradient is all-reduced over tp " +
                 std::to_string(tpReduces[rp.name]) + " times");
    }
  }

  //--- float8
  //------------------------------------------------------------------

  void checkFloat8(const pl::Plan &p) {
    // Expected: one set per distinct amax axes, in order of first appearance.
    std::map<std::vector<std::string>, std::set<std::string>> sets;
    for (const RefParam &rp : ref.params)
      if (rp.fp8Gather)
        sets[ref.amaxAxes(rp)].insert(rp.name);
    std::map<std::string, std::string> amaxOf; ///< weight -> reduced amax id
    int amaxInstructions = 0, maxReduces = 0;
    for (size_t k = 0; k < p.program.size(); ++k) {
      const pl::Instruction &in = p.program[k];
      if (in.op == pl::OpKind::Fp8Cast) {
        if (sets.empty())
          fail("float8", p.rank, describe(in) + " without float8 all-gather");
        if (in.dtype != pl::DType::Float8E4M3)
          fail("float8", p.rank, describe(in) + ": not float8_e4m3fn");
      }
      if (in.op != pl::OpKind::Fp8Amax)
        continue;
      ++amaxInstructions;
      std::set<std::string> weights;
      for (const std::string &id : in.inputs) {
        const pl::Buffer *b = buffer(p.rank, id);
        if (!b || b->kind != pl::BufferKind::ParamShard)
          fail("float8", p.rank,
               describe(in) + " reads " + id + ", not a parameter shard");
        weights.insert(id);
      }
      std::vector<std::string> axes;
      bool found = false;
      for (auto &[a, set] : sets)
        if (set == weights) {
          axes = a;
          found = true;
        }
      if (!found) {
        fail("float8", p.rank,
             describe(in) + " takes the amax of weights that are not one set "
                            "split by the same axes");
        continue;
      }
      if (in.outputs.size() != 1) {
        fail("float8", p.rank, describe(in) + ": not one output");
        continue;
      }
      const pl::Buffer *local = buffer(p.rank, in.outputs[0]);
      if (!local ||
          local->globalShape != Ints{static_cast<int64_t>(weights.size())})
        fail("float8", p.rank, describe(in) + ": amax buffer shape");
      // The one MAX all-reduce of that amax.
      int readers = 0;
      for (const pl::Instruction &ar : p.program) {
        if (std::find(ar.inputs.begin(), ar.inputs.end(), in.outputs[0]) ==
                ar.inputs.end() ||
            ar.op == pl::OpKind::Free)
          continue;
        ++readers;
        if (ar.op != pl::OpKind::AllReduce || ar.reduce != ReduceOp::Max) {
          fail("float8", p.rank,
               describe(ar) + " reads the local amax (not the MAX all-reduce)");
          continue;
        }
        ++maxReduces;
        const pl::Communicator *cm = comm(p.rank, ar.comm);
        if (!cm || cm->axes != axes)
          fail("float8", p.rank,
               describe(ar) + " over " + (cm ? join(cm->axes) : "?") +
                   ", expected " + join(axes));
        if (ar.count != static_cast<int64_t>(weights.size()) ||
            ar.dtype != pl::DType::Float32)
          fail("float8", p.rank,
               describe(ar) + ": count " + std::to_string(ar.count) +
                   ", expected " + std::to_string(weights.size()));
        if (cm && cm->faultTolerant)
          fail("float8", p.rank, describe(ar) + " is fault tolerant");
        if (ar.outputs.size() == 1)
          for (const std::string &w : weights)
            amaxOf[w] = ar.outputs[0];
      }
      if (readers != 1)
        fail("float8", p.rank,
             describe(in) + ": " + std::to_string(readers) +
                 " readers of the local amax");
    }
    if (amaxInstructions != static_cast<int>(sets.size()))
      fail("float8", p.rank,
           std::to_string(amaxInstructions) +
               " fp8_amax instructions, expected " +
               std::to_string(sets.size()) + " (one per distinct split)");
    for (const pl::Instruction &in : p.program) {
      if (in.op == pl::OpKind::AllReduce && in.reduce == ReduceOp::Max &&
          --maxReduces < 0)
        fail("float8", p.rank, describe(in) + ": a MAX all-reduce of no amax");
      if (in.op != pl::OpKind::Compute)
        continue;
      std::string unit = unitOf(in);
      std::set<std::string> needed;
      for (const RefParam &rp : ref.params)
        if (rp.unit == unit && rp.fp8Gather)
          needed.insert(amaxOf[rp.name]);
      for (const std::string &a : needed)
        if (std::find(in.inputs.begin(), in.inputs.end(), a) == in.inputs.end())
          fail("float8", p.rank, describe(in) + " does not read the amax " + a);
      for (const std::string &id : in.inputs)
        if (id.rfind("fp8.amax", 0) == 0 && !needed.count(id))
          fail("float8", p.rank,
               describe(in) + " reads the amax " + id +
                   " of no weight it uses");
    }
  }

  //--- computes
  //------------------------------------------------------------------

  static std::string unitOf(const pl::Instruction &in) {
    std::string s = in.label;
    for (std::string prefix : {"forward ", "backward "})
      if (s.rfind(prefix, 0) == 0)
        s = s.substr(prefix.size());
    // Then notes in parentheses: " (microbatch 1)".
    size_t note = s.find(" (");
    if (note != std::string::npos)
      s.resize(note);
    return s;
  }

  void checkComputes(const pl::Plan &p) {
    std::vector<std::string> expected, labels;
    for (int64_t mb = 0; mb < c.ga; ++mb) {
      std::string suffix =
          c.ga > 1 ? " (microbatch " + std::to_string(mb) + ")" : "";
      for (const std::string &u : ref.units)
        expected.push_back("forward " + u + suffix);
      for (auto it = ref.units.rbegin(); it != ref.units.rend(); ++it)
        expected.push_back("backward " + *it + suffix);
    }
    for (const pl::Instruction &in : p.program) {
      if (in.op != pl::OpKind::Compute)
        continue;
      labels.push_back(in.label);
      bool backward = in.label.rfind("backward ", 0) == 0;
      std::string unit = unitOf(in);
      std::map<std::string, int> reads, grads;
      for (const std::string &id : in.inputs) {
        const pl::Buffer *b = buffer(p.rank, id);
        const RefParam *rp = ref.rootOf(id);
        if (!rp || !b)
          continue;
        if (rp->unit != unit) {
          fail("computes", p.rank,
               describe(in) + " reads " + id + " of unit " + rp->unit);
          continue;
        }
        if (b->kind == pl::BufferKind::Gradient) {
          ++grads[rp->name]; // accumulation into the previous microbatch's
          Box grad = ref.gradBox(*rp, p.rank);
          if (b->globalShape != ref.gradShape(*rp) || boxOf(*b) != grad)
            fail("computes", p.rank,
                 describe(in) + " accumulates into " + id + " " +
                     bf::str(b->globalShape) + " " + str(boxOf(*b)) +
                     ", expected " + bf::str(ref.gradShape(*rp)) + " " +
                     str(grad));
          continue;
        }
        ++reads[rp->name];
        Box compute = ref.computeBox(*rp, p.rank);
        if (boxOf(*b) != compute)
          fail("computes", p.rank,
               describe(in) + " reads " + id + " " + str(boxOf(*b)) +
                   ", expected the compute box " + str(compute));
        pl::DType dt = rp->fp8Gather ? pl::DType::Float8E4M3 : ref.computeDtype;
        if (b->dtype != dt)
          fail("computes", p.rank,
               describe(in) + " reads " + id + " in " +
                   std::string(pl::dtypeName(b->dtype)));
        if (ref.gathers && b->kind != pl::BufferKind::Gathered)
          fail("computes", p.rank,
               describe(in) + " reads " + id + " of kind " +
                   std::string(pl::bufferKindName(b->kind)));
      }
      // With "last_microbatch", later backwards add into the unsharded
      // gradients of the one before; with "every_microbatch" each writes
      // fresh ones (the accumulation happens on the reduced shards).
      bool later = c.ga > 1 && !c.everyMicrobatch() &&
                   in.label.find("(microbatch 0)") == std::string::npos;
      for (const RefParam &rp : ref.params) {
        if (rp.unit != unit)
          continue;
        if (reads[rp.name] != 1)
          fail("computes", p.rank,
               describe(in) + " reads " + rp.name + " " +
                   std::to_string(reads[rp.name]) + " times");
        if (grads[rp.name] != (backward && later ? 1 : 0))
          fail("computes", p.rank,
               describe(in) + " reads " + std::to_string(grads[rp.name]) +
                   " gradients of " + rp.name);
      }
      if (!backward)
        continue;
      std::set<std::string> produced;
      for (const std::string &id : in.outputs) {
        const pl::Buffer *b = buffer(p.rank, id);
        const RefParam *rp = ref.rootOf(id);
        if (!b || !rp || b->kind != pl::BufferKind::Gradient) {
          fail("computes", p.rank, describe(in) + " writes " + id);
          continue;
        }
        produced.insert(rp->name);
        // Sequence-parallel weights' gradients come stacked: the rank's own
        // row (its TP coordinate) of [tp] + shape.
        Box grad = ref.gradBox(*rp, p.rank);
        if (b->globalShape != ref.gradShape(*rp) || boxOf(*b) != grad ||
            b->dtype != ref.reduceDtype)
          fail("computes", p.rank,
               describe(in) + " writes " + id + " " + bf::str(b->globalShape) +
                   " " + str(boxOf(*b)) + " in " +
                   std::string(pl::dtypeName(b->dtype)) + ", expected " +
                   bf::str(ref.gradShape(*rp)) + " " + str(grad) + " in " +
                   std::string(pl::dtypeName(ref.reduceDtype)));
      }
      for (const RefParam &rp : ref.params)
        if (rp.unit == unit && !produced.count(rp.name))
          fail("computes", p.rank,
               describe(in) + " writes no gradient of " + rp.name);
    }
    if (labels != expected)
      fail("computes", p.rank,
           "computes " + join(labels) + ", expected " + join(expected));
  }

  //--- schedule
  //------------------------------------------------------------------

  /// What an op does to its buffers (docs/plan-format.md's op table):
  /// collectives, send and recv, and local ops (fp8_amax, fp8_cast, cast,
  /// sum, accumulate, compute, optimizer_update, grad_norm, clip_gradients)
  /// read their inputs and write their outputs; free releases its inputs;
  /// wait touches none. Every op is listed, so a new one needs a decision
  /// here.
  enum class Access { ReadsWrites, Frees, Nothing };
  static Access access(pl::OpKind op) {
    switch (op) {
    case pl::OpKind::AllGather:
    case pl::OpKind::ReduceScatter:
    case pl::OpKind::AllReduce:
    case pl::OpKind::AllToAll:
    case pl::OpKind::Permute:
    case pl::OpKind::Broadcast:
    case pl::OpKind::Send:
    case pl::OpKind::Recv:
    case pl::OpKind::Fp8Amax:
    case pl::OpKind::Fp8Cast:
    case pl::OpKind::Cast:
    case pl::OpKind::Sum:
    case pl::OpKind::Accumulate:
    case pl::OpKind::Compute:
    case pl::OpKind::OptimizerUpdate:
    case pl::OpKind::GradNorm:
    case pl::OpKind::ClipGradients:
      return Access::ReadsWrites;
    case pl::OpKind::Free:
      return Access::Frees;
    case pl::OpKind::Wait:
      return Access::Nothing;
    }
    ADD_FAILURE() << "unknown op " << static_cast<int>(op);
    return Access::ReadsWrites;
  }

  void checkSchedule(const pl::Plan &p) {
    size_t n = p.program.size();
    totals.instructions += static_cast<int64_t>(n);
    std::map<std::string, int> index;
    for (size_t i = 0; i < n; ++i)
      index[p.program[i].id] = static_cast<int>(i);
    // Happens-before: stream order plus deps, closed transitively.
    std::vector<std::vector<int>> preds(n), succs(n);
    std::map<std::string, int> lastOnStream;
    for (size_t i = 0; i < n; ++i) {
      const pl::Instruction &in = p.program[i];
      auto it = lastOnStream.find(in.stream);
      if (it != lastOnStream.end())
        preds[i].push_back(it->second);
      lastOnStream[in.stream] = static_cast<int>(i);
      for (const std::string &d : in.deps)
        preds[i].push_back(index.at(d));
      for (int q : preds[i])
        succs[q].push_back(static_cast<int>(i));
    }
    std::vector<int> indegree(n), order;
    for (size_t i = 0; i < n; ++i)
      indegree[i] = static_cast<int>(preds[i].size());
    for (size_t i = 0; i < n; ++i)
      if (!indegree[i])
        order.push_back(static_cast<int>(i));
    for (size_t h = 0; h < order.size(); ++h)
      for (int s : succs[order[h]])
        if (--indegree[s] == 0)
          order.push_back(s);
    if (order.size() != n) {
      fail("schedule", p.rank, "wait cycle");
      return;
    }
    size_t words = (n + 63) / 64;
    std::vector<uint64_t> anc(n * words, 0);
    for (int i : order)
      for (int q : preds[i]) {
        for (size_t w = 0; w < words; ++w)
          anc[i * words + w] |= anc[q * words + w];
        anc[i * words + q / 64] |= uint64_t(1) << (q % 64);
      }
    auto hb = [&](int a, int b) {
      return (anc[b * words + a / 64] >> (a % 64)) & 1;
    };

    std::map<std::string, std::vector<int>> writers, readers, frees;
    for (size_t i = 0; i < n; ++i) {
      const pl::Instruction &in = p.program[i];
      int ii = static_cast<int>(i);
      switch (access(in.op)) {
      case Access::Frees:
        for (const std::string &b : in.inputs)
          frees[b].push_back(ii);
        if (!in.outputs.empty())
          fail("schedule", p.rank, describe(in) + " has outputs");
        break;
      case Access::Nothing:
        if (!in.inputs.empty() || !in.outputs.empty())
          fail("schedule", p.rank, describe(in) + " names buffers");
        break;
      case Access::ReadsWrites:
        for (const std::string &b : in.inputs)
          readers[b].push_back(ii);
        for (const std::string &b : in.outputs)
          writers[b].push_back(ii);
        break;
      }
    }
    auto name = [&](int i) { return describe(p.program[i]); };
    // (This caught all-gathers of folded mixed-precision casts without any
    // deps: re-gathers racing the forward's reads and frees; fixed in
    // 49df58d.)
    for (auto &[b, rs] : readers) {
      bool isPersistent = persistent[b];
      const std::vector<int> &ws = writers[b];
      for (int r : rs) {
        ++totals.readsChecked;
        // The version the program means: the last earlier writer.
        int w = -1;
        for (int x : ws)
          if (x < r)
            w = x;
        if (w < 0 && !isPersistent) {
          fail("schedule", p.rank,
               name(r) + " reads " + b + " before any write");
          continue;
        }
        if (w >= 0 && !hb(w, r))
          fail("schedule", p.rank,
               name(r) + " reads " + b +
                   " but is not ordered after its writer " + name(w));
        for (int x : ws) {
          if (x == r || x == w)
            continue;
          bool before = w >= 0 ? hb(x, w) : false;
          if (!before && !hb(r, x))
            fail("schedule", p.rank,
                 name(r) + " reads " + b + " while " + name(x) +
                     " may overwrite it (not ordered)");
        }
        for (int f : frees[b]) {
          bool freedBefore = w >= 0 && hb(f, w);
          if (!freedBefore && !hb(r, f))
            fail("schedule", p.rank,
                 name(r) + " reads " + b + " but " + name(f) +
                     " may free it first");
        }
        if (!isPersistent) {
          bool freedAfter = false;
          for (int f : frees[b])
            freedAfter |= hb(r, f);
          if (!freedAfter)
            fail("schedule", p.rank,
                 b + " is not freed after its reader " + name(r));
        }
      }
    }
    for (auto &[b, ws] : writers) {
      if (persistent[b])
        continue;
      for (int w : ws) {
        bool freed = false;
        for (int f : frees[b])
          freed |= hb(w, f);
        if (!freed)
          fail("schedule", p.rank,
               b + " written by " + name(w) + " is never freed");
      }
    }
  }

  void checkPeak(const pl::Plan &p) {
    if (!p.estimates) {
      fail("schedule", p.rank, "no estimates");
      return;
    }
    auto &peak = p.estimates->peakMemoryBytes;
    auto it = peak.find("gathered");
    if (!ref.gathers) {
      if (it != peak.end() && it->second > 0)
        fail("schedule", p.rank, "gathered memory without FSDP");
      return;
    }
    std::map<std::string, int64_t> unitBytes;
    int64_t all = 0;
    for (const RefParam &rp : ref.params) {
      int64_t bytes = bf::prod(ref.computeBox(rp, p.rank).shape) *
                      pl::dtypeBytes(rp.fp8Gather ? pl::DType::Float8E4M3
                                                  : ref.computeDtype);
      unitBytes[rp.unit] += bytes;
      all += bytes;
    }
    // The configs say reshard_after_forward true ("always"): every unit is
    // resharded except the root, which FSDP2 keeps gathered all step. So at
    // most two resharded units (the prefetch bound; a unit re-gathered right
    // after its forward waits for that copy's free, never two copies) plus
    // the root are gathered at once.
    Ints sizes;
    int64_t kept = 0;
    for (auto &[u, b] : unitBytes)
      (u == "root" ? kept : sizes.emplace_back(0)) += b;
    std::sort(sizes.rbegin(), sizes.rend());
    int64_t bound = kept + (sizes.empty() ? 0 : sizes[0]) +
                    (sizes.size() > 1 ? sizes[1] : 0);
    if (it == peak.end()) {
      fail("schedule", p.rank, "no gathered peak estimate");
      return;
    }
    if (c.reshard && it->second > bound)
      fail("schedule", p.rank,
           "gathered peak " + std::to_string(it->second) +
               " bytes exceeds the two largest units' " +
               std::to_string(bound));
    if (it->second > all)
      fail("schedule", p.rank,
           "gathered peak " + std::to_string(it->second) +
               " bytes exceeds all parameters gathered, " +
               std::to_string(all));
  }
};

//===----------------------------------------------------------------------===//
// Determinism helpers
//===----------------------------------------------------------------------===//

void expectSameTemplate(const Config &c, const Mesh &mesh,
                        const pl::ProgramTemplate &a,
                        const pl::ProgramTemplate &b) {
  EXPECT_TRUE(a.mesh == b.mesh) << c.name;
  ASSERT_EQ(a.comms.size(), b.comms.size()) << c.name;
  for (size_t i = 0; i < a.comms.size(); ++i) {
    EXPECT_EQ(a.comms[i].id, b.comms[i].id) << c.name;
    EXPECT_EQ(a.comms[i].axes, b.comms[i].axes) << c.name;
    EXPECT_EQ(a.comms[i].view, b.comms[i].view) << c.name;
    EXPECT_EQ(a.comms[i].faultTolerant, b.comms[i].faultTolerant) << c.name;
  }
  ASSERT_EQ(a.buffers.size(), b.buffers.size()) << c.name;
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    const pl::BufferTemplate &x = a.buffers[i], &y = b.buffers[i];
    EXPECT_TRUE(x.id == y.id && x.kind == y.kind && x.dtype == y.dtype &&
                x.globalShape == y.globalShape &&
                x.persistent == y.persistent &&
                formatLayout(mesh, x.layout) == formatLayout(mesh, y.layout))
        << c.name << ": buffer " << x.id << " vs " << y.id;
  }
  EXPECT_EQ(a.streams, b.streams) << c.name;
  EXPECT_TRUE(a.program == b.program) << c.name << ": programs differ";
  EXPECT_EQ(a.flops, b.flops) << c.name;
}

//===----------------------------------------------------------------------===//
// The sweep
//===----------------------------------------------------------------------===//

class PipelineSweep : public ::testing::TestWithParam<Config> {};

TEST_P(PipelineSweep, MatchesReferences) {
  const Config &c = GetParam();
  auto spec = loadConfig(c);
  ASSERT_TRUE(spec.ok()) << c.name << ": " << spec.error().message << "\n"
                         << specText(c);
  auto context = pipeline::makeContext();
  auto compiled = pipeline::compile(*context, *spec);
  ASSERT_TRUE(compiled.ok()) << c.name << ": " << compiled.error().message;
  auto prepared = pl::PreparedTemplate::prepare(compiled->program);
  ASSERT_TRUE(prepared.ok()) << c.name << ": " << prepared.error().message;

  // Determinism: compiling again (in a fresh context) gives the same
  // template.
  {
    auto context2 = pipeline::makeContext();
    auto again = pipeline::compile(*context2, *spec);
    ASSERT_TRUE(again.ok()) << again.error().message;
    expectSameTemplate(c, prepared->mesh(), compiled->program, again->program);
  }

  Ref ref(c, *spec);
  std::vector<int64_t> ranks = prepared->ranks();
  ASSERT_EQ(static_cast<int64_t>(ranks.size()), ref.world);
  std::vector<pl::Plan> plans;
  for (int64_t r : ranks) {
    auto plan = prepared->instantiate(r);
    ASSERT_TRUE(plan.ok()) << c.name << ": rank " << r << ": "
                           << plan.error().message;
    auto again = prepared->instantiate(r);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(*plan == *again)
        << c.name << ": rank " << r << ": instantiating twice differs";
    auto valid = pl::validatePlan(*plan);
    EXPECT_TRUE(valid.ok())
        << c.name << ": rank " << r << ": " << valid.error().message;
    plans.push_back(std::move(*plan));
  }

  // Debugging aid: PIPELINE_TEST_DUMP=DIR writes each configuration's spec
  // and rank 0's plan there (`meshplan plan --spec DIR/<name>.spec.json`
  // reproduces a tiny configuration; odd ones need the model text).
  if (const char *dump = std::getenv("PIPELINE_TEST_DUMP")) {
    auto write = [&](const std::string &file, const std::string &text) {
      if (std::FILE *f =
              std::fopen((std::string(dump) + "/" + file).c_str(), "w")) {
        std::fputs(text.c_str(), f);
        std::fclose(f);
      }
    };
    write(c.name + ".spec.json", specText(c));
    write(c.name + ".rank0.json", pl::writePlan(plans[0]));
    if (c.odd)
      write("odd.json", oddModelJson());
  }
  auto verified = pl::verifyPlans(plans);
  ASSERT_TRUE(verified.ok()) << verified.error().message;
  EXPECT_TRUE(verified->ok())
      << c.name << ": verify: " << verified->failure->message;

  Checker(c, ref, *prepared, plans).run();
  ++totals.configs;
  totals.plans += static_cast<int64_t>(plans.size());
}

INSTANTIATE_TEST_SUITE_P(Specs, PipelineSweep, ::testing::ValuesIn(configs()),
                         [](const ::testing::TestParamInfo<Config> &info) {
                           return info.param.name;
                         });

/// The sweep covers what the brief asks for: checked here so that a
/// configuration dropped by mistake is noticed.
TEST(PipelineSweepCoverage, CoversTheRoles) {
  bool ddpOnly = false, fsdp1 = false, fsdp2 = false, hsdp = false,
       managed = false, tp2 = false, tp4 = false, extra = false, fp8On = false,
       fp8Off = false, sr = false, reshardTrue = false, reshardFalse = false,
       ga1 = false, ga2 = false, gaEvery = false, gaLast = false,
       gaEveryHsdp = false, gaLastHsdp = false, shuffled = false, odd = false;
  // Stacked (sequence-parallel) gradients under FSDP x TP, under HSDP x TP
  // (the replicate all-reduce of stacked rows, uneven on the odd model),
  // without data parallelism, and a TP axis of size 1 (nothing stacked).
  bool stackedFsdp = false, stackedHsdpOdd = false, stackedNoDp = false,
       sequenceParallelTp1 = false;
  for (const Config &c : configs()) {
    int64_t tp = 0;
    for (auto &[name, size] : c.axes)
      if (name == c.tpAxis)
        tp = size;
    bool sp = false;
    for (auto &[pattern, style] : c.tpPlan)
      sp |= style == "sequence_parallel";
    bool stacked = sp && tp > 1;
    stackedFsdp |= stacked && !c.shard.empty() && c.replicate.empty();
    stackedHsdpOdd |=
        stacked && !c.shard.empty() && !c.replicate.empty() && c.odd;
    stackedNoDp |= stacked && c.shard.empty() && c.replicate.empty();
    sequenceParallelTp1 |= sp && tp == 1;
    ddpOnly |= !c.replicate.empty() && c.shard.empty() && c.tpAxis.empty();
    fsdp1 |= c.shard.size() == 1 && c.replicate.empty();
    fsdp2 |= c.shard.size() == 2;
    hsdp |= !c.shard.empty() && !c.replicate.empty();
    managed |= !c.managed.empty();
    for (auto &[name, size] : c.axes) {
      tp2 |= name == c.tpAxis && size == 2;
      tp4 |= name == c.tpAxis && size == 4;
    }
    extra |= !c.extra.empty();
    fp8On |= c.float8 == 2;
    fp8Off |= c.float8 == 1;
    sr |= c.stochasticRounding;
    reshardTrue |= !c.shard.empty() && c.reshard;
    reshardFalse |= !c.shard.empty() && !c.reshard;
    ga1 |= c.ga == 1;
    ga2 |= c.ga == 2;
    gaEvery |= c.everyMicrobatch() && c.ga > 2;
    gaLast |= c.ga > 1 && !c.everyMicrobatch();
    gaEveryHsdp |= c.everyMicrobatch() && !c.replicate.empty();
    gaLastHsdp |= c.ga > 1 && !c.everyMicrobatch() && !c.replicate.empty();
    shuffled |= c.shuffle;
    odd |= c.odd;
  }
  EXPECT_TRUE(ddpOnly && fsdp1 && fsdp2 && hsdp && managed && tp2 && tp4 &&
              extra && fp8On && fp8Off && sr && reshardTrue && reshardFalse &&
              ga1 && ga2 && gaEvery && gaLast && gaEveryHsdp && gaLastHsdp &&
              shuffled && odd);
  EXPECT_TRUE(stackedFsdp && stackedHsdpOdd && stackedNoDp &&
              sequenceParallelTp1);
}

//===----------------------------------------------------------------------===//
// FSDP units and the reshard policy
//===----------------------------------------------------------------------===//

/// A spec of `model` sharding over 2 ranks, with `dp` added to its
/// data_parallel section (JSON members, or "").
std::string unitSpec(const std::string &model, const std::string &dp) {
  return R"({"model": ")" + model +
         R"(", "world_size": 2, "mesh": {"axes": [{"name": "dp", "size": 2}]},
             "data_parallel": {"shard_axes": ["dp"])" +
         (dp.empty() ? "" : ", " + dp) + R"(},
             "mixed_precision": {"param_dtype": "bfloat16"}})";
}

/// Rank 0's plan of a spec.
Result<pl::Plan> planOf(const fe::ResolvedSpec &spec) {
  auto context = pipeline::makeContext();
  auto compiled = pipeline::compile(*context, spec);
  if (!compiled)
    return compiled.error();
  auto prepared = pl::PreparedTemplate::prepare(compiled->program);
  if (!prepared)
    return prepared.error();
  return prepared->instantiate(0);
}

/// The all-gathers of a plan (only those that gather `tensor`, when given),
/// adding every tensor they gather to `together`.
int64_t countGathers(const pl::Plan &plan, const std::string &tensor = "",
                     std::set<std::string> *together = nullptr) {
  std::map<std::string, std::string> tensorOf;
  for (const pl::Buffer &b : plan.buffers)
    tensorOf[b.id] = b.tensor;
  int64_t n = 0;
  for (const pl::Instruction &in : plan.program) {
    if (in.op != pl::OpKind::AllGather)
      continue;
    bool has = tensor.empty();
    for (const std::string &out : in.outputs)
      has |= tensorOf[out] == tensor;
    if (!has)
      continue;
    ++n;
    if (together)
      for (const std::string &out : in.outputs)
        together->insert(tensorOf[out]);
  }
  return n;
}

// The default units are torchtitan's, from
// torchtitan/models/llama3/infra/parallelize.py, function apply_fsdp:
//   fully_shard(model.tok_embeddings, ...)
//   for layer_id, transformer_block in model.layers.items():
//       fully_shard(transformer_block, ...)
//   fully_shard([model.norm, model.output], ...,
//               reshard_after_forward=reshard_after_forward_policy == "always")
//   fully_shard(model, ...)  # the root: nothing is left for it here
// with the "default" policy resharding every block (and the embedding) after
// forward and not [norm, output].
//===----------------------------------------------------------------------===//
// Gradient accumulation modes and gradient memory
//===----------------------------------------------------------------------===//

// FSDP over 4 ranks of the tiny model with 4 microbatches, fp32 gradients.
// "last_microbatch" keeps every unsharded gradient alive until the last
// backward: the gradient peak is at least the whole model's gradients (on
// rank 0: 561.75 KiB, two copies of a unit while its backward adds into the
// previous sum). "every_microbatch" frees each unit's unsharded gradients
// right after their reduce-scatter and keeps only sharded accumulators: the
// peak is at most two shards of every gradient (accumulator and addend) plus
// the unsharded gradients of two units (284.94 KiB on rank 0), so it falls by
// at least the whole model minus that.
TEST(GradientAccumulation, EveryMicrobatchFreesUnshardedGradients) {
  auto peakFor = [](const std::string &mode) -> std::optional<pl::Plan> {
    std::string text =
        R"({"model": "tiny", "world_size": 4,
            "mesh": {"axes": [{"name": "s", "size": 4}]},
            "data_parallel": {"shard_axes": ["s"]},
            "gradient_accumulation": {"steps": 4, "reduce": ")" +
        mode + R"("}})";
    auto spec = fe::loadSpec(text, MESHPLAN_SOURCE_DIR);
    EXPECT_TRUE(spec.ok()) << spec.error().message;
    if (!spec)
      return std::nullopt;
    auto plan = planOf(*spec);
    EXPECT_TRUE(plan.ok()) << plan.error().message;
    if (!plan)
      return std::nullopt;
    return std::move(*plan);
  };
  auto every = peakFor("every_microbatch"), last = peakFor("last_microbatch");
  ASSERT_TRUE(every && last && every->estimates && last->estimates);
  auto bytes = [](const pl::Buffer &b) {
    int64_t n = pl::dtypeBytes(b.dtype);
    for (int64_t x : b.localShape)
      n *= x;
    return n;
  };
  int64_t wholeModel = 0, shards = 0;
  for (const pl::Buffer &b : every->buffers)
    if (b.kind == pl::BufferKind::ParamShard) {
      shards += bytes(b);
      int64_t n = 4; // fp32 gradients
      for (int64_t x : b.globalShape)
        n *= x;
      wholeModel += n;
    }
  // Unsharded gradients one backward writes, per unit.
  std::vector<int64_t> unitGrads;
  std::map<std::string, const pl::Buffer *> byId;
  for (const pl::Buffer &b : every->buffers)
    byId[b.id] = &b;
  for (const pl::Instruction &in : every->program)
    if (in.op == pl::OpKind::Compute && in.phase == "backward" &&
        in.microbatch == 0) {
      int64_t n = 0;
      for (const std::string &id : in.outputs)
        n += bytes(*byId.at(id));
      unitGrads.push_back(n);
    }
  std::sort(unitGrads.rbegin(), unitGrads.rend());
  ASSERT_GE(unitGrads.size(), 2u);
  int64_t everyPeak = every->estimates->peakMemoryBytes.at("gradient");
  int64_t lastPeak = last->estimates->peakMemoryBytes.at("gradient");
  EXPECT_GE(lastPeak, wholeModel);
  EXPECT_LE(everyPeak, 2 * shards + unitGrads[0] + unitGrads[1]);
  EXPECT_GE(lastPeak - everyPeak,
            wholeModel - (2 * shards + unitGrads[0] + unitGrads[1]));
  // The step's traffic: four reduce-scatters per parameter instead of one.
  auto scatters = [](const pl::Plan &p) {
    return std::count_if(p.program.begin(), p.program.end(),
                         [](const pl::Instruction &in) {
                           return in.op == pl::OpKind::ReduceScatter;
                         });
  };
  EXPECT_EQ(scatters(*every), 4 * scatters(*last));
}

TEST(FsdpUnits, DefaultUnitsAreTorchtitans) {
  for (auto [model, layers] :
       {std::pair<std::string, int>{"tiny", 2}, {"llama3-8b", 32}}) {
    auto spec = fe::loadSpec(unitSpec(model, ""), MESHPLAN_SOURCE_DIR);
    ASSERT_TRUE(spec.ok()) << spec.error().message;
    std::vector<std::string> expected = {"tok_embeddings"};
    for (int i = 0; i < layers; ++i)
      expected.push_back("layers." + std::to_string(i));
    expected.push_back("norm+output");
    std::vector<std::string> names;
    for (const fe::UnitAssignment &unit : spec->units)
      names.push_back(unit.name);
    EXPECT_EQ(names, expected) << model;
    // Each unit holds exactly its modules' parameters.
    for (const fe::UnitAssignment &unit : spec->units) {
      std::set<std::string> got, want;
      for (int p : unit.params)
        got.insert(spec->params[p].name);
      for (const fe::ParamAssignment &p : spec->params) {
        bool in = unit.name == "norm+output"
                      ? p.name.rfind("norm.", 0) == 0 ||
                            p.name.rfind("output.", 0) == 0
                      : p.name.rfind(unit.name + ".", 0) == 0;
        if (in)
          want.insert(p.name);
      }
      EXPECT_EQ(got, want) << model << " " << unit.name;
      EXPECT_EQ(unit.reshardAfterForward, unit.name != "norm+output")
          << model << " " << unit.name;
      EXPECT_FALSE(unit.root) << model << " " << unit.name;
    }
  }
}

// [norm, output] is one bucketed all-gather: once per step under the
// default policy (kept from its forward into its backward), twice under
// "always" (re-gathered for backward, as FSDP2 does for a resharded unit).
// Per-module units (meshplan's former grouping) gather norm twice and output
// once under the default policy: two more all-gathers per step.
TEST(FsdpUnits, NormOutputGatheredOnceUnderDefaultTwiceUnderAlways) {
  for (std::string model : {"tiny", "llama3-8b"}) {
    auto gathers = [&](const std::string &dp, const std::string &tensor,
                       std::set<std::string> *together = nullptr) {
      auto spec = fe::loadSpec(unitSpec(model, dp), MESHPLAN_SOURCE_DIR);
      EXPECT_TRUE(spec.ok()) << spec.error().message;
      if (!spec)
        return int64_t{-1};
      auto plan = planOf(*spec);
      EXPECT_TRUE(plan.ok()) << plan.error().message;
      return plan ? countGathers(*plan, tensor, together) : int64_t{-1};
    };
    std::set<std::string> together;
    EXPECT_EQ(gathers("", "norm.weight", &together), 1) << model;
    EXPECT_EQ(together, (std::set<std::string>{"norm.weight", "output.weight"}))
        << model;
    EXPECT_EQ(gathers(R"("reshard_after_forward": "default")", "output.weight"),
              1)
        << model;
    EXPECT_EQ(gathers(R"("reshard_after_forward": "always")", "norm.weight"), 2)
        << model;
    EXPECT_EQ(gathers(R"("reshard_after_forward": true)", "output.weight"), 2)
        << model;
    EXPECT_EQ(gathers(R"("reshard_after_forward": "never")", "norm.weight"), 1)
        << model;
    int64_t titan = gathers("", ""),
            perModule = gathers(R"("units": "per_module")", "");
    EXPECT_EQ(gathers(R"("units": "per_module")", "norm.weight"), 2) << model;
    EXPECT_EQ(perModule - titan, 2) << model;
  }
}

// An explicit grouping: the computes run the spec's units, and each
// all-gather brings in parameters of one unit only.
TEST(FsdpUnits, ExplicitGrouping) {
  auto spec =
      fe::loadSpec(unitSpec("tiny", R"("units": [["tok_embeddings", "layers.0"],
                                    ["layers.1", "norm", "output"]])"),
                   MESHPLAN_SOURCE_DIR);
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  ASSERT_EQ(spec->units.size(), 2u);
  EXPECT_EQ(spec->units[0].name, "tok_embeddings+layers.0");
  EXPECT_EQ(spec->units[1].name, "layers.1+norm+output");
  auto plan = planOf(*spec);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  std::map<std::string, std::string> tensorOf;
  for (const pl::Buffer &b : plan->buffers)
    tensorOf[b.id] = b.tensor;
  auto unitOf = [](const std::string &tensor) {
    return tensor.rfind("tok_embeddings.", 0) == 0 ||
                   tensor.rfind("layers.0.", 0) == 0
               ? std::string("tok_embeddings+layers.0")
               : std::string("layers.1+norm+output");
  };
  std::vector<std::string> computes;
  for (const pl::Instruction &in : plan->program) {
    if (in.op == pl::OpKind::Compute)
      computes.push_back(in.phase + " " + in.unit);
    if (in.op != pl::OpKind::AllGather)
      continue;
    std::set<std::string> units;
    for (const std::string &out : in.outputs)
      units.insert(unitOf(tensorOf[out]));
    EXPECT_EQ(units.size(), 1u) << in.label;
  }
  EXPECT_EQ(computes,
            (std::vector<std::string>{"forward tok_embeddings+layers.0",
                                      "forward layers.1+norm+output",
                                      "backward layers.1+norm+output",
                                      "backward tok_embeddings+layers.0"}));
}

class SummaryEnvironment : public ::testing::Environment {
public:
  void TearDown() override {
    std::printf("[ pipeline ] %d configurations, %lld plans, %lld "
                "instructions, %lld collectives and %lld reads checked, "
                "%lld stacked gradient paths traced\n",
                totals.configs, static_cast<long long>(totals.plans),
                static_cast<long long>(totals.instructions),
                static_cast<long long>(totals.collectivesChecked),
                static_cast<long long>(totals.readsChecked),
                static_cast<long long>(totals.stackedPaths));
  }
};
//===----------------------------------------------------------------------===//
// planSpec: the one way the CLI and meshplan-train plan a spec
//===----------------------------------------------------------------------===//

TEST(PlanSpec, OneTemplateServesEveryRankWithoutAPipeline) {
  auto spec = fe::loadSpecFile(std::string(MESHPLAN_SOURCE_DIR) +
                               "/examples/specs/fsdp-tp.json");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto planned = pipeline::planSpec(std::move(*spec));
  ASSERT_TRUE(planned.ok()) << planned.error().message;
  ASSERT_EQ(planned->templates.size(), 1u);
  for (int64_t r : planned->first().ranks()) {
    EXPECT_EQ(planned->pipelineRankOf(r), 0);
    EXPECT_EQ(&planned->templateFor(r), &planned->first());
  }
  // The same template compile and prepare give.
  auto again = pipeline::compileTemplate(*planned->context, planned->spec);
  ASSERT_TRUE(again.ok()) << again.error().message;
  auto a = planned->first().instantiate(3), b = again->prepared.instantiate(3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b);
}

TEST(PlanSpec, ATemplatePerPipelineCoordinate) {
  std::string path = std::string(MESHPLAN_SOURCE_DIR) +
                     "/test/trainer/specs/pp2-fsdp2-tp2.json";
  auto spec = fe::loadSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  pipeline::CompileOptions options;
  options.import.tokensPerMicrobatch = 64;
  options.import.sequenceLength = 32;
  auto planned = pipeline::planSpec(*spec, options);
  ASSERT_TRUE(planned.ok()) << planned.error().message;
  ASSERT_EQ(planned->templates.size(), 2u);
  ASSERT_TRUE(planned->templates[0] && planned->templates[1]);
  const Mesh &mesh = *planned->spec.mesh;
  for (int64_t r : planned->first().ranks()) {
    int64_t coordinate = planned->pipelineRankOf(r);
    EXPECT_EQ(coordinate, mesh.coordinateAt(*mesh.positionOf(r),
                                            planned->spec.pipeline->axisIndex));
    EXPECT_EQ(&planned->templateFor(r), &*planned->templates[coordinate]);
    auto plan = planned->templateFor(r).instantiate(r);
    ASSERT_TRUE(plan.ok()) << "rank " << r << ": " << plan.error().message;
  }
  // Only the coordinates asked for; the others fall back to the first.
  auto one = pipeline::planSpec(*spec, options, std::vector<int64_t>{1});
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_FALSE(one->templates[0]);
  ASSERT_TRUE(one->templates[1]);
  EXPECT_EQ(&one->first(), &*one->templates[1]);
  auto bad = pipeline::planSpec(*spec, options, std::vector<int64_t>{2});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message,
            "pp coordinate 2 does not exist (pipeline_parallel has 2)");
}

[[maybe_unused]] ::testing::Environment *const summary =
    ::testing::AddGlobalTestEnvironment(new SummaryEnvironment);

} // namespace
