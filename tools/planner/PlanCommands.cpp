//===- PlanCommands.cpp - plan, explain, trace ----------------------------===//

#include "PlanCommands.h"

#include "MeshSetup.h"

#include "meshplan/Frontend/Spec.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/CostModel.h"
#include "meshplan/Plan/PlanDirectory.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Plan/Verify.h"
#include "meshplan/Support/Timing.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <unistd.h>

using namespace meshplan;
using namespace meshplan::cli;
namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// Loading and compiling
//===----------------------------------------------------------------------===//

namespace {
/// The spec planned (pipeline::planSpec, as meshplan-train plans it).
using Planned = pipeline::PlannedSpec;

using Clock = SteadyClock;
} // namespace

static frontend::ResolvedSpec loadSpecOrThrow(const SpecFlags &flags) {
  if (flags.spec.empty())
    throw CliError("--spec: a parallelism spec file is required");
  if (flags.tokens <= 0)
    throw CliError("--tokens: must be > 0, not " +
                   std::to_string(flags.tokens));
  if (flags.seqLen <= 0)
    throw CliError("--seq-len: must be > 0, not " +
                   std::to_string(flags.seqLen));
  frontend::SpecOptions options;
  options.worldSize = flags.worldSize;
  if (flags.model.empty()) {
    // Unreadable is the flag's problem; what is inside is the file's.
    if (auto text = plan::readTextFile(flags.spec); !text)
      throw CliError("--spec: " + text.error().message);
    auto resolved = frontend::loadSpecFile(flags.spec, options);
    if (!resolved)
      throw CliError(resolved.error().message);
    return std::move(*resolved);
  }
  // --model replaces the spec's "model"; its errors name the flag.
  auto text = plan::readTextFile(flags.spec);
  if (!text)
    throw CliError("--spec: " + text.error().message);
  auto spec = frontend::parseSpec(*text, options);
  if (!spec)
    throw CliError(spec.error().within(flags.spec).message);
  spec->model = flags.model;
  auto model = frontend::loadSpecModel(*spec, ".");
  if (!model) {
    std::string message = model.error().message;
    if (message.rfind("/model: ", 0) == 0)
      message = message.substr(8);
    throw CliError("--model: " + message);
  }
  auto resolved = frontend::resolveSpec(std::move(*spec), std::move(*model));
  if (!resolved)
    throw CliError(resolved.error().within(flags.spec).message);
  return std::move(*resolved);
}

/// Loads the spec, checks `rank` (when given) and --context-parallel
/// against it before anything is compiled or written, and runs the
/// pipeline.
static Planned planOrThrow(
    const SpecFlags &flags, const CostFlags &cost, std::optional<int64_t> rank,
    std::function<Result<void>(std::string_view, mlir::ModuleOp)> afterStage =
        nullptr,
    bool everyCoordinate = false) {
  frontend::ResolvedSpec spec = loadSpecOrThrow(flags);
  if (rank)
    checkRank(*spec.mesh, *rank);
  pipeline::CompileOptions options;
  options.import.tokensPerMicrobatch = flags.tokens;
  options.import.sequenceLength = flags.seqLen;
  if (cost.contextParallel)
    options.import.contextParallelAxis =
        *cost.contextParallel == "none" ? "" : *cost.contextParallel;
  if (auto axis = pipeline::contextParallelAxis(spec, options.import); !axis)
    throw CliError("--context-parallel: " + axis.error().message);
  options.afterStage = std::move(afterStage);
  // Under a pipeline, one compile per pp coordinate planned: --rank's, or
  // all of them.
  std::optional<std::vector<int64_t>> coordinates;
  if (spec.pipeline && rank && !everyCoordinate) {
    auto position = spec.mesh->positionOf(*rank);
    coordinates = std::vector<int64_t>{
        position ? spec.mesh->coordinateAt(*position, spec.pipeline->axisIndex)
                 : 0};
  }
  auto planned = pipeline::planSpec(std::move(spec), options, coordinates);
  if (!planned)
    throw std::runtime_error(planned.error().message);
  return std::move(*planned);
}

static std::string meshText(const Mesh &mesh) {
  std::string out;
  for (const MeshAxis &axis : mesh.getAxes())
    out += (out.empty() ? "" : ", ") + axis.name + "=" +
           std::to_string(axis.size) + (axis.managed ? " (managed)" : "");
  return out;
}

