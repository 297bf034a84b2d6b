//===- BFloat16.cpp - float <-> bfloat16 ----------------------------------===//
//
// Round to nearest even on the integer bits, as torch's c10::BFloat16 does
// (NaN -> 0x7FC0), so a cast here and a cast in the trainer agree.
//
//===----------------------------------------------------------------------===//

#include "KernelSupport.h"

namespace meshplan::runtime::kernels {
using namespace detail;

namespace {

MESHPLAN_KERNEL_LOOP void toBf16Loop(const float *in, uint16_t *out,
                                     int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = roundBf16(in[i]);
}

MESHPLAN_KERNEL_LOOP void fromBf16Loop(const uint16_t *in, float *out,
                                       int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = widenBf16(in[i]);
}

} // namespace

uint16_t floatToBf16(float x) { return roundBf16(x); }

float bf16ToFloat(uint16_t bits) { return widenBf16(bits); }

void castToBf16(std::span<const float> in, std::span<uint16_t> out,
                const Threading &threading) {
  require(in.size() == out.size(), "castToBf16",
          "input and output sizes differ");
  parallelFor(static_cast<int64_t>(in.size()), threading,
              [&](int64_t begin, int64_t end) {
                toBf16Loop(in.data() + begin, out.data() + begin, end - begin);
              });
}

void castBf16ToFloat(std::span<const uint16_t> in, std::span<float> out,
                     const Threading &threading) {
  require(in.size() == out.size(), "castBf16ToFloat",
          "input and output sizes differ");
  parallelFor(static_cast<int64_t>(in.size()), threading,
              [&](int64_t begin, int64_t end) {
                fromBf16Loop(in.data() + begin, out.data() + begin,
                             end - begin);
              });
}

} // namespace meshplan::runtime::kernels
