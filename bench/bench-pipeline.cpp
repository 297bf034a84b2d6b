//===- bench-pipeline.cpp - Planning and verifying pipelined plan sets ---===//
//
// The speed targets of pipeline parallelism (issue 16, docs/pipeline.md
// "Speed"), measured in one run:
//
// A. Verifying all 256 plans of Llama 3 8B with PP 4 (interleaved_1f1b,
//    v = 2, 16 microbatches, torchtitan's split) x TP 8 x FSDP 8: the spec
//    of test/planner/Inputs/pipeline/llama3-8b-interleaved.json on mesh
//    dp = 8, pp = 4, tp = 8. One template per pp coordinate is compiled
//    once, as `meshplan plan --all` does; then
//      - verify_pp_in_memory: plan::verifyPlans on the 256 plans in memory
//        (verification-only instantiations, as `plan --all` verifies);
//      - verify_pp_directory: what `meshplan verify DIR` does: the plan
//        directory (written once, before the benchmarks, by
//        writePlanDirectory with 2 threads, as `plan --all -o DIR`) read
//        back with all cores (PlanDetail::VerificationOnly), verified, and
//        the plans freed;
//      - plan_all_and_verify_pp: everything `meshplan plan --all` does but
//        writing: the 4 compiles, 256 instantiations, verification.
//    Target: <= 3 s each on this 2-core machine (the issue's target is
//    about verification; the third is for reference).
//
// B. One rank's plan of Llama 3 405B with PP 8 (1f1b, 16 microbatches,
//    torchtitan's split) x TP 8 (torchtitan's Llama TP plan) x FSDP on
//    1,024 ranks (FSDP 16) and 16,384 ranks (FSDP 256), the last rank:
//    frontend::loadSpec, pipeline::makeContext, pipeline::compile of that
//    rank's pp coordinate (CompileOptions::pipelineRank, module verification
//    on, as the CLI), PreparedTemplate::prepare, instantiate with
//    estimates, writePlan to a string, teardown: `meshplan plan --rank R`
//    without the file. Targets: median <= 1 s, and t(16,384) / t(1,024)
//    <= 1.5 (planning one rank is O(axes)), printed as a ratio of the
//    medians of this run.
//
// Defaults (overridable on the command line): --benchmark_repetitions=5,
// --benchmark_enable_random_interleaving=true. The plan directory (~120 MiB)
// goes to a fresh directory under $TMPDIR (or /tmp), removed at exit. The
// summary prints medians of real and CPU (whole process) time and
// PASS/FAIL; the exit status is 1 on FAIL.
//
//   build/bin/bench-pipeline
//
//===----------------------------------------------------------------------===//

#include "meshplan/Frontend/Spec.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Plan/PlanDirectory.h"
#include "meshplan/Plan/Template.h"
#include "meshplan/Plan/Verify.h"

#include "BenchSupport.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

using namespace meshplan;
namespace fs = std::filesystem;

