//===- TuneCommand.cpp - meshplan tune ------------------------------------===//
//
// Runs pipeline::tune (lib/Pipeline/Tune.cpp, docs/tune.md) and prints the
// best candidates as a table and the winning spec, which `meshplan plan
// --spec` accepts unchanged. Exit 0: a spec was found; 1: nothing fits the
// device; 2: bad input.
//
//===----------------------------------------------------------------------===//

#include "TuneCommand.h"

#include "MeshSetup.h"
#include "Progress.h"

#include "meshplan/Frontend/Presets.h"
#include "meshplan/Pipeline/Tune.h"
#include "meshplan/Plan/CostModel.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <unistd.h>

namespace meshplan::cli {

using Json = nlohmann::ordered_json;

/// Bytes in the largest binary unit that leaves at least 1 of it.
static std::string gib(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::ostringstream s;
  s << std::fixed << std::setprecision(u ? 2 : 0) << v << " " << units[u];
  return s.str();
}

static std::string ms(double seconds) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << seconds * 1e3;
  return s.str();
}

/// One table row per candidate; columns padded to their widest cell.
static std::string table(const std::vector<pipeline::TuneCandidate> &rows) {
  std::vector<std::vector<std::string>> cells = {
      {"#", "pp", "schedule", "dp_replicate", "dp_shard", "cp", "tp", "reshard",
       "fp8 gather", "microbatches", "activation ckpt", "step ms",
       "exposed comm ms", "TP/CP comm ms", "peak"}};
  for (size_t i = 0; i < rows.size(); ++i) {
    const pipeline::TuneCandidate &c = rows[i];
    std::string ga = std::to_string(c.accumulationSteps);
    if (c.accumulationSteps > 1)
      ga += c.reduce == frontend::AccumulationReduce::EveryMicrobatch
                ? " (every)"
                : " (last)";
    std::string schedule = "-";
    if (c.pp > 1) {
      // The pipeline's microbatches are the accumulation.
      ga = std::to_string(c.microbatches);
      schedule = std::string(pipelineScheduleKindName(c.schedule));
      if (c.stagesPerRank > 1)
        schedule += " v=" + std::to_string(c.stagesPerRank);
    }
    cells.push_back(
        {std::to_string(i + 1), std::to_string(c.pp), schedule,
         std::to_string(c.replicate), std::to_string(c.shard),
         std::to_string(c.cp), std::to_string(c.tp),
         c.reshardAfterForward ? "default" : "never",
         c.float8AllGather ? "yes" : "no", ga,
         std::string(frontend::activationCheckpointingName(c.checkpointing)),
         ms(c.stepSeconds), ms(c.exposedCommSeconds), ms(c.trainerCommSeconds),
         gib(c.peakBytes)});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto &row : cells)
    for (size_t k = 0; k < row.size(); ++k)
      width[k] = std::max(width[k], row[k].size());
  std::string out;
  for (const auto &row : cells) {
    for (size_t k = 0; k < row.size(); ++k) {
      out += row[k];
      if (k + 1 < row.size())
        out += std::string(width[k] - row[k].size() + 2, ' ');
    }
    out += "\n";
  }
  return out;
}

/// One candidate as `tune --json` lists it (docs/tune.md, "JSON output").
static Json candidateJson(const pipeline::TuneCandidate &c) {
  Json j = {{"pp", c.pp},
            {"dp_replicate", c.replicate},
            {"dp_shard", c.shard},
            {"cp", c.cp},
            {"tp", c.tp}};
  if (c.pp > 1) {
    j["schedule"] = std::string(pipelineScheduleKindName(c.schedule));
    j["stages_per_rank"] = c.stagesPerRank;
    j["microbatches"] = c.microbatches;
  } else {
    j["schedule"] = nullptr;
    j["stages_per_rank"] = 1;
    j["microbatches"] = c.accumulationSteps;
  }
  j["accumulation_reduce"] =
      std::string(frontend::accumulationReduceName(c.reduce));
  j["reshard_after_forward"] = c.reshardAfterForward ? "default" : "never";
  j["float8_all_gather"] = c.float8AllGather;
  j["activation_checkpointing"] =
      std::string(frontend::activationCheckpointingName(c.checkpointing));
  j["step_seconds"] = c.stepSeconds;
  j["plan_step_seconds"] = c.planStepSeconds;
  j["trainer_comm_seconds"] = c.trainerCommSeconds;
  j["exposed_comm_seconds"] = c.exposedCommSeconds;
  j["peak_bytes"] = c.peakBytes;
  j["description"] = c.describe();
  return j;
}

/// `tune --json`: the search, its ranking and the winner; with `r` null,
/// the search found nothing that fits (`error` says why).
static std::string tuneJson(const pipeline::TuneOptions &t,
                            const pipeline::TuneResult *r,
                            const std::string &error,
                            const std::string &written) {
  Json j = {{"model", t.model},
            {"world_size", t.world},
            {"device", t.cost.device},
            {"global_batch_tokens", pipeline::globalTokensOf(t)},
            {"sequence_length", t.sequenceLength}};
  if (!r) {
    j["fits"] = false;
    j["error"] = error;
    return j.dump(1);
  }
  j["fits"] = true;
  j["capacity_bytes"] = r->capacityBytes;
  j["counts"] = {
      {"enumerated", r->enumerated},      {"pipelined", r->pipelined},
      {"refused_by_spec", r->infeasible}, {"screened_out", r->screenedOut},
      {"planned", r->compiled},           {"fit", r->ranked.size()}};
  Json ranked = Json::array();
  for (const pipeline::TuneCandidate &c : r->ranked)
    ranked.push_back(candidateJson(c));
  j["ranked"] = std::move(ranked);
  j["spec"] = Json::parse(r->ranked.front().specJson);
  j["written"] = written.empty() ? Json(nullptr) : Json(written);
  return j.dump(1);
}