PlannedRanks meshplan::cli::planEveryRank(
    const SpecFlags &flags,
    const std::function<void(const plan::Plan &)> &perRank) {
  // Every pp coordinate's template, under pipeline_parallel.
  Planned p = planOrThrow(flags, CostFlags{}, std::nullopt);
  const plan::PreparedTemplate &prepared = p.first();
  PlannedRanks out;
  out.modelName = p.spec.model->name;
  out.mesh = prepared.mesh().str();
  out.worldSize = prepared.mesh().size();
  // Same bound as plan --all: every rank is instantiated.
  if (out.worldSize > kMaxPlanDirectoryRanks)
    throw CliError("--spec: the mesh has " + std::to_string(out.worldSize) +
                   " ranks; checkpoint commands plan at most " +
                   kMaxPlanDirectoryRanksText + " (docs/limits.md)");
  if (auto text = plan::readTextFile(flags.spec))
    out.specText = std::move(*text);
  for (int64_t rank : prepared.ranks()) {
    auto plan = p.templateFor(rank).instantiate(rank, /*withEstimates=*/false);
    if (!plan)
      throw std::runtime_error("internal error: " + plan.error().message);
    perRank(*plan);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// plan
//===----------------------------------------------------------------------===//

namespace {
/// A one-line progress bar on stderr, redrawn at most every 1%.
class ProgressBar {
public:
  ProgressBar(bool enabled, std::string what)
      : enabled(enabled), what(std::move(what)) {}
  void operator()(int64_t done, int64_t total) {
    if (!enabled || total <= 0)
      return;
    int64_t percent = done * 100 / total;
    if (percent == lastPercent && done != total)
      return;
    lastPercent = percent;
    int filled = static_cast<int>(percent * 30 / 100);
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld", what.c_str(),
                 std::string(filled, '#').c_str(),
                 std::string(30 - filled, '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total));
    if (done == total)
      std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

private:
  bool enabled;
  std::string what;
  int64_t lastPercent = -1;
};
} // namespace

/// "1 communicator", "3 communicators".
static std::string count(int64_t n, const std::string &noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

static std::string fixed(double value, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << value;
  return os.str();
}

static std::string bytesText(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fixed(bytes, u == 0 ? 0 : 2) + " " + units[u];
}

//===----------------------------------------------------------------------===//
// Device capacity
//===----------------------------------------------------------------------===//

namespace {
/// The cost model the flags select, and whether --device-memory set its
/// capacity.
struct Device {
  plan::CostModel model;
  bool memoryFromFlag = false;
};
} // namespace

/// --device and --device-memory, checked before anything is planned.
static Device deviceOrThrow(const CostFlags &flags);

plan::CostModel meshplan::cli::costModelOrThrow(const CostFlags &flags) {
  return deviceOrThrow(flags).model;
}

static Device deviceOrThrow(const CostFlags &flags) {
  Device d;
  if (flags.device) {
    const plan::DevicePreset *preset = plan::findDevicePreset(*flags.device);
    if (!preset)
      throw CliError("--device: unknown device \"" + *flags.device +
                     "\"; expected one of " + plan::devicePresetList());
    d.model = preset->model;
  }
  if (flags.deviceMemory) {
    const std::string &text = *flags.deviceMemory;
    int64_t bytes = 0;
    bool ok = !text.empty() && text.size() <= 19 &&
              text.find_first_not_of("0123456789") == std::string::npos;
    if (ok) {
      for (char c : text)
        if (__builtin_mul_overflow(bytes, int64_t(10), &bytes) ||
            __builtin_add_overflow(bytes, int64_t(c - '0'), &bytes))
          ok = false;
    }
    if (!ok || bytes < 1)
      throw CliError("--device-memory: expected the bytes a rank may use, a "
                     "positive integer below 2^63, not \"" +
                     text + "\"");
    // The flag states what the plan may use: no reserve comes off it.
    d.model.deviceMemoryBytes = bytes;
    d.model.reservedMemoryBytes = 0;
    d.memoryFromFlag = true;
  }
  return d;
}

/// "77.65 GiB (h100-sxm-80gb: 79.65 GiB less 2.00 GiB reserved)".
static std::string capacityText(const Device &d) {
  const plan::CostModel &m = d.model;
  std::string out = bytesText(double(m.memoryCapacityBytes()));
  if (d.memoryFromFlag)
    return out + " (--device-memory)";
  return out + " (" + m.device + ": " + bytesText(double(m.deviceMemoryBytes)) +
         " less " + bytesText(double(m.reservedMemoryBytes)) + " reserved)";
}

/// The kinds of a plan's peak estimate, largest first (at most `limit`):
/// "gradient 189.98 GiB, optimizer_state 23.63 GiB".
static std::string largestKinds(const plan::Plan &plan, size_t limit) {
  std::vector<std::pair<int64_t, std::string>> kinds;
  if (plan.estimates)
    for (const auto &[kind, bytes] : plan.estimates->peakMemoryBytes)
      if (kind != "total" && bytes > 0)
        kinds.push_back({bytes, kind});
  std::stable_sort(
      kinds.begin(), kinds.end(),
      [](const auto &a, const auto &b) { return a.first > b.first; });
  std::string out;
  for (size_t i = 0; i < kinds.size() && i < limit; ++i)
    out += (out.empty() ? "" : ", ") + kinds[i].second + " " +
           bytesText(double(kinds[i].first));
  return out;
}

static int64_t peakTotal(const plan::Plan &plan) {
  if (!plan.estimates)
    return 0;
  auto it = plan.estimates->peakMemoryBytes.find("total");
  return it == plan.estimates->peakMemoryBytes.end() ? 0 : it->second;
}

/// Empty when `plan`'s estimated peak fits; else "rank 0's estimated peak
/// 225.91 GiB exceeds the capacity 77.65 GiB (...) by 148.26 GiB; largest
/// kinds: ...".
static std::string overCapacity(const plan::Plan &plan, const Device &d) {
  int64_t peak = peakTotal(plan), capacity = d.model.memoryCapacityBytes();
  if (peak <= capacity)
    return "";
  return "rank " + std::to_string(plan.rank) + "'s estimated peak " +
         bytesText(double(peak)) + " exceeds the capacity " + capacityText(d) +
         " by " + bytesText(double(peak - capacity)) +
         "; largest kinds: " + largestKinds(plan, 3);
}

CommandOutput meshplan::cli::runPlanCommand(const PlanOptions &options) {
  if (options.all == options.rank.has_value())
    throw CliError(options.all ? "--all: give --all or --rank R, not both"
                               : "--rank: give --rank R or --all");
  if (options.outDir.empty())
    throw CliError("-o: an output directory is required");
  if (options.progress != "auto" && options.progress != "always" &&
      options.progress != "never")
    throw CliError("--progress: expected auto, always or never, not \"" +
                   options.progress + "\"");
  Device device = deviceOrThrow(options.cost);
  auto start = Clock::now();

  // IR dumps go to a fresh directory, written only once the spec loaded.
  int stage = 0;
  std::function<Result<void>(std::string_view, mlir::ModuleOp)> dump;
  if (!options.dumpIr.empty()) {
    dump = [&](std::string_view name, mlir::ModuleOp module) -> Result<void> {
      std::error_code ec;
      fs::create_directories(options.dumpIr, ec);
      char prefix[8];
      std::snprintf(prefix, sizeof prefix, "%02d-", stage++);
      std::string path =
          options.dumpIr + "/" + prefix + std::string(name) + ".mlir";
      std::string text;
      llvm::raw_string_ostream os(text);
      module.print(os);
      std::ofstream file(path);
      file << text;
      if (!file)
        return Error("--dump-ir: cannot write " + path);
      return {};
    };
  }
  Planned p = planOrThrow(options.spec, options.cost, options.rank, dump);
  auto afterCompile = Clock::now();
  const plan::PreparedTemplate &prepared = p.first();
  int64_t world = prepared.mesh().size();
  if (options.rank) {
    if (dump) {
      auto local = pipeline::specializeRank(*p.compiled.module, *options.rank);
      if (!local)
        throw std::runtime_error(local.error().message);
      if (auto ok = dump("dist-specialize-rank", **local); !ok)
        throw CliError(ok.error().message);
    }
  }
  // --all materializes one plan per rank (and verification holds them all);
  // refuse before listing the ranks. One rank is O(axes) at any mesh size.
  if (options.all && world > kMaxPlanDirectoryRanks)
    throw CliError("--all: the mesh has " + std::to_string(world) +
                   " ranks; --all plans at most " + kMaxPlanDirectoryRanksText +
                   " (docs/limits.md); plan one rank at a time with --rank");
  bool showProgress =
      options.progress == "always" || (options.progress == "auto" && isatty(2));
  std::vector<int64_t> ranks =
      options.all ? prepared.ranks() : std::vector<int64_t>{*options.rank};

  // A plan that cannot fit the device is refused before anything is
  // verified or written: the first rank here, every rank while writing
  // (uneven shards make peaks differ by rank).
  CommandOutput result;
  auto refuse = [&](const std::string &why) {
    result.exitCode = 1;
    result.err = "meshplan: over capacity: " + why +
                 "\nnothing was written to " + options.outDir +
                 "; --allow-over-capacity writes it anyway, --device and "
                 "--device-memory set the capacity (docs/memory.md)\n";
    return result;
  };
  std::mutex overMutex;
  std::string over; // the lowest over-capacity rank's message
  int64_t overRank = -1;
  // (An instantiation error is left to the writer, which names the file.)
  if (auto first = p.templateFor(ranks.front()).instantiate(ranks.front())) {
    over = overCapacity(*first, device);
    overRank = ranks.front();
    if (!over.empty() && !options.allowOverCapacity)
      return refuse(over);
  }

  // Verify the whole set before writing anything.
  std::string verified;
  if (options.all && !options.noVerify && world <= options.verifyLimit) {
    auto verifyStart = Clock::now();
    std::vector<plan::Plan> plans;
    plans.reserve(ranks.size());
    ProgressBar bar(showProgress, "verifying");
    for (int64_t rank : ranks) {
      auto plan = p.templateFor(rank).instantiate(rank, /*withEstimates=*/false,
                                                  /*verificationOnly=*/true);
      if (!plan)
        throw std::runtime_error("internal error: " + plan.error().message);
      plans.push_back(std::move(*plan));
      bar(static_cast<int64_t>(plans.size()), world);
    }
    auto report = plan::verifyPlans(plans);
    if (!report)
      throw std::runtime_error("internal error: " + report.error().message);
    if (!report->ok()) {
      result.exitCode = 1;
      result.err = "meshplan: verification failed (" +
                   std::string(plan::failureKindName(report->failure->kind)) +
                   "): " + report->failure->message +
                   "\nnothing was written to " + options.outDir + "\n";
      return result;
    }
    verified = "verified all " + std::to_string(world) + " ranks (" +
               count(report->stats.collectives, "collective") + " on " +
               count(report->stats.communicators, "communicator") +
               " agree; every program runs to completion) in " +
               fixed(secondsSince(verifyStart), 2) + " s";
  } else if (options.all) {
    verified = options.noVerify
                   ? "not verified (--no-verify)"
                   : "not verified: " + std::to_string(world) +
                         " ranks exceed the default limit of " +
                         std::to_string(options.verifyLimit) +
                         " (run meshplan verify " + options.outDir + ")";
  } else {
    verified = "one rank; cross-rank verification needs --all";
  }

  ProgressBar bar(showProgress, "writing plans");
  bool refused = false;
  auto written = plan::writePlanDirectory(
      options.outDir, world,
      [&](int64_t rank) -> Result<plan::Plan> {
        auto plan = p.templateFor(rank).instantiate(rank);
        if (!plan)
          return plan;
        std::string why = overCapacity(*plan, device);
        if (why.empty())
          return plan;
        std::lock_guard<std::mutex> lock(overMutex);
        // The lowest rank over capacity is the one named.
        if (over.empty() || rank < overRank) {
          over = why;
          overRank = rank;
        }
        if (options.allowOverCapacity)
          return plan;
        refused = true;
        return makeError("over capacity");
      },
      ranks, [&](int64_t done, int64_t total) { bar(done, total); },
      options.threads ? options.threads : 2);
  if (!written) {
    if (refused)
      return refuse(over);
    throw CliError("-o: " + written.error().message);
  }
  if (!over.empty())
    result.err =
        "meshplan: warning: over capacity (--allow-over-capacity): " + over +
        " (docs/memory.md)\n";

  const plan::ProgramTemplate &program = p.templateFor(ranks.front()).get();
  std::ostringstream out;
  out << "planned " << ranks.size() << (ranks.size() == 1 ? " rank" : " ranks")
      << " of " << p.spec.model->name << " on mesh "
      << meshText(prepared.mesh()) << " (" << world
      << " ranks): " << count(program.comms.size(), "communicator") << ", "
      << count(program.buffers.size(), "buffer") << ", "
      << count(program.program.size(), "instruction") << " per rank";
  if (p.spec.pipeline)
    out << " at pp coordinate " << p.pipelineRankOf(ranks.front()) << " ("
        << p.spec.pipeline->config.ranks << " pp coordinates, one template "
        << "each)";
  out << "\n";
  out << verified << "\n";
  out << "wrote " << options.outDir << " in " << fixed(secondsSince(start), 2)
      << " s\n";
  if (options.timings) {
    out << "stage timings:\n";
    for (const pipeline::StageTiming &t : p.compiled.timings)
      out << "  " << std::left << std::setw(26) << t.stage << std::right
          << fixed(t.seconds * 1e3, 1) << " ms\n";
    out << "  " << std::left << std::setw(26) << "verify + write" << std::right
        << fixed(secondsSince(afterCompile) * 1e3, 1) << " ms\n";
  }
  result.out = out.str();
  return result;
}

//===----------------------------------------------------------------------===//
// explain
//===----------------------------------------------------------------------===//

namespace {
struct CollectiveSummary {
  int64_t count = 0;    ///< instructions
  int64_t elements = 0; ///< summed counts
  int64_t bytes = 0;    ///< bytes this rank sends
};
} // namespace

/// The plan of one rank for explain and trace. The template is valid (it
/// prepared), so what instantiation refuses is the input's: a limit such as
/// a group of more than 2^20 listed members (docs/limits.md), an exit-2
/// error as `plan` reports it, not an internal error.
static plan::Plan instantiateOrThrow(const plan::PreparedTemplate &prepared,
                                     int64_t rank) {
  auto planned = prepared.instantiate(rank);
  if (!planned)
    throw CliError("--rank: the plan of rank " + std::to_string(rank) + ": " +
                   planned.error().message);
  return std::move(*planned);
}

/// The ranks that run one pipeline with `rank`: its coordinates with each
/// pp coordinate in turn.
static std::vector<int64_t> pipelinePeers(const Planned &p, int64_t rank) {
  const Mesh &mesh = *p.spec.mesh;
  int axis = p.spec.pipeline->axisIndex;
  int64_t position = *mesh.positionOf(rank);
  int64_t base =
      position - mesh.coordinateAt(position, axis) * mesh.stride(axis);
  std::vector<int64_t> ranks;
  for (int64_t c = 0; c < p.spec.pipeline->config.ranks; ++c)
    ranks.push_back(mesh.rankAt(base + c * mesh.stride(axis)));
  return ranks;
}

/// The plans of the ranks that run one pipeline with `rank` (by pp
/// coordinate), laid out together under the cost model.
struct PipelineLayout {
  std::vector<int64_t> ranks;
  std::vector<plan::Plan> plans;
  std::vector<plan::Schedule> schedules;
};
static PipelineLayout layOutPipeline(const Planned &p, int64_t rank,
                                     const Device &device) {
  PipelineLayout out;
  out.ranks = pipelinePeers(p, rank);
  std::vector<std::vector<double>> flops;
  for (int64_t peer : out.ranks) {
    const plan::PreparedTemplate &t = p.templateFor(peer);
    out.plans.push_back(instantiateOrThrow(t, peer));
    flops.push_back(t.flops());
  }
  std::vector<const plan::Plan *> pointers;
  for (const plan::Plan &one : out.plans)
    pointers.push_back(&one);
  auto schedules = plan::simulateTogether(pointers, flops, device.model);
  if (!schedules)
    throw std::runtime_error("internal error: " + schedules.error().message);
  out.schedules = std::move(*schedules);
  return out;
}

/// The per-stage table and the bubble of a pipelined spec: the plans of the
/// ranks that run one pipeline with `rank`, laid out together under the
/// cost model (plan::simulateTogether).
static void explainPipeline(const Planned &p, int64_t rank,
                            const Device &device, std::ostringstream &out) {
  const frontend::ResolvedPipeline &pp = *p.spec.pipeline;
  const PipelineScheduleConfig &config = pp.config;
  PipelineLayout layout = layOutPipeline(p, rank, device);
  const std::vector<int64_t> &peers = layout.ranks;
  const std::vector<plan::Plan> &plans = layout.plans;

  out << "\npipeline: " << pipelineScheduleKindName(config.kind) << " over "
      << pp.axis << "=" << config.ranks << ", " << config.microbatches
      << " microbatches, " << config.stagesPerRank << " stage"
      << (config.stagesPerRank == 1 ? "" : "s") << " per rank ("
      << pp.numStages() << " stages); rank " << rank << " is " << pp.axis
      << " coordinate " << p.pipelineRankOf(rank) << "\n";
  out << "  the pipeline of rank " << rank
      << ", laid out together under the cost model:\n";
  out << "  " << std::left << std::setw(6) << pp.axis << std::setw(8) << "rank"
      << std::setw(10) << "stages" << std::right << std::setw(12)
      << "parameters" << std::setw(13) << "peak memory" << std::setw(13)
      << "activations" << std::setw(14) << "compute busy" << std::setw(10)
      << "step" << std::setw(8) << "idle"
      << "\n";
  double step = 0, idle = 0;
  for (size_t c = 0; c < plans.size(); ++c) {
    const plan::Schedule &s = layout.schedules[c];
    step = std::max(step, s.stepSeconds);
  }
  for (size_t c = 0; c < plans.size(); ++c) {
    const plan::Plan &one = plans[c];
    const plan::Schedule &s = layout.schedules[c];
    std::string stages;
    int64_t parameters = 0;
    for (int64_t stage : pp.stagesOfRank[c]) {
      stages += (stages.empty() ? "" : ",") + std::to_string(stage);
      parameters += pp.stages[size_t(stage)].numParameters;
    }
    int64_t peak = 0, activations = 0;
    if (one.estimates) {
      const auto &m = one.estimates->peakMemoryBytes;
      if (auto it = m.find("total"); it != m.end())
        peak = it->second;
      if (auto it = m.find("activation"); it != m.end())
        activations = it->second;
    }
    double busy = s.computeStream >= 0
                      ? s.streamBusySeconds[size_t(s.computeStream)]
                      : 0.0;
    // Idle against the pipeline's step: every rank's step ends with the
    // slowest one's.
    double rankIdle = step > 0 ? std::max(0.0, 1.0 - busy / step) : 0.0;
    idle += rankIdle;
    double count = double(parameters);
    out << "  " << std::left << std::setw(6) << c << std::setw(8) << peers[c]
        << std::setw(10) << stages << std::right << std::setw(12)
        << (count >= 1e9   ? fixed(count / 1e9, 2) + "B"
            : count >= 1e6 ? fixed(count / 1e6, 2) + "M"
                           : fixed(count / 1e3, 1) + "K")
        << std::setw(13) << bytesText(double(peak)) << std::setw(13)
        << bytesText(double(activations)) << std::setw(14)
        << (fixed(busy * 1e3, 1) + " ms") << std::setw(10)
        << (fixed(s.stepSeconds * 1e3, 1) + " ms") << std::setw(7)
        << fixed(100.0 * rankIdle, 1) << "%\n";
  }
  double bubble = plans.empty() ? 0 : idle / double(plans.size());
  const char *formula =
      config.kind == PipelineScheduleKind::Interleaved1F1B ? "(p-1)/(v m+p-1)"
      : config.kind == PipelineScheduleKind::ZeroBubbleV   ? "(p-1)/(6m+p-1)"
                                                           : "(p-1)/(m+p-1)";
  out << "  bubble: " << fixed(100.0 * bubble, 1)
      << "% under the cost model (the compute stream idle over the "
         "pipeline's step, averaged over its ranks; exposed communication "
         "included); textbook "
      << formula << " = " << fixed(100.0 * textbookBubbleFraction(config), 1)
      << "%\n";
  out << "\nstep under the cost model (docs/plan-format.md#cost-model-and-"
         "trace), the pipeline's ranks laid out together: "
      << fixed(step * 1e3, 1) << " ms; rank " << rank << " exposed "
      << "communication "
      << fixed(layout.schedules[size_t(p.pipelineRankOf(rank))]
                       .exposedCommSeconds *
                   1e3,
               1)
      << " ms\n";
}

std::string meshplan::cli::runExplainCommand(const ExplainOptions &options) {
  Device device = deviceOrThrow(options.cost);
  // A pipeline: every pp coordinate, for the per-stage table and the
  // bubble.
  Planned p = planOrThrow(options.spec, options.cost, options.rank, nullptr,
                          /*everyCoordinate=*/true);
  const plan::PreparedTemplate &prepared = p.templateFor(options.rank);
  plan::Plan plan = instantiateOrThrow(prepared, options.rank);
  const frontend::Spec &spec = p.spec.spec;
  const Mesh &mesh = prepared.mesh();

  std::map<std::string, const plan::Communicator *> comms;
  for (const plan::Communicator &c : plan.communicators)
    comms[c.id] = &c;
  // (comm, op, dtype) -> summary
  std::map<std::tuple<std::string, std::string, std::string>, CollectiveSummary>
      collectives;
  int64_t fp8Bytes = 0, fp8BytesAtParamDtype = 0, fp8Gathers = 0;
  plan::DType paramDtype =
      *plan::parseDType(frontend::dtypeName(spec.mixedPrecision.paramDtype));
  for (const plan::Instruction &in : plan.program) {
    if (!plan::isCollective(in.op))
      continue;
    int64_t n = static_cast<int64_t>(comms[in.comm]->ranks.size());
    int64_t sent = plan::bytesSent(in.op, *in.dtype, in.count, n);
    auto &s = collectives[{in.comm, std::string(plan::opKindName(in.op)),
                           std::string(plan::dtypeName(*in.dtype))}];
    s.count += 1;
    s.elements += in.count;
    s.bytes += sent;
    if (in.op == plan::OpKind::AllGather &&
        (*in.dtype == plan::DType::Float8E4M3 ||
         *in.dtype == plan::DType::Float8E5M2)) {
      ++fp8Gathers;
      fp8Bytes += sent;
      fp8BytesAtParamDtype += plan::bytesSent(in.op, paramDtype, in.count, n);
    }
  }
  auto schedule = plan::simulate(plan, prepared.flops(), device.model);

  std::ostringstream out;
  double count = static_cast<double>(frontend::countParameters(*p.spec.model));
  out << "model " << p.spec.model->name << ": "
      << (count >= 1e9   ? fixed(count / 1e9, 2) + "B"
          : count >= 1e6 ? fixed(count / 1e6, 2) + "M"
                         : fixed(count / 1e3, 1) + "K")
      << " parameters in " << p.spec.params.size() << " tensors, "
      << p.spec.units.size() << " FSDP units ("
      << (spec.dataParallel.units == frontend::UnitGrouping::Explicit
              ? std::string("the spec's")
              : std::string(frontend::kUnitGroupingNames[static_cast<int>(
                    spec.dataParallel.units)]))
      << ")\n";
  out << "mesh " << meshText(mesh) << ": " << mesh.size() << " ranks\n";
  auto list = [](const std::vector<std::string> &names) {
    std::string s;
    for (const std::string &n : names)
      s += (s.empty() ? "" : ", ") + n;
    return s.empty() ? std::string("-") : s;
  };
  out << "roles: replicate {" << list(spec.dataParallel.replicateAxes)
      << "}, shard {" << list(spec.dataParallel.shardAxes) << "}, tensor {"
      << (spec.tensorParallel ? spec.tensorParallel->axis : "-") << "}, extra {"
      << list(spec.extraAxes) << "}; reshard after forward: "
      << frontend::reshardPolicyName(spec.dataParallel.reshardAfterForward)
      << "; params " << frontend::dtypeName(spec.optimizer.paramDtype)
      << ", compute " << frontend::dtypeName(spec.mixedPrecision.paramDtype)
      << ", reduce " << frontend::dtypeName(spec.mixedPrecision.reduceDtype)
      << "\n\n";

  // Columns as wide as the longest communicator id.
  int idWidth = 14;
  for (const plan::Communicator &c : plan.communicators)
    idWidth = std::max(idWidth, static_cast<int>(c.id.size()) + 2);
  out << "communicators of rank " << options.rank << ":\n";
  for (const plan::Communicator &c : plan.communicators) {
    out << "  " << std::left << std::setw(idWidth) << c.id << "axes {"
        << list(c.axes) << "}  group [";
    for (size_t i = 0; i < c.ranks.size() && i < 8; ++i)
      out << (i ? "," : "") << c.ranks[i];
    if (c.ranks.size() > 8)
      out << ",... " << c.ranks.size() << " ranks";
    out << "]  color " << c.color << " key " << c.key
        << (c.faultTolerant ? "  fault-tolerant" : "") << "\n";
  }
  out << "\ncollectives per step of rank " << options.rank
      << " (bytes this rank sends, ring algorithms):\n";
  out << "  " << std::left << std::setw(idWidth) << "communicator"
      << std::setw(16) << "op" << std::setw(15) << "dtype" << std::right
      << std::setw(6) << "calls" << std::setw(16) << "elements" << std::setw(14)
      << "bytes"
      << "\n";
  int64_t totalBytes = 0;
  for (const auto &[key, s] : collectives) {
    const auto &[comm, op, dtype] = key;
    out << "  " << std::left << std::setw(idWidth) << comm << std::setw(16)
        << op << std::setw(15) << dtype << std::right << std::setw(6) << s.count
        << std::setw(16) << s.elements << std::setw(14)
        << bytesText(static_cast<double>(s.bytes)) << "\n";
    totalBytes += s.bytes;
  }
  out << "  total sent per step: " << bytesText(static_cast<double>(totalBytes))
      << "\n\n";

  // The FSDP units: what each gathers on this rank and how often.
  {
    std::map<std::string, std::string> tensorOf; // buffer -> parameter
    for (const plan::Buffer &buffer : plan.buffers)
      tensorOf[buffer.id] = buffer.tensor;
    std::map<std::string, int> unitOfParam;
    for (size_t u = 0; u < p.spec.units.size(); ++u)
      for (int param : p.spec.units[u].params)
        unitOfParam[p.spec.params[param].name] = static_cast<int>(u);
    // Per unit: all-gather instructions and the bytes they bring in.
    std::vector<int64_t> gathers(p.spec.units.size(), 0);
    std::vector<int64_t> gatheredBytes(p.spec.units.size(), 0);
    for (const plan::Instruction &in : plan.program) {
      if (in.op != plan::OpKind::AllGather || in.outputs.empty())
        continue;
      auto it = unitOfParam.find(tensorOf[in.outputs.front()]);
      if (it == unitOfParam.end())
        continue;
      ++gathers[it->second];
      gatheredBytes[it->second] +=
          in.count * static_cast<int64_t>(plan::dtypeBytes(*in.dtype));
    }
    int64_t totalGathers = 0;
    for (int64_t g : gathers)
      totalGathers += g;
    out << "FSDP units (" << p.spec.units.size() << "; gathered bytes per "
        << "step on rank " << options.rank << "):\n";
    // The name column fits the longest name (explicit units join patterns).
    size_t nameWidth = 16;
    for (const frontend::UnitAssignment &unit : p.spec.units)
      nameWidth = std::max(nameWidth, unit.name.size() + 2);
    auto line = [&](size_t u, const std::string &name) {
      const frontend::UnitAssignment &unit = p.spec.units[u];
      int64_t elements = 0;
      for (int param : unit.params) {
        int64_t n = 1;
        for (int64_t d : p.spec.params[param].shape)
          n *= d;
        elements += n;
      }
      std::string params;
      if (unit.params.size() <= 3)
        for (int param : unit.params)
          params += (params.empty() ? "" : ", ") + p.spec.params[param].name;
      else
        params = std::to_string(unit.params.size()) + " tensors";
      out << "  " << std::left << std::setw(static_cast<int>(nameWidth)) << name
          << std::right << std::setw(10)
          << fixed(static_cast<double>(elements) / 1e6, 2) << "M  "
          << std::setw(11) << bytesText(static_cast<double>(gatheredBytes[u]))
          << "  " << gathers[u] << " all-gather" << (gathers[u] == 1 ? "" : "s")
          << (unit.reshardAfterForward ? ", resharded after forward"
                                       : ", kept from forward to backward")
          << (unit.root ? " (root)" : "") << "  [" << params << "]\n";
    };
    // Runs of blocks with the same size and gathers print once.
    auto blockPrefix = [](const std::string &name) {
      size_t dot = name.rfind('.');
      if (dot == std::string::npos || dot + 1 == name.size() ||
          name.find_first_not_of("0123456789", dot + 1) != std::string::npos)
        return std::string();
      return name.substr(0, dot + 1);
    };
    for (size_t u = 0; u < p.spec.units.size();) {
      size_t v = u + 1;
      std::string prefix = blockPrefix(p.spec.units[u].name);
      while (!prefix.empty() && v < p.spec.units.size() &&
             blockPrefix(p.spec.units[v].name) == prefix &&
             p.spec.units[v].params.size() == p.spec.units[u].params.size() &&
             gathers[v] == gathers[u] && gatheredBytes[v] == gatheredBytes[u] &&
             p.spec.units[v].reshardAfterForward ==
                 p.spec.units[u].reshardAfterForward)
        ++v;
      if (v - u > 2) {
        line(u, p.spec.units[u].name + ".." +
                    p.spec.units[v - 1].name.substr(prefix.size()));
        out << "    (" << (v - u) << " units like this)\n";
      } else {
        for (size_t w = u; w < v; ++w)
          line(w, p.spec.units[w].name);
      }
      u = v;
    }
    out << "  " << totalGathers << " all-gathers per step";
    // Against per-module units (norm and output apart) under the same
    // policy: what torchtitan's [norm, output] unit saves.
    const frontend::UnitAssignment *normOutput = nullptr;
    for (const frontend::UnitAssignment &unit : p.spec.units)
      if (unit.name == "norm+output")
        normOutput = &unit;
    if (normOutput && !p.spec.pipeline &&
        spec.dataParallel.units == frontend::UnitGrouping::Torchtitan) {
      frontend::Spec perModule = spec;
      perModule.dataParallel.units = frontend::UnitGrouping::PerModule;
      auto other = frontend::resolveSpec(perModule, p.spec.model);
      std::optional<int64_t> otherGathers;
      mlir::MLIRContext *ctx = p.context.get();
      if (other) {
        pipeline::CompileOptions compileOptions;
        compileOptions.import = p.options.import;
        if (auto compiled =
                pipeline::compileTemplate(*ctx, *other, compileOptions))
          if (auto otherPlan = compiled->prepared.instantiate(options.rank)) {
            otherGathers = 0;
            for (const plan::Instruction &in : otherPlan->program)
              *otherGathers += in.op == plan::OpKind::AllGather;
          }
      }
      if (otherGathers)
        out << "; per-module units (norm and output apart) under the same "
               "policy would take "
            << *otherGathers << ": " << (*otherGathers - totalGathers)
            << " fewer, as [norm, output] is one unit"
            << (normOutput->reshardAfterForward
                    ? ""
                    : " kept gathered from its forward into its backward "
                      "(reshard policy " +
                          std::string(frontend::reshardPolicyName(
                              spec.dataParallel.reshardAfterForward)) +
                          ")");
    }
    out << "\n\n";
  }

  // Kinds first ("activation 2.95 GiB; gathered 1.18 GiB; ..."), then the
  // total, which ends the line.
  out << "memory of rank " << options.rank << " (peak, by kind):";
  if (plan.estimates) {
    const auto &peak = plan.estimates->peakMemoryBytes;
    for (const auto &[kind, bytes] : peak)
      if (kind != "total")
        out << " " << kind << " " << bytesText(static_cast<double>(bytes))
            << ";";
    if (auto total = peak.find("total"); total != peak.end())
      out << " total " << bytesText(static_cast<double>(total->second));
  }
  out << "\n";
  auto act = pipeline::estimateActivations(p.spec, p.options.import);
  if (act && !act->units.empty()) {
    out << "  activation: the trainer's, estimated (docs/memory.md) for "
        << act->tokensPerRank << " tokens per rank per microbatch";
    if (act->contextSize > 1)
      out << " (" << options.spec.tokens
          << " per data-parallel rank, sequences split over "
          << act->contextAxis << "=" << act->contextSize << ")";
    out << ", " << act->blocks << " transformer block"
        << (act->blocks == 1 ? "" : "s") << ", "
        << frontend::dtypeName(spec.mixedPrecision.paramDtype)
        << ", activation checkpointing "
        << frontend::activationCheckpointingName(spec.activationCheckpointing)
        << "\n";
  }
  {
    int64_t peak = peakTotal(plan),
            capacity = device.model.memoryCapacityBytes();
    out << "  capacity " << capacityText(device) << ": ";
    if (peak <= capacity)
      out << "headroom " << bytesText(double(capacity - peak)) << " ("
          << fixed(100.0 * double(capacity - peak) /
                       double(std::max<int64_t>(1, capacity)),
                   0)
          << "%)\n";
    else
      out << "over by " << bytesText(double(peak - capacity))
          << "; largest kinds: " << largestKinds(plan, 3)
          << "; meshplan plan refuses it without --allow-over-capacity\n";
  }

  if (spec.float8 && spec.float8->enabled) {
    out << "float8: ";
    if (fp8Gathers == 0) {
      out << (spec.float8->allGather
                  ? "no float8 weight is all-gathered on this mesh"
                  : "compute only (all_gather off): no gather savings")
          << "\n";
    } else {
      out << fp8Gathers << " all-gathers in float8 send "
          << bytesText(static_cast<double>(fp8Bytes)) << " instead of "
          << bytesText(static_cast<double>(fp8BytesAtParamDtype)) << " in "
          << frontend::dtypeName(spec.mixedPrecision.paramDtype) << ": saves "
          << bytesText(static_cast<double>(fp8BytesAtParamDtype - fp8Bytes))
          << " per step ("
          << fixed(100.0 * double(fp8BytesAtParamDtype - fp8Bytes) /
                       double(std::max<int64_t>(1, fp8BytesAtParamDtype)),
                   0)
          << "%)\n";
    }
  }
  if (p.spec.pipeline)
    explainPipeline(p, options.rank, device, out);
  else if (schedule)
    out << "\nstep under the cost model (docs/plan-format.md#cost-model-and-"
           "trace): "
        << fixed(schedule->stepSeconds * 1e3, 1) << " ms, exposed "
        << "communication " << fixed(schedule->exposedCommSeconds * 1e3, 1)
        << " ms (" << (act ? act->tokensPerRank : options.spec.tokens)
        << " tokens per rank per microbatch)\n";
  return out.str();
}

//===----------------------------------------------------------------------===//
// trace
//===----------------------------------------------------------------------===//

std::string meshplan::cli::runTraceCommand(const TraceOptions &options) {
  if (options.output.empty())
    throw CliError("-o: an output file is required");
  Device device = deviceOrThrow(options.cost);
  Planned p = planOrThrow(options.spec, options.cost, options.rank, nullptr,
                          /*everyCoordinate=*/true);
  plan::Plan planned =
      instantiateOrThrow(p.templateFor(options.rank), options.rank);
  Result<plan::Schedule> schedule = makeError("no schedule");
  if (!p.spec.pipeline) {
    schedule = plan::simulate(planned, p.first().flops(), device.model);
  } else {
    // The rank's timeline within its pipeline: laid out together with the
    // other stages' ranks, so that waiting for a transfer shows as idle.
    schedule =
        std::move(layOutPipeline(p, options.rank, device)
                      .schedules[size_t(p.pipelineRankOf(options.rank))]);
  }
  if (!schedule)
    throw std::runtime_error("internal error: " + schedule.error().message);
  std::string trace = plan::chromeTrace(planned, *schedule);
  // Write beside the target and rename: never a half-written trace.
  std::string tmp = options.output + ".tmp";
  {
    std::ofstream file(tmp, std::ios::binary);
    file << trace;
    if (!file.good()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw CliError("-o: cannot write " + options.output);
    }
  }
  std::error_code ec;
  fs::rename(tmp, options.output, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw CliError("-o: cannot write " + options.output + ": " + ec.message());
  }
  std::ostringstream out;
  out << "wrote " << options.output << ": rank " << options.rank << ", "
      << planned.program.size() << " instructions on " << planned.streams.size()
      << " streams; step " << fixed(schedule->stepSeconds * 1e3, 1)
      << " ms, exposed communication "
      << fixed(schedule->exposedCommSeconds * 1e3, 1)
      << " ms (open in ui.perfetto.dev or chrome://tracing)\n";
  return out.str();
}
