//===- Progress.h - The progress bar of meshplan's long commands ----------===//
//
// One bar for every long command (`plan --all`, `verify`, `tune`, `ckpt
// reshard/import/export`): one line on stderr, "WHAT [####......] done/total",
// redrawn in place with \r, ended by a newline at total/total. Drawn under
// `--progress always`, or `auto` (the default) when stderr is a terminal;
// never under `--progress never` or a command's --json, so that pipes and
// logs get no control characters.
//
//===----------------------------------------------------------------------===//

#ifndef MESHPLAN_TOOLS_COMMON_PROGRESS_H
#define MESHPLAN_TOOLS_COMMON_PROGRESS_H

#include <cstdint>
#include <optional>
#include <string>

namespace meshplan::cli {

/// Whether `--progress MODE` draws a bar: "always", "never", or "auto"
/// (stderr is a terminal); nullopt for any other mode (the caller's error).
std::optional<bool> progressWanted(const std::string &mode);

/// The text the command line's --progress help shows.
inline constexpr const char *kProgressHelp =
    "Progress bar on stderr: auto (if a terminal), always, never";

/// A one-line progress bar on stderr, redrawn at most every 1% (and at
/// total/total, which ends the line). Calls must come one at a time, with
/// `done` not decreasing.
class ProgressBar {
public:
  ProgressBar(bool enabled, std::string what)
      : enabled(enabled), what(std::move(what)) {}
  void operator()(int64_t done, int64_t total);

private:
  bool enabled;
  std::string what;
  int64_t lastPercent = -1;
};

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_COMMON_PROGRESS_H
