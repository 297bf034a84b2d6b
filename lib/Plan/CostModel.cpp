//===- CostModel.cpp - Alpha-beta cost model ------------------------------===//

#include "meshplan/Plan/CostModel.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

namespace meshplan::plan {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

int64_t saturatingMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out))
    return kInt64Max;
  return out;
}

int64_t saturatingAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out))
    return kInt64Max;
  return out;
}

/// Product of non-negative factors, saturating at INT64_MAX.
int64_t product(std::initializer_list<int64_t> factors) {
  int64_t out = 1;
  for (int64_t f : factors)
    out = saturatingMul(out, std::max<int64_t>(0, f));
  return out;
}

/// ceil(a / b) for a >= 0, b >= 1 (a split of a dim: the largest part,
/// so every rank's estimate is an upper bound on uneven splits).
int64_t ceilDiv(int64_t a, int64_t b) {
  b = std::max<int64_t>(1, b);
  a = std::max<int64_t>(0, a);
  return a / b + (a % b != 0 ? 1 : 0);
}

/// One GPU per rank in 8-GPU nodes; see CostModel.h for the sources.
CostModel deviceModel(std::string name, double flops, double hbm,
                      double nvlinkPerDirection, double ibPerDirection,
                      int64_t memoryMiB) {
  CostModel m;
  m.device = std::move(name);
  m.peakFlopsPerSecond = flops;
  m.hbmBytesPerSecond = hbm;
  m.intraNodeBytesPerSecond = nvlinkPerDirection;
  m.interNodeBytesPerSecond = ibPerDirection;
  m.deviceMemoryBytes = memoryMiB << 20;
  return m;
}

} // namespace

const std::vector<DevicePreset> &devicePresets() {
  static const std::vector<DevicePreset> presets = {
      {"h100-sxm-80gb",
       {"h100", "h100-sxm", "h100-80gb"},
       "NVIDIA H100 SXM5 80GB HBM3",
       deviceModel("h100-sxm-80gb", 989e12, 3.35e12, 450e9, 50e9, 81559)},
      {"h200-141gb",
       {"h200", "h200-sxm", "h200-sxm-141gb"},
       "NVIDIA H200 SXM 141GB HBM3e",
       deviceModel("h200-141gb", 989e12, 4.8e12, 450e9, 50e9, 143771)},
      {"a100-80gb",
       {"a100", "a100-sxm", "a100-sxm-80gb"},
       "NVIDIA A100 SXM4 80GB HBM2e",
       deviceModel("a100-80gb", 312e12, 2.039e12, 300e9, 25e9, 81920)},
  };
  return presets;
}

const DevicePreset *findDevicePreset(std::string_view name) {
  for (const DevicePreset &d : devicePresets()) {
    if (d.name == name)
      return &d;
    for (std::string_view alias : d.aliases)
      if (alias == name)
        return &d;
  }
  return nullptr;
}

