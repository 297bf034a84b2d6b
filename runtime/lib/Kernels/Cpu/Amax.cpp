//===- Amax.cpp - max |x| for tensorwise float8 scales --------------------===//
//
// The maximum is taken over the absolute values' bit patterns as integers:
// for non-negative floats the integer order is the numeric order, and every
// NaN pattern is above +inf, so one integer max both finds amax and propagates
// NaN, in a loop the compiler vectorizes (a float max would drop NaNs
// depending on operand order). Max is exact and order-free, so the threaded
// result is the single-threaded one.
//
//===----------------------------------------------------------------------===//

#include "KernelSupport.h"

#include <atomic>

namespace meshplan::runtime::kernels {
using namespace detail;

namespace {

MESHPLAN_KERNEL_LOOP int32_t maxAbsBits(const float *in, int64_t n) {
  int32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t a = std::bit_cast<int32_t>(in[i]) & 0x7FFFFFFF;
    m = a > m ? a : m;
  }
  return m;
}

MESHPLAN_KERNEL_LOOP int32_t maxAbsBits(const uint16_t *in, int64_t n) {
  int16_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    int16_t a = static_cast<int16_t>(in[i] & 0x7FFF);
    m = a > m ? a : m;
  }
  return int32_t(m) << 16;
}

template <typename In>
float amaxSpan(std::span<const In> in, const Threading &threading) {
  std::atomic<int32_t> result{0};
  parallelFor(static_cast<int64_t>(in.size()), threading,
              [&](int64_t begin, int64_t end) {
                int32_t m = maxAbsBits(in.data() + begin, end - begin);
                int32_t seen = result.load(std::memory_order_relaxed);
                while (m > seen && !result.compare_exchange_weak(seen, m)) {
                }
              });
  int32_t bits = result.load();
  return bits > 0x7F800000 ? std::bit_cast<float>(0x7FC00000u)
                           : std::bit_cast<float>(bits);
}

} // namespace

float amax(std::span<const float> in, const Threading &threading) {
  return amaxSpan(in, threading);
}

float amax(std::span<const uint16_t> inBf16, const Threading &threading) {
  return amaxSpan(inBf16, threading);
}

} // namespace meshplan::runtime::kernels
