//===- PlanCommands.h - plan, explain, trace ------------------------------===//
//
// The commands that run the planner pipeline (lib/Pipeline) on a model and
// a parallelism spec. Bad input (flags, spec, model) is a CliError: one line
// on stderr naming the flag or the JSON pointer, exit code 2, and nothing
// written: `plan` builds the whole directory beside its target and renames
// it into place only once every plan is written (and verified). A plan
// whose estimated peak memory exceeds the device's capacity is refused with
// exit code 1 (and nothing written) unless --allow-over-capacity.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_PLANCOMMANDS_H
#define MESHPLAN_TOOLS_PLANNER_PLANCOMMANDS_H

#include "meshplan/Plan/Trace.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshplan::frontend {
struct Model;
} // namespace meshplan::frontend

namespace meshplan::cli {

/// Flags every pipeline command shares.
struct SpecFlags {
  std::string spec;
  std::string model; ///< overrides the spec's "model" when set
  std::optional<int64_t> worldSize;
  /// The cost model's work (docs/memory.md, "The work per microbatch"):
  /// --tokens-per-rank gives a data-parallel rank's tokens per microbatch
  /// directly; --global-batch-tokens the global batch, split as the spec's
  /// "batch" is (frontend::microbatchWork). Unset: the spec's "batch",
  /// else 8192 tokens per rank per microbatch. --seq-len likewise
  /// overrides the spec's sequence length (default 8192).
  std::optional<int64_t> tokensPerRank;
  std::optional<int64_t> globalBatchTokens;
  std::optional<int64_t> seqLen;
};

/// The machine the cost model describes and the work it charges
/// (plan, explain, trace): docs/memory.md.
struct CostFlags {
  /// --device: a preset or alias (plan::devicePresets()); unset: the
  /// default, h100-sxm-80gb.
  std::optional<std::string> device;
  /// --device-memory: the bytes a rank's estimated peak may use, replacing
  /// the preset's memory less its reserve. Text, validated here: a positive
  /// integer.
  std::optional<std::string> deviceMemory;
  /// --context-parallel: the extra axis that splits sequences, or "none";
  /// unset: an extra axis named "cp".
  std::optional<std::string> contextParallel;
};

/// The cost model --device and --device-memory select (a CliError names
/// the bad flag).
plan::CostModel costModelOrThrow(const CostFlags &flags);

struct PlanOptions {
  SpecFlags spec;
  CostFlags cost;
  /// Write plans whose estimated peak exceeds the device's capacity (with a
  /// warning) instead of refusing them with exit code 1.
  bool allowOverCapacity = false;
  std::optional<int64_t> rank;
  bool all = false;
  std::string outDir;
  bool noVerify = false;
  /// Verify by default up to this many ranks.
  int64_t verifyLimit = 4096;
  std::string dumpIr;            ///< directory for IR after every stage
  std::string progress = "auto"; ///< auto | always | never
  unsigned threads = 0;
  bool timings = false; ///< print the time of every stage
};

struct CommandOutput {
  int exitCode = 0;
  std::string out; ///< stdout
  std::string err; ///< stderr
};

CommandOutput runPlanCommand(const PlanOptions &options);

struct ExplainOptions {
  SpecFlags spec;
  CostFlags cost;
  int64_t rank = 0;
  bool json = false;
};
std::string runExplainCommand(const ExplainOptions &options);

struct TraceOptions {
  SpecFlags spec;
  CostFlags cost;
  int64_t rank = 0;
  std::string output;
};
/// Writes the trace to options.output and returns the line saying so; with
/// output "-", returns the trace itself (for stdout) and puts that line in
/// `*summaryOut` (for stderr).
std::string runTraceCommand(const TraceOptions &options,
                            std::string *summaryOut = nullptr);

/// The plans of `ranks` under the spec and their timelines under the cost
/// model, as `trace` lays them out (`trace --merge` puts them beside a
/// run's measured timelines).
struct RankPrediction {
  plan::Plan plan;
  plan::Schedule schedule;
};
std::vector<RankPrediction> predictRanks(const SpecFlags &flags,
                                         const CostFlags &cost,
                                         const std::vector<int64_t> &ranks);

/// What the checkpoint commands (`ckpt reshard`, `ckpt import`) need of a
/// spec: plans it as `plan --all` does (same loading, flags and errors) and
/// hands every rank's plan to `perRank`, one at a time, in rank order.
struct PlannedRanks {
  std::string modelName;
  std::string mesh; ///< Mesh::str()
  int64_t worldSize = 0;
  std::string specText; ///< the spec file's bytes, for its fingerprint
  /// The spec's model (`ckpt import --format hf-llama` checks the file's
  /// config against its dims and heads).
  std::shared_ptr<const frontend::Model> model;
};
PlannedRanks
planEveryRank(const SpecFlags &flags,
              const std::function<void(const plan::Plan &)> &perRank);

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_PLANCOMMANDS_H