std::string devicePresetList() {
  std::string out;
  for (const DevicePreset &d : devicePresets()) {
    out += (out.empty() ? "" : ", ") + std::string(d.name);
    if (!d.aliases.empty())
      out += " (" + std::string(d.aliases.front()) + ")";
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Activation memory
//===----------------------------------------------------------------------===//

std::vector<ActivationTerm> blockTerms(const BlockShape &b, int64_t n,
                                       int64_t p) {
  int64_t ns = ceilDiv(n, b.sequenceTp);
  int64_t at = ceilDiv(b.heads, b.attentionTp);
  int64_t ft = ceilDiv(b.ffnDim, b.ffnTp);
  int64_t headBytes = product({n, p, at, b.headDim});
  std::vector<ActivationTerm> terms = {
      {"attention_norm input", product({ns, p, b.dim})},
      {"attention_norm rstd (fp32)", product({ns, 4})},
      {"attention input (whole sequence)", product({n, p, b.dim})},
      {"q after RoPE", headBytes},
      {"k after RoPE, repeated to the query heads", headBytes},
      {"v repeated to the query heads", headBytes},
      {"SDPA output", headBytes},
      {"SDPA logsumexp (fp32)", product({n, 4, at})},
      {"wo input", headBytes},
      {"ffn_norm input", product({ns, p, b.dim})},
      {"ffn_norm rstd (fp32)", product({ns, 4})},
      {"feed-forward input (whole sequence)", product({n, p, b.dim})},
  };
  int64_t ffn = product({n, p, ft});
  if (b.gatedFfn) {
    terms.push_back({"w1 output (SiLU input)", ffn});
    terms.push_back({"SiLU output", ffn});
    terms.push_back({"w3 output", ffn});
  } else {
    terms.push_back({"w1 output (activation input)", ffn});
  }
  terms.push_back({"w2 input", ffn});
  return terms;
}

std::vector<ActivationTerm> selectiveBlockTerms(const BlockShape &b, int64_t n,
                                                int64_t p) {
  int64_t ns = ceilDiv(n, b.sequenceTp);
  int64_t at = ceilDiv(b.heads, b.attentionTp);
  int64_t kt = ceilDiv(b.kvHeads, b.attentionTp);
  int64_t ft = ceilDiv(b.ffnDim, b.ffnTp);
  bool sp = b.sequenceTp > 1;
  std::vector<ActivationTerm> terms = {
      {"block input", product({ns, p, b.dim})},
      {"wq output (matmul 1)", product({n, p, at, b.headDim})},
      {"wv output (matmul 3)", product({n, p, kt, b.headDim})},
      {"SDPA output", product({n, p, at, b.headDim})},
      {"SDPA logsumexp (fp32)", product({n, 4, at})},
      {"wo reduce-scatter output", sp ? product({ns, p, b.dim}) : 0},
      {"w1 output (matmul 5)", product({n, p, ft})},
      {"w2 output (matmul 7)", b.gatedFfn ? product({n, p, b.dim}) : 0},
      {"w2 reduce-scatter output", sp ? product({ns, p, b.dim}) : 0},
  };
  return terms;
}

std::vector<ActivationTerm> savedBlockTerms(const BlockShape &b, int64_t n,
                                            int64_t p, Recompute policy) {
  switch (policy) {
  case Recompute::None:
    return blockTerms(b, n, p);
  case Recompute::Selective:
    return selectiveBlockTerms(b, n, p);
  case Recompute::Full:
    break;
  }
  return {{"block input", product({ceilDiv(n, b.sequenceTp), p, b.dim})}};
}

int64_t blockBackwardTransientBytes(const BlockShape &b, int64_t n, int64_t p,
                                    Recompute policy) {
  if (policy == Recompute::None)
    return 0;
  return sumTerms(blockTerms(b, n, p));
}

std::vector<ActivationTerm> outputTerms(const OutputShape &o, int64_t n,
                                        int64_t p) {
  int64_t ns = ceilDiv(n, o.sequenceTp);
  return {
      {"final norm input", product({ns, p, o.dim})},
      {"final norm rstd (fp32)", product({ns, 4})},
      {"output input (whole sequence)", product({n, p, o.dim})},
      {"log-softmax of the logits (fp32)",
       product({n, 4, ceilDiv(o.vocab, o.vocabTp)})},
  };
}

int64_t outputTransientBytes(const OutputShape &o, int64_t n, int64_t p) {
  // logits.float() is the logits themselves when they are fp32 already.
  int64_t perLogit = p >= 4 ? 4 : p + 4;
  return product({n, ceilDiv(o.vocab, o.vocabTp), perLogit});
}

int64_t tokenIdBytes(int64_t n) { return product({n, 8}); }

int64_t sumTerms(const std::vector<ActivationTerm> &terms) {
  int64_t sum = 0;
  for (const ActivationTerm &t : terms)
    sum = saturatingAdd(sum, t.bytes);
  return sum;
}

Result<void> checkCostModel(const CostModel &m) {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  struct Field {
    const char *name;
    double value;
  };
  for (const Field &f :
       {Field{"peak FLOP/s", m.peakFlopsPerSecond}, Field{"MFU", m.mfu},
        Field{"intra-node bandwidth", m.intraNodeBytesPerSecond},
        Field{"inter-node bandwidth", m.interNodeBytesPerSecond},
        Field{"intra-node latency", m.intraNodeLatencySeconds},
        Field{"inter-node latency", m.interNodeLatencySeconds},
        Field{"HBM bandwidth", m.hbmBytesPerSecond}})
    if (!positive(f.value))
      return makeError(std::string("cost model: ") + f.name + " must be a " +
                       "finite number > 0");
  if (m.mfu > 1)
    return makeError("cost model: MFU must be at most 1");
  if (!std::isfinite(m.dispatchSeconds) || m.dispatchSeconds < 0)
    return makeError("cost model: dispatch latency must be a finite number "
                     ">= 0");
  if (m.ranksPerNode < 1)
    return makeError("cost model: ranks per node must be >= 1");
  if (m.deviceMemoryBytes < 1)
    return makeError("cost model: device memory must be >= 1 byte");
  if (m.reservedMemoryBytes < 0 || m.reservedMemoryBytes >= m.deviceMemoryBytes)
    return makeError("cost model: reserved memory must be >= 0 and below the "
                     "device memory");
  return {};
}

int64_t bytesSent(OpKind op, DType dtype, int64_t count, int64_t groupSize) {
  if (!isCollective(op) || groupSize <= 1 || count <= 0)
    return 0;
  int64_t x = saturatingMul(count, dtypeBytes(dtype));
  int64_t n = groupSize;
  switch (op) {
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::AllToAll:
    return saturatingMul(n - 1, x);
  case OpKind::AllReduce: {
    // floor(2 (n-1) x / n) = 2x - ceil(2x / n), without overflow for any
    // x <= 2^61.
    if (x > kInt64Max / 2)
      return kInt64Max;
    int64_t twice = 2 * x;
    return twice - (twice / n + (twice % n != 0 ? 1 : 0));
  }
  case OpKind::Permute:
  case OpKind::Broadcast:
  case OpKind::Send:
    return x;
  default: // a recv sends nothing
    return 0;
  }
}

int64_t ringSteps(OpKind op, int64_t groupSize) {
  if (!isCollective(op) || groupSize <= 1)
    return 0;
  switch (op) {
  case OpKind::AllReduce:
    return 2 * (groupSize - 1);
  case OpKind::Permute:
  case OpKind::Send:
  case OpKind::Recv:
    return 1;
  default:
    return groupSize - 1;
  }
}

bool isIntraNode(const Communicator &comm, const CostModel &model) {
  if (comm.ranks.empty())
    return true;
  int64_t perNode = std::max<int64_t>(1, model.ranksPerNode);
  int64_t node = comm.ranks.front() / perNode;
  return std::all_of(comm.ranks.begin(), comm.ranks.end(),
                     [&](int64_t r) { return r / perNode == node; });
}

double durationSeconds(const Instruction &in, const Communicator *comm,
                       double flops, const CostModel &model,
                       int64_t memoryBytes) {
  if (isCollective(in.op)) {
    if (!comm || !in.dtype)
      return 0;
    int64_t n = static_cast<int64_t>(comm->ranks.size());
    if (n <= 1)
      return 0;
    bool intra = isIntraNode(*comm, model);
    double alpha =
        intra ? model.intraNodeLatencySeconds : model.interNodeLatencySeconds;
    double bandwidth =
        intra ? model.intraNodeBytesPerSecond : model.interNodeBytesPerSecond;
    // A recv takes as long as the send it pairs with.
    OpKind moved = in.op == OpKind::Recv ? OpKind::Send : in.op;
    return double(ringSteps(in.op, n)) * alpha +
           double(bytesSent(moved, *in.dtype, in.count, n)) / bandwidth;
  }
  double computeS = std::max(0.0, flops) / model.flopsPerSecond();
  double memoryS =
      double(std::max<int64_t>(0, memoryBytes)) / model.hbmBytesPerSecond;
  switch (in.op) {
  case OpKind::Compute:
    return computeS;
  case OpKind::OptimizerUpdate:
    return std::max(computeS, memoryS);
  case OpKind::Free:
  case OpKind::Wait:
    return 0;
  default: // fp8_amax, fp8_cast and other element-wise local ops
    return memoryS;
  }
}

} // namespace meshplan::plan
