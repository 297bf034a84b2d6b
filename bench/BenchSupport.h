//===- BenchSupport.h - What the bench programs share -----------*- C++ -*-===//
//
// The parts every Google Benchmark program under bench/ with a summary does
// alike: start the library with default flags unless the command line gives
// them, show only medians and cvs on the console while keeping every
// repetition for the summary, and print the summary's PASS/FAIL verdict.
//
//===----------------------------------------------------------------------===//

#ifndef MESHPLAN_BENCH_BENCHSUPPORT_H
#define MESHPLAN_BENCH_BENCHSUPPORT_H

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

namespace meshplan::bench {

/// Tensor-parallel degree of the benchmark meshes.
constexpr int64_t kTp = 8;

/// A benchmark mesh pp x dp x fsdp x tp (tp = kTp); size-1 axes keep tiny
/// worlds 4-D.
struct MeshShape {
  int64_t pp, dp, fsdp;
  int64_t world() const { return pp * dp * fsdp * kTp; }
};

/// Calls benchmark::Initialize on the command line with, ahead of it, the
/// defaults for a noisy machine: --benchmark_repetitions=5, `flag=value` for
/// each {flag, value} of `extra`, and
/// --benchmark_enable_random_interleaving=true (so that load from other
/// processes hits all benchmarks alike); each only where the command line
/// does not give that flag (as `flag` or `flag=...`). Returns 0, or the exit
/// status 2 when an argument is left that the library does not know
/// (reported on stderr).
inline int initBenchmark(
    int argc, char **argv,
    const std::vector<std::pair<std::string, std::string>> &extra = {}) {
  std::vector<std::pair<std::string, std::string>> defaults = {
      {"--benchmark_repetitions", "5"}};
  defaults.insert(defaults.end(), extra.begin(), extra.end());
  defaults.push_back({"--benchmark_enable_random_interleaving", "true"});
  auto given = [&](std::string_view flag) {
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i];
      if (arg.substr(0, flag.size()) == flag &&
          (arg.size() == flag.size() || arg[flag.size()] == '='))
        return true;
    }
    return false;
  };
  // Kept for the life of the process, as argv is.
  static std::vector<std::string> added;
  for (const auto &[flag, value] : defaults)
    if (!given(flag))
      added.push_back(flag + "=" + value);
  std::vector<char *> args{argv[0]};
  for (std::string &flag : added)
    args.push_back(flag.data());
  for (int i = 1; i < argc; ++i)
    args.push_back(argv[i]);
  int count = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data()))
    return 2;
  return 0;
}

/// Adds the summary's failures every program shares: each benchmark that
/// reported an error, and a run in which nothing was timed.
inline void addRunFailures(const std::vector<std::string> &errors,
                           bool timedAnything,
                           std::vector<std::string> &failures) {
  for (const std::string &error : errors)
    failures.push_back("error in " + error);
  if (!timedAnything)
    failures.push_back("nothing was timed (check --benchmark_filter)");
}

/// Console output showing only errors, single runs, and the median and cv of
/// repeated runs, in colour only on a terminal (the library's own
/// --benchmark_color=auto). For the summary, errors are collected, each
/// repetition goes to record() and each aggregate to recordAggregate().
class QuietConsoleReporter : public benchmark::ConsoleReporter {
public:
  std::vector<std::string> errors;
  int64_t repetitions = 1;

  QuietConsoleReporter()
      : ConsoleReporter(isatty(fileno(stdout)) ? OO_ColorTabular : OO_Tabular) {
  }

  void ReportRuns(const std::vector<Run> &runs) override {
    std::vector<Run> shown;
    for (const Run &run : runs) {
      bool aggregate = run.run_type == Run::RT_Aggregate;
      if (run.error_occurred || run.repetitions <= 1 ||
          (aggregate &&
           (run.aggregate_name == "median" || run.aggregate_name == "cv")))
        shown.push_back(run);
      if (run.error_occurred) {
        errors.push_back(run.benchmark_name() + ": " + run.error_message);
      } else if (run.run_type == Run::RT_Aggregate) {
        recordAggregate(run);
      } else {
        repetitions = std::max<int64_t>(repetitions, run.repetitions);
        record(run);
      }
    }
    if (!shown.empty())
      ConsoleReporter::ReportRuns(shown);
  }

protected:
  virtual void record(const Run &run) = 0;
  virtual void recordAggregate(const Run &) {}

  /// The N of the run's argument "world:N" (or "N"); `none` without one.
  static int64_t worldOf(const Run &run, int64_t none) {
    const std::string &args = run.run_name.args;
    if (args.empty())
      return none;
    size_t colon = args.find(':');
    return std::atoll(args.c_str() +
                      (colon == std::string::npos ? 0 : colon + 1));
  }

  /// The factor from times in `unit` to a unit of which a second has
  /// `perSecond` (1e3: ms, 1e9: ns).
  static double scale(benchmark::TimeUnit unit, double perSecond) {
    return perSecond / benchmark::GetTimeUnitMultiplier(unit);
  }
};

/// The median; -1 when there are no values.
inline double median(std::vector<double> values) {
  if (values.empty())
    return -1;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

/// printf into a string.
[[gnu::format(printf, 1, 2)]] inline std::string formatted(const char *format,
                                                           ...) {
  va_list args, copy;
  va_start(args, format);
  va_copy(copy, args);
  int size = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string text(size > 0 ? size : 0, '\0');
  std::vsnprintf(text.data(), text.size() + 1, format, args);
  va_end(args);
  return text;
}

/// Prints the verdict line: "PASS: <passLine>" when `failures` is empty,
/// else "FAIL: " and the failures joined by "; ", then `failSuffix`. Returns
/// whether it passed.
inline bool printVerdict(const std::vector<std::string> &failures,
                         const std::string &passLine,
                         const std::string &failSuffix = "") {
  if (failures.empty()) {
    std::printf("PASS: %s\n", passLine.c_str());
    return true;
  }
  std::printf("FAIL: ");
  for (size_t i = 0; i < failures.size(); ++i)
    std::printf("%s%s", i ? "; " : "", failures[i].c_str());
  std::printf("%s\n", failSuffix.c_str());
  return false;
}

} // namespace meshplan::bench

#endif // MESHPLAN_BENCH_BENCHSUPPORT_H
