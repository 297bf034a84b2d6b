//===- Philox.cpp - Philox-4x32-10 and the stochastic-rounding bits -------===//
//
// A counter-based generator makes stochastic rounding layout-transparent:
// an element's bits are a function of (seed, step, tensor id, global index),
// computed where the element lives, so no rank draws random numbers for the
// whole tensor and every sharding rounds alike. The mapping onto Philox's
// counter and key is documented at stochasticRoundingBits (Kernels.h).
//
//===----------------------------------------------------------------------===//

#include "KernelSupport.h"

#include <algorithm>

namespace meshplan::runtime::kernels {
using namespace detail;

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                      std::array<uint32_t, 2> key) {
  PhiloxSchedule schedule(key);
  philoxRounds(counter[0], counter[1], counter[2], counter[3], schedule);
  return counter;
}

std::array<uint32_t, 2> detail::stochasticRoundingKey(uint64_t seed,
                                                      uint64_t tensorId) {
  // SplitMix64's finalizer: a bijection of the tensor id, so for one seed no
  // two tensors share a key.
  uint64_t z = tensorId + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  uint64_t k = seed ^ z;
  return {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}

MESHPLAN_KERNEL_LOOP void detail::philoxRandom16(uint64_t firstGroup,
                                                 int64_t groups,
                                                 const PhiloxSchedule &schedule,
                                                 uint64_t step, uint16_t *out) {
  uint32_t step0 = static_cast<uint32_t>(step);
  uint32_t step1 = static_cast<uint32_t>(step >> 32);
  PhiloxSchedule s = schedule; // a local copy: no aliasing with `out`
  for (int64_t j = 0; j < groups; ++j) {
    uint64_t group = firstGroup + static_cast<uint64_t>(j);
    uint32_t c0 = static_cast<uint32_t>(group);
    uint32_t c1 = static_cast<uint32_t>(group >> 32);
    uint32_t c2 = step0, c3 = step1;
    philoxRounds(c0, c1, c2, c3, s);
    uint16_t *o = out + 8 * j;
    o[0] = static_cast<uint16_t>(c0);
    o[1] = static_cast<uint16_t>(c0 >> 16);
    o[2] = static_cast<uint16_t>(c1);
    o[3] = static_cast<uint16_t>(c1 >> 16);
    o[4] = static_cast<uint16_t>(c2);
    o[5] = static_cast<uint16_t>(c2 >> 16);
    o[6] = static_cast<uint16_t>(c3);
    o[7] = static_cast<uint16_t>(c3 >> 16);
  }
}

void detail::forEachRandomBlock(
    std::span<const IndexRun> runs, int64_t n, const StochasticRoundingKey &key,
    const Threading &threading,
    const std::function<void(int64_t, int64_t, const uint16_t *)> &fn) {
  PhiloxSchedule schedule(stochasticRoundingKey(key.seed, key.tensorId));
  uint64_t step = static_cast<uint64_t>(key.step);
  parallelFor(n, threading, [&](int64_t begin, int64_t end) {
    uint16_t random[kRandomBlock + 2 * kRandomPerCall];
    forEachRunPiece(
        runs, begin, end, [&](int64_t local, int64_t global, int64_t length) {
          for (int64_t done = 0; done < length; done += kRandomBlock) {
            int64_t count = std::min(kRandomBlock, length - done);
            uint64_t first = static_cast<uint64_t>(global + done);
            int64_t lane = static_cast<int64_t>(first % kRandomPerCall);
            int64_t groups =
                (lane + count + kRandomPerCall - 1) / kRandomPerCall;
            philoxRandom16(first / kRandomPerCall, groups, schedule, step,
                           random);
            fn(local + done, count, random + lane);
          }
        });
  });
}

uint16_t stochasticRoundingBits(const StochasticRoundingKey &key,
                                int64_t globalIndex) {
  uint64_t index = static_cast<uint64_t>(globalIndex);
  uint64_t group = index / kRandomPerCall;
  uint64_t step = static_cast<uint64_t>(key.step);
  std::array<uint32_t, 4> words = philox4x32_10(
      {static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
       static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32)},
      stochasticRoundingKey(key.seed, key.tensorId));
  uint64_t lane = index % kRandomPerCall;
  return static_cast<uint16_t>(words[lane / 2] >> (16 * (lane % 2)));
}

} // namespace meshplan::runtime::kernels
