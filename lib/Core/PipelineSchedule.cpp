//===- PipelineSchedule.cpp - Pipeline schedules, lowering and check ------===//
//
// The compute orders are re-derived from torch.distributed.pipelining's
// schedules.py (late 2025); each builder names the torch function whose
// order it reproduces. docs/pipeline.md states the rules in prose.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/PipelineSchedule.h"
#include "meshplan/Core/Limits.h"

#include <algorithm>
#include <cassert>

namespace meshplan {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

PipelineAction compute(PipelineOp op, int64_t stage, int64_t microbatch) {
  return PipelineAction{op, static_cast<int32_t>(stage),
                        static_cast<int32_t>(microbatch), -1};
}

const char *opText(PipelineOp op) {
  switch (op) {
  case PipelineOp::Forward:
    return "F";
  case PipelineOp::Backward:
    return "B";
  case PipelineOp::BackwardInput:
    return "I";
  case PipelineOp::BackwardWeight:
    return "W";
  case PipelineOp::SendActivation:
    return "SEND_F";
  case PipelineOp::RecvActivation:
    return "RECV_F";
  case PipelineOp::SendGrad:
    return "SEND_B";
  case PipelineOp::RecvGrad:
    return "RECV_B";
  }
  return "?";
}

//===----------------------------------------------------------------------===//
// Compute orders, one builder per schedule
//===----------------------------------------------------------------------===//

/// ScheduleGPipe._get_pipeline_order: every forward, then every backward,
/// both in microbatch order.
std::vector<PipelineAction> gpipeRank(int64_t rank, int64_t m) {
  std::vector<PipelineAction> ops;
  ops.reserve(2 * m);
  for (int64_t mb = 0; mb < m; ++mb)
    ops.push_back(compute(PipelineOp::Forward, rank, mb));
  for (int64_t mb = 0; mb < m; ++mb)
    ops.push_back(compute(PipelineOp::Backward, rank, mb));
  return ops;
}

/// Schedule1F1B._get_pipeline_order: p-1-r warm-up forwards, then forward
/// and backward alternate until every forward ran, then the remaining
/// backwards. (torch's own runner, _step_microbatches, counts p-r warm-up
/// forwards and then backward-first pairs: the same sequence.)
std::vector<PipelineAction> oneFOneBRank(int64_t rank, int64_t p, int64_t m) {
  std::vector<PipelineAction> ops;
  ops.reserve(2 * m);
  int64_t warmup = std::min(m, p - 1 - rank);
  int64_t fwd = 0, bwd = 0;
  for (; fwd < warmup; ++fwd)
    ops.push_back(compute(PipelineOp::Forward, rank, fwd));
  for (; fwd < m; ++fwd, ++bwd) {
    ops.push_back(compute(PipelineOp::Forward, rank, fwd));
    ops.push_back(compute(PipelineOp::Backward, rank, bwd));
  }
  for (; bwd < m; ++bwd)
    ops.push_back(compute(PipelineOp::Backward, rank, bwd));
  return ops;
}

/// torch's "flex" rounds of ScheduleInterleaved1F1B: microbatches go through
/// a rank's local stages in rounds of max(1, m / p) groups.
int64_t interleavedRounds(int64_t p, int64_t m) {
  return std::max<int64_t>(1, m / p);
}

/// ScheduleInterleaved1F1B._calculate_single_rank_operations with
/// _get_warmup_ops(multiply_factor=2) and _get_1f1b_rank_ops: op k of the
/// forward stream runs local stage (k / mpr) mod v, op k of the backward
/// stream (counted from the first backward) local stage v-1 - (k / mpr) mod
/// v, each stage taking its microbatches in order; warm-up forwards, then
/// forward/backward pairs, then the remaining backwards.
std::vector<PipelineAction> interleavedRank(int64_t rank, int64_t p, int64_t m,
                                            int64_t v) {
  int64_t mpr = m / interleavedRounds(p, m);
  int64_t total = m * v;
  int64_t warmup = std::min((v - 1) * mpr + 2 * (p - 1 - rank), total);
  std::vector<int64_t> fwdNext(v, 0), bwdNext(v, 0);
  std::vector<PipelineAction> ops;
  ops.reserve(2 * total);
  auto forward = [&](int64_t k) {
    int64_t local = (k / mpr) % v;
    ops.push_back(
        compute(PipelineOp::Forward, local * p + rank, fwdNext[local]++));
  };
  auto backward = [&](int64_t k) {
    int64_t local = v - 1 - (k / mpr) % v;
    ops.push_back(
        compute(PipelineOp::Backward, local * p + rank, bwdNext[local]++));
  };
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f)
    forward(f);
  for (; f < total; ++f, ++b) {
    forward(f);
    backward(b);
  }
  for (; b < total; ++b)
    backward(b);
  return ops;
}

