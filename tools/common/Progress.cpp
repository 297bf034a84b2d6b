//===- Progress.cpp - The progress bar of meshplan's long commands --------===//

#include "Progress.h"

#include <cstdio>
#include <unistd.h>

namespace meshplan::cli {

std::optional<bool> progressWanted(const std::string &mode) {
  if (mode == "always")
    return true;
  if (mode == "never")
    return false;
  if (mode == "auto")
    return isatty(STDERR_FILENO) != 0;
  return std::nullopt;
}

void ProgressBar::operator()(int64_t done, int64_t total) {
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

} // namespace meshplan::cli
