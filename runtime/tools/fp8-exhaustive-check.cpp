//===- fp8-exhaustive-check.cpp - Every float -> fp8 cast vs cuda_fp8.h ---===//
//
// Checks the runtime's saturating round-to-nearest-even casts to e4m3fn and
// e5m2 against NVIDIA's cuda_fp8.h host conversions
// (__nv_cvt_float_to_fp8(x * scale, __NV_SATFINITE, ...)) on all 2^32 float
// bit patterns, for each scale given, through the span kernel castToFp8 (and
// the scalar floatToFp8 at scale 1); and fp8ToFloat on all 256 codes of each
// format against __nv_cvt_fp8_to_halfraw. Scale 1 alone already covers every
// input the rounding can see; other scales exercise the multiply before it.
// Prints one summary line per format and scale, then PASS or FAIL; exits 0
// only when nothing differs. Built only where /usr/local/cuda/include has
// cuda_fp8.h (no CUDA library is linked).
//
//   cmake --build build -j2 --target meshplan-fp8-exhaustive-check
//   build/bin/meshplan-fp8-exhaustive-check                  # scale 1
//   build/bin/meshplan-fp8-exhaustive-check --scales=1,0.1,3.7 --threads=2
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Kernels.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace meshplan::runtime::kernels;

namespace {

constexpr uint64_t kPatterns = uint64_t(1) << 32;
constexpr uint64_t kChunk = uint64_t(1) << 20;
constexpr int kShownMismatches = 10;

__nv_fp8_interpretation_t cudaFormat(Fp8Format format) {
  return format == Fp8Format::E4M3FN ? __NV_E4M3 : __NV_E5M2;
}

const char *nameOf(Fp8Format format) {
  return format == Fp8Format::E4M3FN ? "e4m3fn" : "e5m2";
}

float halfToFloat(uint16_t h) {
  int exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  double v = exponent == 0    ? std::ldexp(mantissa, -24)
             : exponent == 31 ? (mantissa ? NAN : INFINITY)
                              : std::ldexp(1024 + mantissa, exponent - 25);
  return static_cast<float>(h & 0x8000 ? -v : v);
}

struct Result {
  std::atomic<uint64_t> mismatches{0};
  std::mutex shownMutex;
  int shown = 0;

  void report(const char *what, uint32_t bits, float scale, int got,
              int expected) {
    mismatches.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(shownMutex);
    if (shown++ < kShownMismatches)
      std::printf("  mismatch (%s): x = 0x%08x scale %g: got 0x%02x, "
                  "cuda_fp8.h 0x%02x\n",
                  what, bits, static_cast<double>(scale), got, expected);
  }
};

/// Every pattern at one scale, chunks handed out to `threads` workers.
uint64_t checkAll(Fp8Format format, float scale, int threads) {
  Result result;
  std::atomic<uint64_t> nextChunk{0};
  auto worker = [&] {
    std::vector<float> in(kChunk);
    std::vector<uint8_t> out(kChunk);
    for (;;) {
      uint64_t start = nextChunk.fetch_add(kChunk);
      if (start >= kPatterns)
        return;
      for (uint64_t i = 0; i < kChunk; ++i)
        in[i] = std::bit_cast<float>(static_cast<uint32_t>(start + i));
      castToFp8(in, scale, out, format, Threading::singleThreaded());
      for (uint64_t i = 0; i < kChunk; ++i) {
        uint8_t expected = __nv_cvt_float_to_fp8(in[i] * scale, __NV_SATFINITE,
                                                 cudaFormat(format));
        uint32_t bits = static_cast<uint32_t>(start + i);
        if (out[i] != expected)
          result.report("castToFp8", bits, scale, out[i], expected);
        if (scale == 1.0f) {
          uint8_t scalar = floatToFp8(in[i], format);
          if (scalar != expected)
            result.report("floatToFp8", bits, scale, scalar, expected);
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back(worker);
  worker();
  for (std::thread &t : pool)
    t.join();
  return result.mismatches.load();
}

uint64_t checkDecode(Fp8Format format) {
  uint64_t mismatches = 0;
  for (int c = 0; c < 256; ++c) {
    float ours = fp8ToFloat(static_cast<uint8_t>(c), format);
    float theirs =
        halfToFloat(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c),
                                            cudaFormat(format))
                        .x);
    bool same = std::isnan(theirs) ? std::isnan(ours)
                                   : std::bit_cast<uint32_t>(ours) ==
                                         std::bit_cast<uint32_t>(theirs);
    if (!same) {
      ++mismatches;
      std::printf("  mismatch (fp8ToFloat): %s code 0x%02x: got %g, "
                  "cuda_fp8.h %g\n",
                  nameOf(format), c, static_cast<double>(ours),
                  static_cast<double>(theirs));
    }
  }
  return mismatches;
}

bool parseScales(const char *text, std::vector<float> &scales) {
  scales.clear();
  std::string s = text;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    std::string item = s.substr(
        at, comma == std::string::npos ? std::string::npos : comma - at);
    char *end = nullptr;
    float v = std::strtof(item.c_str(), &end);
    if (item.empty() || *end != '\0')
      return false;
    scales.push_back(v);
    if (comma == std::string::npos)
      break;
    at = comma + 1;
  }
  return !scales.empty();
}

} // namespace

int main(int argc, char **argv) {
  std::vector<float> scales = {1.0f};
  int threads =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    if (std::strncmp(arg, "--scales=", 9) == 0) {
      if (!parseScales(arg + 9, scales)) {
        std::fprintf(stderr, "fp8-exhaustive-check: bad --scales: %s\n",
                     arg + 9);
        return 2;
      }
    } else if (std::strncmp(arg, "--threads=", 10) == 0 &&
               std::atoi(arg + 10) > 0) {
      threads = std::atoi(arg + 10);
    } else {
      std::fprintf(stderr, "usage: %s [--scales=S1,S2,...] [--threads=N]\n",
                   argv[0]);
      return 2;
    }
  }

  auto begin = std::chrono::steady_clock::now();
  uint64_t total = 0;
  for (Fp8Format format : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    uint64_t decode = checkDecode(format);
    std::printf("%s fp8ToFloat: 256 codes, %llu mismatches\n", nameOf(format),
                static_cast<unsigned long long>(decode));
    total += decode;
    for (float scale : scales) {
      auto t0 = std::chrono::steady_clock::now();
      uint64_t mismatches = checkAll(format, scale, threads);
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      std::printf("%s scale %g: %llu float patterns, %llu mismatches "
                  "(%.1f s)\n",
                  nameOf(format), static_cast<double>(scale),
                  static_cast<unsigned long long>(kPatterns),
                  static_cast<unsigned long long>(mismatches), seconds);
      std::fflush(stdout);
      total += mismatches;
    }
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin)
          .count();
  std::printf("%s: float -> e4m3fn/e5m2 (saturating, nearest even) on all "
              "2^32 patterns x %zu scale(s) vs cuda_fp8.h: %llu mismatches "
              "in %.1f s on %d threads\n",
              total == 0 ? "PASS" : "FAIL", scales.size(),
              static_cast<unsigned long long>(total), seconds, threads);
  return total == 0 ? 0 : 1;
}
