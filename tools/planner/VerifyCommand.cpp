//===- VerifyCommand.cpp - meshplan verify DIR ----------------------------===//

#include "Commands.h"

#include "meshplan/Plan/Verify.h"

#include <chrono>
#include <cstdio>

namespace meshplan::cli {

static std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

VerifyOutput runVerifyCommand(const VerifyOptions &options) {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  // Directory errors already name the file or directory.
  // Verification-only plans plus the interned facts of the full plans
  // (buffers, operands, callbacks, optimizer): PlanFacts.h.
  Result<plan::PlanSet> read = plan::readPlanSet(options.dir, options.threads);
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
  if (!result.ok()) {
    out.exitCode = 1;
    out.err = "meshplan: verification failed (" +
              std::string(plan::failureKindName(result.failure->kind)) +
              "): " + result.failure->message + "\n";
    return out;
  }
  const plan::VerifyStats &s = result.stats;
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
