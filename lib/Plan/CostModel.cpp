//===- CostModel.cpp - Alpha-beta cost model ------------------------------===//

#include "meshplan/Plan/CostModel.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace meshplan::plan {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

int64_t saturatingMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out))
    return kInt64Max;
  return out;
}

} // namespace

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
  if (m.ranksPerNode < 1)
    return makeError("cost model: ranks per node must be >= 1");
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
    return x;
  default:
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
    return double(ringSteps(in.op, n)) * alpha +
           double(bytesSent(in.op, *in.dtype, in.count, n)) / bandwidth;
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
