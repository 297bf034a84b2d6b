//===- StochasticRounding.cpp - fp32 -> bf16 with random rounding ---------===//
//
// torchao's _fp32_to_bf16_sr, with the random bits drawn per global element
// (Philox.cpp) instead of as a tensor of the global shape, and the index runs
// that say which global elements a shard holds.
//
//===----------------------------------------------------------------------===//

#include "KernelSupport.h"

namespace meshplan::runtime::kernels {
using namespace detail;

namespace {

MESHPLAN_KERNEL_LOOP void roundLoop(const float *in, const uint32_t *random,
                                    uint16_t *out, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = roundBf16Stochastic(in[i], random[i]);
}

/// Checked multiplication of non-negative sizes.
bool multiply(int64_t a, int64_t b, int64_t &product) {
  return !__builtin_mul_overflow(a, b, &product);
}

} // namespace

uint16_t stochasticRoundBf16(float x, uint32_t random16) {
  return roundBf16Stochastic(x, random16 & 0xFFFFu);
}

std::optional<std::vector<IndexRun>>
boxIndexRuns(std::span<const int64_t> globalShape,
             std::span<const int64_t> offset,
             std::span<const int64_t> localShape) {
  size_t rank = globalShape.size();
  if (offset.size() != rank || localShape.size() != rank)
    return std::nullopt;
  int64_t globalCount = 1;
  bool empty = false;
  for (size_t d = 0; d < rank; ++d) {
    if (globalShape[d] < 0 || offset[d] < 0 || localShape[d] < 0 ||
        offset[d] > globalShape[d] ||
        localShape[d] > globalShape[d] - offset[d] ||
        !multiply(globalCount, globalShape[d], globalCount))
      return std::nullopt;
    empty = empty || localShape[d] == 0;
  }
  std::vector<IndexRun> runs;
  if (empty)
    return runs;
  if (rank == 0) {
    runs.push_back({0, 0, 1});
    return runs;
  }
  // Trailing dimensions the box spans completely merge into one run with the
  // innermost dimension it cuts (`inner`).
  size_t inner = rank - 1;
  while (inner > 0 && localShape[inner] == globalShape[inner])
    --inner;
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d)
    stride[d - 1] = stride[d] * globalShape[d];
  int64_t length = localShape[inner] * stride[inner];
  int64_t count = 1;
  for (size_t d = 0; d < inner; ++d)
    count *= localShape[d];
  runs.reserve(static_cast<size_t>(count));
  // An odometer over the outer dimensions' local indices.
  std::vector<int64_t> index(inner, 0);
  for (int64_t r = 0; r < count; ++r) {
    int64_t global = offset[inner] * stride[inner];
    for (size_t d = 0; d < inner; ++d)
      global += (offset[d] + index[d]) * stride[d];
    runs.push_back({r * length, global, length});
    for (size_t d = inner; d-- > 0;) {
      if (++index[d] < localShape[d])
        break;
      index[d] = 0;
    }
  }
  return runs;
}

void castToBf16Stochastic(std::span<const float> in, std::span<uint16_t> out,
                          const StochasticRoundingKey &key,
                          std::span<const IndexRun> runs,
                          const Threading &threading) {
  const char *kernel = "castToBf16Stochastic";
  require(in.size() == out.size(), kernel, "input and output sizes differ");
  int64_t n = static_cast<int64_t>(in.size());
  requireTiling(runs, n, kernel);
  forEachRandomBlock(
      runs, n, key, threading,
      [&](int64_t local, int64_t length, const uint32_t *random) {
        roundLoop(in.data() + local, random, out.data() + local, length);
      });
}

} // namespace meshplan::runtime::kernels