/// ScheduleZBVZeroBubble._calculate_single_rank_operations: rank r holds
/// stages r (chunk 0, going down) and 2p-1-r (chunk 1, coming back). The
/// pattern is written for max(2p-1, m) microbatches; actions on microbatches
/// beyond m are then dropped, as torch does.
std::vector<PipelineAction> zbvRank(int64_t rank, int64_t p, int64_t m) {
  int64_t n = std::max(2 * p - 1, m);
  int64_t s0 = rank, s1 = 2 * p - 1 - rank;
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  std::vector<PipelineAction> ops;
  ops.reserve(6 * n);
  auto add = [&](PipelineOp op, int64_t stage, int64_t mb) {
    if (mb < m)
      ops.push_back(compute(op, stage, mb));
  };
  for (int64_t i = 0; i < 2 * (p - rank) - 1; ++i)
    add(PipelineOp::Forward, s0, f0++);
  for (int64_t i = 0; i < rank; ++i) {
    add(PipelineOp::Forward, s1, f1++);
    add(PipelineOp::Forward, s0, f0++);
  }
  for (int64_t i = 0; i < p - rank; ++i) {
    add(PipelineOp::Forward, s1, f1++);
    add(PipelineOp::BackwardInput, s1, b1);
    add(PipelineOp::BackwardWeight, s1, b1++);
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n)
      add(PipelineOp::Forward, s0, f0++);
    add(PipelineOp::BackwardInput, s0, b0);
    add(PipelineOp::BackwardWeight, s0, b0++);
    add(PipelineOp::Forward, s1, f1++);
    add(PipelineOp::BackwardInput, s1, b1);
    add(PipelineOp::BackwardWeight, s1, b1++);
  }
  int64_t w0 = b0, w1 = b1;
  for (int64_t i = 0; i < rank; ++i) {
    add(PipelineOp::BackwardInput, s0, b0++);
    add(PipelineOp::BackwardInput, s1, b1++);
  }
  for (int64_t i = 0; i < p - rank; ++i) {
    add(PipelineOp::BackwardInput, s0, b0++);
    add(PipelineOp::BackwardWeight, s0, w0++);
  }
  while (w1 < b1)
    add(PipelineOp::BackwardWeight, s1, w1++);
  while (w0 < b0)
    add(PipelineOp::BackwardWeight, s0, w0++);
  assert(w0 == b0 && b0 == f0 && w1 == b1 && b1 == f1);
  return ops;
}

//===----------------------------------------------------------------------===//
// Send/recv lowering
//===----------------------------------------------------------------------===//

