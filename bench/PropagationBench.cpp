//===- PropagationBench.cpp - dist propagation vs upstream shard ----------===//
//
// Times meshplan's `dist-propagate-layouts` + `dist-lower-redistribute` on a
// generated function of N elementwise ops, and in the same run upstream
// MLIR 22's `sharding-propagation` (shard dialect) on the equivalent function
// (same chain as tosa ops with one shard annotation), both in-process on one
// thread. Prints ns per op, the ratio upstream / meshplan, and checks the
// 10,000-op target (<= 2 s).
//
// Run: build/bin/bench-propagation   (or ./bench/run.sh build)
//
//===----------------------------------------------------------------------===//

#include "meshplan/Dialect/Dist/IR/DistDialect.h"
#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/Transforms/Passes.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tosa/IR/ShardingInterfaceImpl.h"
#include "mlir/Dialect/Tosa/IR/TosaOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <sstream>

using namespace mlir;

namespace {

constexpr const char *kType = "tensor<1024x256xf32>";

/// N elementwise ops chained on a parameter sharded on dim 0 over 8 ranks;
/// every op also reads a second argument laid out on dim 1, so propagation
/// must reconcile two layouts (one redistribute, shared).
std::string distModule(int n) {
  std::ostringstream os;
  os << "dist.mesh @m [\"dp\" = 8]\n"
     << "func.func @f(%a: " << kType
     << " {dist.layout = #dist.layout<@m, [{\"dp\"}, {}]>}, %b: " << kType
     << " {dist.layout = #dist.layout<@m, [{}, {\"dp\"}]>}) -> " << kType
     << " {\n";
  std::string prev = "%a";
  for (int i = 0; i < n; ++i) {
    os << "  %v" << i << " = arith." << (i % 2 ? "subf" : "addf") << " " << prev
       << ", %b : " << kType << "\n";
    prev = "%v" + std::to_string(i);
  }
  os << "  return " << prev << " : " << kType << "\n}\n";
  return os.str();
}

/// The same chain for upstream: a shard.grid, the first argument annotated
/// with split_axes = [[0]], the second with [[], [0]], tosa add/sub.
std::string shardModule(int n) {
  std::ostringstream os;
  std::string t = std::string("(") + kType + ", " + kType + ") -> " + kType;
  os << "shard.grid @m(shape = 8)\n"
     << "func.func @f(%a0: " << kType << ", %b0: " << kType << ") -> " << kType
     << " {\n"
     << "  %sa = shard.sharding @m split_axes = [[0]] : !shard.sharding\n"
     << "  %a = shard.shard %a0 to %sa : " << kType << "\n"
     << "  %sb = shard.sharding @m split_axes = [[], [0]] : !shard.sharding\n"
     << "  %b = shard.shard %b0 to %sb : " << kType << "\n";
  std::string prev = "%a";
  for (int i = 0; i < n; ++i) {
    os << "  %v" << i << " = tosa." << (i % 2 ? "sub" : "add") << " " << prev
       << ", %b : " << t << "\n";
    prev = "%v" + std::to_string(i);
  }
  os << "  return " << prev << " : " << kType << "\n}\n";
  return os.str();
}

struct Fixture {
  DialectRegistry registry;
  std::unique_ptr<MLIRContext> context;
  std::map<std::pair<bool, int>, OwningOpRef<ModuleOp>> modules;

  Fixture() {
    registry.insert<meshplan::dist::DistDialect, func::FuncDialect,
                    arith::ArithDialect, tensor::TensorDialect,
                    shard::ShardDialect, tosa::TosaDialect>();
    tosa::registerShardingInterfaceExternalModels(registry);
    context = std::make_unique<MLIRContext>(registry,
                                            MLIRContext::Threading::DISABLED);
    context->loadAllAvailableDialects();
  }