namespace {

constexpr double kMaxVerifyS = 3.0;
constexpr double kMaxPlanMs = 1000.0;
constexpr double kMaxPlanRatio = 1.5;

constexpr int64_t kVerifyDp = 8, kVerifyPp = 4, kVerifyTp = 8;
constexpr int64_t kVerifyWorld = kVerifyDp * kVerifyPp * kVerifyTp; // 256
constexpr int64_t kPlanPp = 8, kPlanTp = 8;
const std::vector<int64_t> kPlanWorlds = {1024, 16384};

std::string tempRoot;

[[noreturn]] void die(const std::string &what, const std::string &message) {
  std::fprintf(stderr, "bench-pipeline: %s: %s\n", what.c_str(),
               message.c_str());
  std::fflush(nullptr);
  if (!tempRoot.empty()) {
    std::error_code ec;
    fs::remove_all(tempRoot, ec);
  }
  _exit(2);
}
template <typename T> T orDie(Result<T> result, const std::string &what) {
  if (!result.ok())
    die(what, result.error().message);
  return std::move(result.value());
}
void orDie(Result<void> result, const std::string &what) {
  if (!result.ok())
    die(what, result.error().message);
}

std::string n(int64_t v) { return std::to_string(v); }

/// test/planner/Inputs/pipeline/llama3-8b-interleaved.json on dp = 8,
/// pp = 4, tp = 8 with 16 microbatches.
std::string spec8b() {
  return R"json({
  "model": "llama3-8b",
  "mesh": {"axes": [{"name": "dp", "size": )json" +
         n(kVerifyDp) + R"json(}, {"name": "pp", "size": )json" + n(kVerifyPp) +
         R"json(}, {"name": "tp", "size": )json" + n(kVerifyTp) + R"json(}]},
  "data_parallel": {"shard_axes": ["dp"]},
  "tensor_parallel": {"axis": "tp", "plan": [
    {"pattern": "layers.*.attention.wq", "style": "colwise"},
    {"pattern": "layers.*.attention.wo", "style": "rowwise"}
  ]},
  "pipeline_parallel": {"axis": "pp", "schedule": "interleaved_1f1b",
                        "microbatches": 16, "stages_per_rank": 2,
                        "split": "torchtitan"}
})json";
}

/// Llama 3 405B on (dp, pp, tp) = (world / 64, 8, 8): FSDP over dp,
/// torchtitan's Llama TP plan, 1F1B with 16 microbatches.
std::string spec405b(int64_t world) {
  return R"json({
  "model": "llama3-405b",
  "world_size": )json" +
         n(world) + R"json(,
  "mesh": {"axes": [{"name": "dp", "size": )json" +
         n(world / (kPlanPp * kPlanTp)) +
         R"json(}, {"name": "pp", "size": )json" + n(kPlanPp) +
         R"json(}, {"name": "tp", "size": )json" + n(kPlanTp) + R"json(}]},
  "data_parallel": {"shard_axes": ["dp"]},
  "tensor_parallel": {"axis": "tp", "plan": [
    {"pattern": "tok_embeddings", "style": "rowwise"},
    {"pattern": "layers.*.attention_norm", "style": "sequence_parallel"},
    {"pattern": "layers.*.attention.wq", "style": "colwise"},
    {"pattern": "layers.*.attention.wk", "style": "colwise"},
    {"pattern": "layers.*.attention.wv", "style": "colwise"},
    {"pattern": "layers.*.attention.wo", "style": "rowwise"},
    {"pattern": "layers.*.ffn_norm", "style": "sequence_parallel"},
    {"pattern": "layers.*.feed_forward.w1", "style": "colwise"},
    {"pattern": "layers.*.feed_forward.w2", "style": "rowwise"},
    {"pattern": "layers.*.feed_forward.w3", "style": "colwise"},
    {"pattern": "norm", "style": "sequence_parallel"},
    {"pattern": "output", "style": "colwise"}
  ]},
  "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
  "optimizer": {"name": "adamw"},
  "pipeline_parallel": {"axis": "pp", "schedule": "1f1b", "microbatches": 16,
                        "split": "torchtitan"}
})json";
}

/// One template per pp coordinate of a pipelined spec, and the coordinate
/// of every rank: what `meshplan plan --all` compiles.
struct PipelineTemplates {
  frontend::ResolvedSpec spec;
  std::vector<plan::PreparedTemplate> byCoordinate;

  const plan::PreparedTemplate &templateFor(int64_t rank) const {
    const Mesh &mesh = *spec.mesh;
    int64_t position = orDie(mesh.positionOf(rank), "positionOf");
    return byCoordinate[size_t(
        mesh.coordinateAt(position, spec.pipeline->axisIndex))];
  }
};

PipelineTemplates compileAll(const std::string &specText) {
  PipelineTemplates out{orDie(frontend::loadSpec(specText, "."), "spec"), {}};
  auto context = pipeline::makeContext();
  for (int64_t c = 0; c < out.spec.pipeline->config.ranks; ++c) {
    pipeline::CompileOptions options;
    options.pipelineRank = c;
    auto compiled =
        orDie(pipeline::compile(*context, out.spec, options), "compile");
    out.byCoordinate.push_back(
        orDie(plan::PreparedTemplate::prepare(compiled.program), "prepare"));
  }
  return out;
}

std::vector<plan::Plan> instantiateAll(const PipelineTemplates &t) {
  std::vector<plan::Plan> plans;
  for (int64_t rank = 0; rank < t.spec.mesh->size(); ++rank)
    plans.push_back(
        orDie(t.templateFor(rank).instantiate(rank, /*withEstimates=*/false,
                                              /*verificationOnly=*/true),
              "instantiate"));
  return plans;
}

std::optional<PipelineTemplates> templates8b;
std::vector<plan::Plan> inMemoryPlans;
std::string planDir;
plan::VerifyStats verifyStats;
size_t dirFiles = 0;
uintmax_t dirBytes = 0;

void verifiedOrSkip(benchmark::State &state, const plan::VerifyResult &v) {
  if (!v.ok())
    state.SkipWithError(("verification failed: " + v.failure->message).c_str());
  verifyStats = v.stats;
}

void runVerifyInMemory(benchmark::State &state) {
  for (auto _ : state) {
    plan::VerifyResult v =
        orDie(plan::verifyPlans(inMemoryPlans), "verifyPlans");
    verifiedOrSkip(state, v);
  }
}