/// Places sends and receives the way torch's `_add_send_recv` does: ranks
/// take turns in rounds, in rank order; in each round a rank schedules its
/// next compute action if its input is there (received, or produced by the
/// neighbouring stage on the same rank); an action whose output crosses to
/// another rank is followed by its send, and the matching receive is
/// appended to the receiver's list at that moment. Every rank's list is thus
/// a subsequence of one global order in which each send and its receive are
/// adjacent, so the result runs to completion even when every send blocks
/// until its receive is posted.
///
/// torch replays the rounds literally (O(p) per round, O(p^2) rounds for a
/// long pipeline); here each action's round is computed directly: one more
/// than the rank's previous action, and no earlier than the round in which
/// its input's sender ran, plus one when the sender's turn comes after this
/// rank's in a round. Each rank's list is then its compute actions and
/// incoming receives sorted by (round, rank of the acting rank), which is
/// torch's order. O(actions log actions).
Result<PipelineSchedule>
lowerSendRecv(const PipelineScheduleConfig &config,
              std::vector<std::vector<PipelineAction>> computeOrder) {
  PipelineSchedule out;
  out.config = config;
  out.placement = placementOf(config.kind);
  out.splitBackward = config.kind == PipelineScheduleKind::ZeroBubbleV;
  const int64_t p = config.ranks, m = config.microbatches;
  const int64_t numStages = out.numStages();
  auto key = [m](int64_t stage, int64_t mb) { return stage * m + mb; };
  // A table: rankOfStage divides, and this runs for every action.
  std::vector<int32_t> stageRank(numStages);
  for (int64_t st = 0; st < numStages; ++st)
    stageRank[st] = static_cast<int32_t>(rankOfStage(out.placement, p, st));
  auto rankOf = [&](int64_t stage) -> int64_t { return stageRank[stage]; };
  // Round in which F(s, mb) and B/I(s, mb) were scheduled; -1 until then.
  std::vector<int64_t> fRound(numStages * m, -1), bRound(numStages * m, -1);

  // Per action: its round; per rank: the next action to place.
  std::vector<std::vector<int64_t>> rounds(p);
  std::vector<size_t> next(p, 0);
  for (int64_t r = 0; r < p; ++r)
    rounds[r].assign(computeOrder[r].size(), -1);

  // The round from which `a` on rank r may run given its cross-rank input,
  // or -1 when that input has not been scheduled yet. Inputs from a stage on
  // the same rank need no extra bound: they come earlier in the rank's list
  // (the per-rank dependency order is checked by the simulator).
  auto inputRound = [&](const PipelineAction &a, int64_t r) -> int64_t {
    int64_t s = a.stage;
    if (a.op == PipelineOp::Forward && s > 0 && rankOf(s - 1) != r) {
      int64_t t = fRound[key(s - 1, a.microbatch)];
      if (t < 0)
        return -1;
      return rankOf(s - 1) < r ? t : t + 1;
    }
    if ((a.op == PipelineOp::Backward || a.op == PipelineOp::BackwardInput) &&
        s + 1 < numStages && rankOf(s + 1) != r) {
      int64_t t = bRound[key(s + 1, a.microbatch)];
      if (t < 0)
        return -1;
      return rankOf(s + 1) < r ? t : t + 1;
    }
    return 0;
  };

  // Worklist over ranks. A rank waits on one (stage, mb) input at a time,
  // and each output has one consumer rank, so one waiter slot per output.
  std::vector<int32_t> waitF(numStages * m, -1), waitB(numStages * m, -1);
  std::vector<int64_t> work;
  for (int64_t r = p - 1; r >= 0; --r)
    work.push_back(r);
  int64_t placed = 0, total = 0;
  for (const auto &ops : computeOrder)
    total += static_cast<int64_t>(ops.size());
  while (!work.empty()) {
    int64_t r = work.back();
    work.pop_back();
    auto &ops = computeOrder[r];
    while (next[r] < ops.size()) {
      const PipelineAction &a = ops[next[r]];
      int64_t t = inputRound(a, r);
      if (t < 0) {
        // Wake up when the producing stage schedules this microbatch.
        if (a.op == PipelineOp::Forward)
          waitF[key(a.stage - 1, a.microbatch)] = static_cast<int32_t>(r);
        else
          waitB[key(a.stage + 1, a.microbatch)] = static_cast<int32_t>(r);
        break;
      }
      if (next[r] > 0)
        t = std::max(t, rounds[r][next[r] - 1] + 1);
      rounds[r][next[r]] = t;
      ++placed;
      int64_t k = key(a.stage, a.microbatch);
      if (a.op == PipelineOp::Forward) {
        fRound[k] = t;
        if (waitF[k] >= 0)
          work.push_back(waitF[k]);
      } else if (a.op == PipelineOp::Backward ||
                 a.op == PipelineOp::BackwardInput) {
        bRound[k] = t;
        if (waitB[k] >= 0)
          work.push_back(waitB[k]);
      }
      ++next[r];
    }
  }
  if (placed != total) {
    for (int64_t r = 0; r < p; ++r)
      if (next[r] < computeOrder[r].size())
        return makeError("internal error: " +
                         std::string(pipelineScheduleKindName(config.kind)) +
                         " schedule for " + str(p) + " ranks, " + str(m) +
                         " microbatches, " + str(config.stagesPerRank) +
                         " stages per rank never feeds rank " + str(r) +
                         "'s action " + str(static_cast<int64_t>(next[r])) +
                         " (" + formatPipelineAction(computeOrder[r][next[r]]) +
                         ")");
  }

  // Merge: compute actions (each followed by its send) and receives, by
  // (round, acting rank). Sort keys are unique: a rank acts once a round.
  struct Item {
    int64_t round, actor;
    PipelineAction action;
    bool withSend;
  };
  std::vector<std::vector<Item>> items(p);
  for (int64_t r = 0; r < p; ++r)
    items[r].reserve(computeOrder[r].size() * 2);
  for (int64_t r = 0; r < p; ++r) {
    for (size_t i = 0; i < computeOrder[r].size(); ++i) {
      const PipelineAction &a = computeOrder[r][i];
      int64_t s = a.stage;
      int64_t dest = -1;
      if (a.op == PipelineOp::Forward && s + 1 < numStages &&
          rankOf(s + 1) != r) {
        dest = rankOf(s + 1);
        items[dest].push_back(
            Item{rounds[r][i], r,
                 PipelineAction{PipelineOp::RecvActivation, a.stage + 1,
                                a.microbatch, static_cast<int32_t>(r)},
                 false});
      } else if ((a.op == PipelineOp::Backward ||
                  a.op == PipelineOp::BackwardInput) &&
                 s > 0 && rankOf(s - 1) != r) {
        dest = rankOf(s - 1);
        items[dest].push_back(
            Item{rounds[r][i], r,
                 PipelineAction{PipelineOp::RecvGrad, a.stage - 1, a.microbatch,
                                static_cast<int32_t>(r)},
                 false});
      }
      PipelineAction own = a;
      own.peer = static_cast<int32_t>(dest); // the send's peer, kept below
      items[r].push_back(Item{rounds[r][i], r, own, dest >= 0});
    }
  }
  out.ranks.resize(p);
  for (int64_t r = 0; r < p; ++r) {
    auto &list = items[r];
    std::sort(list.begin(), list.end(), [](const Item &x, const Item &y) {
      return x.round != y.round ? x.round < y.round : x.actor < y.actor;
    });
    auto &ops = out.ranks[r];
    ops.reserve(list.size() * 2);
    for (const Item &item : list) {
      PipelineAction a = item.action;
      if (!a.isRecv()) {
        int32_t dest = a.peer;
        a.peer = -1;
        ops.push_back(a);
        if (item.withSend)
          ops.push_back(PipelineAction{a.op == PipelineOp::Forward
                                           ? PipelineOp::SendActivation
                                           : PipelineOp::SendGrad,
                                       a.stage, a.microbatch, dest});
      } else {
        ops.push_back(a);
      }
    }
    ops.shrink_to_fit();
  }
  return out;
}

/// The smallest and largest microbatch counts next to `m` that interleaved
/// rounds accept, for the error message.
std::string nearestInterleavedCounts(int64_t p, int64_t m) {
  auto ok = [p](int64_t k) {
    return k >= 1 && k % interleavedRounds(p, k) == 0;
  };
  int64_t lo = m - 1, hi = m + 1;
  while (lo > 0 && !ok(lo))
    --lo;
  while (!ok(hi))
    ++hi;
  return lo > 0 ? str(lo) + " or " + str(hi) : str(hi);
}

} // namespace

//===----------------------------------------------------------------------===//
// Names and placement
//===----------------------------------------------------------------------===//

std::string_view pipelineScheduleKindName(PipelineScheduleKind kind) {
  switch (kind) {
  case PipelineScheduleKind::GPipe:
    return "gpipe";
  case PipelineScheduleKind::OneFOneB:
    return "1f1b";
  case PipelineScheduleKind::Interleaved1F1B:
    return "interleaved_1f1b";
  case PipelineScheduleKind::ZeroBubbleV:
    return "zbv";
  }
  return "?";
}

