//===- TestHooks.cpp - meshplan-train's fault-injection hooks -------------===//
//
// What the tests set in the environment to make meshplan-train slow down,
// wait, poison a gradient or kill itself at a chosen point (docs/trainer.md,
// docs/fault-tolerance.md). Apart from the trainer's own code so that
// Train.cpp reads as the trainer; none of these is for production use.
//
//===----------------------------------------------------------------------===//

#include "TestHooks.h"
#include "Trainer.h"

#include "meshplan/Plan/Plan.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;

/// Test hook (test/trainer/fault-tolerance.sh, docs/fault-tolerance.md):
/// MESHPLAN_TEST_STEP_DELAY_MS=N makes every rank sleep N ms before each
/// step (outside the step's timing), so that the survivors of a killed
/// replica group cannot finish the job before a restarted group, slow to
/// start on a loaded machine, has joined (runtime.ft.trainer). Not for
/// production use.
void meshplan::trainer::delayStepForTests() {
  static const int64_t ms = [] {
    const char *v = std::getenv("MESHPLAN_TEST_STEP_DELAY_MS");
    return v && *v ? std::max<int64_t>(0, std::atoll(v)) : int64_t(0);
  }();
  if (ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

/// Test hook (runtime.ft.phases): MESHPLAN_TEST_HOLD="S:PATH" makes a rank
/// that has completed step S wait, before its next step, until PATH exists,
/// which the test creates once the fault it injects has happened: the job
/// cannot end before a restarted group has rejoined, however slowly it
/// starts. An event, not a longer delay. Not for production use.
void meshplan::trainer::holdStepForTests(int64_t stepsDone) {
  static const std::optional<std::pair<int64_t, std::string>> hold =
      []() -> std::optional<std::pair<int64_t, std::string>> {
    const char *v = std::getenv("MESHPLAN_TEST_HOLD");
    if (!v || !*v || !std::strchr(v, ':'))
      return std::nullopt;
    return std::pair{int64_t(std::atoll(v)),
                     std::string(std::strchr(v, ':') + 1)};
  }();
  if (!hold || stepsDone != hold->first)
    return;
  while (::access(hold->second.c_str(), F_OK) != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

/// Test hook: MESHPLAN_TEST_NAN_GRAD_STEP=S writes NaN into the first
/// element of the embedding's gradient at step S (microbatch 0), so that
/// the step's gradient norm is not finite (trainer.optimizer-step checks
/// that every rank skips the update and the run still equals --reference,
/// which poisons the same step).
int64_t meshplan::trainer::nanGradStepForTests() {
  const char *v = std::getenv("MESHPLAN_TEST_NAN_GRAD_STEP");
  return v ? std::atoll(v) : 0;
}

void meshplan::trainer::poisonGradientForTests(ComputeCall &call) {
  static const int64_t step = nanGradStepForTests();
  if (step == 0 || call.step != step || call.microbatch != 0 ||
      call.unit != "tok_embeddings")
    return;
  for (TensorView &g : call.grads)
    if (g.buffer->kind != plan::BufferKind::Activation &&
        g.dtype() == DType::Float32 && g.numElements() > 0) {
      g.as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      return;
    }
}

/// MESHPLAN_TEST_KILL="STEP:RANK[,RANK...][:WHEN]" makes the listed ranks
/// kill themselves with SIGKILL in step STEP, in their group's first
/// incarnation only: at the step's first forward (WHEN "forward", the
/// default) or at its last backward (WHEN "last-backward", the embedding's,
/// when the other units' reductions are in flight). Not for production use.
void meshplan::trainer::maybeKillForTests(const ComputeCall &call,
                                          int64_t rank) {
  static const std::optional<
      std::tuple<int64_t, std::vector<int64_t>, std::string>>
      hook = []()
      -> std::optional<std::tuple<int64_t, std::vector<int64_t>, std::string>> {
    const char *v = std::getenv("MESHPLAN_TEST_KILL");
    const char *inc = std::getenv("MESHPLAN_FT_INCARNATION");
    if (!v || !*v || (inc && *inc && std::string(inc) != "0"))
      return std::nullopt;
    std::string s = v;
    size_t c1 = s.find(':');
    if (c1 == std::string::npos)
      return std::nullopt;
    size_t c2 = s.find(':', c1 + 1);
    std::string ranks = s.substr(
        c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
    std::vector<int64_t> list;
    for (size_t p = 0; p < ranks.size();) {
      size_t q = ranks.find(',', p);
      if (q == std::string::npos)
        q = ranks.size();
      list.push_back(std::atoll(ranks.substr(p, q - p).c_str()));
      p = q + 1;
    }
    return std::tuple{std::atoll(s.substr(0, c1).c_str()), list,
                      c2 == std::string::npos ? std::string("forward")
                                              : s.substr(c2 + 1)};
  }();
  if (!hook || call.step != std::get<0>(*hook) ||
      std::find(std::get<1>(*hook).begin(), std::get<1>(*hook).end(), rank) ==
          std::get<1>(*hook).end())
    return;
  const std::string &phase = std::get<2>(*hook);
  bool now = phase == "forward"
                 ? call.phase == "forward"
                 : call.phase == "backward" && call.unit == "tok_embeddings";
  if (now)
    std::raise(SIGKILL);
}
