//===- bench-cuda-kernels.cpp - CUDA kernels against device copy bandwidth ===//
//
// Issue 14's bar for the GPU kernels: each kernel's bytes read + written per
// second as a fraction of a device-to-device copy's (cudaMemcpyAsync; 2 x
// the bytes copied), on the same device, sizes and run, >= 0.7. Kernels and
// bytes per element:
//   cast_e4m3     float -> e4m3fn with a device scale  4 read + 1 written
//   amax          max |x| of floats                    4 read
//   adamw_fp32    AdamW, fp32 param/grad/m/v            16 read + 12 written
//   adamw_bf16_sr AdamW, bf16 param + stochastic        14 read + 10 written
//                 rounding (Philox per element)
// Timed with CUDA events around a batch of launches on one stream (manual
// time), medians of --benchmark_repetitions (default 5). The summary prints
// the median fraction per kernel and size and FAILs below 0.7.
//
// Without a CUDA device it prints one line saying so and exits 77.
//
//   build/bin/bench-cuda-kernels          (CUDA builds; docs/cuda.md)
//
//===----------------------------------------------------------------------===//

#include "Kernels/Cuda/CudaKernels.h"

#include "BenchSupport.h"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;
namespace cu = meshplan::runtime::cuda;

namespace {

constexpr double kMinFraction = 0.7;
constexpr int kLaunchesPerBatch = 10;
const std::vector<int64_t> kSizes = {int64_t(1) << 24, int64_t(1) << 26};

struct Kernel {
  const char *name;
  double bytesPerElement; ///< read + written
};
const Kernel kCopy = {"d2d_copy", 8};
const std::vector<Kernel> kKernels = {
    {"cast_e4m3", 5}, {"amax", 4}, {"adamw_fp32", 28}, {"adamw_bf16_sr", 24}};

/// Device buffers of one size, shared by every benchmark of that size.
struct Buffers {
  int64_t n = 0;
  float *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
  uint16_t *bf16 = nullptr;
  uint8_t *fp8 = nullptr;
  float *scalar = nullptr; ///< [0]: scale, [1]: amax result
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
};

std::map<int64_t, Buffers> &allBuffers() {
  static std::map<int64_t, Buffers> buffers;
  return buffers;
}

bool check(cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return true;
  std::fprintf(stderr, "bench-cuda-kernels: %s: %s\n", what,
               cudaGetErrorString(e));
  return false;
}

template <typename T> cudaError_t deviceAlloc(T **pointer, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void **>(pointer), bytes);
}

