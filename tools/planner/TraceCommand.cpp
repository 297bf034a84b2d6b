//===- TraceCommand.cpp - trace --merge and --summary of a run ------------===//

#include "TraceCommand.h"

#include "MeshSetup.h"

#include "meshplan/Plan/ExecutedTrace.h"

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace meshplan;
using namespace meshplan::cli;
namespace fs = std::filesystem;

namespace {

std::vector<plan::RankTrace> readOrThrow(const std::string &flag,
                                         const std::string &dir) {
  auto traces = plan::readTraceDirectory(dir);
  if (!traces)
    throw CliError(flag + ": " + traces.error().message);
  return std::move(*traces);
}

/// Writes beside the target and renames: never a half-written trace.
void writeAtomically(const std::string &path, const std::string &text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream file(tmp, std::ios::binary);
    file << text;
    file.flush();
    if (!file.good()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw CliError("-o: cannot write " + path);
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw CliError("-o: cannot write " + path + ": " + ec.message());
  }
}

} // namespace

std::string
meshplan::cli::runExecutedTraceCommand(const ExecutedTraceOptions &options) {
  if (!options.summary.empty()) {
    if (!options.output.empty())
      throw CliError("-o: --summary prints to stdout; -o is for --merge");
    return plan::summarizeTraces(readOrThrow("--summary", options.summary));
  }
  if (options.output.empty())
    throw CliError("-o: an output file is required (\"-\" for stdout)");
  std::vector<plan::RankTrace> traces = readOrThrow("--merge", options.merge);
  std::vector<RankPrediction> predicted;
  std::map<int64_t, plan::Prediction> predictions;
  if (!options.spec.spec.empty()) {
    std::vector<int64_t> ranks;
    for (const plan::RankTrace &t : traces)
      if (ranks.empty() || ranks.back() != t.rank) // incarnations of one rank
        ranks.push_back(t.rank);
    predicted = predictRanks(options.spec, options.cost, ranks);
    for (RankPrediction &p : predicted)
      predictions[p.plan.rank] = {&p.plan, p.schedule};
  }
  auto merged = plan::mergeTraces(traces, predictions);
  if (!merged)
    throw CliError((options.spec.spec.empty() ? "--merge: " : "--spec: ") +
                   merged.error().message);
  if (options.output == "-")
    return *merged;
  writeAtomically(options.output, *merged);
  std::ostringstream out;
  // Committed steps (a fault-tolerant rank's over its incarnations); the
  // discarded attempts are counted apart.
  std::map<int64_t, int64_t> stepsOf;
  int64_t discarded = 0;
  for (const plan::RankTrace &t : traces)
    for (const plan::ExecutedStep &s : t.steps)
      (s.committed ? stepsOf[t.rank] : discarded) += 1;
  int64_t steps = 0;
  for (const auto &[rank, n] : stepsOf)
    steps = std::max(steps, n);
  std::vector<int64_t> missing = plan::missingRanks(traces);
  out << "wrote " << options.output << ": "
      << traces.front().worldSize - int64_t(missing.size()) << " of "
      << traces.front().worldSize << " ranks";
  if (traces.front().faultTolerant)
    out << " (" << traces.size() << " process files)";
  out << ", " << steps << " steps"
      << (traces.front().faultTolerant
              ? " (" + std::to_string(discarded) + " discarded attempts)"
              : "")
      << (predictions.empty() ? ""
                              : ", " + std::to_string(predictions.size()) +
                                    " predicted beside them")
      << (missing.empty() ? ""
                          : " (" + std::to_string(missing.size()) +
                                " ranks have no trace file: marked)")
      << " (open in ui.perfetto.dev)\n";
  return out.str();
}
