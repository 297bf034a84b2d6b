//===- CommandLine.h - The error style of meshplan's command lines -------===//
//
// `meshplan` and `meshplan-train` parse their flags with CLI11 and report a
// bad command line the same way: one line "PROGRAM: error: <what>" on
// stderr, nothing on stdout, exit code 2; a mistyped flag or subcommand is
// named with the closest known one ("did you mean"), which CLI11 alone does
// not do. Shared here so that both tools keep one style.
//
//===----------------------------------------------------------------------===//

#ifndef MESHPLAN_TOOLS_COMMON_COMMANDLINE_H
#define MESHPLAN_TOOLS_COMMON_COMMANDLINE_H

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace meshplan::cli {

/// A mistyped subcommand or long flag, named with the closest known one
/// (CLI11 reports `plan --sepc F` as "--spec is required" and `meshplan
/// paln` as "A subcommand is required"). Walks the words as CLI11 will:
/// a word naming a subcommand enters it; the words after a flag that takes
/// values are its values; the rest are left to CLI11. `program` starts the
/// message ("meshplan run: unknown flag ...").
std::optional<std::string> unknownWord(CLI::App &app,
                                       const std::vector<char *> &args,
                                       const std::string &program);

/// Parses `args` (args[0] is the program) into `app`: nullopt when the
/// command should run, else the exit code main returns: 0 after --help or
/// --version, 2 after printing "PROGRAM: error: <what>" on stderr for an
/// unknown word or anything CLI11 refuses. `hint`, when set, adds text to
/// CLI11's errors (e.g. the list of subcommands).
std::optional<int>
parseCommandLine(CLI::App &app, std::vector<char *> args,
                 const std::string &program,
                 const std::function<std::string()> &hint = nullptr);

/// A flag that no longer exists under `name` (it meant different things in
/// different subcommands): kept out of --help and refused with "<name>:
/// <message>", where the message names the flag to use, rather than being
/// reported unknown or, worse, silently reinterpreted.
void addRenamedFlag(CLI::App *cmd, const std::string &name,
                    const std::string &message);

/// A validator for an integer flag in [min, max]: CLI11 reports a value
/// outside as "--flag: expected an integer in [min, max], got \"text\"".
CLI::Validator integerIn(int64_t min, int64_t max);

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_COMMON_COMMANDLINE_H