CommandOutput runTuneCommand(const TuneOptions &options) {
  CommandOutput result;
  std::ostringstream out;
  try {
    pipeline::TuneOptions t;
    t.model = options.model;
    t.world = options.world;
    if (t.world < 1 || t.world > (int64_t(1) << 31))
      throw CliError("--world: expected a world size in [1, 2^31], not " +
                     std::to_string(options.world));
    t.cost = costModelOrThrow(options.cost);
    if (options.seqLen < 1)
      throw CliError("--seq-len: expected a positive sequence length");
    t.sequenceLength = options.seqLen;
    if (options.globalBatchTokens) {
      const int64_t tokens = *options.globalBatchTokens;
      if (tokens < 1 || tokens % options.seqLen != 0)
        throw CliError(
            "--global-batch-tokens: expected the global batch in tokens, a "
            "positive multiple of the sequence length " +
            std::to_string(options.seqLen) + ", not " + std::to_string(tokens));
      t.tokensPerStep = tokens;
    }
    if (options.maxContextParallel < 1)
      throw CliError("--max-cp: expected at least 1");
    t.maxContextParallel = options.maxContextParallel;
    if (options.pipelineParallel < 0)
      throw CliError("--pp: expected 0 (search), 1 (no pipeline) or a "
                     "pipeline-parallel degree, not " +
                     std::to_string(options.pipelineParallel));
    if (options.pipelineParallel > 1 &&
        options.world % options.pipelineParallel != 0)
      throw CliError("--pp: " + std::to_string(options.pipelineParallel) +
                     " does not divide the world size " +
                     std::to_string(options.world));
    if (options.maxPipelineParallel < 1)
      throw CliError("--max-pp: expected at least 1");
    t.pipelineParallel = options.pipelineParallel;
    t.maxPipelineParallel = options.maxPipelineParallel;
    t.confirm = options.confirm;
    std::optional<bool> bar = progressWanted(options.progress);
    if (!bar)
      throw CliError("--progress: expected auto, always or never, not \"" +
                     options.progress + "\"");
    // Never under --json: its stderr stays for errors.
    ProgressBar progress(*bar && !options.json, "planning candidates");
    t.progress = [&](size_t done, size_t total) {
      progress(int64_t(done), int64_t(total));
    };
    auto tuned = pipeline::tune(t);
    if (!tuned) {
      const std::string &m = tuned.error().message;
      result.exitCode =
          m.find("no candidate fits the device") != std::string::npos ? 1 : 2;
      if (options.json && result.exitCode == 1) {
        // Nothing fits is an answer, not bad input: it is JSON too.
        result.out = tuneJson(t, nullptr, m, "") + "\n";
        return result;
      }
      result.err = "meshplan: " + m + "\n";
      return result;
    }
    const pipeline::TuneResult &r = *tuned;
    int64_t tokens =
        t.tokensPerStep ? t.tokensPerStep : t.world * t.sequenceLength;
    out << "tune: " << t.model << " on " << t.world << " ranks of "
        << t.cost.device << " (" << gib(r.capacityBytes)
        << " usable per rank); " << tokens << " tokens per step, sequences of "
        << t.sequenceLength << "\n"
        << r.enumerated << " candidates (" << r.pipelined
        << " with a pipeline): " << r.infeasible << " refused by the spec, "
        << r.screenedOut << " estimated over capacity, " << r.compiled
        << " planned (" << r.ranked.size() << " fit)\n\n";
    std::vector<pipeline::TuneCandidate> best(
        r.ranked.begin(),
        r.ranked.begin() + std::min(r.ranked.size(), options.top));
    out << table(best) << "\n";
    const pipeline::TuneCandidate &winner = r.ranked.front();
    if (options.json && options.output == "-")
      throw CliError("-o: --json prints the winning spec already (its "
                     "\"spec\" key); give -o FILE or leave -o out");
    if (options.output.empty()) {
      out << winner.specJson;
    } else if (options.output == "-") {
      // The spec alone on stdout (a pipe into a file or `plan --spec
      // /dev/stdin`); the table on stderr.
      result.err = out.str();
      result.out = winner.specJson;
      return result;
    } else {
      // A spec's model path is relative to the spec's directory: a model
      // file named relative to here is named relative to the output.
      std::string specJson = winner.specJson;
      if (!frontend::findPreset(t.model) &&
          std::filesystem::is_regular_file(t.model) &&
          std::filesystem::path(t.model).is_relative()) {
        pipeline::TuneOptions there = t;
        std::filesystem::path dir =
            std::filesystem::absolute(options.output).parent_path();
        there.model =
            std::filesystem::relative(std::filesystem::absolute(t.model), dir)
                .generic_string();
        specJson = pipeline::tuneSpecJson(there, winner);
      }
      std::string tmp = options.output + ".tmp";
      {
        std::ofstream f(tmp, std::ios::trunc);
        f << specJson;
        if (!f.flush())
          throw CliError("-o: cannot write " + tmp);
      }
      if (std::rename(tmp.c_str(), options.output.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw CliError("-o: cannot write " + options.output);
      }
      out << "wrote the winning spec to " << options.output << "\n";
    }
    if (options.json) {
      result.out = tuneJson(t, &r, "", options.output) + "\n";
      return result;
    }
  } catch (const CliError &e) {
    result.exitCode = 2;
    result.err = std::string("meshplan: error: ") + e.what() + "\n";
    return result;
  }
  result.out = out.str();
  return result;
}

} // namespace meshplan::cli