void runVerifyDirectory(benchmark::State &state) {
  for (auto _ : state) {
    std::vector<plan::Plan> plans = orDie(
        plan::readPlanDirectory(planDir, 0, plan::PlanDetail::VerificationOnly),
        "readPlanDirectory");
    plan::VerifyResult v = orDie(plan::verifyPlans(plans), "verifyPlans");
    verifiedOrSkip(state, v);
    plans = {}; // freeing them is part of the command's run
  }
}

void runPlanAllAndVerify(benchmark::State &state) {
  for (auto _ : state) {
    PipelineTemplates t = compileAll(spec8b());
    std::vector<plan::Plan> plans = instantiateAll(t);
    plan::VerifyResult v = orDie(plan::verifyPlans(plans), "verifyPlans");
    verifiedOrSkip(state, v);
  }
}

/// `meshplan plan --spec S --rank R` without the file: R is the last rank.
void runPlanOneRank(benchmark::State &state) {
  int64_t world = state.range(0);
  std::string text = spec405b(world);
  size_t bytes = 0;
  for (auto _ : state) {
    std::optional<frontend::ResolvedSpec> spec;
    spec.emplace(orDie(frontend::loadSpec(text, "."), "load spec"));
    int64_t rank = world - 1;
    int64_t position = orDie(spec->mesh->positionOf(rank), "positionOf");
    auto context = pipeline::makeContext();
    pipeline::CompileOptions options;
    options.pipelineRank =
        spec->mesh->coordinateAt(position, spec->pipeline->axisIndex);
    std::optional<pipeline::Compiled> compiled;
    compiled.emplace(
        orDie(pipeline::compile(*context, *spec, options), "compile"));
    std::optional<plan::PreparedTemplate> prepared;
    prepared.emplace(
        orDie(plan::PreparedTemplate::prepare(compiled->program), "prepare"));
    std::optional<plan::Plan> plan;
    plan.emplace(orDie(prepared->instantiate(rank), "instantiate"));
    std::string written = plan::writePlan(*plan);
    benchmark::DoNotOptimize(written.data());
    bytes = written.size();
    plan.reset();
    prepared.reset();
    compiled.reset();
    context.reset();
    spec.reset();
  }
  state.counters["plan_bytes"] = double(bytes);
}

struct Sample {
  double realMs = 0, cpuMs = 0;
};

class SummaryReporter : public bench::QuietConsoleReporter {
public:
  /// benchmark name -> world (0: none) -> one sample per repetition
  std::map<std::string, std::map<int64_t, std::vector<Sample>>> samples;

private:
  void record(const Run &run) override {
    double unit = scale(run.time_unit, 1e3);
    samples[run.run_name.function_name][worldOf(run, 0)].push_back(
        {run.GetAdjustedRealTime() * unit, run.GetAdjustedCPUTime() * unit});
  }
};

std::optional<Sample> medianOf(const SummaryReporter &reporter,
                               const std::string &name, int64_t world) {
  auto it = reporter.samples.find(name);
  if (it == reporter.samples.end())
    return std::nullopt;
  auto at = it->second.find(world);
  if (at == it->second.end() || at->second.empty())
    return std::nullopt;
  std::vector<double> real, cpu;
  for (const Sample &s : at->second) {
    real.push_back(s.realMs);
    cpu.push_back(s.cpuMs);
  }
  return Sample{bench::median(real), bench::median(cpu)};
}