  ModuleOp module(bool upstream, int n) {
    auto &slot = modules[{upstream, n}];
    if (!slot) {
      std::string text = upstream ? shardModule(n) : distModule(n);
      slot = parseSourceString<ModuleOp>(text, context.get());
      if (!slot) {
        std::fprintf(stderr, "bench-propagation: generated module failed to "
                             "parse\n");
        std::exit(2);
      }
    }
    return *slot;
  }
};

Fixture &fixture() {
  static Fixture f;
  return f;
}

void runPipeline(benchmark::State &state, bool upstream) {
  int n = static_cast<int>(state.range(0));
  Fixture &f = fixture();
  ModuleOp source = f.module(upstream, n);
  for (auto _ : state) {
    state.PauseTiming();
    OwningOpRef<ModuleOp> copy(source.clone());
    PassManager pm(f.context.get());
    if (upstream) {
      pm.addNestedPass<func::FuncOp>(shard::createShardingPropagation());
    } else {
      pm.addPass(meshplan::dist::createDistPropagateLayouts());
      pm.addPass(meshplan::dist::createDistLowerRedistribute());
    }
    state.ResumeTiming();
    if (failed(pm.run(*copy))) {
      state.SkipWithError("pipeline failed");
      break;
    }
    state.PauseTiming();
    copy = nullptr; // destroy outside the timed region
    state.ResumeTiming();
  }
  state.counters["ops"] = n;
}

/// Collects the median of each benchmark's repetitions.
class Collector : public benchmark::ConsoleReporter {
public:
  std::map<std::string, double> seconds;
  void ReportRuns(const std::vector<Run> &runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run &run : runs)
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name == "median")
        seconds[run.run_name.function_name + "/" + run.run_name.args] =
            run.GetAdjustedRealTime() /
            benchmark::GetTimeUnitMultiplier(run.time_unit);
  }
};

} // namespace

int main(int argc, char **argv) {
  std::vector<char *> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=5";
  std::string agg = "--benchmark_report_aggregates_only=true";
  bool userReps = false;
  for (char *a : args)
    userReps |= std::string(a).rfind("--benchmark_repetitions", 0) == 0;
  if (!userReps) {
    args.push_back(reps.data());
    args.push_back(agg.data());
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  for (bool upstream : {false, true}) {
    auto *b = benchmark::RegisterBenchmark(
        upstream ? "upstream_sharding_propagation" : "meshplan_propagate_lower",
        [upstream](benchmark::State &s) { runPipeline(s, upstream); });
    b->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond)->Iterations(3);
  }
  // The timed pipeline must do the work: every value laid out, and the one
  // conflicting operand moved by a single all_to_all.
  {
    Fixture &f = fixture();
    OwningOpRef<ModuleOp> copy(f.module(false, 1000).clone());
    PassManager pm(f.context.get());
    pm.addPass(meshplan::dist::createDistPropagateLayouts());
    pm.addPass(meshplan::dist::createDistLowerRedistribute());
    int exchanges = 0, unlaid = 0;
    if (succeeded(pm.run(*copy)))
      copy->walk([&](Operation *op) {
        exchanges += isa<meshplan::dist::AllToAllOp>(op);
        for (Type t : op->getResultTypes())
          unlaid += isa<RankedTensorType>(t) && !meshplan::dist::getLayout(t);
      });
    if (exchanges != 1 || unlaid != 0) {
      std::fprintf(
          stderr,
          "bench-propagation: pipeline output is wrong (%d all_to_all, "
          "%d values without layout)\n",
          exchanges, unlaid);
      return 2;
    }
  }
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::Shutdown();

  double ours = collector.seconds["meshplan_propagate_lower/10000"];
  double theirs = collector.seconds["upstream_sharding_propagation/10000"];
  std::printf("\nSummary (median wall time, one thread, 10,000 ops):\n");
  std::printf("  meshplan propagate + lower : %8.3f s\n", ours);
  std::printf("  upstream sharding-propagation: %8.3f s\n", theirs);
  if (ours > 0)
    std::printf("  ratio upstream / meshplan  : %8.2f\n", theirs / ours);
  bool pass = ours > 0 && ours <= 2.0;
  std::printf("%s: meshplan %s the 2 s target\n", pass ? "PASS" : "FAIL",
              pass ? "meets" : "misses");
  return pass ? 0 : 1;
}