Result<PipelineScheduleKind> parsePipelineScheduleKind(std::string_view name) {
  for (auto kind : {PipelineScheduleKind::GPipe, PipelineScheduleKind::OneFOneB,
                    PipelineScheduleKind::Interleaved1F1B,
                    PipelineScheduleKind::ZeroBubbleV})
    if (name == pipelineScheduleKindName(kind))
      return kind;
  return makeError("unknown pipeline schedule \"" + std::string(name) +
                   "\"; expected one of gpipe, 1f1b, interleaved_1f1b, zbv");
}

StagePlacement placementOf(PipelineScheduleKind kind) {
  return kind == PipelineScheduleKind::ZeroBubbleV ? StagePlacement::V
                                                   : StagePlacement::Loop;
}

int64_t rankOfStage(StagePlacement placement, int64_t ranks, int64_t stage) {
  int64_t within = stage % ranks;
  if (placement == StagePlacement::Loop || (stage / ranks) % 2 == 0)
    return within;
  return ranks - 1 - within;
}

int64_t PipelineSchedule::rankOfStage(int64_t stage) const {
  return meshplan::rankOfStage(placement, config.ranks, stage);
}

std::vector<int64_t> stagesOfRank(StagePlacement placement, int64_t ranks,
                                  int64_t stagesPerRank, int64_t rank) {
  std::vector<int64_t> stages;
  stages.reserve(stagesPerRank);
  for (int64_t c = 0; c < stagesPerRank; ++c)
    stages.push_back(c * ranks + (placement == StagePlacement::V && c % 2
                                      ? ranks - 1 - rank
                                      : rank));
  return stages;
}

//===----------------------------------------------------------------------===//
// Validation and building
//===----------------------------------------------------------------------===//

Result<void> checkPipelineScheduleConfig(const PipelineScheduleConfig &config) {
  const int64_t p = config.ranks, m = config.microbatches,
                v = config.stagesPerRank;
  std::string name(pipelineScheduleKindName(config.kind));
  if (p < 1)
    return makeError("pipeline_parallel: the pp axis must have at least 1 "
                     "rank, got " +
                     str(p));
  if (m < 1)
    return makeError(
        "pipeline_parallel: microbatches must be at least 1, got " + str(m));
  if (v < 1)
    return makeError(
        "pipeline_parallel: stages_per_rank must be at least 1, got " + str(v));
  int64_t stages = 0, pairs = 0;
  if (mulOverflows(p, v, &stages) || mulOverflows(stages, m, &pairs) ||
      pairs > kMaxPipelineStageMicrobatches)
    return makeError("pipeline_parallel: " + str(p) + " pp ranks x " + str(v) +
                     " stages per rank x " + str(m) +
                     " microbatches is more than " +
                     kMaxPipelineStageMicrobatchesText +
                     " (stage, microbatch) pairs (docs/limits.md)");
  switch (config.kind) {
  case PipelineScheduleKind::GPipe:
  case PipelineScheduleKind::OneFOneB:
    if (v != 1)
      return makeError("pipeline_parallel: schedule " + name +
                       " runs one stage per rank, got stages_per_rank " +
                       str(v) + "; interleaved_1f1b runs several");
    if (config.kind == PipelineScheduleKind::OneFOneB && m < p)
      return makeError("pipeline_parallel: schedule 1f1b needs at least as "
                       "many microbatches as pp ranks (torch's Schedule1F1B "
                       "requires microbatches >= stages), got " +
                       str(m) + " microbatches for " + str(p) + " ranks");
    break;
  case PipelineScheduleKind::Interleaved1F1B: {
    int64_t rounds = interleavedRounds(p, m);
    if (m % rounds != 0)
      return makeError(
          "pipeline_parallel: schedule interleaved_1f1b needs the "
          "microbatches to be a multiple of the number of rounds max(1, "
          "microbatches / pp ranks) (torch's ScheduleInterleaved1F1B), got " +
          str(m) + " microbatches for " + str(p) + " ranks (" + str(rounds) +
          " rounds); " + nearestInterleavedCounts(p, m) + " would do");
    break;
  }
  case PipelineScheduleKind::ZeroBubbleV:
    if (v != 2)
      return makeError("pipeline_parallel: schedule zbv places exactly 2 "
                       "stages on each rank (a V), got stages_per_rank " +
                       str(v));
    break;
  }
  return {};
}

Result<std::vector<std::vector<PipelineAction>>>
buildPipelineComputeOrder(const PipelineScheduleConfig &config) {
  MESHPLAN_TRY(checkPipelineScheduleConfig(config));
  const int64_t p = config.ranks, m = config.microbatches,
                v = config.stagesPerRank;
  std::vector<std::vector<PipelineAction>> order(p);
  for (int64_t r = 0; r < p; ++r) {
    switch (config.kind) {
    case PipelineScheduleKind::GPipe:
      order[r] = gpipeRank(r, m);
      break;
    case PipelineScheduleKind::OneFOneB:
      order[r] = oneFOneBRank(r, p, m);
      break;
    case PipelineScheduleKind::Interleaved1F1B:
      order[r] = interleavedRank(r, p, m, v);
      break;
    case PipelineScheduleKind::ZeroBubbleV:
      order[r] = zbvRank(r, p, m);
      break;
    }
  }
  return order;
}

