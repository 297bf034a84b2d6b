//===- Metrics.h - One JSON line per step (--metrics FILE) ----------------===//
//
// meshplan-train --metrics FILE writes what each step did as one JSON object
// per line (docs/observability.md, "Metrics files"): the same keys the
// Python driver writes (meshplan.metrics), so `python -m meshplan.plot`
// draws either. Each line is written whole and flushed, so a run that dies
// leaves every finished step readable. Rank 0 writes FILE; a FILE with
// "{rank}" in it is written by every rank, the placeholder replaced by its
// rank.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_EXAMPLES_TRAINER_METRICS_H
#define MESHPLAN_EXAMPLES_TRAINER_METRICS_H

#include "meshplan/Core/Result.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

namespace meshplan::trainer {

struct StepMetrics {
  int64_t step = 0;
  int64_t rank = 0;
  double loss = 0;
  bool lossIsGlobal = true; ///< averaged over the data-parallel ranks
  double lr = 0;
  std::optional<double> gradNorm; ///< with clipping
  double clipCoefficient = 1;
  bool updateSkipped = false;
  int64_t tokens = 0; ///< per step, all ranks
  double stepSeconds = 0;
  double computeSeconds = 0, communicationSeconds = 0, exposedSeconds = 0,
         runtimeSeconds = 0;
  int64_t peakRssBytes = 0; ///< this process's peak resident memory
  std::optional<int64_t> faultToleranceEpoch;
};

class MetricsFile {
public:
  /// Opens (truncates) the file this rank writes, or returns null when
  /// this rank writes none. Errors name --metrics and the path.
  static Result<std::unique_ptr<MetricsFile>> open(const std::string &pattern,
                                                   int64_t rank);
  ~MetricsFile();
  Result<void> write(const StepMetrics &m);

  /// This process's peak resident set so far, in bytes.
  static int64_t peakRssBytes();

private:
  explicit MetricsFile(std::FILE *f, std::string path)
      : file(f), path(std::move(path)) {}
  std::FILE *file;
  std::string path;
};

} // namespace meshplan::trainer

#endif // MESHPLAN_EXAMPLES_TRAINER_METRICS_H
