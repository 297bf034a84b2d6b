//===- bench-plan-instantiate.cpp - Per-rank plan instantiation cost ------===//
//
// Times PreparedTemplate::instantiate (with estimates) on a synthetic
// training-step template of ~10,500 instructions and ~1,025 buffers (25
// layers x 10 FSDP x TP weights, 16 microbatches, pipeline sends) on 4-D
// meshes (pp, dp, fsdp, tp), tp = 8, of 64 .. 131,072 ranks, each with the
// default and with a shuffled device order, cycling over pseudo-random ranks.
// Instantiation must not depend on the world size: the summary prints the
// median time per rank at each world size and t(131072) / t(64), and FAILs
// when that ratio exceeds 2.0 or a rank takes 50 ms or more. It also times
// instantiating all ranks of the 1,024-rank mesh one after the other.
//
// Defaults (overridable on the command line): --benchmark_repetitions=5,
// --benchmark_min_time=0.2, --benchmark_enable_random_interleaving=true.
//
//   build/bin/bench-plan-instantiate            (or: bench/run.sh build)
//
//===----------------------------------------------------------------------===//

#include "meshplan/Plan/Template.h"
#include "meshplan/Plan/Verify.h"

#include "BenchSupport.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace meshplan;
using namespace meshplan::plan;

