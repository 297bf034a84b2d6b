//===- TraceCommand.h - trace --merge and --summary of a run --------------===//
//
// `meshplan trace --merge DIR -o FILE` writes one Chrome/Perfetto trace of
// the executed-step traces a run recorded in DIR (docs/observability.md),
// with the cost model's prediction of the traced ranks beside them when
// --spec is given; `meshplan trace --summary DIR` prints where the time went
// and who everyone waited for. Bad input (an unreadable, truncated or
// malformed rank file, files of different runs, a spec of another plan) is
// a CliError naming the file and the JSON pointer; nothing is written.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_TRACECOMMAND_H
#define MESHPLAN_TOOLS_PLANNER_TRACECOMMAND_H

#include "PlanCommands.h"

#include <string>

namespace meshplan::cli {

struct ExecutedTraceOptions {
  std::string merge;   ///< --merge DIR
  std::string summary; ///< --summary DIR
  std::string output;  ///< -o FILE ("-": stdout)
  /// --spec and its flags, optional: predict the traced ranks.
  SpecFlags spec;
  CostFlags cost;
};

/// The text for stdout.
std::string runExecutedTraceCommand(const ExecutedTraceOptions &options);

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_TRACECOMMAND_H
