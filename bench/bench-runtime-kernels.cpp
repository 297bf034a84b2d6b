//===- bench-runtime-kernels.cpp - CPU kernels against memcpy bandwidth ---===//
//
// The runtime's per-step CPU kernels are streaming loops, so the bar is the
// machine's copy bandwidth: each kernel's bytes read + written per second as
// a fraction of memcpy's (2 x the bytes copied per second), measured in the
// same run on the same buffer sizes (4M and 16M elements) and thread counts
// (one thread, and the kernels' default threading against a memcpy split the
// same way). Kernels and bytes per element:
//   cast_e4m3     float -> e4m3fn with a scale       4 read + 1 written
//   amax          max |x| of floats                  4 read
//   adamw_fp32    AdamW, fp32 param/grad/m/v          16 read + 12 written
//   adamw_bf16_sr AdamW, bf16 param + stochastic      14 read + 10 written
//                 rounding (Philox per element)
// The summary prints the median fraction per kernel, size and thread count
// and FAILs when one is below 0.5.
//
// Defaults (overridable on the command line): --benchmark_repetitions=5,
// --benchmark_min_time=0.1, --benchmark_enable_random_interleaving=true.
//
//   build/bin/bench-runtime-kernels            (or: bench/run.sh build)
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Kernels.h"

#include "BenchSupport.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime::kernels;

namespace {

constexpr double kMinFraction = 0.5;
const std::vector<int64_t> kSizes = {int64_t(1) << 22, int64_t(1) << 24};

struct Kernel {
  const char *name;
  double bytesPerElement; ///< read + written
};
const Kernel kMemcpy = {"memcpy", 8};
const std::vector<Kernel> kKernels = {
    {"cast_e4m3", 5}, {"amax", 4}, {"adamw_fp32", 28}, {"adamw_bf16_sr", 24}};

/// The buffers of one size, shared by every benchmark of that size.
struct Buffers {
  std::vector<float> a, b, c, d;
  std::vector<uint8_t> fp8;
  std::vector<uint16_t> bf16;
};

Buffers &buffersFor(int64_t n) {
  static std::map<int64_t, std::unique_ptr<Buffers>> all;
  std::unique_ptr<Buffers> &slot = all[n];
  if (!slot) {
    slot = std::make_unique<Buffers>();
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto fill = [&](std::vector<float> &v, float scale) {
      v.resize(n);
      for (float &x : v)
        x = normal(rng) * scale;
    };
    fill(slot->a, 1.0f);
    fill(slot->b, 1e-2f);
    fill(slot->c, 1e-3f);
    fill(slot->d, 1e-3f);
    for (float &x : slot->d)
      x = x * x;
    slot->fp8.resize(n);
    slot->bf16.resize(n);
    castToBf16(slot->a, slot->bf16);
  }
  return *slot;
}

/// The threads the kernels' default Threading uses for n elements, so that
/// memcpy is split the same way.
int threadsFor(int64_t n, bool threaded) {
  if (!threaded)
    return 1;
  Threading t;
  int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(
      std::clamp<int64_t>(n / t.minElementsPerThread, 1, hw));
}

void parallelMemcpy(float *dst, const float *src, int64_t n, int threads) {
  if (threads == 1) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) {
    int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    workers.emplace_back([=] {
      std::memcpy(dst + begin, src + begin, (end - begin) * sizeof(float));
    });
  }
  std::memcpy(dst, src, std::min(n, chunk) * sizeof(float));
  for (std::thread &w : workers)
    w.join();
}

