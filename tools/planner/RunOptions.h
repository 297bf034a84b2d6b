//===- RunOptions.h - meshplan run's flags as written -----------*- C++ -*-===//
//
// Shared by the launcher (RunCommand.cpp) and its fault-tolerant mode
// (FaultTolerantLaunch.cpp), which parses the flags of its own: each
// includes this header rather than the other's.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_RUNOPTIONS_H
#define MESHPLAN_TOOLS_PLANNER_RUNOPTIONS_H

#include <optional>
#include <string>
#include <vector>

namespace meshplan::cli {

/// The flags as written; runLaunchCommand parses and checks them so that
/// every message names the flag in the CLI's usual form.
struct RunOptions {
  std::string nprocPerNode;              ///< -n (required)
  std::optional<std::string> store;      ///< file:DIR | redis://HOST:PORT
  std::optional<std::string> timeout;    ///< seconds, exported to the ranks
  std::string nnodes = "1";              ///< --nnodes
  std::string nodeRank = "0";            ///< --node-rank
  std::string grace = "5";               ///< seconds from SIGTERM to SIGKILL
  std::optional<std::string> masterAddr; ///< exported as MASTER_ADDR
  std::optional<std::string> masterPort; ///< exported as MASTER_PORT
  /// --fault-tolerant: restart a failed replica group's processes while the
  /// others continue (FaultTolerantLaunch.h, docs/fault-tolerance.md).
  bool faultTolerant = false;
  std::optional<std::string> maxRestarts; ///< per group (default 3)
  std::optional<std::string> minReplicas; ///< exported (default 1)
  std::optional<std::string> heartbeatMs; ///< exported (default 2000)
  std::optional<std::string> job;         ///< the job's name in the store
  std::vector<std::string> program;       ///< PROGRAM ARGS...
};

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_RUNOPTIONS_H