bool printSummary(const SummaryReporter &reporter) {
  std::vector<std::string> failures;
  std::printf("\nA. llama3-8b, PP 4 (interleaved_1f1b, v = 2, 16 "
              "microbatches) x TP 8 x FSDP 8: all %lld plans (median of %lld "
              "repetitions; target <= %.0f s)\n",
              static_cast<long long>(kVerifyWorld),
              static_cast<long long>(reporter.repetitions), kMaxVerifyS);
  std::printf("   %zu plan files, %.1f MiB; %lld communicators, %lld "
              "collectives and transfers, %lld instructions\n",
              dirFiles, double(dirBytes) / (1024.0 * 1024.0),
              static_cast<long long>(verifyStats.communicators),
              static_cast<long long>(verifyStats.collectives),
              static_cast<long long>(verifyStats.instructions));
  for (auto [name, label, target] :
       {std::tuple{"verify_pp_in_memory", "verifyPlans, plans in memory", true},
        std::tuple{"verify_pp_directory",
                   "`meshplan verify DIR`: read + verify + free", true},
        std::tuple{"plan_all_and_verify_pp",
                   "4 compiles + 256 instantiations + verify", false}}) {
    auto m = medianOf(reporter, name, 0);
    if (!m) {
      std::printf("   %-48s not run\n", label);
      continue;
    }
    bool pass = m->realMs / 1e3 <= kMaxVerifyS;
    std::printf("   %-48s %7.3f s real, %7.3f s CPU  %s\n", label,
                m->realMs / 1e3, m->cpuMs / 1e3,
                target ? (pass ? "PASS" : "FAIL") : "(reference)");
    if (target && !pass)
      failures.push_back(
          std::string(name) + " " +
          bench::formatted("%.2f s > %.0f s", m->realMs / 1e3, kMaxVerifyS));
  }

  std::printf("\nB. One rank's plan (the last) of llama3-405b, PP 8 (1f1b, 16 "
              "microbatches) x TP 8 x FSDP (median; target <= %.0f ms, "
              "ratio <= %.1f):\n",
              kMaxPlanMs, kMaxPlanRatio);
  std::map<int64_t, Sample> med;
  for (int64_t world : kPlanWorlds) {
    auto m = medianOf(reporter, "plan_405b_pp8_last_rank", world);
    if (!m) {
      std::printf("   %6lld ranks: not run\n", static_cast<long long>(world));
      continue;
    }
    med[world] = *m;
    bool pass = m->realMs <= kMaxPlanMs;
    std::printf("   %6lld ranks (FSDP %lld): %7.1f ms real, %7.1f ms CPU  "
                "%s\n",
                static_cast<long long>(world),
                static_cast<long long>(world / (kPlanPp * kPlanTp)), m->realMs,
                m->cpuMs, pass ? "PASS" : "FAIL");
    if (!pass)
      failures.push_back(bench::formatted("plan at %lld ranks %.0f ms > %.0f",
                                          static_cast<long long>(world),
                                          m->realMs, kMaxPlanMs));
  }
  int64_t lo = kPlanWorlds.front(), hi = kPlanWorlds.back();
  if (med.count(lo) && med.count(hi)) {
    double ratio = med[hi].realMs / med[lo].realMs;
    double cpuRatio = med[hi].cpuMs / med[lo].cpuMs;
    bool pass = ratio <= kMaxPlanRatio;
    std::printf("   t(%lld) / t(%lld) = %.2f real, %.2f CPU  %s\n",
                static_cast<long long>(hi), static_cast<long long>(lo), ratio,
                cpuRatio, pass ? "PASS" : "FAIL");
    if (!pass)
      failures.push_back(
          bench::formatted("plan ratio %.2f > %.1f", ratio, kMaxPlanRatio));
  }
  std::printf("\n");
  bench::addRunFailures(reporter.errors, !reporter.samples.empty(), failures);
  return bench::printVerdict(failures, "every pipeline target met");
}

} // namespace

int main(int argc, char **argv) {
  if (int status = bench::initBenchmark(argc, argv))
    return status;

  // A: the templates, the plans in memory, and the plan directory.
  templates8b.emplace(compileAll(spec8b()));
  inMemoryPlans = instantiateAll(*templates8b);
  const char *tmp = std::getenv("TMPDIR");
  std::string root =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/bench-pipeline-XXXXXX";
  if (!mkdtemp(root.data()))
    die(root, "mkdtemp failed");
  tempRoot = root;
  planDir = root + "/plans";
  {
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < kVerifyWorld; ++r)
      ranks.push_back(r);
    orDie(plan::writePlanDirectory(
              planDir, kVerifyWorld,
              [](int64_t rank) {
                return templates8b->templateFor(rank).instantiate(rank);
              },
              ranks, nullptr, 2),
          "writePlanDirectory");
  }
  for (const fs::directory_entry &e : fs::directory_iterator(planDir)) {
    dirBytes += e.file_size();
    ++dirFiles;
  }

  benchmark::RegisterBenchmark("verify_pp_in_memory", runVerifyInMemory)
      ->Unit(benchmark::kMillisecond)
      ->MeasureProcessCPUTime()
      ->Iterations(1);
  benchmark::RegisterBenchmark("verify_pp_directory", runVerifyDirectory)
      ->Unit(benchmark::kMillisecond)
      ->MeasureProcessCPUTime()
      ->Iterations(1);
  benchmark::RegisterBenchmark("plan_all_and_verify_pp", runPlanAllAndVerify)
      ->Unit(benchmark::kMillisecond)
      ->MeasureProcessCPUTime()
      ->Iterations(1);
  auto *plan =
      benchmark::RegisterBenchmark("plan_405b_pp8_last_rank", runPlanOneRank);
  plan->ArgName("world")
      ->Unit(benchmark::kMillisecond)
      ->MeasureProcessCPUTime()
      ->Iterations(1);
  for (int64_t world : kPlanWorlds)
    plan->Arg(world);

  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  bool ok = printSummary(reporter);
  std::error_code ec;
  fs::remove_all(root, ec);
  return ok ? 0 : 1;
}
