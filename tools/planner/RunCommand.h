//===- RunCommand.h - meshplan run: the launcher --------------*- C++ -*-===//
//
// `meshplan run -n N [options] -- PROGRAM ARGS...` starts N processes of
// PROGRAM with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...) and
// a store address in MESHPLAN_STORE, prefixes every line they print with
// "[rank R] ", and stops the whole job when one rank fails or the launcher is
// signalled. With --fault-tolerant, a failed rank stops and restarts only its
// replica group (FaultTolerantLaunch.h). Every flag is checked before
// anything is created or started; a bad one is a CliError (one line, exit
// code 2). docs/runtime.md describes the behaviour and the exit codes.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_RUNCOMMAND_H
#define MESHPLAN_TOOLS_PLANNER_RUNCOMMAND_H

#include "RunOptions.h"

#include <string>
#include <vector>

namespace CLI {
class App;
} // namespace CLI

namespace meshplan::cli {

/// Runs the job and returns the launcher's exit code: 0 when every rank
/// exited with 0, 1 when a rank failed, 126/127 when PROGRAM cannot be
/// executed, 128+S when the launcher received signal S. Throws CliError for
/// bad flags before anything is started.
int runLaunchCommand(const RunOptions &options);

/// If argv is `meshplan run ...`, moves PROGRAM and its arguments into
/// `program` and returns the arguments CLI11 should parse: the launcher's
/// options end at `--` or at the first argument that is neither an option of
/// `runCmd` nor an option's value, so PROGRAM's own flags (`-c`, `--lr`) are
/// never taken for the launcher's. Otherwise returns argv unchanged.
std::vector<char *> splitRunCommandLine(const CLI::App &runCmd, int argc,
                                        char **argv,
                                        std::vector<std::string> &program);

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_RUNCOMMAND_H
