//===- bench-tune.cpp - meshplan tune on large worlds --------------------===//
//
// Times pipeline::tune (what `meshplan tune` runs) for llama3-405b on 1,024
// and 16,384 H100s with the default search (docs/tune.md): the enumeration
// and screen of every candidate (pipelines included: pp degree, schedule,
// microbatches) plus the real compiles of the 8 best (every pp coordinate
// of a pipelined one). The
// target is "seconds": the summary prints the median per search and FAILs
// above 30 s (autoparallel's searches take 35-60 s, Alpa's minutes to hours).
//
//   build/bin/bench-tune        (or: bench/run.sh build)
//
//===----------------------------------------------------------------------===//

#include "meshplan/Pipeline/Tune.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

using namespace meshplan;

namespace {

constexpr double kMaxSeconds = 30.0;

std::map<int64_t, std::vector<double>> seconds;
std::map<int64_t, size_t> candidates;

void BM_Tune405B(benchmark::State &state) {
  pipeline::TuneOptions options;
  options.model = "llama3-405b";
  options.world = state.range(0);
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    auto result = pipeline::tune(options);
    double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (!result) {
      state.SkipWithError(result.error().message.c_str());
      return;
    }
    seconds[options.world].push_back(s);
    candidates[options.world] = result->enumerated;
    benchmark::DoNotOptimize(result->ranked.front().stepSeconds);
  }
}
BENCHMARK(BM_Tune405B)
    ->Arg(1024)
    ->Arg(16384)
    ->Unit(benchmark::kSecond)
    ->Iterations(1)
    ->Repetitions(3)
    ->UseRealTime();

} // namespace

int main(int argc, char **argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  bool ok = !seconds.empty();
  std::printf("\nmeshplan tune, llama3-405b on H100 80 GB (median of the "
              "repetitions; target <= %.0f s):\n",
              kMaxSeconds);
  for (auto &[world, v] : seconds) {
    std::sort(v.begin(), v.end());
    double median = v[v.size() / 2];
    bool pass = median <= kMaxSeconds;
    ok = ok && pass;
    std::printf("  %6lld ranks: %zu candidates, %.2f s  %s\n", (long long)world,
                candidates[world], median, pass ? "PASS" : "FAIL");
  }
  return ok ? 0 : 1;
}
