//===- TuneCommand.h - meshplan tune --------------------------------------===//
//
// Searches mesh factorizations and training options for the fastest spec
// that fits the device (lib/Pipeline/Tune.cpp, docs/tune.md).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_TUNECOMMAND_H
#define MESHPLAN_TOOLS_PLANNER_TUNECOMMAND_H

#include "PlanCommands.h"

#include <cstdint>
#include <optional>
#include <string>

namespace meshplan::cli {

struct TuneOptions {
  std::string model;
  int64_t world = 0;
  CostFlags cost;
  /// Global batch in tokens per optimizer step; unset: one sequence per
  /// rank (world x seqLen), as pipeline::TuneOptions::tokensPerStep.
  std::optional<int64_t> globalBatchTokens;
  int64_t seqLen = 8192;
  int64_t maxContextParallel = 8;
  /// 0: search pp degrees up to maxPipelineParallel; 1: no pipeline; N:
  /// only pp = N (pipeline::TuneOptions::pipelineParallel).
  int64_t pipelineParallel = 0;
  int64_t maxPipelineParallel = 16;
  size_t top = 5;     ///< rows of the table
  size_t confirm = 8; ///< candidates planned for real; 0: all screened
  std::string output; ///< the winning spec; "" prints it
  std::string progress = "auto";
  /// One JSON object on stdout (docs/tune.md, "JSON output"), also when
  /// nothing fits; no bar.
  bool json = false;
};

CommandOutput runTuneCommand(const TuneOptions &options);

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_TUNECOMMAND_H