namespace {

constexpr double kMaxRatio = 2.0;
constexpr double kMaxMsPerRank = 50.0;
constexpr int kLayers = 25;
constexpr int kMicrobatches = 16;
constexpr size_t kNumRanks = 256; ///< pseudo-random ranks cycled over
constexpr int64_t kAllRanksWorld = 1024;

using meshplan::bench::kTp;
using meshplan::bench::MeshShape;
const std::vector<MeshShape> kShapes = {
    {1, 2, 4},    // 64
    {2, 4, 8},    // 512
    {2, 8, 8},    // 1024
    {4, 8, 16},   // 4096
    {8, 16, 32},  // 32768
    {16, 32, 32}, // 131072
};

template <typename T> T orDie(Result<T> result, const std::string &what) {
  if (!result.ok()) {
    std::fprintf(stderr, "bench-plan-instantiate: %s: %s\n", what.c_str(),
                 result.error().message.c_str());
    std::exit(2);
  }
  return std::move(result.value());
}

uint64_t splitmix64(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Weight {
  const char *name;
  int64_t rows, cols;
};
/// One transformer layer's weights (rows not all divisible by tp * fsdp).
const std::vector<Weight> kWeights = {
    {"attention.wq", 4096, 4096},
    {"attention.wk", 1024, 4096},
    {"attention.wv", 1024, 4096},
    {"attention.wo", 4096, 4096},
    {"attention_norm", 4100, 1},
    {"feed_forward.w1", 14336, 4096},
    {"feed_forward.w2", 4096, 14336},
    {"feed_forward.w3", 14336, 4096},
    {"ffn_norm", 4100, 1},
    {"adapter", 1000, 4096},
};

/// The synthetic step: per weight, an FSDP all-gather over fsdp before
/// forward and again before backward (freed in between), 16 microbatches of
/// forward and backward compute, a reduce-scatter of the gradient over fsdp,
/// an all-reduce over dp and the optimizer update; per layer and microbatch
/// a pipeline send forward and backward over pp.
ProgramTemplate makeTemplate(const MeshShape &s,
                             std::optional<std::vector<int64_t>> order) {
  std::string where = "world " + std::to_string(s.world());
  ProgramTemplate t;
  t.mesh.axes = {{"pp", s.pp, false},
                 {"dp", s.dp, false},
                 {"fsdp", s.fsdp, false},
                 {"tp", kTp, false}};
  t.mesh.deviceOrder = std::move(order);
  auto mesh = std::make_shared<const Mesh>(
      orDie(Mesh::create(t.mesh.axes, t.mesh.deviceOrder), where + ": mesh"));
  View root = View::root(mesh);
  AxisNamespace ns(mesh);
  auto layout = [&](const char *text) {
    return orDie(parseLayout(root, ns, text), where + ": layout");
  };
  Layout sharded = layout("[{tp, fsdp},{}]");
  Layout gathered = layout("[{tp},{}]");
  Layout act = layout("[{},{tp}]");

  t.comms = {{"tp", {"tp"}, "slice(tp)", false},
             {"fsdp", {"fsdp"}, "slice(fsdp)", false},
             {"dp", {"dp"}, "slice(dp)", false},
             {"pp", {"pp"}, "slice(pp)", false},
             {"dp_all", {"dp", "fsdp"}, "flatten(dp,fsdp)", false}};
  t.streams = {"compute", "comm", "pp"};

  auto add = [&](Instruction in, double flops) {
    t.program.push_back(std::move(in));
    t.flops.push_back(flops);
  };
  auto collective = [&](std::string id, OpKind op, const char *comm,
                        DType dtype, int64_t count, std::vector<std::string> io,
                        std::vector<std::string> deps, std::string label) {
    Instruction in;
    in.id = std::move(id);
    in.stream = op == OpKind::Permute ? "pp" : "comm";
    in.op = op;
    in.comm = comm;
    in.dtype = dtype;
    in.count = count;
    if (isReduction(op))
      in.reduce = ReduceOp::Avg;
    in.inputs = {io[0]};
    in.outputs = {io[1]};
    in.deps = std::move(deps);
    in.label = std::move(label);
    add(std::move(in), 0);
  };
  auto local = [&](std::string id, OpKind op, std::vector<std::string> inputs,
                   std::vector<std::string> outputs,
                   std::vector<std::string> deps, std::string label,
                   double flops) {
    Instruction in;
    in.id = std::move(id);
    in.stream = "compute";
    in.op = op;
    in.inputs = std::move(inputs);
    in.outputs = std::move(outputs);
    in.deps = std::move(deps);
    in.label = std::move(label);
    add(std::move(in), flops);
  };
  constexpr int64_t kTokens = 8192;
  auto product = [](const std::vector<int64_t> &v) {
    int64_t n = 1;
    for (int64_t x : v)
      n *= x;
    return n;
  };

  for (int l = 0; l < kLayers; ++l) {
    std::string layer = "layers." + std::to_string(l);
    std::string actId = layer + ".act";
    t.buffers.push_back({actId, BufferKind::Activation, DType::BFloat16,
                         std::vector<int64_t>{kTokens, 4096}, act, false});
    for (const Weight &w : kWeights) {
      std::string p = layer + "." + w.name;
      std::vector<int64_t> shape = {w.rows, w.cols};
      t.buffers.push_back(
          {p, BufferKind::ParamShard, DType::Float32, shape, sharded, true});
      t.buffers.push_back({p + ".full", BufferKind::Gathered, DType::BFloat16,
                           shape, gathered, false});
      t.buffers.push_back({p + ".grad", BufferKind::Gradient, DType::Float32,
                           shape, sharded, false});
      t.buffers.push_back({p + ".adam", BufferKind::OptimizerState,
                           DType::Float32, shape, sharded, true});
      int64_t shard = product(paddedShapeOf(sharded, shape));
      double flops = 2.0 * double(kTokens) * double(w.rows) * double(w.cols) /
                     kMicrobatches / double(kTp);
      collective(p + ".ag.fwd", OpKind::AllGather, "fsdp", DType::BFloat16,
                 shard, {p, p + ".full"}, {}, "all-gather " + p + " (forward)");
      for (int m = 0; m < kMicrobatches; ++m)
        local(p + ".fwd.mb" + std::to_string(m), OpKind::Compute,
              {p + ".full", actId}, {actId},
              m == 0 ? std::vector<std::string>{p + ".ag.fwd"}
                     : std::vector<std::string>{},
              "forward " + p + " microbatch " + std::to_string(m), flops);
      local(p + ".free.fwd", OpKind::Free, {p + ".full"}, {}, {}, "", 0);
      collective(p + ".ag.bwd", OpKind::AllGather, "fsdp", DType::BFloat16,
                 shard, {p, p + ".full"}, {p + ".free.fwd"},
                 "all-gather " + p + " (backward)");
      for (int m = 0; m < kMicrobatches; ++m)
        local(p + ".bwd.mb" + std::to_string(m), OpKind::Compute,
              {p + ".full", actId}, {p + ".grad"},
              m == 0 ? std::vector<std::string>{p + ".ag.bwd"}
                     : std::vector<std::string>{},
              "backward " + p + " microbatch " + std::to_string(m), 2 * flops);
      local(p + ".free.bwd", OpKind::Free, {p + ".full"}, {}, {}, "", 0);
      collective(p + ".rs", OpKind::ReduceScatter, "fsdp", DType::Float32,
                 shard, {p + ".grad", p + ".grad"},
                 {p + ".bwd.mb" + std::to_string(kMicrobatches - 1)},
                 "reduce-scatter " + p + " gradient");
      collective(p + ".ar", OpKind::AllReduce, "dp", DType::Float32, shard,
                 {p + ".grad", p + ".grad"}, {}, "all-reduce " + p + " grad");
      local(p + ".opt", OpKind::OptimizerUpdate, {p + ".grad", p + ".adam"},
            {p, p + ".adam"}, {p + ".ar"}, "adamw " + p, 12.0 * double(shard));
    }
    int64_t actCount = product(paddedShapeOf(act, {kTokens, 4096}));
    for (int m = 0; m < kMicrobatches; ++m) {
      std::string mb = std::to_string(m);
      std::string last = layer + "." + kWeights.back().name;
      collective(layer + ".send.fwd.mb" + mb, OpKind::Permute, "pp",
                 DType::BFloat16, actCount, {actId, actId},
                 {last + ".fwd.mb" + mb}, "pp send " + layer + " mb " + mb);
      collective(layer + ".send.bwd.mb" + mb, OpKind::Permute, "pp",
                 DType::BFloat16, actCount, {actId, actId},
                 {last + ".bwd.mb" + mb}, "pp grad " + layer + " mb " + mb);
    }
  }
  return t;
}

struct Setup {
  std::unique_ptr<PreparedTemplate> plain, shuffled;
  std::vector<int64_t> ranks;
  double prepareMs = 0;
};

std::map<int64_t, Setup> &setups() {
  static std::map<int64_t, Setup> all;
  return all;
}

Setup makeSetup(const MeshShape &shape) {
  std::string where = "world " + std::to_string(shape.world());
  Setup s;
  auto t0 = std::chrono::steady_clock::now();
  s.plain = std::make_unique<PreparedTemplate>(orDie(
      PreparedTemplate::prepare(makeTemplate(shape, std::nullopt)), where));
  auto t1 = std::chrono::steady_clock::now();
  s.prepareMs = std::chrono::duration<double, std::milli>(t1 - t0).count();
  std::vector<int64_t> order(shape.world());
  for (int64_t i = 0; i < shape.world(); ++i)
    order[i] = i;
  uint64_t shuffleSeed = 0x6f72646572ULL;
  for (int64_t i = shape.world() - 1; i > 0; --i)
    std::swap(order[i],
              order[splitmix64(shuffleSeed) % static_cast<uint64_t>(i + 1)]);
  s.shuffled = std::make_unique<PreparedTemplate>(
      orDie(PreparedTemplate::prepare(makeTemplate(shape, std::move(order))),
            where + " (shuffled)"));
  uint64_t seed = 0x6d657368706c616eULL;
  for (size_t i = 0; i < kNumRanks; ++i)
    s.ranks.push_back(static_cast<int64_t>(
        splitmix64(seed) % static_cast<uint64_t>(shape.world())));
  return s;
}

/// A sanity check outside the timing: one plan per world validates, and on
/// the smallest mesh the whole set verifies.
void check(const Setup &s, int64_t world) {
  for (const PreparedTemplate *pt : {s.plain.get(), s.shuffled.get()}) {
    Plan plan = orDie(pt->instantiate(s.ranks[0]), "instantiate");
    if (Result<void> ok = validatePlan(plan); !ok) {
      std::fprintf(stderr, "bench-plan-instantiate: world %lld: %s\n",
                   static_cast<long long>(world), ok.error().message.c_str());
      std::exit(2);
    }
  }
  if (world == kShapes.front().world()) {
    std::vector<Plan> plans;
    for (int64_t r : s.plain->ranks())
      plans.push_back(orDie(s.plain->instantiate(r), "instantiate"));
    VerifyResult v = orDie(verifyPlans(plans), "verify");
    if (!v.ok()) {
      std::fprintf(stderr, "bench-plan-instantiate: %s\n",
                   v.failure->message.c_str());
      std::exit(2);
    }
  }
}

void runInstantiate(benchmark::State &state, bool shuffled) {
  const Setup &s = setups().at(state.range(0));
  const PreparedTemplate &pt = shuffled ? *s.shuffled : *s.plain;
  size_t i = 0;
  for (auto _ : state) {
    Result<Plan> plan = pt.instantiate(s.ranks[i++ % kNumRanks]);
    benchmark::DoNotOptimize(plan);
    if (!plan.ok()) {
      state.SkipWithError("instantiate failed");
      break;
    }
  }
}

void runAllRanks(benchmark::State &state) {
  const Setup &s = setups().at(kAllRanksWorld);
  std::vector<int64_t> ranks = s.plain->ranks();
  for (auto _ : state) {
    for (int64_t r : ranks) {
      Result<Plan> plan = s.plain->instantiate(r);
      benchmark::DoNotOptimize(plan);
      if (!plan.ok()) {
        state.SkipWithError("instantiate failed");
        return;
      }
    }
  }
}

/// Every repetition's real ms per iteration, for the summary.
class SummaryReporter : public bench::QuietConsoleReporter {
public:
  /// benchmark name -> world -> real ms per iteration, one per repetition
  std::map<std::string, std::map<int64_t, std::vector<double>>> samples;

private:
  void record(const Run &run) override {
    samples[run.run_name.function_name][worldOf(run, kAllRanksWorld)].push_back(
        run.GetAdjustedRealTime() * scale(run.time_unit, 1e3));
  }
};

bool printSummary(const SummaryReporter &reporter) {
  const ProgramTemplate &t = setups().begin()->second.plain->get();
  std::printf("\nSummary: median real time per instantiate() in ms (%lld "
              "repetitions; template of %zu instructions, %zu buffers, %zu "
              "communicators; ranks cycle over %zu pseudo-random ranks)\n\n",
              static_cast<long long>(reporter.repetitions), t.program.size(),
              t.buffers.size(), t.comms.size(), kNumRanks);
  std::printf("%-26s", "world");
  for (const MeshShape &shape : kShapes)
    std::printf(" %9lld", static_cast<long long>(shape.world()));
  std::printf("  %15s\n", "t(131072)/t(64)");
  std::printf("%-26s", "prepare (once, ms)");
  for (const MeshShape &shape : kShapes)
    std::printf(" %9.1f", setups().at(shape.world()).prepareMs);
  std::printf("\n");

  std::vector<std::string> failures;
  for (const char *name : {"instantiate", "instantiate_shuffled_order"}) {
    auto it = reporter.samples.find(name);
    if (it == reporter.samples.end())
      continue;
    std::printf("%-26s", name);
    std::map<int64_t, double> med;
    for (const MeshShape &shape : kShapes) {
      auto sample = it->second.find(shape.world());
      if (sample == it->second.end()) {
        std::printf(" %9s", "-");
        continue;
      }
      med[shape.world()] = bench::median(sample->second);
      std::printf(" %9.2f", med[shape.world()]);
    }
    int64_t lo = kShapes.front().world(), hi = kShapes.back().world();
    if (med.count(lo) && med.count(hi)) {
      double ratio = med[hi] / med[lo];
      std::printf("  %15.2f\n", ratio);
      if (!(ratio <= kMaxRatio))
        failures.push_back(std::string(name) + ": t(" + std::to_string(hi) +
                           ")/t(" + std::to_string(lo) +
                           ") = " + std::to_string(ratio));
    } else {
      std::printf("\n");
    }
    for (const auto &[world, ms] : med)
      if (!(ms < kMaxMsPerRank))
        failures.push_back(std::string(name) + ": " + std::to_string(ms) +
                           " ms per rank at world " + std::to_string(world));
  }
  if (auto it = reporter.samples.find("instantiate_all_1024_ranks");
      it != reporter.samples.end())
    for (const auto &[world, ms] : it->second)
      std::printf("\ninstantiate all %lld ranks one after the other: %.2f s "
                  "(median)\n",
                  static_cast<long long>(world), bench::median(ms) / 1e3);
  std::printf("\n");
  bench::addRunFailures(reporter.errors, !reporter.samples.empty(), failures);
  return bench::printVerdict(
      failures,
      bench::formatted("t(%lld)/t(%lld) <= %.1f and < %.0f ms per rank",
                       static_cast<long long>(kShapes.back().world()),
                       static_cast<long long>(kShapes.front().world()),
                       kMaxRatio, kMaxMsPerRank));
}

} // namespace

int main(int argc, char **argv) {
  if (int status =
          bench::initBenchmark(argc, argv, {{"--benchmark_min_time", "0.2"}}))
    return status;

  for (const MeshShape &shape : kShapes) {
    Setup s = makeSetup(shape);
    check(s, shape.world());
    setups()[shape.world()] = std::move(s);
  }
  for (bool shuffled : {false, true}) {
    auto *bench = benchmark::RegisterBenchmark(
        shuffled ? "instantiate_shuffled_order" : "instantiate",
        [shuffled](benchmark::State &state) {
          runInstantiate(state, shuffled);
        });
    bench->ArgName("world")->Unit(benchmark::kMillisecond);
    for (const MeshShape &shape : kShapes)
      bench->Arg(shape.world());
  }
  benchmark::RegisterBenchmark("instantiate_all_1024_ranks", runAllRanks)
      ->Unit(benchmark::kSecond)
      ->Iterations(1);

  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return printSummary(reporter) ? 0 : 1;
}
