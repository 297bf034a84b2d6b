//===- CoreQueries.cpp - Per-rank query cost vs. world size ---------------===//
//
// Every per-rank query of core (coordinates, communicator split keys, groups,
// local ranks, shard boxes) is arithmetic on strides: O(number of axes), never
// O(world). This program times each query on 4-D meshes (pp, dp, fsdp, tp)
// with tp = 8 fixed and world sizes 8 .. 2^20, cycling over a fixed list of
// pseudo-random ranks spread across the world, and checks that the time per
// query stays flat: slowest / fastest median <= 2.0 for every query kind.
//
// Defaults (each overridable on the command line): --benchmark_repetitions=5,
// --benchmark_min_time=0.1, --benchmark_enable_random_interleaving=true (so
// that load from other processes hits all world sizes alike). The summary uses
// the median over repetitions of the real time per query; the console shows
// each benchmark's median and cv as it finishes (in shuffled order), and the
// table at the end puts them side by side. Exit status 1 on FAIL.
//
//   build/bin/bench-core-queries            (or: bench/run.sh build)
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Mesh.h"
#include "meshplan/Core/MeshView.h"

#include "BenchSupport.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace meshplan;

namespace {

constexpr double kMaxRatio = 2.0;
/// Number of precomputed ranks each benchmark cycles over (a power of two).
constexpr size_t kNumRanks = 4096;
/// Weight of an FSDP x TP layer: dim 0 split by [tp, dp, fsdp].
const std::vector<int64_t> kWeightShape = {16384, 8192};
constexpr const char *kWeightLayout = "[{tp, dp, fsdp}, {}]";

using meshplan::bench::kTp;
using meshplan::bench::MeshShape;
const std::vector<MeshShape> kShapes = {
    {1, 1, 1},     // 8
    {1, 2, 4},     // 64
    {2, 4, 8},     // 512
    {4, 8, 16},    // 4096
    {8, 16, 32},   // 32768
    {16, 32, 64},  // 262144
    {16, 64, 128}, // 1048576 = 2^20
};

enum class Query {
  Coordinate,
  SplitKey,
  GroupTp,
  LocalRank,
  Shard,
  ShardSliceOfSlice,
  SplitPermuted
};
const std::vector<std::pair<Query, std::string>> kQueries = {
    {Query::Coordinate, "coordinate"},
    {Query::SplitKey, "split_dp_all"},
    {Query::GroupTp, "group_tp"},
    {Query::LocalRank, "local_rank_dp_fsdp"},
    {Query::Shard, "shard_fsdp_tp"},
    {Query::ShardSliceOfSlice, "shard_slice_of_slice"},
    {Query::SplitPermuted, "split_dp_all_device_order"},
};

template <typename T> T orDie(Result<T> result, const std::string &what) {
  if (!result.ok()) {
    std::fprintf(stderr, "bench-core-queries: %s: %s\n", what.c_str(),
                 result.error().message.c_str());
    std::exit(2);
  }
  return std::move(result.value());
}

/// Everything one world size needs, built once before timing.
struct Setup {
  int64_t world;
  std::shared_ptr<const Mesh> mesh;
  View root;                  ///< (pp, dp, fsdp, tp)
  View flat;                  ///< flatten(dp, fsdp as dp_all): (pp, dp_all, tp)
  View sliced;                ///< flat.slice(dp_all, tp).slice(tp, dp, fsdp)
  std::vector<int> dpAllAxis; ///< {dp_all} in `flat`
  std::vector<int> dpFsdpAxes; ///< {dp, fsdp} in `root`
  AxisRefList tpRefs;
  Layout layout;       ///< kWeightLayout on `root`
  Layout slicedLayout; ///< kWeightLayout on `sliced`
  std::vector<int64_t> ranks;
  /// The same mesh with a shuffled explicit device order, and its dp_all
  /// refs: rank -> position goes through the inverse order.
  std::shared_ptr<const Mesh> permutedMesh;
  AxisRefList permutedDpAllRefs;
};

uint64_t splitmix64(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::unique_ptr<Setup> makeSetup(const MeshShape &shape) {
  std::string where = "world " + std::to_string(shape.world());
  auto mesh =
      std::make_shared<const Mesh>(orDie(Mesh::create({{"pp", shape.pp},
                                                       {"dp", shape.dp},
                                                       {"fsdp", shape.fsdp},
                                                       {"tp", kTp}}),
                                         where + ": mesh"));
  AxisNamespace ns(mesh);
  View root = View::root(mesh);
  View flat = orDie(flattenView(root, {"dp", "fsdp"}, "dp_all", ns),
                    where + ": flatten");
  View outer = orDie(sliceView(flat, {"dp_all", "tp"}, ns), where + ": slice");
  // A slice of a slice that also slices into the flattened axis.
  View sliced = orDie(sliceView(outer, {"tp", "dp", "fsdp"}, ns),
                      where + ": slice of slice");
  std::vector<int> dpAllAxis =
      orDie(flat.axisIndices({"dp_all"}), where + ": dp_all");
  std::vector<int> dpFsdpAxes =
      orDie(root.axisIndices({"dp", "fsdp"}), where + ": dp, fsdp");
  AxisRefList tpRefs =
      root.refsOf(orDie(root.axisIndices({"tp"}), where + ": tp"));
  Layout layout =
      orDie(parseLayout(root, ns, kWeightLayout), where + ": layout");
  Layout slicedLayout = orDie(parseLayout(sliced, ns, kWeightLayout),
                              where + ": layout on slice of slice");
  std::vector<int64_t> ranks(kNumRanks);
  uint64_t seed = 0x6d657368706c616eULL; // the same list for every world
  for (int64_t &rank : ranks)
    rank = static_cast<int64_t>(splitmix64(seed) %
                                static_cast<uint64_t>(shape.world()));
  std::vector<int64_t> order(shape.world());
  for (int64_t i = 0; i < shape.world(); ++i)
    order[i] = i;
  uint64_t shuffleSeed = 0x6f72646572ULL;
  for (int64_t i = shape.world() - 1; i > 0; --i)
    std::swap(order[i],
              order[splitmix64(shuffleSeed) % static_cast<uint64_t>(i + 1)]);
  auto permutedMesh = std::make_shared<const Mesh>(
      orDie(Mesh::create(mesh->getAxes(), std::move(order)),
            where + ": permuted mesh"));
  AxisRefList permutedDpAllRefs = flat.refsOf(dpAllAxis);
  return std::unique_ptr<Setup>(new Setup{
      shape.world(), mesh, root, flat, sliced, dpAllAxis, dpFsdpAxes, tpRefs,
      layout, slicedLayout, std::move(ranks), permutedMesh, permutedDpAllRefs});
}

/// Checks the answers on a sample of ranks against direct arithmetic, so that
/// the timed queries are known to compute the right thing.
bool verify(const Setup &s) {
  const Mesh &mesh = *s.mesh;
  auto fail = [&](int64_t rank, const std::string &what) {
    std::fprintf(stderr, "bench-core-queries: world %lld, rank %lld: %s\n",
                 static_cast<long long>(s.world), static_cast<long long>(rank),
                 what.c_str());
    return false;
  };
  for (size_t i = 0; i < 256; ++i) {
    int64_t rank = s.ranks[i];
    auto coord = s.root.coordinate(rank);
    if (!coord.ok() || coord->size() != 4)
      return fail(rank, "coordinate failed");
    int64_t back = 0;
    for (int a = 0; a < 4; ++a)
      back += (*coord)[a] * mesh.stride(a);
    if (back != rank)
      return fail(rank, "coordinate does not round-trip");
    // dp_all = dp * |fsdp| + fsdp; its members are kTp apart.
    int64_t dpAll = (*coord)[1] * mesh.axis(2).size + (*coord)[2];
    auto key = s.flat.split(rank, s.dpAllAxis);
    if (!key.ok() || key->key != dpAll || key->color != rank - dpAll * kTp)
      return fail(rank, "split key of dp_all is wrong");
    auto local = s.root.localRank(rank, s.dpFsdpAxes);
    if (!local.ok() || *local != dpAll)
      return fail(rank, "local rank over (dp, fsdp) is wrong");
    auto group = groupOf(mesh, s.tpRefs, rank);
    if (!group.ok() || group->size() != kTp)
      return fail(rank, "tp group has the wrong size");
    for (int64_t t = 0; t < kTp; ++t)
      if ((*group)[t] != rank - (*coord)[3] + t)
        return fail(rank, "tp group has the wrong members");
    auto box = shardOf(s.root, s.layout, kWeightShape, rank);
    auto slicedBox = shardOf(s.sliced, s.slicedLayout, kWeightShape, rank);
    if (!box.ok() || !slicedBox.ok())
      return fail(rank, "shardOf failed");
    if (box->offset != slicedBox->offset ||
        box->localShape != slicedBox->localShape ||
        box->paddedShape != slicedBox->paddedShape)
      return fail(rank, "shard box differs on the slice of a slice");
    if (box->localShape[1] != kWeightShape[1] ||
        box->localShape[0] > box->paddedShape[0])
      return fail(rank, "shard box is malformed");
  }
  return true;
}

std::map<int64_t, std::unique_ptr<Setup>> &setups() {
  static std::map<int64_t, std::unique_ptr<Setup>> all;
  return all;
}

/// Times `query(rank)` over the precomputed ranks, one query per iteration.
template <typename F>
void timeQuery(benchmark::State &state, const Setup &s, F query) {
  size_t i = 0;
  for (auto _ : state) {
    auto result = query(s.ranks[i++ & (kNumRanks - 1)]);
    benchmark::DoNotOptimize(result);
    if (!result.ok()) {
      state.SkipWithError("query failed");
      break;
    }
  }
}

void runQuery(benchmark::State &state, Query query) {
  const Setup &s = *setups().at(state.range(0));
  switch (query) {
  case Query::Coordinate:
    timeQuery(state, s, [&](int64_t r) { return s.root.coordinate(r); });
    break;
  case Query::SplitKey:
    timeQuery(state, s,
              [&](int64_t r) { return s.flat.split(r, s.dpAllAxis); });
    break;
  case Query::GroupTp:
    timeQuery(state, s,
              [&](int64_t r) { return groupOf(*s.mesh, s.tpRefs, r); });
    break;
  case Query::LocalRank:
    timeQuery(state, s,
              [&](int64_t r) { return s.root.localRank(r, s.dpFsdpAxes); });
    break;
  case Query::Shard:
    timeQuery(state, s, [&](int64_t r) {
      return shardOf(s.root, s.layout, kWeightShape, r);
    });
    break;
  case Query::ShardSliceOfSlice:
    timeQuery(state, s, [&](int64_t r) {
      return shardOf(s.sliced, s.slicedLayout, kWeightShape, r);
    });
    break;
  case Query::SplitPermuted:
    timeQuery(state, s, [&](int64_t r) {
      return splitKeyOf(*s.permutedMesh, s.permutedDpAllRefs, r);
    });
    break;
  }
}

/// Every repetition's real and CPU ns per query, and the library's median,
/// for the summary.
class SummaryReporter : public bench::QuietConsoleReporter {
public:
  struct Samples {
    std::vector<double> real, cpu; // ns per query, one per repetition
    double reportedMedian = -1;    // the library's median aggregate, if seen
  };
  /// query name -> world -> samples
  std::map<std::string, std::map<int64_t, Samples>> samples;

private:
  void record(const Run &run) override {
    Samples &s = samples[run.run_name.function_name][worldOf(run, 0)];
    double ns = scale(run.time_unit, 1e9);
    s.real.push_back(run.GetAdjustedRealTime() * ns);
    s.cpu.push_back(run.GetAdjustedCPUTime() * ns);
  }
  void recordAggregate(const Run &run) override {
    Samples &s = samples[run.run_name.function_name][worldOf(run, 0)];
    repetitions = std::max<int64_t>(repetitions, run.repetitions);
    if (run.aggregate_name == "median")
      s.reportedMedian = run.GetAdjustedRealTime() * scale(run.time_unit, 1e9);
  }
};

/// Prints the table; returns true when every ratio is within kMaxRatio.
bool printSummary(const SummaryReporter &reporter) {
  std::vector<int64_t> worlds;
  for (const MeshShape &shape : kShapes)
    worlds.push_back(shape.world());
  std::printf("\nSummary: median real time per query in ns (%lld "
              "repetitions; ranks cycle over %zu pseudo-random ranks)\n\n",
              static_cast<long long>(reporter.repetitions), kNumRanks);
  std::printf("%-22s", "query");
  for (int64_t world : worlds)
    std::printf(" %9lld", static_cast<long long>(world));
  std::printf("  %14s  %9s\n", "slowest/fastest", "(cpu time)");

  std::vector<std::string> failures;
  bool any = false;
  for (const auto &[query, name] : kQueries) {
    auto it = reporter.samples.find(name);
    if (it == reporter.samples.end())
      continue;
    any = true;
    std::printf("%-22s", name.c_str());
    double lo = 0, hi = 0, cpuLo = 0, cpuHi = 0;
    int64_t loWorld = 0, hiWorld = 0;
    bool first = true;
    for (int64_t world : worlds) {
      auto sample = it->second.find(world);
      if (sample == it->second.end()) {
        std::printf(" %9s", "-");
        continue;
      }
      double real = sample->second.real.empty()
                        ? sample->second.reportedMedian
                        : bench::median(sample->second.real);
      double cpu =
          sample->second.cpu.empty() ? real : bench::median(sample->second.cpu);
      std::printf(" %9.1f", real);
      if (first || real < lo)
        lo = real, loWorld = world;
      if (first || real > hi)
        hi = real, hiWorld = world;
      cpuLo = first ? cpu : std::min(cpuLo, cpu);
      cpuHi = first ? cpu : std::max(cpuHi, cpu);
      first = false;
    }
    double ratio = lo > 0 ? hi / lo : 0;
    double cpuRatio = cpuLo > 0 ? cpuHi / cpuLo : 0;
    std::printf("  %14.2f  %9.2f\n", ratio, cpuRatio);
    if (!(ratio <= kMaxRatio)) {
      char buffer[256];
      std::snprintf(buffer, sizeof buffer,
                    "%s: %.2f (%.1f ns at world %lld vs %.1f ns at world %lld)",
                    name.c_str(), ratio, hi, static_cast<long long>(hiWorld),
                    lo, static_cast<long long>(loWorld));
      failures.push_back(buffer);
    }
  }
  std::printf("\n");
  for (const std::string &error : reporter.errors)
    failures.push_back("error in " + error);
  if (!any)
    failures.push_back("no query was timed (check --benchmark_filter)");
  return bench::printVerdict(failures,
                             bench::formatted("all ratios <= %.1f", kMaxRatio),
                             bench::formatted(" (limit %.1f)", kMaxRatio));
}

} // namespace

int main(int argc, char **argv) {
  if (int status =
          bench::initBenchmark(argc, argv, {{"--benchmark_min_time", "0.1"}}))
    return status;

  for (const MeshShape &shape : kShapes) {
    auto setup = makeSetup(shape);
    if (!verify(*setup))
      return 2;
    setups()[shape.world()] = std::move(setup);
  }
  for (const auto &[query, name] : kQueries) {
    auto *bench = benchmark::RegisterBenchmark(
        name.c_str(),
        [query = query](benchmark::State &state) { runQuery(state, query); });
    bench->ArgName("world")->Unit(benchmark::kNanosecond);
    for (const MeshShape &shape : kShapes)
      bench->Arg(shape.world());
  }

  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return printSummary(reporter) ? 0 : 1;
}
