//===- Metrics.cpp - One JSON line per step (--metrics FILE) --------------===//

#include "Metrics.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sys/resource.h>

namespace meshplan::trainer {

Result<std::unique_ptr<MetricsFile>>
MetricsFile::open(const std::string &pattern, int64_t rank) {
  std::string path = pattern;
  const std::string placeholder = "{rank}";
  bool perRank = false;
  for (size_t at = path.find(placeholder); at != std::string::npos;
       at = path.find(placeholder)) {
    path.replace(at, placeholder.size(), std::to_string(rank));
    perRank = true;
  }
  if (!perRank && rank != 0)
    return std::unique_ptr<MetricsFile>();
  std::FILE *f = std::fopen(path.c_str(), "w");
  if (!f)
    return makeError("--metrics: cannot write " + path + ": " +
                     std::strerror(errno));
  return std::unique_ptr<MetricsFile>(new MetricsFile(f, path));
}

MetricsFile::~MetricsFile() {
  if (file)
    std::fclose(file);
}

int64_t MetricsFile::peakRssBytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024; // kilobytes on Linux
}

Result<void> MetricsFile::write(const StepMetrics &m) {
  auto number = [](double v) -> nlohmann::ordered_json {
    return std::isfinite(v) ? nlohmann::ordered_json(v)
                            : nlohmann::ordered_json(nullptr);
  };
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["rank"] = m.rank;
  j["loss"] = number(m.loss);
  j["loss_scope"] = m.lossIsGlobal ? "global" : "rank";
  j["lr"] = number(m.lr);
  if (m.gradNorm) {
    j["grad_norm"] = number(*m.gradNorm);
    j["clip_coefficient"] = number(m.clipCoefficient);
    j["update_skipped"] = m.updateSkipped;
  }
  j["tokens"] = m.tokens;
  j["tokens_per_second"] =
      number(m.stepSeconds > 0 ? double(m.tokens) / m.stepSeconds : 0);
  j["step_seconds"] = number(m.stepSeconds);
  j["compute_seconds"] = number(m.computeSeconds);
  j["communication_seconds"] = number(m.communicationSeconds);
  j["exposed_seconds"] = number(m.exposedSeconds);
  j["runtime_seconds"] = number(m.runtimeSeconds);
  j["peak_rss_bytes"] = m.peakRssBytes;
  if (m.faultToleranceEpoch)
    j["ft_epoch"] = *m.faultToleranceEpoch;
  std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file) != line.size() ||
      std::fflush(file) != 0)
    return makeError("--metrics: cannot write " + path + ": " +
                     std::strerror(errno));
  return {};
}

} // namespace meshplan::trainer
