//===- bench-grad-norm.cpp - the exact gradient norm against a double sum -===//
//
// Gradient clipping's local part (core's accumulateGradNorm: fp32 squares
// summed exactly, docs/trainer.md "The optimizer step") against the naive
// alternative it replaces, a double sum of the squares in one order, on the
// same 4M gradient values in the same run. Prints ns per element of both
// and their ratio; FAILs when the exact sum costs more than 3x the double
// sum.
//
//   build/bin/bench-grad-norm
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/GradNorm.h"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <vector>

namespace {

const std::vector<float> &gradients() {
  static const std::vector<float> values = [] {
    std::vector<float> v(size_t(1) << 22);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.01f);
    for (float &x : v)
      x = d(rng);
    return v;
  }();
  return values;
}

double exactNs = 0, doubleNs = 0;

void BM_ExactSquareSum(benchmark::State &state) {
  const std::vector<float> &v = gradients();
  std::vector<int64_t> acc(
      size_t(meshplan::gradNormBufferLength(meshplan::GradNormType::L2)));
  for (auto _ : state) {
    std::fill(acc.begin(), acc.end(), 0);
    meshplan::accumulateGradNorm(meshplan::GradNormType::L2, v, acc);
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(v.size()));
}

void BM_DoubleSquareSum(benchmark::State &state) {
  const std::vector<float> &v = gradients();
  for (auto _ : state) {
    double sum = 0;
    for (float x : v)
      sum += double(x) * double(x);
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(v.size()));
}

class Reporter : public benchmark::ConsoleReporter {
public:
  void ReportRuns(const std::vector<Run> &runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run &r : runs) {
      // Both benchmarks report milliseconds per pass over the values.
      double ns = r.GetAdjustedRealTime() * 1e6 / double(gradients().size());
      if (r.run_name.function_name == "BM_ExactSquareSum")
        exactNs = ns;
      else if (r.run_name.function_name == "BM_DoubleSquareSum")
        doubleNs = ns;
    }
  }
};

} // namespace

BENCHMARK(BM_ExactSquareSum)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DoubleSquareSum)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char **argv) {
  benchmark::Initialize(&argc, argv);
  Reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  bool ok = exactNs > 0 && doubleNs > 0 && exactNs <= 3 * doubleNs;
  std::printf("\nexact sum of squares %.2f ns/element, double sum %.2f "
              "ns/element: ratio %.2f [<= 3: %s]\n",
              exactNs, doubleNs, doubleNs > 0 ? exactNs / doubleNs : 0.0,
              ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