void run(benchmark::State &state, const Kernel &kernel, bool threaded) {
  int64_t n = state.range(0);
  Buffers &buf = buffersFor(n);
  Threading threading = threaded ? Threading{} : Threading::singleThreaded();
  int threads = threadsFor(n, threaded);
  std::string name = kernel.name;
  AdamWParams params{1e-4, 0.9, 0.999, 1e-8, 0.01};
  std::vector<IndexRun> runs = {{0, 0, n}};
  int64_t step = 1;
  for (auto _ : state) {
    if (name == "memcpy") {
      parallelMemcpy(buf.b.data(), buf.a.data(), n, threads);
    } else if (name == "cast_e4m3") {
      castToFp8(buf.a, 37.5f, buf.fp8, Fp8Format::E4M3FN, threading);
    } else if (name == "amax") {
      benchmark::DoNotOptimize(amax(buf.a, threading));
    } else if (name == "adamw_fp32") {
      adamwFp32(buf.a, buf.b, buf.c, buf.d, params, step++, threading);
    } else if (name == "adamw_bf16_sr") {
      adamwBf16StochasticRounding(buf.bf16, buf.b, buf.c, buf.d, params, step++,
                                  42, 7, runs, threading);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(
      state.iterations() * kernel.bytesPerElement * static_cast<double>(n)));
  state.counters["threads"] = threads;
}

/// Every repetition's real ms per iteration, for the summary.
class SummaryReporter : public bench::QuietConsoleReporter {
public:
  /// benchmark name -> elements -> real ms, one per repetition
  std::map<std::string, std::map<int64_t, std::vector<double>>> samples;

private:
  void record(const Run &run) override {
    samples[run.run_name.function_name][worldOf(run, 0)].push_back(
        run.GetAdjustedRealTime() * scale(run.time_unit, 1e3));
  }
};

std::string benchName(const Kernel &kernel, bool threaded) {
  return std::string(kernel.name) + (threaded ? "/threads" : "/1_thread");
}

bool printSummary(const SummaryReporter &reporter) {
  std::printf("\nSummary: median bandwidth (bytes read + written per second) "
              "as a fraction of memcpy's, same size and threads (%lld "
              "repetitions; %u hardware threads)\n\n",
              static_cast<long long>(reporter.repetitions),
              std::thread::hardware_concurrency());
  std::printf("%-16s %-9s %10s %9s %10s %9s\n", "kernel", "threads", "elements",
              "ms", "GB/s", "fraction");
  std::vector<std::string> failures;
  double worst = 1e30;
  for (bool threaded : {false, true}) {
    auto memcpyIt = reporter.samples.find(benchName(kMemcpy, threaded));
    for (int64_t n : kSizes) {
      int threads = threadsFor(n, threaded);
      double memcpyMs = -1;
      if (memcpyIt != reporter.samples.end() && memcpyIt->second.count(n))
        memcpyMs = bench::median(memcpyIt->second.at(n));
      for (const Kernel *k :
           {&kMemcpy, &kKernels[0], &kKernels[1], &kKernels[2], &kKernels[3]}) {
        auto it = reporter.samples.find(benchName(*k, threaded));
        if (it == reporter.samples.end() || !it->second.count(n))
          continue;
        double ms = bench::median(it->second.at(n));
        double gbs = k->bytesPerElement * double(n) / (ms * 1e-3) / 1e9;
        std::printf("%-16s %-9d %10lld %9.2f %10.2f", k->name, threads,
                    static_cast<long long>(n), ms, gbs);
        if (k == &kMemcpy || memcpyMs <= 0) {
          std::printf(" %9s\n", k == &kMemcpy ? "1" : "-");
          continue;
        }
        double memcpyGbs =
            kMemcpy.bytesPerElement * double(n) / (memcpyMs * 1e-3) / 1e9;
        double fraction = gbs / memcpyGbs;
        worst = std::min(worst, fraction);
        std::printf(" %9.2f\n", fraction);
        if (!(fraction >= kMinFraction))
          failures.push_back(bench::formatted(
              "%s at %lld elements on %d thread(s): %.2f of memcpy", k->name,
              static_cast<long long>(n), threads, fraction));
      }
    }
  }
  std::printf("\n");
  bench::addRunFailures(reporter.errors, !reporter.samples.empty(), failures);
  return bench::printVerdict(
      failures,
      bench::formatted("every kernel >= %.1f of memcpy bandwidth (worst %.2f)",
                       kMinFraction, worst));
}

} // namespace

int main(int argc, char **argv) {
  if (int status =
          bench::initBenchmark(argc, argv, {{"--benchmark_min_time", "0.1"}}))
    return status;

  for (bool threaded : {false, true}) {
    for (const Kernel *k :
         {&kMemcpy, &kKernels[0], &kKernels[1], &kKernels[2], &kKernels[3]}) {
      auto *b = benchmark::RegisterBenchmark(
          benchName(*k, threaded).c_str(),
          [k, threaded](benchmark::State &state) { run(state, *k, threaded); });
      b->ArgName("n")->Unit(benchmark::kMillisecond)->UseRealTime();
      for (int64_t n : kSizes)
        b->Arg(n);
    }
  }

  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return printSummary(reporter) ? 0 : 1;
}