Result<PipelineSchedule>
buildPipelineSchedule(const PipelineScheduleConfig &config) {
  auto order = buildPipelineComputeOrder(config);
  if (!order)
    return order.error();
  auto schedule = lowerSendRecv(config, std::move(*order));
  if (!schedule)
    return schedule.error();
  // Never hand out a schedule the check refuses; O(actions), about a tenth
  // of the build at the size limit.
  auto sim = simulatePipelineSchedule(*schedule);
  if (!sim)
    return makeError(
        "internal error: the " +
        std::string(pipelineScheduleKindName(config.kind)) +
        " schedule built for " + str(config.ranks) + " ranks, " +
        str(config.microbatches) + " microbatches and " +
        str(config.stagesPerRank) +
        " stages per rank fails its check: " + sim.error().message);
  return schedule;
}

double textbookBubbleFraction(const PipelineScheduleConfig &config) {
  double p = static_cast<double>(config.ranks);
  double m = static_cast<double>(config.microbatches);
  double v = static_cast<double>(config.stagesPerRank);
  switch (config.kind) {
  case PipelineScheduleKind::GPipe:
  case PipelineScheduleKind::OneFOneB:
    // Idle (p-1)(F+B) per rank next to m(F+B) of work.
    return (p - 1) / (m + p - 1);
  case PipelineScheduleKind::Interleaved1F1B:
    // Narayanan et al.'s bubble, (p-1)/(v m) of the ideal time, as a
    // fraction of the total: the fill shrinks v-fold with the stages.
    return (p - 1) / (v * m + p - 1);
  case PipelineScheduleKind::ZeroBubbleV:
    // ZB-V's bubble (p-1)(F + B - 2W) vanishes for F = I = W; what remains
    // is the one-chunk-forward skew per hop (docs/pipeline.md).
    return (p - 1) / (6 * m + p - 1);
  }
  return 0;
}

//===----------------------------------------------------------------------===//
// Check and simulation
//===----------------------------------------------------------------------===//

namespace {

std::string describe(const PipelineAction &a) {
  std::string text = formatPipelineAction(a);
  if (a.isSend())
    text += " to rank " + str(a.peer);
  else if (a.isRecv())
    text += " from rank " + str(a.peer);
  return text;
}

std::string at(int64_t rank, size_t index, const PipelineAction &a) {
  return "rank " + str(rank) + "'s action " + str(static_cast<int64_t>(index)) +
         " (" + describe(a) + ")";
}

} // namespace

namespace {

/// The list's shape before anything is simulated: the config, one program
/// per rank, costs in range, and no absurd number of actions.
Result<void> checkScheduleShape(const PipelineSchedule &schedule,
                                const PipelineCosts &costs) {
  MESHPLAN_TRY(checkPipelineScheduleConfig(schedule.config));
  const int64_t p = schedule.config.ranks, m = schedule.config.microbatches;
  const int64_t numStages = schedule.numStages();
  if (static_cast<int64_t>(schedule.ranks.size()) != p)
    return makeError("pipeline schedule has " +
                     str(static_cast<int64_t>(schedule.ranks.size())) +
                     " rank programs for " + str(p) + " pp ranks");
  for (int64_t c : {costs.forward, costs.backward, costs.backwardInput,
                    costs.backwardWeight})
    if (c < 0 || c > (int64_t(1) << 32))
      return makeError("pipeline costs must lie in 0..2^32, got " + str(c));
  int64_t actionCount = 0;
  for (const auto &ops : schedule.ranks)
    actionCount += static_cast<int64_t>(ops.size());
  // Seven actions per (stage, microbatch) at most; anything longer repeats
  // an action, so refuse before simulating an absurd list.
  if (actionCount > 7 * numStages * m)
    return makeError("pipeline schedule has " + str(actionCount) +
                     " actions; " + str(numStages) + " stages x " + str(m) +
                     " microbatches need at most " + str(7 * numStages * m));
  return {};
}

/// One simulatePipelineSchedule: the static check (each action in order on
/// its rank, then completeness and send/receive pairing) records where each
/// message's send and receive stand, which the execution then pairs.
class ScheduleSimulator {
public:
  ScheduleSimulator(const PipelineSchedule &schedule,
                    const PipelineCosts &costs)
      : schedule(schedule), costs(costs), p(schedule.config.ranks),
        m(schedule.config.microbatches), numStages(schedule.numStages()),
        stageRank(numStages), done(numStages * m, 0),
        sendFAt(numStages * m, -1), recvFAt(numStages * m, -1),
        sendBAt(numStages * m, -1), recvBAt(numStages * m, -1) {
    for (int64_t st = 0; st < numStages; ++st)
      stageRank[st] = static_cast<int32_t>(schedule.rankOfStage(st));
    sim.peakActivations.assign(p, 0);
  }

  /// Static check, rank by rank: every stage lives on one rank, so the bits
  /// of a stage only change while its rank is walked.
  Result<void> checkActions() {
    for (int64_t r = 0; r < p; ++r) {
      const auto &ops = schedule.ranks[r];
      int64_t live = 0;
      for (size_t i = 0; i < ops.size(); ++i)
        MESHPLAN_TRY(checkAction(r, i, live));
    }
    return {};
  }

  /// Completeness, and every send paired with its receive.
  Result<void> checkCompleteness() const;

  /// Runs the lists to the end, or fails naming the deadlock's cycle.
  Result<void> execute();

  /// The figures of the run `execute` made.
  PipelineSimulation result() &&;

private:
  // Per (stage, microbatch) progress bits of the static check.
  enum : uint8_t {
    kF = 1,
    kB = 2, // B or I ran
    kSplit = 4,
    kW = 8,
    kRecvF = 16,
    kRecvB = 32,
    kSendF = 64,
    kSendB = 128,
  };

