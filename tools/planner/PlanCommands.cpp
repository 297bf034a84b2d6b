//===- PlanCommands.cpp - plan, explain, trace ----------------------------===//

#include "PlanCommands.h"

#include "MeshSetup.h"
#include "Progress.h"

#include "meshplan/Frontend/Spec.h"
#include "meshplan/Pipeline/Explain.h"
#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/CostModel.h"
#include "meshplan/Plan/PlanDirectory.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Plan/Verify.h"
#include "meshplan/Support/Timing.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
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

/// The cost model's work per microbatch: the flags, else the spec's
/// "batch", else 8192 tokens of sequences of 8192 (frontend::microbatchWork,
/// the rule meshplan.plan shares).
static void setBatchOrThrow(const frontend::ResolvedSpec &spec,
                            const SpecFlags &flags,
                            pipeline::ImportOptions &import) {
  frontend::WorkRequest request;
  request.tokensPerRank = flags.tokensPerRank;
  request.globalBatchTokens = flags.globalBatchTokens;
  request.sequenceLength = flags.seqLen;
  request.tokensPerRankName = "--tokens-per-rank";
  request.globalBatchTokensName = "--global-batch-tokens";
  request.sequenceLengthName = "--seq-len";
  auto work = frontend::microbatchWork(spec.spec, request);
  if (!work)
    throw CliError(work.error().message);
  import.tokensPerMicrobatch = work->tokensPerRank;
  import.sequenceLength = work->sequenceLength;
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
  setBatchOrThrow(spec, flags, options.import);
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

/// "ddp=2, fsdp=2, abcd=2", managed axes marked.
static std::string meshText(const std::vector<MeshAxis> &axes) {
  std::string out;
  for (const MeshAxis &axis : axes)
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
  out.model = p.spec.model;
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
      throw CliError(
          "--device: unknown device \"" + *flags.device +
          "\"; expected one of " + plan::devicePresetList() +
          (*flags.device == "cpu" || *flags.device == "cuda"
               ? " (the hardware the cost model describes; where a step "
                 "runs, cpu or cuda, is meshplan-train's --device)"
               : ""));
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

/// The kinds of a peak estimate (bytes by kind, as
/// plan::Estimates::peakMemoryBytes), largest first (at most `limit`):
/// "gradient 189.98 GiB, optimizer_state 23.63 GiB".
static std::string largestKinds(const std::map<std::string, int64_t> &peak,
                                size_t limit) {
  std::vector<std::pair<int64_t, std::string>> kinds;
  for (const auto &[kind, bytes] : peak)
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
         " by " + bytesText(double(peak - capacity)) + "; largest kinds: " +
         largestKinds(plan.estimates ? plan.estimates->peakMemoryBytes
                                     : std::map<std::string, int64_t>{},
                      3);
}

/// `plan --all`'s verification before anything is written: every rank's
/// plan instantiated on `threadCount` threads (default 2), each full plan
/// held only while its facts are recorded (as `meshplan verify` reads a
/// directory), each thread with a builder of its own (mergeFacts joins
/// them), the bar counting ranks in order.
static plan::VerifyResult verifyInMemory(const Planned &p,
                                         const std::vector<int64_t> &ranks,
                                         unsigned threadCount,
                                         bool showProgress) {
  int64_t world = p.first().mesh().size();
  unsigned threads = threadCount ? threadCount : 2u;
  std::vector<plan::Plan> plans(ranks.size());
  std::vector<plan::FactsBuilder> builder(threads);
  ProgressBar bar(showProgress, "verifying");
  std::atomic<int64_t> done{0};
  int64_t shown = 0; // thread 0's, then the caller's after the join
  std::mutex failMutex;
  std::string failure;
  auto work = [&](unsigned t) {
    for (size_t i = t; i < ranks.size(); i += threads) {
      auto plan = p.templateFor(ranks[i]).instantiate(ranks[i],
                                                      /*withEstimates=*/false);
      if (!plan) {
        std::lock_guard<std::mutex> lock(failMutex);
        failure = plan.error().message;
        return;
      }
      builder[t].add(i, *plan);
      plans[i] = plan::verificationCopy(*plan);
      int64_t n = ++done;
      // Thread 0 shows every count up to the current one, in order (the
      // bar's output does not depend on how the threads interleave); the
      // rest after the join.
      for (; t == 0 && shown < n && shown + 1 < world; ++shown)
        bar(shown + 1, world);
    }
  };
  {
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t)
      pool.emplace_back(work, t);
    work(0);
    for (std::thread &th : pool)
      th.join();
  }
  if (!failure.empty())
    throw std::runtime_error("internal error: " + failure);
  for (; shown < world; ++shown)
    bar(shown + 1, world);
  plan::PlanSetFacts facts = plan::mergeFacts(builder, plans.size());
  auto report = plan::verifyPlans(plans, facts);
  if (!report)
    throw std::runtime_error("internal error: " + report.error().message);
  return std::move(*report);
}

CommandOutput meshplan::cli::runPlanCommand(const PlanOptions &options) {
  if (options.all == options.rank.has_value())
    throw CliError(options.all ? "--all: give --all or --rank R, not both"
                               : "--rank: give --rank R or --all");
  if (options.outDir.empty())
    throw CliError("-o: an output directory is required");
  // One rank's plan is one file: "-" writes it to stdout. --all writes a
  // directory, which stdout cannot be.
  bool toStdout = options.outDir == "-";
  if (toStdout && options.all)
    throw CliError("-o: plan --all writes a directory (one rank<R>.json per "
                   "rank); \"-\" (standard output) names no directory; "
                   "use -o - with --rank R for one rank's plan");
  if (options.dumpIr == "-")
    throw CliError("--dump-ir: writes a directory (one file per stage); "
                   "\"-\" (standard output) names no directory");
  std::optional<bool> showProgress = progressWanted(options.progress);
  if (!showProgress)
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
  std::vector<int64_t> ranks =
      options.all ? prepared.ranks() : std::vector<int64_t>{*options.rank};

  // A plan that cannot fit the device is refused before anything is
  // verified or written: the first rank here, every rank while writing
  // (uneven shards make peaks differ by rank).
  CommandOutput result;
  auto refuse = [&](const std::string &why) {
    result.exitCode = 1;
    result.err = "meshplan: over capacity: " + why +
                 "\nnothing was written to " +
                 (toStdout ? std::string("stdout") : options.outDir) +
                 "; --allow-over-capacity writes it anyway, --device and "
                 "--device-memory set the capacity (docs/memory.md)\n";
    return result;
  };
  std::mutex overMutex;
  std::string over; // the lowest over-capacity rank's message
  int64_t overRank = -1;
  // (An instantiation error is left to the writer, which names the file.)
  auto first = p.templateFor(ranks.front()).instantiate(ranks.front());
  if (first) {
    over = overCapacity(*first, device);
    overRank = ranks.front();
    if (!over.empty() && !options.allowOverCapacity)
      return refuse(over);
  }
  if (toStdout) {
    // The plan on stdout, exactly as rank<R>.json; what plan says about it
    // on stderr.
    if (!first)
      throw CliError("--rank: the plan of rank " +
                     std::to_string(ranks.front()) + ": " +
                     first.error().message);
    result.out = plan::writePlan(*first);
    if (!over.empty())
      result.err =
          "meshplan: warning: over capacity (--allow-over-capacity): " + over +
          " (docs/memory.md)\n";
    result.err += "planned rank " + std::to_string(ranks.front()) + " of " +
                  p.spec.model->name + " on mesh " +
                  meshText(prepared.mesh().getAxes()) + " (" +
                  std::to_string(world) + " ranks); written to stdout\n";
    return result;
  }

  // Verify the whole set before writing anything.
  std::string verified;
  if (options.all && !options.noVerify && world <= options.verifyLimit) {
    auto verifyStart = Clock::now();
    plan::VerifyResult report =
        verifyInMemory(p, ranks, options.threads, *showProgress);
    if (!report.ok()) {
      result.exitCode = 1;
      result.err = "meshplan: verification failed (" +
                   std::string(plan::failureKindName(report.failure->kind)) +
                   "): " + report.failure->message +
                   "\nnothing was written to " + options.outDir + "\n";
      return result;
    }
    verified = "verified all " + std::to_string(world) + " ranks (" +
               count(report.stats.collectives, "collective") + " on " +
               count(report.stats.communicators, "communicator") +
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

  ProgressBar bar(*showProgress, "writing plans");
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
      << meshText(prepared.mesh().getAxes()) << " (" << world
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

/// The plan of one rank for trace. The template is valid (it prepared), so
/// what instantiation refuses is the input's: a limit such as a group of
/// more than 2^20 listed members (docs/limits.md), an exit-2 error as `plan`
/// reports it, not an internal error.
static plan::Plan instantiateOrThrow(const plan::PreparedTemplate &prepared,
                                     int64_t rank) {
  auto planned = prepared.instantiate(rank);
  if (!planned)
    throw CliError("--rank: the plan of rank " + std::to_string(rank) + ": " +
                   planned.error().message);
  return std::move(*planned);
}

/// Throws a pipeline::explain / layOutPipeline error as the CLI reports it:
/// a rank's plan that instantiation refuses is the input's (an exit-2
/// error naming --rank, as `plan` reports it), anything else a planner bug.
[[noreturn]] static void throwExplainError(const Error &error) {
  if (error.message.rfind("internal error: ", 0) == 0)
    throw std::runtime_error(error.message);
  throw CliError("--rank: " + error.message);
}

/// "8.03B", "106.8K".
static std::string parameterCountText(double count) {
  return count >= 1e9   ? fixed(count / 1e9, 2) + "B"
         : count >= 1e6 ? fixed(count / 1e6, 2) + "M"
                        : fixed(count / 1e3, 1) + "K";
}

/// "ddp, fsdp", or "-" for none.
static std::string nameList(const std::vector<std::string> &names) {
  std::string s;
  for (const std::string &n : names)
    s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? std::string("-") : s;
}

/// The FSDP unit table; runs of blocks with the same size and gathers
/// print once.
static void printUnits(const pipeline::Explanation &e,
                       std::ostringstream &out) {
  out << "FSDP units (" << e.unitCount << "; gathered bytes per "
      << "step on rank " << e.rank << "):\n";
  // The name column fits the longest name (explicit units join patterns).
  size_t nameWidth = 16;
  for (const pipeline::Explanation::Unit &unit : e.units)
    nameWidth = std::max(nameWidth, unit.name.size() + 2);
  auto line = [&](const pipeline::Explanation::Unit &unit,
                  const std::string &name) {
    std::string params;
    if (unit.params.size() <= 3)
      for (const std::string &param : unit.params)
        params += (params.empty() ? "" : ", ") + param;
    else
      params = std::to_string(unit.params.size()) + " tensors";
    out << "  " << std::left << std::setw(static_cast<int>(nameWidth)) << name
        << std::right << std::setw(10)
        << fixed(static_cast<double>(unit.elements) / 1e6, 2) << "M  "
        << std::setw(11) << bytesText(static_cast<double>(unit.gatheredBytes))
        << "  " << unit.allGathers << " all-gather"
        << (unit.allGathers == 1 ? "" : "s")
        << (unit.reshardAfterForward ? ", resharded after forward"
                                     : ", kept from forward to backward")
        << (unit.root ? " (root)" : "") << "  [" << params << "]\n";
  };
  auto blockPrefix = [](const std::string &name) {
    size_t dot = name.rfind('.');
    if (dot == std::string::npos || dot + 1 == name.size() ||
        name.find_first_not_of("0123456789", dot + 1) != std::string::npos)
      return std::string();
    return name.substr(0, dot + 1);
  };
  const auto &units = e.units;
  for (size_t u = 0; u < units.size();) {
    size_t v = u + 1;
    std::string prefix = blockPrefix(units[u].name);
    while (!prefix.empty() && v < units.size() &&
           blockPrefix(units[v].name) == prefix &&
           units[v].params.size() == units[u].params.size() &&
           units[v].allGathers == units[u].allGathers &&
           units[v].gatheredBytes == units[u].gatheredBytes &&
           units[v].reshardAfterForward == units[u].reshardAfterForward)
      ++v;
    if (v - u > 2) {
      line(units[u],
           units[u].name + ".." + units[v - 1].name.substr(prefix.size()));
      out << "    (" << (v - u) << " units like this)\n";
    } else {
      for (size_t w = u; w < v; ++w)
        line(units[w], units[w].name);
    }
    u = v;
  }
  out << "  " << e.unitAllGathers << " all-gathers per step";
  if (e.perModule)
    out << "; per-module units (norm and output apart) under the same "
           "policy would take "
        << e.perModule->allGathers << ": "
        << (e.perModule->allGathers - e.unitAllGathers)
        << " fewer, as [norm, output] is one unit"
        << (e.perModule->normOutputKeptGathered
                ? " kept gathered from its forward into its backward "
                  "(reshard policy " +
                      e.reshardAfterForward + ")"
                : "");
  out << "\n\n";
}

/// The peak memory line, the activation estimate's assumptions and the
/// headroom on the device.
static void printMemory(const pipeline::Explanation &e, const Device &device,
                        std::ostringstream &out) {
  // Kinds first ("activation 2.95 GiB; gathered 1.18 GiB; ..."), then the
  // total, which ends the line.
  out << "memory of rank " << e.rank << " (peak, by kind):";
  for (const pipeline::Explanation::MemoryKind &kind : e.peakMemory)
    out << " " << kind.kind << " " << bytesText(static_cast<double>(kind.bytes))
        << ";";
  if (e.peakMemoryTotal)
    out << " total " << bytesText(static_cast<double>(*e.peakMemoryTotal));
  out << "\n";
  if (const auto &act = e.activations) {
    out << "  activation: the trainer's, estimated (docs/memory.md) for "
        << act->tokensPerRank << " tokens per rank per microbatch";
    if (act->contextSize > 1)
      out << " (" << act->tokensPerDataParallelRank
          << " per data-parallel rank, sequences split over "
          << act->contextAxis << "=" << act->contextSize << ")";
    out << ", " << act->blocks << " transformer block"
        << (act->blocks == 1 ? "" : "s") << ", " << act->dtype
        << ", activation checkpointing " << act->activationCheckpointing
        << "\n";
  }
  const pipeline::Explanation::Capacity &capacity = e.capacity;
  out << "  capacity " << capacityText(device) << ": ";
  if (capacity.fits) {
    out << "headroom " << bytesText(double(capacity.headroomBytes)) << " ("
        << fixed(100.0 * double(capacity.headroomBytes) /
                     double(std::max<int64_t>(1, capacity.capacityBytes)),
                 0)
        << "%)\n";
  } else {
    std::map<std::string, int64_t> kinds;
    for (const pipeline::Explanation::MemoryKind &kind : e.peakMemory)
      kinds[kind.kind] = kind.bytes;
    out << "over by " << bytesText(double(-capacity.headroomBytes))
        << "; largest kinds: " << largestKinds(kinds, 3)
        << "; meshplan plan refuses it without --allow-over-capacity\n";
  }
}

/// The per-stage table and the bubble of a pipelined spec, then the step of
/// its ranks laid out together.
/// The schedule, the decay groups and the clipping's reduction, for specs
/// that use any of them (others print nothing new).
static void printOptimizerStep(const pipeline::Explanation::OptimizerStep &o,
                               int64_t rank, std::ostringstream &out) {
  if (!o.schedule && !o.maxNorm && o.noDecay.empty())
    return;
  out << "optimizer step: adamw lr " << o.lr;
  if (const auto &s = o.schedule) {
    LrPhases ph = lrPhases(*s);
    out << ", lr_schedule over " << s->totalSteps << " steps: warmup "
        << ph.warmup << ", stable " << ph.stable << ", "
        << lrDecayTypeName(s->decayType) << " decay " << ph.decay << " to "
        << s->minLrFactor << "x (torchtitan's: its last decay step lies past "
        << "the run); rate at step";
    for (size_t i = 0; i < o.lrSamples.size(); ++i)
      out << (i ? "," : "") << " " << o.lrSamples[i].first << ": "
          << o.lrSamples[i].second;
  }
  out << "\n  weight decay " << o.weightDecay;
  if (!o.noDecay.empty()) {
    out << ", 0 for " << o.noDecay.size()
        << " parameters of this rank (no_decay):";
    for (size_t i = 0; i < o.noDecay.size() && i < 6; ++i)
      out << " " << o.noDecay[i];
    if (o.noDecay.size() > 6)
      out << " ...";
  }
  out << "\n";
  if (o.maxNorm) {
    out << "  gradient clipping: max_norm " << *o.maxNorm << ", norm_type "
        << o.normType << "; rank " << rank << " counts " << o.countedTensors
        << " of its " << o.gradients << " gradients (" << o.countedElements
        << " elements), the exact partial norm "
        << (o.normType == "2" ? "(int64 fixed point, summed)"
                              : "(largest magnitude, max)")
        << " reduced over {" << nameList(o.normAxes) << "}: ranks [";
    for (size_t i = 0; i < o.normRanks.size() && i < 8; ++i)
      out << (i ? "," : "") << o.normRanks[i];
    if (o.normRanks.size() > 8)
      out << ",... " << o.normRanks.size() << " ranks";
    out << "]\n";
  }
}

static void printPipeline(const pipeline::Explanation &e,
                          std::ostringstream &out) {
  const pipeline::Explanation::Pipeline &pp = *e.pipeline;
  out << "\npipeline: " << pp.schedule << " over " << pp.axis << "=" << pp.size
      << ", " << pp.microbatches << " microbatches, " << pp.stagesPerRank
      << " stage" << (pp.stagesPerRank == 1 ? "" : "s") << " per rank ("
      << pp.stageCount << " stages); rank " << e.rank << " is " << pp.axis
      << " coordinate " << pp.coordinate << "\n";
  out << "  the pipeline of rank " << e.rank
      << ", laid out together under the cost model:\n";
  out << "  " << std::left << std::setw(6) << pp.axis << std::setw(8) << "rank"
      << std::setw(10) << "stages" << std::right << std::setw(12)
      << "parameters" << std::setw(13) << "peak memory" << std::setw(13)
      << "activations" << std::setw(14) << "compute busy" << std::setw(10)
      << "step" << std::setw(8) << "idle"
      << "\n";
  for (const pipeline::Explanation::PipelineStage &s : pp.ranks) {
    std::string stages;
    for (int64_t stage : s.stages)
      stages += (stages.empty() ? "" : ",") + std::to_string(stage);
    out << "  " << std::left << std::setw(6) << s.coordinate << std::setw(8)
        << s.rank << std::setw(10) << stages << std::right << std::setw(12)
        << parameterCountText(double(s.parameters)) << std::setw(13)
        << bytesText(double(s.peakMemoryBytes)) << std::setw(13)
        << bytesText(double(s.activationBytes)) << std::setw(14)
        << (fixed(s.computeBusySeconds * 1e3, 1) + " ms") << std::setw(10)
        << (fixed(s.stepSeconds * 1e3, 1) + " ms") << std::setw(7)
        << fixed(100.0 * s.idleFraction, 1) << "%\n";
  }
  out << "  bubble: " << fixed(100.0 * pp.bubbleFraction, 1)
      << "% under the cost model (the compute stream idle over the "
         "pipeline's step, averaged over its ranks; exposed communication "
         "included); textbook "
      << pp.textbookFormula << " = "
      << fixed(100.0 * pp.textbookBubbleFraction, 1) << "%\n";
  out << "\nstep under the cost model (docs/plan-format.md#cost-model-and-"
         "trace), the pipeline's ranks laid out together: "
      << fixed(e.step->seconds * 1e3, 1) << " ms; rank " << e.rank
      << " exposed communication "
      << fixed(e.step->exposedCommunicationSeconds * 1e3, 1) << " ms\n";
}

std::string meshplan::cli::runExplainCommand(const ExplainOptions &options) {
  Device device = deviceOrThrow(options.cost);
  // A pipeline: every pp coordinate, for the per-stage table and the
  // bubble.
  Planned p = planOrThrow(options.spec, options.cost, options.rank, nullptr,
                          /*everyCoordinate=*/true);
  auto explained = pipeline::explain(p, options.rank, device.model);
  if (!explained)
    throwExplainError(explained.error());
  const pipeline::Explanation &e = *explained;
  if (options.json)
    return pipeline::explanationJson(e).dump(2) + "\n";

  std::ostringstream out;
  out << "model " << e.modelName << ": "
      << parameterCountText(static_cast<double>(e.parameterCount))
      << " parameters in " << e.tensorCount << " tensors, " << e.unitCount
      << " FSDP units ("
      << (e.unitGrouping == "explicit" ? std::string("the spec's")
                                       : e.unitGrouping)
      << ")\n";
  out << "mesh " << meshText(e.meshAxes) << ": " << e.worldSize << " ranks\n";
  out << "roles: replicate {" << nameList(e.replicateAxes) << "}, shard {"
      << nameList(e.shardAxes) << "}, tensor {" << e.tensorAxis.value_or("-")
      << "}, extra {" << nameList(e.extraAxes)
      << "}; reshard after forward: " << e.reshardAfterForward << "; params "
      << e.paramDtype << ", compute " << e.computeDtype << ", reduce "
      << e.reduceDtype << "\n\n";

  // Columns as wide as the longest communicator id.
  int idWidth = 14;
  for (const pipeline::Explanation::Communicator &c : e.communicators)
    idWidth = std::max(idWidth, static_cast<int>(c.id.size()) + 2);
  out << "communicators of rank " << e.rank << ":\n";
  for (const pipeline::Explanation::Communicator &c : e.communicators) {
    out << "  " << std::left << std::setw(idWidth) << c.id << "axes {"
        << nameList(c.axes) << "}  group [";
    for (size_t i = 0; i < c.ranks.size() && i < 8; ++i)
      out << (i ? "," : "") << c.ranks[i];
    if (c.ranks.size() > 8)
      out << ",... " << c.ranks.size() << " ranks";
    out << "]  color " << c.color << " key " << c.key
        << (c.faultTolerant ? "  fault-tolerant" : "") << "\n";
  }
  out << "\ncollectives per step of rank " << e.rank
      << " (bytes this rank sends, ring algorithms):\n";
  out << "  " << std::left << std::setw(idWidth) << "communicator"
      << std::setw(16) << "op" << std::setw(15) << "dtype" << std::right
      << std::setw(6) << "calls" << std::setw(16) << "elements" << std::setw(14)
      << "bytes"
      << "\n";
  for (const pipeline::Explanation::CollectiveSummary &s : e.collectives)
    out << "  " << std::left << std::setw(idWidth) << s.communicator
        << std::setw(16) << s.op << std::setw(15) << s.dtype << std::right
        << std::setw(6) << s.calls << std::setw(16) << s.elements
        << std::setw(14) << bytesText(static_cast<double>(s.bytes)) << "\n";
  out << "  total sent per step: "
      << bytesText(static_cast<double>(e.collectiveBytes)) << "\n\n";

  printUnits(e, out);
  printMemory(e, device, out);

  if (const auto &f8 = e.float8) {
    out << "float8: ";
    if (f8->allGathers == 0) {
      out << (f8->allGather
                  ? "no float8 weight is all-gathered on this mesh"
                  : "compute only (all_gather off): no gather savings")
          << "\n";
    } else {
      int64_t saved = f8->bytesInComputeDtype - f8->bytes;
      out << f8->allGathers << " all-gathers in float8 send "
          << bytesText(static_cast<double>(f8->bytes)) << " instead of "
          << bytesText(static_cast<double>(f8->bytesInComputeDtype)) << " in "
          << e.computeDtype << ": saves "
          << bytesText(static_cast<double>(saved)) << " per step ("
          << fixed(100.0 * double(saved) /
                       double(std::max<int64_t>(1, f8->bytesInComputeDtype)),
                   0)
          << "%)\n";
    }
  }
  if (e.optimizer)
    printOptimizerStep(*e.optimizer, e.rank, out);
  if (e.pipeline)
    printPipeline(e, out);
  else if (e.step)
    out << "\nstep under the cost model (docs/plan-format.md#cost-model-and-"
           "trace): "
        << fixed(e.step->seconds * 1e3, 1) << " ms, exposed "
        << "communication "
        << fixed(e.step->exposedCommunicationSeconds * 1e3, 1) << " ms ("
        << e.step->tokensPerRank << " tokens per rank per microbatch)\n";
  return out.str();
}

//===----------------------------------------------------------------------===//
// trace
//===----------------------------------------------------------------------===//

std::string meshplan::cli::runTraceCommand(const TraceOptions &options,
                                           std::string *summaryOut) {
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
    auto layout = pipeline::layOutPipeline(p, options.rank, device.model);
    if (!layout)
      throwExplainError(layout.error());
    schedule =
        std::move(layout->schedules[size_t(p.pipelineRankOf(options.rank))]);
  }
  if (!schedule)
    throw std::runtime_error("internal error: " + schedule.error().message);
  std::string trace = plan::chromeTrace(planned, *schedule);
  std::ostringstream summary;
  summary << "rank " << options.rank << ", " << planned.program.size()
          << " instructions on " << planned.streams.size() << " streams; step "
          << fixed(schedule->stepSeconds * 1e3, 1)
          << " ms, exposed communication "
          << fixed(schedule->exposedCommSeconds * 1e3, 1) << " ms";
  if (options.output == "-") {
    // The trace alone on stdout; the summary on stderr.
    if (summaryOut)
      *summaryOut = "meshplan: trace of " + summary.str() + "\n";
    return trace;
  }
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
  out << "wrote " << options.output << ": " << summary.str()
      << " (open in ui.perfetto.dev or chrome://tracing)\n";
  return out.str();
}

//===----------------------------------------------------------------------===//
// trace --merge: the cost model's timelines beside a run's
//===----------------------------------------------------------------------===//

std::vector<RankPrediction>
meshplan::cli::predictRanks(const SpecFlags &flags, const CostFlags &cost,
                            const std::vector<int64_t> &ranks) {
  std::vector<RankPrediction> out;
  if (ranks.empty())
    return out;
  Device device = deviceOrThrow(cost);
  Planned p = planOrThrow(flags, cost, ranks.front(), nullptr,
                          /*everyCoordinate=*/true);
  for (int64_t rank : ranks) {
    checkRank(*p.spec.mesh, rank);
    RankPrediction r;
    r.plan = instantiateOrThrow(p.templateFor(rank), rank);
    auto schedule = p.spec.pipeline ? [&]() -> Result<plan::Schedule> {
      auto layout = pipeline::layOutPipeline(p, rank, device.model);
      if (!layout)
        return layout.error();
      return std::move(layout->schedules[size_t(p.pipelineRankOf(rank))]);
    }()
        : plan::simulate(r.plan, p.templateFor(rank).flops(), device.model);
    if (!schedule)
      throwExplainError(schedule.error());
    r.schedule = std::move(*schedule);
    out.push_back(std::move(r));
  }
  return out;
}
