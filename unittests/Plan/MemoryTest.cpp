//===- MemoryTest.cpp - Activation terms, device capacity, peak walk ------===//
//
// Every term of the activation model (CostModel.h, docs/memory.md) against a
// count by hand for a small Llama-style block (the `tiny` preset's shapes:
// h = 64, a = 4 query heads, k = 2 key/value heads, d = 16, f = 128, V =
// 256) and 10 tokens, in bf16 (p = 2) unless stated. Each expected number
// is written out as the product it comes from. Then the device presets and
// the activation events of the template's peak walk.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Plan/CostModel.h"
#include "meshplan/Plan/Template.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::plan;

namespace {

BlockShape tinyBlock() {
  BlockShape b;
  b.dim = 64;
  b.heads = 4;
  b.kvHeads = 2;
  b.headDim = 16;
  b.ffnDim = 128;
  return b;
}

BlockShape tinyBlockTp2() {
  BlockShape b = tinyBlock();
  b.attentionTp = b.ffnTp = b.sequenceTp = 2;
  return b;
}

using Terms = std::vector<std::pair<std::string, int64_t>>;

Terms asPairs(const std::vector<ActivationTerm> &terms) {
  Terms out;
  for (const ActivationTerm &t : terms)
    out.emplace_back(std::string(t.name), t.bytes);
  return out;
}

int64_t sum(const Terms &terms) {
  int64_t s = 0;
  for (const auto &[name, bytes] : terms)
    s += bytes;
  return s;
}

constexpr int64_t n = 10, p = 2;

TEST(ActivationTerms, BlockWithoutCheckpointing) {
  Terms want = {
      {"attention_norm input", n * p * 64},
      {"attention_norm rstd (fp32)", n * 4},
      {"attention input (whole sequence)", n * p * 64},
      {"q after RoPE", n * p * 4 * 16},
      // repeat_kv: k and v have the 4 query heads, not the 2 kv heads.
      {"k after RoPE, repeated to the query heads", n * p * 4 * 16},
      {"v repeated to the query heads", n * p * 4 * 16},
      {"SDPA output", n * p * 4 * 16},
      {"SDPA logsumexp (fp32)", n * 4 * 4},
      {"wo input", n * p * 4 * 16},
      {"ffn_norm input", n * p * 64},
      {"ffn_norm rstd (fp32)", n * 4},
      {"feed-forward input (whole sequence)", n * p * 64},
      {"w1 output (SiLU input)", n * p * 128},
      {"SiLU output", n * p * 128},
      {"w3 output", n * p * 128},
      {"w2 input", n * p * 128},
  };
  Terms got = asPairs(blockTerms(tinyBlock(), n, p));
  EXPECT_EQ(got, want);
  // 9 tensors of n*p*64, three fp32 per-token scalars (two rstd, 4 lse), 4
  // of n*p*128.
  EXPECT_EQ(sum(got), 9 * 1280 + (40 + 40 + 160) + 4 * 2560);
  EXPECT_EQ(sum(got), 22000);
}

TEST(ActivationTerms, BlockUnderTensorAndSequenceParallelism) {
  // TP 2 splits the heads (2 per rank) and f (64 per rank); sequence
  // parallelism splits the norms' tokens (5 per rank); the linears after a
  // norm read the gathered 10 tokens.
  Terms want = {
      {"attention_norm input", 5 * p * 64},
      {"attention_norm rstd (fp32)", 5 * 4},
      {"attention input (whole sequence)", n * p * 64},
      {"q after RoPE", n * p * 2 * 16},
      {"k after RoPE, repeated to the query heads", n * p * 2 * 16},
      {"v repeated to the query heads", n * p * 2 * 16},
      {"SDPA output", n * p * 2 * 16},
      {"SDPA logsumexp (fp32)", n * 4 * 2},
      {"wo input", n * p * 2 * 16},
      {"ffn_norm input", 5 * p * 64},
      {"ffn_norm rstd (fp32)", 5 * 4},
      {"feed-forward input (whole sequence)", n * p * 64},
      {"w1 output (SiLU input)", n * p * 64},
      {"SiLU output", n * p * 64},
      {"w3 output", n * p * 64},
      {"w2 input", n * p * 64},
  };
  Terms got = asPairs(blockTerms(tinyBlockTp2(), n, p));
  EXPECT_EQ(got, want);
  EXPECT_EQ(sum(got), 12280);
  // Uneven: 11 tokens over 2 sequence-parallel ranks, the larger part (6).
  Terms uneven = asPairs(blockTerms(tinyBlockTp2(), 11, p));
  EXPECT_EQ(uneven[0].second, 6 * p * 64);
  EXPECT_EQ(uneven[2].second, 11 * p * 64);
}

TEST(ActivationTerms, UngatedFeedForward) {
  BlockShape b = tinyBlock();
  b.gatedFfn = false;
  Terms got = asPairs(blockTerms(b, n, p));
  ASSERT_EQ(got.size(), 14u);
  EXPECT_EQ(got[12], (std::pair<std::string, int64_t>{
                         "w1 output (activation input)", n * p * 128}));
  EXPECT_EQ(got[13],
            (std::pair<std::string, int64_t>{"w2 input", n * p * 128}));
  EXPECT_EQ(sum(got), 22000 - 2 * 2560);
}

TEST(ActivationTerms, SelectiveKeepsTorchtitansOpOutputs) {
  Terms want = {
      {"block input", n * p * 64},
      {"wq output (matmul 1)", n * p * 4 * 16},
      // wv's own output: the 2 kv heads.
      {"wv output (matmul 3)", n * p * 2 * 16},
      {"SDPA output", n * p * 4 * 16},
      {"SDPA logsumexp (fp32)", n * 4 * 4},
      {"wo reduce-scatter output", 0}, // no sequence parallelism
      {"w1 output (matmul 5)", n * p * 128},
      {"w2 output (matmul 7)", n * p * 64},
      {"w2 reduce-scatter output", 0},
  };
  Terms got = asPairs(selectiveBlockTerms(tinyBlock(), n, p));
  EXPECT_EQ(got, want);
  EXPECT_EQ(sum(got), 8480);

  Terms tp = {
      {"block input", 5 * p * 64},
      {"wq output (matmul 1)", n * p * 2 * 16},
      {"wv output (matmul 3)", n * p * 1 * 16},
      {"SDPA output", n * p * 2 * 16},
      {"SDPA logsumexp (fp32)", n * 4 * 2},
      {"wo reduce-scatter output", 5 * p * 64},
      {"w1 output (matmul 5)", n * p * 64},
      // The matmul's output before the reduce-scatter: every token, the
      // whole h (a partial sum).
      {"w2 output (matmul 7)", n * p * 64},
      {"w2 reduce-scatter output", 5 * p * 64},
  };
  got = asPairs(selectiveBlockTerms(tinyBlockTp2(), n, p));
  EXPECT_EQ(got, tp);
  EXPECT_EQ(sum(got), 6160);

  // Ungated: w2 is matmul 6, recomputed.
  BlockShape ungated = tinyBlock();
  ungated.gatedFfn = false;
  EXPECT_EQ(sumTerms(selectiveBlockTerms(ungated, n, p)), 8480 - n * p * 64);
}

TEST(ActivationTerms, PoliciesSavedAndTransient) {
  BlockShape b = tinyBlock();
  EXPECT_EQ(sumTerms(savedBlockTerms(b, n, p, Recompute::None)), 22000);
  EXPECT_EQ(sumTerms(savedBlockTerms(b, n, p, Recompute::Selective)), 8480);
  Terms full = asPairs(savedBlockTerms(b, n, p, Recompute::Full));
  EXPECT_EQ(full, (Terms{{"block input", n * p * 64}}));
  EXPECT_EQ(
      sum(asPairs(savedBlockTerms(tinyBlockTp2(), n, p, Recompute::Full))),
      5 * p * 64);
  // Backward recomputes the block: its whole set again, on top.
  EXPECT_EQ(blockBackwardTransientBytes(b, n, p, Recompute::None), 0);
  EXPECT_EQ(blockBackwardTransientBytes(b, n, p, Recompute::Full), 22000);
  EXPECT_EQ(blockBackwardTransientBytes(b, n, p, Recompute::Selective), 22000);
}

TEST(ActivationTerms, OutputAndLoss) {
  OutputShape o;
  o.dim = 64;
  o.vocab = 256;
  Terms want = {
      {"final norm input", n * p * 64},
      {"final norm rstd (fp32)", n * 4},
      {"output input (whole sequence)", n * p * 64},
      {"log-softmax of the logits (fp32)", n * 4 * 256},
  };
  EXPECT_EQ(asPairs(outputTerms(o, n, p)), want);
  EXPECT_EQ(sumTerms(outputTerms(o, n, p)), 12840);
  // bf16 logits and their fp32 copy at the loss.
  EXPECT_EQ(outputTransientBytes(o, n, p), n * 256 * (2 + 4));
  // fp32 compute: .float() is the logits themselves.
  EXPECT_EQ(outputTransientBytes(o, n, 4), n * 256 * 4);
  // Loss parallel: a colwise output keeps V split; sequence-parallel norm.
  o.vocabTp = 2;
  o.sequenceTp = 2;
  Terms tp = {
      {"final norm input", 5 * p * 64},
      {"final norm rstd (fp32)", 5 * 4},
      {"output input (whole sequence)", n * p * 64},
      {"log-softmax of the logits (fp32)", n * 4 * 128},
  };
  EXPECT_EQ(asPairs(outputTerms(o, n, p)), tp);
  EXPECT_EQ(outputTransientBytes(o, n, p), n * 128 * 6);
  EXPECT_EQ(tokenIdBytes(n), n * 8);
}

TEST(ActivationTerms, SaturatesInsteadOfOverflowing) {
  BlockShape huge = tinyBlock();
  huge.dim = int64_t(1) << 40;
  int64_t tokens = int64_t(1) << 40;
  EXPECT_EQ(sumTerms(blockTerms(huge, tokens, p)),
            std::numeric_limits<int64_t>::max());
}

//===----------------------------------------------------------------------===//
// Devices
//===----------------------------------------------------------------------===//

TEST(DevicePresets, NamesAliasesAndCapacity) {
  const DevicePreset *h100 = findDevicePreset("h100");
  ASSERT_NE(h100, nullptr);
  EXPECT_EQ(h100->name, "h100-sxm-80gb");
  EXPECT_EQ(findDevicePreset("h100-sxm-80gb"), h100);
  EXPECT_EQ(findDevicePreset("H100"), nullptr);
  // The default cost model is the H100's.
  CostModel def;
  EXPECT_EQ(def.device, "h100-sxm-80gb");
  EXPECT_EQ(def.deviceMemoryBytes, h100->model.deviceMemoryBytes);
  EXPECT_EQ(def.peakFlopsPerSecond, h100->model.peakFlopsPerSecond);
  // nvidia-smi's memory.total less the 2 GiB reserve.
  EXPECT_EQ(def.memoryCapacityBytes(),
            (int64_t(81559) << 20) - (int64_t(2) << 30));
  const DevicePreset *h200 = findDevicePreset("h200");
  ASSERT_NE(h200, nullptr);
  EXPECT_EQ(h200->model.deviceMemoryBytes, int64_t(143771) << 20);
  EXPECT_EQ(h200->model.hbmBytesPerSecond, 4.8e12);
  const DevicePreset *a100 = findDevicePreset("a100");
  ASSERT_NE(a100, nullptr);
  EXPECT_EQ(a100->model.deviceMemoryBytes, int64_t(80) << 30);
  EXPECT_EQ(a100->model.peakFlopsPerSecond, 312e12);
  for (const DevicePreset &d : devicePresets()) {
    EXPECT_TRUE(checkCostModel(d.model).ok()) << d.name;
    EXPECT_EQ(d.model.device, d.name);
  }
  EXPECT_EQ(devicePresetList(),
            "h100-sxm-80gb (h100), h200-141gb (h200), a100-80gb (a100)");
  CostModel bad;
  bad.reservedMemoryBytes = bad.deviceMemoryBytes;
  EXPECT_FALSE(checkCostModel(bad).ok());
  bad = CostModel{};
  bad.deviceMemoryBytes = 0;
  EXPECT_FALSE(checkCostModel(bad).ok());
}

//===----------------------------------------------------------------------===//
// The peak walk with activations
//===----------------------------------------------------------------------===//

/// A compute instruction of `unit` reading the one parameter "w".
Instruction computeOf(const std::string &id, const std::string &phase,
                      const std::string &unit, int64_t microbatch) {
  Instruction in;
  in.id = id;
  in.stream = "compute";
  in.op = OpKind::Compute;
  in.inputs = {"w"};
  in.phase = phase;
  in.unit = unit;
  in.microbatch = microbatch;
  return in;
}

/// One rank, two units, two microbatches: fwd a, fwd b, bwd b, bwd a per
/// microbatch; a persistent 16-byte parameter shard.
ProgramTemplate twoUnits() {
  ProgramTemplate t;
  t.mesh.axes = {{"dp", 1, false}};
  t.streams = {"compute"};
  BufferTemplate w;
  w.id = "w";
  w.kind = BufferKind::ParamShard;
  w.dtype = DType::Float32;
  w.globalShape = {4};
  w.layout.dims.assign(1, {});
  w.persistent = true;
  w.tensor = "w";
  w.tensorId = 0;
  t.buffers.push_back(w);
  int id = 0;
  for (int64_t mb = 0; mb < 2; ++mb)
    for (auto [phase, unit] :
         std::vector<std::pair<const char *, const char *>>{
             {"forward", "a"},
             {"forward", "b"},
             {"backward", "b"},
             {"backward", "a"}}) {
      t.program.push_back(
          computeOf("i" + std::to_string(id++), phase, unit, mb));
    }
  return t;
}

std::map<std::string, int64_t> peaks(ProgramTemplate t) {
  auto prepared = PreparedTemplate::prepare(std::move(t));
  EXPECT_TRUE(prepared.ok()) << prepared.error().message;
  auto plan = prepared->instantiate(0);
  EXPECT_TRUE(plan.ok()) << plan.error().message;
  return plan->estimates->peakMemoryBytes;
}

TEST(ActivationWalk, OneMicrobatchAtATime) {
  ProgramTemplate t = twoUnits();
  // No activations given: no "activation" category.
  EXPECT_EQ(peaks(t), (std::map<std::string, int64_t>{{"param_shard", 16},
                                                      {"total", 16}}));
  t.activations["a"] = {100, 0, 30};
  t.activations["b"] = {50, 20, 40};
  // fwd a: 100; fwd b: 150 + 20 = 170; bwd b: 150 + 40 = 190, then 100;
  // bwd a: 100 + 30 = 130, then 0. The second microbatch repeats it: the
  // first one's activations are gone.
  EXPECT_EQ(peaks(t),
            (std::map<std::string, int64_t>{
                {"activation", 190}, {"param_shard", 16}, {"total", 206}}));
  // A unit missing from the map keeps nothing: b alone, 50 + 40 at its
  // backward.
  t.activations.erase("a");
  EXPECT_EQ(peaks(t),
            (std::map<std::string, int64_t>{
                {"activation", 90}, {"param_shard", 16}, {"total", 106}}));
}

// A zero-bubble split backward holds the forward's activations until its
// weight part: backward_input adds the backward's transient bytes and frees
// nothing, backward_weight frees what the forward saved.
TEST(ActivationWalk, SplitBackwardHoldsActivationsUntilTheWeightPart) {
  ProgramTemplate t = twoUnits();
  t.activations["a"] = {100, 0, 30};
  t.activations["b"] = {50, 20, 40};
  // Microbatch 0 of b: forward, input part, then microbatch 1's forward of b
  // before microbatch 0's weight part (as zbv orders them).
  auto compute = computeOf;
  t.program = {compute("f0", "forward", "b", 0),
               compute("i0", "backward_input", "b", 0),
               compute("f1", "forward", "b", 1),
               compute("w0", "backward_weight", "b", 0),
               compute("i1", "backward_input", "b", 1),
               compute("w1", "backward_weight", "b", 1)};
  // f0: 50 + 20; i0: 50 + 40 = 90; f1: 100 + 20 = 120 (microbatch 0's 50
  // still held); w0: frees 50; i1: 50 + 40 = 90; w1: frees the rest.
  EXPECT_EQ(peaks(t),
            (std::map<std::string, int64_t>{
                {"activation", 120}, {"param_shard", 16}, {"total", 136}}));
  // As full backwards, microbatch 0's activations are gone before f1.
  t.program = {
      compute("f0", "forward", "b", 0), compute("b0", "backward", "b", 0),
      compute("f1", "forward", "b", 1), compute("b1", "backward", "b", 1)};
  EXPECT_EQ(peaks(t),
            (std::map<std::string, int64_t>{
                {"activation", 90}, {"param_shard", 16}, {"total", 106}}));
}

TEST(ActivationWalk, NegativeBytesAreRefused) {
  ProgramTemplate t = twoUnits();
  t.activations["a"] = {-1, 0, 0};
  auto prepared = PreparedTemplate::prepare(std::move(t));
  ASSERT_FALSE(prepared.ok());
  EXPECT_EQ(prepared.error().message,
            "activations of unit \"a\": bytes must be >= 0");
}

} // namespace