  int64_t key(int64_t stage, int64_t mb) const { return stage * m + mb; }
  int64_t rankOf(int64_t stage) const { return stageRank[stage]; }
  // Inlined: they run once per action, and as calls each would build and
  // test a Result (callgrind: +4% instructions for the simulation).
  [[gnu::always_inline]] Result<void> checkAction(int64_t r, size_t i,
                                                  int64_t &live);
  [[gnu::always_inline]] Result<void> checkComputeAction(int64_t r, size_t i,
                                                         int64_t &live);
  [[gnu::always_inline]] Result<void> checkTransferAction(int64_t r, size_t i);
  int64_t partnerOf(const PipelineAction &a) const;
  int64_t cost(PipelineOp op) const;
  Error deadlock() const;

  const PipelineSchedule &schedule;
  const PipelineCosts &costs;
  const int64_t p, m, numStages;
  // A table: rankOfStage divides, and this runs several times per action.
  std::vector<int32_t> stageRank;
  std::vector<uint8_t> done;
  // Index of each message's send and receive in its rank's list, keyed by
  // the sending stage: SEND_F(s)/RECV_F(s+1) at key(s), SEND_B(s)/RECV_B(s-1)
  // at key(s).
  std::vector<int32_t> sendFAt, recvFAt, sendBAt, recvBAt;
  // Execution: each rank's next action and clock.
  std::vector<size_t> pc;
  std::vector<int64_t> clock;
  PipelineSimulation sim;
};

inline Result<void> ScheduleSimulator::checkAction(int64_t r, size_t i,
                                                   int64_t &live) {
  const PipelineAction &a = schedule.ranks[r][i];
  int64_t s = a.stage, mb = a.microbatch;
  if (s < 0 || s >= numStages || mb < 0 || mb >= m ||
      a.op > PipelineOp::RecvGrad)
    return makeError(at(r, i, a) + " names stage " + str(s) + " microbatch " +
                     str(mb) + "; the schedule has " + str(numStages) +
                     " stages and " + str(m) + " microbatches");
  if (rankOf(s) != r)
    return makeError(at(r, i, a) + " runs stage " + str(s) +
                     ", which is on rank " + str(rankOf(s)));
  if (!a.isCompute() == (a.peer < 0))
    return makeError(at(r, i, a) + (a.isCompute()
                                        ? " is compute but names a peer"
                                        : " names no peer rank"));
  return a.isCompute() ? checkComputeAction(r, i, live)
                       : checkTransferAction(r, i);
}

inline Result<void> ScheduleSimulator::checkComputeAction(int64_t r, size_t i,
                                                          int64_t &live) {
  const PipelineAction &a = schedule.ranks[r][i];
  int64_t s = a.stage, mb = a.microbatch;
  uint8_t &bits = done[key(s, mb)];
  bool prevHere = s > 0 && rankOf(s - 1) == r;
  bool nextHere = s + 1 < numStages && rankOf(s + 1) == r;
  auto twice = [&](const char *what) {
    return makeError(at(r, i, a) + " repeats " + what + " of stage " + str(s) +
                     " microbatch " + str(mb));
  };
  switch (a.op) {
  case PipelineOp::Forward:
    if (bits & kF)
      return twice("the forward");
    if (s > 0 && !(prevHere ? (done[key(s - 1, mb)] & kF) : (bits & kRecvF)))
      return makeError(at(r, i, a) + " runs before its input: " +
                       (prevHere ? "F of stage " + str(s - 1) + " on this rank"
                                 : std::string("RECV_F")) +
                       " comes later or never");
    bits |= kF;
    sim.peakActivations[r] = std::max(sim.peakActivations[r], ++live);
    return {};
  case PipelineOp::Backward:
  case PipelineOp::BackwardInput:
    if (bits & kB)
      return twice("the backward");
    if (!(bits & kF))
      return makeError(at(r, i, a) + " runs before the forward of stage " +
                       str(s) + " microbatch " + str(mb));
    if (s + 1 < numStages &&
        !(nextHere ? (done[key(s + 1, mb)] & kB) : (bits & kRecvB)))
      return makeError(
          at(r, i, a) + " runs before its output gradient: " +
          (nextHere ? "the backward of stage " + str(s + 1) + " on this rank"
                    : std::string("RECV_B")) +
          " comes later or never");
    bits |= kB;
    if (a.op == PipelineOp::BackwardInput)
      bits |= kSplit;
    --live;
    return {};
  case PipelineOp::BackwardWeight:
    if (bits & kW)
      return twice("the weight gradient");
    if (!(bits & kSplit))
      return makeError(at(r, i, a) +
                       " runs before the input gradient (I) of stage " +
                       str(s) + " microbatch " + str(mb));
    bits |= kW;
    return {};
  default:
    return {};
  }
}

inline Result<void> ScheduleSimulator::checkTransferAction(int64_t r,
                                                           size_t i) {
  const PipelineAction &a = schedule.ranks[r][i];
  int64_t s = a.stage, mb = a.microbatch;
  uint8_t &bits = done[key(s, mb)];
  bool prevHere = s > 0 && rankOf(s - 1) == r;
  bool nextHere = s + 1 < numStages && rankOf(s + 1) == r;
  auto twice = [&](const char *what) {
    return makeError(at(r, i, a) + " repeats " + what + " of stage " + str(s) +
                     " microbatch " + str(mb));
  };
  auto wrongPeer = [&](int64_t expected) {
    return makeError(at(r, i, a) + " names peer rank " + str(a.peer) +
                     "; stage " + str(s) + "'s neighbour is on rank " +
                     str(expected));
  };
  auto noComm = [&](const char *why) {
    return makeError(at(r, i, a) + " is not needed: " + why);
  };
  switch (a.op) {
  case PipelineOp::SendActivation:
    if (s + 1 >= numStages || nextHere)
      return noComm(s + 1 >= numStages ? "the last stage sends no activation"
                                       : "the next stage is on the same rank");
    if (a.peer != rankOf(s + 1))
      return wrongPeer(rankOf(s + 1));
    if (bits & kSendF)
      return twice("SEND_F");
    if (!(bits & kF))
      return makeError(at(r, i, a) + " sends before the forward ran");
    bits |= kSendF;
    sendFAt[key(s, mb)] = static_cast<int32_t>(i);
    return {};
  case PipelineOp::RecvActivation:
    if (s == 0 || prevHere)
      return noComm(s == 0 ? "the first stage receives no activation"
                           : "the previous stage is on the same rank");
    if (a.peer != rankOf(s - 1))
      return wrongPeer(rankOf(s - 1));
    if (bits & kRecvF)
      return twice("RECV_F");
    bits |= kRecvF;
    recvFAt[key(s - 1, mb)] = static_cast<int32_t>(i);
    return {};
  case PipelineOp::SendGrad:
    if (s == 0 || prevHere)
      return noComm(s == 0 ? "the first stage sends no gradient"
                           : "the previous stage is on the same rank");
    if (a.peer != rankOf(s - 1))
      return wrongPeer(rankOf(s - 1));
    if (bits & kSendB)
      return twice("SEND_B");
    if (!(bits & kB))
      return makeError(at(r, i, a) + " sends before the backward ran");
    bits |= kSendB;
    sendBAt[key(s, mb)] = static_cast<int32_t>(i);
    return {};
  case PipelineOp::RecvGrad:
    if (s + 1 >= numStages || nextHere)
      return noComm(s + 1 >= numStages ? "the last stage receives no gradient"
                                       : "the next stage is on the same rank");
    if (a.peer != rankOf(s + 1))
      return wrongPeer(rankOf(s + 1));
    if (bits & kRecvB)
      return twice("RECV_B");
    bits |= kRecvB;
    recvBAt[key(s + 1, mb)] = static_cast<int32_t>(i);
    return {};
  default:
    return {};
  }
}

Result<void> ScheduleSimulator::checkCompleteness() const {
  for (int64_t s = 0; s < numStages; ++s) {
    for (int64_t mb = 0; mb < m; ++mb) {
      uint8_t bits = done[key(s, mb)];
      auto what = [&] {
        return "stage " + str(s) + " microbatch " + str(mb) + " (rank " +
               str(rankOf(s)) + ")";
      };
      if (!(bits & kF))
        return makeError(what() + " has no forward");
      if (!(bits & kB))
        return makeError(what() + " has no backward");
      if ((bits & kSplit) && !(bits & kW))
        return makeError(what() + " has an input gradient (I) but no weight "
                                  "gradient (W)");
      if (s + 1 < numStages && rankOf(s + 1) != rankOf(s)) {
        int64_t q = rankOf(s + 1);
        if (sendFAt[key(s, mb)] < 0)
          return makeError(what() + " never sends its activation to rank " +
                           str(q));
        if (recvFAt[key(s, mb)] < 0)
          return makeError(at(rankOf(s), sendFAt[key(s, mb)],
                              schedule.ranks[rankOf(s)][sendFAt[key(s, mb)]]) +
                           " has no matching RECV_F of stage " + str(s + 1) +
                           " microbatch " + str(mb) + " on rank " + str(q));
      }
      if (s > 0 && rankOf(s - 1) != rankOf(s)) {
        int64_t q = rankOf(s - 1);
        if (sendBAt[key(s, mb)] < 0)
          return makeError(what() + " never sends its input gradient to rank " +
                           str(q));
        if (recvBAt[key(s, mb)] < 0)
          return makeError(at(rankOf(s), sendBAt[key(s, mb)],
                              schedule.ranks[rankOf(s)][sendBAt[key(s, mb)]]) +
                           " has no matching RECV_B of stage " + str(s - 1) +
                           " microbatch " + str(mb) + " on rank " + str(q));
      }
    }
  }
  // (A receive whose send is missing was caught above: every send that must
  // exist does, and each receive sits at the key of the send it matches.)
  return {};
}

/// The index of the action that completes together with `a`.
int64_t ScheduleSimulator::partnerOf(const PipelineAction &a) const {
  switch (a.op) {
  case PipelineOp::SendActivation:
    return recvFAt[key(a.stage, a.microbatch)];
  case PipelineOp::RecvActivation:
    return sendFAt[key(a.stage - 1, a.microbatch)];
  case PipelineOp::SendGrad:
    return recvBAt[key(a.stage, a.microbatch)];
  case PipelineOp::RecvGrad:
    return sendBAt[key(a.stage + 1, a.microbatch)];
  default:
    return -1;
  }
}

int64_t ScheduleSimulator::cost(PipelineOp op) const {
  switch (op) {
  case PipelineOp::Forward:
    return costs.forward;
  case PipelineOp::Backward:
    return costs.backward;
  case PipelineOp::BackwardInput:
    return costs.backwardInput;
  case PipelineOp::BackwardWeight:
    return costs.backwardWeight;
  default:
    return int64_t(0);
  }
}

// Completion is decided under rendezvous: a send and its receive complete
// together once both ranks have reached them. Time is measured the way the
// runtime overlaps communication (sends and receives are posted where they
// stand and cost nothing; a compute action starts when its rank is free and
// its cross-rank input has been computed), so the bubble is that of the
// compute order, not of the blocking model. Both follow from the lists
// alone, so the order in which ranks are advanced does not matter.
Result<void> ScheduleSimulator::execute() {
  pc.assign(p, 0);
  clock.assign(p, 0);
  std::vector<int64_t> fEnd(numStages * m, 0), bEnd(numStages * m, 0);
  sim.busy.assign(p, 0);
  std::vector<int64_t> work;
  for (int64_t r = p - 1; r >= 0; --r)
    work.push_back(r);
  while (!work.empty()) {
    int64_t r = work.back();
    work.pop_back();
    const auto &ops = schedule.ranks[r];
    while (pc[r] < ops.size()) {
      const PipelineAction &a = ops[pc[r]];
      if (a.isCompute()) {
        int64_t s = a.stage, k = key(s, a.microbatch);
        int64_t start = clock[r];
        // Inputs from a stage on the same rank finished before clock[r].
        if (a.op == PipelineOp::Forward && s > 0)
          start = std::max(start, fEnd[key(s - 1, a.microbatch)]);
        if ((a.op == PipelineOp::Backward ||
             a.op == PipelineOp::BackwardInput) &&
            s + 1 < numStages)
          start = std::max(start, bEnd[key(s + 1, a.microbatch)]);
        clock[r] = start + cost(a.op);
        sim.busy[r] += cost(a.op);
        if (a.op == PipelineOp::Forward)
          fEnd[k] = clock[r];
        else if (a.op != PipelineOp::BackwardWeight)
          bEnd[k] = clock[r];
        ++pc[r];
        continue;
      }
      int64_t q = a.peer;
      if (pc[q] != static_cast<size_t>(partnerOf(a)))
        break; // blocked until q reaches the partner action
      ++pc[r];
      ++pc[q];
      work.push_back(q);
    }
  }
  for (int64_t r = 0; r < p; ++r)
    if (pc[r] < schedule.ranks[r].size())
      return deadlock();
  return {};
}

Error ScheduleSimulator::deadlock() const {
  std::vector<int64_t> blocked;
  for (int64_t r = 0; r < p; ++r)
    if (pc[r] < schedule.ranks[r].size())
      blocked.push_back(r);
  // Each blocked rank waits for exactly one other (its current action's
  // peer), which is blocked too, since the partner action lies ahead of it;
  // following the waits from any blocked rank must close a cycle.
  std::vector<int64_t> seenAt(p, -1);
  std::vector<int64_t> path;
  int64_t r = blocked.front();
  while (seenAt[r] < 0) {
    seenAt[r] = static_cast<int64_t>(path.size());
    path.push_back(r);
    r = schedule.ranks[r][pc[r]].peer;
  }
  std::string msg = "pipeline schedule deadlocks under blocking send/recv (" +
                    str(static_cast<int64_t>(blocked.size())) + " of " +
                    str(p) + " ranks stuck): ";
  std::string cycle = "rank " + str(r);
  for (size_t k = static_cast<size_t>(seenAt[r]); k < path.size(); ++k) {
    int64_t x = path[k];
    const PipelineAction &a = schedule.ranks[x][pc[x]];
    int64_t q = a.peer, j = partnerOf(a);
    if (k > static_cast<size_t>(seenAt[r]))
      msg += "; ";
    msg += "rank " + str(x) + " is blocked at its action " +
           str(static_cast<int64_t>(pc[x])) + " (" + describe(a) +
           ") until rank " + str(q) + " reaches its action " + str(j) + " (" +
           describe(schedule.ranks[q][j]) + ")";
    cycle += " -> rank " + str(q);
  }
  msg += "; cycle: " + cycle;
  return makeError(msg);
}

PipelineSimulation ScheduleSimulator::result() && {
  sim.finish = clock;
  for (int64_t t : clock)
    sim.makespan = std::max(sim.makespan, t);
  if (sim.makespan > 0) {
    double idle = 0;
    for (int64_t r = 0; r < p; ++r)
      idle += static_cast<double>(sim.makespan - sim.busy[r]);
    sim.bubbleFraction =
        idle / (static_cast<double>(p) * static_cast<double>(sim.makespan));
  }
  return std::move(sim);
}

} // namespace

Result<PipelineSimulation>
simulatePipelineSchedule(const PipelineSchedule &schedule,
                         const PipelineCosts &costs) {
  MESHPLAN_TRY(checkScheduleShape(schedule, costs));
  ScheduleSimulator simulator(schedule, costs);
  MESHPLAN_TRY(simulator.checkActions());
  MESHPLAN_TRY(simulator.checkCompleteness());
  MESHPLAN_TRY(simulator.execute());
  return std::move(simulator).result();
}

//===----------------------------------------------------------------------===//
// Text
//===----------------------------------------------------------------------===//

std::string formatPipelineAction(const PipelineAction &action) {
  return str(action.stage) + opText(action.op) + str(action.microbatch);
}

std::string formatPipelineSchedule(const PipelineSchedule &schedule,
                                   bool computeOnly) {
  std::string out;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    out += "rank " + str(static_cast<int64_t>(r)) + ":";
    for (const PipelineAction &a : schedule.ranks[r]) {
      if (computeOnly && !a.isCompute())
        continue;
      out += ' ';
      out += formatPipelineAction(a);
    }
    out += '\n';
  }
  return out;
}

} // namespace meshplan
