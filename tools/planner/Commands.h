//===- Commands.h - The meshplan CLI's subcommands ------------------------===//
//
// Each command computes everything with core and returns the full text it
// would print; main() prints it only when the command succeeded, so a bad
// input never leaves partial output on stdout.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_COMMANDS_H
#define MESHPLAN_TOOLS_PLANNER_COMMANDS_H

#include "MeshSetup.h"

#include <optional>
#include <string>

namespace meshplan::cli {

struct MeshOptions {
  MeshFlags mesh;
  std::optional<int64_t> rank;
  bool listGroups = false;
  bool json = false;
};
std::string runMeshCommand(const MeshOptions &options);

struct LayoutOptions {
  MeshFlags mesh;
  std::string shape;
  std::string placements;
  std::string layout;
  std::optional<int64_t> rank;
  bool json = false;
};
std::string runLayoutCommand(const LayoutOptions &options);

struct RedistributeOptions {
  MeshFlags mesh;
  std::string shape;
  std::string from, to;
  std::string dtype = "fp32";
  bool json = false;
};
std::string runRedistributeCommand(const RedistributeOptions &options);

/// `meshplan verify DIR`: reads a plan directory and verifies it across
/// ranks. A bad directory or plan is a CliError (exit 2); a set that fails
/// verification returns exit code 1 with the report in `err`.
struct VerifyOptions {
  std::string dir;
  unsigned threads = 0;
  std::string progress = "auto"; ///< auto | always | never
  /// One JSON object on stdout, success or failure (docs/plan-format.md,
  /// "meshplan verify --json"); no bar.
  bool json = false;
};
struct VerifyOutput {
  int exitCode = 0;
  std::string out; ///< stdout (the summary, on success; JSON always)
  std::string err; ///< stderr (the failure report, without --json)
};
VerifyOutput runVerifyCommand(const VerifyOptions &options);

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_COMMANDS_H
