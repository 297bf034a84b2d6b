//===- VerifyCommand.cpp - meshplan verify DIR ----------------------------===//

#include "Commands.h"
#include "Progress.h"

#include "meshplan/Plan/Verify.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>

namespace meshplan::cli {

static std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

/// A failure as `verify --json` reports it: the kind, the rank and
/// instruction blamed, and the full message.
static nlohmann::ordered_json failureJson(const plan::VerifyFailure &f) {
  using Json = nlohmann::ordered_json;
  auto orNull = [](const std::string &s) {
    return s.empty() ? Json(nullptr) : Json(s);
  };
  auto indexOrNull = [](int64_t v) { return v < 0 ? Json(nullptr) : Json(v); };
  return {{"kind", std::string(plan::failureKindName(f.kind))},
          {"rank", indexOrNull(f.rank)},
          {"instruction", orNull(f.instruction)},
          {"index", indexOrNull(f.index)},
          {"comm", orNull(f.comm)},
          {"tensor", orNull(f.tensor)},
          {"other_rank", indexOrNull(f.otherRank)},
          {"message", f.message}};
}

VerifyOutput runVerifyCommand(const VerifyOptions &options) {
  using Clock = std::chrono::steady_clock;
  std::optional<bool> wanted = progressWanted(options.progress);
  if (!wanted)
    throw CliError("--progress: expected auto, always or never, not \"" +
                   options.progress + "\"");
  ProgressBar bar(*wanted && !options.json, "reading plans");
  auto t0 = Clock::now();
  // Directory errors already name the file or directory.
  // Verification-only plans plus the interned facts of the full plans
  // (buffers, operands, callbacks, optimizer): PlanFacts.h.
  Result<plan::PlanSet> read =
      plan::readPlanSet(options.dir, options.threads,
                        [&](int64_t done, int64_t total) { bar(done, total); });
  if (!read)
    throw CliError(read.error().message);
  plan::PlanSet set = std::move(read.value());
  auto t1 = Clock::now();
  plan::VerifyResult result =
      orThrow(plan::verifyPlans(set.plans, set.facts), options.dir);
  auto t2 = Clock::now();
  double readS = std::chrono::duration<double>(t1 - t0).count();
  double verifyS = std::chrono::duration<double>(t2 - t1).count();

  VerifyOutput out;
  const plan::VerifyStats &s = result.stats;
  if (options.json) {
    nlohmann::ordered_json j = {
        {"directory", options.dir},
        {"ok", result.ok()},
        {"ranks", s.ranks},
        {"communicators", s.communicators},
        {"collectives", s.collectives},
        {"instructions", s.instructions},
        {"read_seconds", readS},
        {"verify_seconds", verifyS},
        {"failure", result.ok() ? nlohmann::ordered_json(nullptr)
                                : failureJson(*result.failure)}};
    out.exitCode = result.ok() ? 0 : 1;
    out.out = j.dump(1) + "\n";
    return out;
  }
  if (!result.ok()) {
    out.exitCode = 1;
    out.err = "meshplan: verification failed (" +
              std::string(plan::failureKindName(result.failure->kind)) +
              "): " + result.failure->message + "\n";
    return out;
  }
  out.out = "verified " + std::to_string(s.ranks) +
            " ranks: " + std::to_string(s.communicators) + " communicators, " +
            std::to_string(s.collectives) + " collectives, " +
            std::to_string(s.instructions) +
            " instructions; every communicator agrees and all programs run "
            "to completion; every rank computes the same step (read " +
            seconds(readS) + ", verify " + seconds(verifyS) + ")\n";
  return out;
}

} // namespace meshplan::cli