Buffers &buffersFor(int64_t n) {
  Buffers &b = allBuffers()[n];
  if (b.n)
    return b;
  b.n = n;
  size_t f = size_t(n) * sizeof(float);
  bool ok = check(deviceAlloc(&b.a, f), "cudaMalloc") &&
            check(deviceAlloc(&b.b, f), "cudaMalloc") &&
            check(deviceAlloc(&b.c, f), "cudaMalloc") &&
            check(deviceAlloc(&b.d, f), "cudaMalloc") &&
            check(deviceAlloc(&b.bf16, size_t(n) * 2), "cudaMalloc") &&
            check(deviceAlloc(&b.fp8, size_t(n)), "cudaMalloc") &&
            check(deviceAlloc(&b.scalar, 2 * sizeof(float)), "cudaMalloc") &&
            check(cudaStreamCreate(&b.stream), "cudaStreamCreate") &&
            check(cudaEventCreate(&b.start), "cudaEventCreate") &&
            check(cudaEventCreate(&b.stop), "cudaEventCreate");
  if (!ok)
    std::exit(1);
  // Values in a realistic range: small gradients, unit-ish parameters.
  std::vector<float> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    host[size_t(i)] = float((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  cudaMemcpy(b.a, host.data(), f, cudaMemcpyHostToDevice);
  cudaMemcpy(b.b, host.data(), f, cudaMemcpyHostToDevice);
  cudaMemset(b.c, 0, f);
  cudaMemset(b.d, 0, f);
  cudaMemset(b.bf16, 0, size_t(n) * 2);
  float scalars[2] = {448.0f, 0.0f};
  cudaMemcpy(b.scalar, scalars, sizeof scalars, cudaMemcpyHostToDevice);
  return b;
}

/// One launch of `kernel` on the buffers.
cudaError_t launch(const std::string &kernel, Buffers &b, int64_t step) {
  kernels::AdamWParams hp;
  if (kernel == "d2d_copy")
    return cudaMemcpyAsync(b.b, b.a, size_t(b.n) * sizeof(float),
                           cudaMemcpyDeviceToDevice, b.stream);
  if (kernel == "cast_e4m3")
    return cu::castToFp8(b.a, b.scalar, b.fp8, b.n, kernels::Fp8Format::E4M3FN,
                         b.stream);
  if (kernel == "amax")
    return cu::amax(b.a, b.n, b.scalar + 1, b.stream);
  if (kernel == "adamw_fp32")
    return cu::adamwFp32(b.b, b.a, b.c, b.d, b.n, hp, step, b.stream);
  return cu::adamwBf16StochasticRounding(b.bf16, b.a, b.c, b.d, b.n, hp, step,
                                         /*seed=*/7, /*tensorId=*/3,
                                         cu::contiguousShardIndex(0), b.stream);
}

void run(benchmark::State &state, std::string kernel, double bytesPerElement) {
  int64_t n = state.range(0);
  Buffers &b = buffersFor(n);
  int64_t step = 1;
  // One warm-up launch, then batches timed by events on the stream.
  if (!check(launch(kernel, b, step++), kernel.c_str()) ||
      !check(cudaStreamSynchronize(b.stream), kernel.c_str())) {
    state.SkipWithError("launch failed");
    return;
  }
  for (auto _ : state) {
    // Any failure ends the benchmark: a failed launch or event would time
    // nothing, and a zero time makes Google Benchmark run ever more
    // iterations.
    cudaError_t e = cudaEventRecord(b.start, b.stream);
    for (int i = 0; i < kLaunchesPerBatch && e == cudaSuccess; ++i)
      e = launch(kernel, b, step++);
    if (e == cudaSuccess)
      e = cudaEventRecord(b.stop, b.stream);
    if (e == cudaSuccess)
      e = cudaEventSynchronize(b.stop);
    float ms = 0;
    if (e == cudaSuccess)
      e = cudaEventElapsedTime(&ms, b.start, b.stop);
    if (e != cudaSuccess || !(ms > 0)) {
      state.SkipWithError(e != cudaSuccess ? cudaGetErrorString(e)
                                           : "the events timed nothing");
      break;
    }
    // An iteration is the whole batch: reporting a tenth of it made Google
    // Benchmark run ten times the GPU time it asked for (over 150 s for the
    // suite on the first GPU run). The summary divides.
    state.SetIterationTime(double(ms) / 1000.0);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    state.SkipWithError(cudaGetErrorString(e));
  state.SetBytesProcessed(int64_t(state.iterations()) * kLaunchesPerBatch *
                          int64_t(double(n) * bytesPerElement));
}

/// Every repetition's ms per launch (event-timed), for the summary.
class SummaryReporter : public bench::QuietConsoleReporter {
public:
  /// kernel -> elements -> ms, one per repetition
  std::map<std::string, std::map<int64_t, std::vector<double>>> samples;

private:
  void record(const Run &run) override {
    samples[run.run_name.function_name][worldOf(run, 0)].push_back(
        run.GetAdjustedRealTime() * scale(run.time_unit, 1e3) /
        kLaunchesPerBatch);
  }
};

bool printSummary(const SummaryReporter &reporter) {
  std::printf("\nSummary: median bandwidth (bytes read + written per second) "
              "as a fraction of a device-to-device copy's, same size (%lld "
              "repetitions)\n\n",
              static_cast<long long>(reporter.repetitions));
  std::printf("%-16s %10s %9s %10s %9s\n", "kernel", "elements", "ms", "GB/s",
              "fraction");
  std::vector<std::string> failures;
  double worst = 1e30;
  auto copyIt = reporter.samples.find(kCopy.name);
  for (int64_t n : kSizes) {
    double copyMs = -1;
    if (copyIt != reporter.samples.end() && copyIt->second.count(n))
      copyMs = bench::median(copyIt->second.at(n));
    std::vector<const Kernel *> all{&kCopy};
    for (const Kernel &k : kKernels)
      all.push_back(&k);
    for (const Kernel *k : all) {
      auto it = reporter.samples.find(k->name);
      if (it == reporter.samples.end() || !it->second.count(n))
        continue;
      double ms = bench::median(it->second.at(n));
      double gbs = k->bytesPerElement * double(n) / (ms * 1e-3) / 1e9;
      std::printf("%-16s %10lld %9.3f %10.1f", k->name,
                  static_cast<long long>(n), ms, gbs);
      if (k == &kCopy || copyMs <= 0) {
        std::printf(" %9s\n", k == &kCopy ? "1" : "-");
        continue;
      }
      double copyGbs =
          kCopy.bytesPerElement * double(n) / (copyMs * 1e-3) / 1e9;
      double fraction = gbs / copyGbs;
      worst = std::min(worst, fraction);
      std::printf(" %9.2f\n", fraction);
      if (!(fraction >= kMinFraction))
        failures.push_back(
            bench::formatted("%s at %lld elements: %.2f of the copy", k->name,
                             static_cast<long long>(n), fraction));
    }
  }
  std::printf("\n");
  bench::addRunFailures(reporter.errors, !reporter.samples.empty(), failures);
  return bench::printVerdict(
      failures,
      bench::formatted("every kernel >= %.1f of the device copy's bandwidth "
                       "(worst %.2f)",
                       kMinFraction, worst));
}

} // namespace

int main(int argc, char **argv) {
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e || devices == 0) {
    std::printf("bench-cuda-kernels: SKIPPED: no usable CUDA device (%s)\n",
                e ? cudaGetErrorString(e) : "none visible");
    return 77;
  }
  // Line by line, so that a run stopped by a time limit still shows what
  // it measured.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device 0: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (int status = bench::initBenchmark(argc, argv))
    return status;
  std::vector<const Kernel *> all{&kCopy};
  for (const Kernel &k : kKernels)
    all.push_back(&k);
  for (const Kernel *k : all) {
    auto *b =
        benchmark::RegisterBenchmark(k->name, [k](benchmark::State &state) {
          run(state, k->name, k->bytesPerElement);
        });
    // 0.2 s of GPU time per repetition: 10 benchmarks x 5 repetitions stay
    // near 10 s of GPU time.
    b->ArgName("n")
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime()
        ->MinTime(0.2);
    for (int64_t n : kSizes)
      b->Arg(n);
  }
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return printSummary(reporter) ? 0 : 1;
}
