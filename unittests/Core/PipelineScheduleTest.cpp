//===- PipelineScheduleTest.cpp - Pipeline schedules against references ---===//
//
// Sweep: for every (p in 1..8, m in 1..24, v in 1..4) and every schedule,
// either the configuration is refused exactly when the test's own statement
// of torch's rules refuses it, or the built schedule
//  - runs every (stage, microbatch)'s F and B (or I and W) exactly once, on
//    the rank the test's own placement table names;
//  - has the compute order of an independent reference written here from
//    torch's documented algorithms (1f1b from Schedule1F1B's runtime loop,
//    interleaved_1f1b in closed form from ScheduleInterleaved1F1B's rounds,
//    gpipe from ScheduleGPipe), not by calling the implementation;
//  - has the sends and receives a literal replay of torch's `_add_send_recv`
//    rounds would place;
//  - runs to completion in a naive lock-step rendezvous interpreter written
//    here, in which every dependency (F(s) after F(s-1), B(s) after B(s+1)
//    and F(s), W after I) holds in global time;
//  - simulates without deadlock, with the textbook bubble.
// Then: a schedule with two sends swapped deadlocks and is reported with both
// ranks, their actions and the cycle; bad configurations and malformed action
// lists are refused with messages; the check is fast at scale.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/PipelineSchedule.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

using namespace meshplan;

namespace {

using Kind = PipelineScheduleKind;
using Op = PipelineOp;
using Order = std::vector<std::vector<PipelineAction>>;

const Kind kKinds[] = {Kind::GPipe, Kind::OneFOneB, Kind::Interleaved1F1B,
                       Kind::ZeroBubbleV};

std::string where(Kind kind, int64_t p, int64_t m, int64_t v) {
  return std::string(pipelineScheduleKindName(kind)) +
         " p=" + std::to_string(p) + " m=" + std::to_string(m) +
         " v=" + std::to_string(v);
}

PipelineAction act(Op op, int64_t stage, int64_t mb, int64_t peer = -1) {
  return PipelineAction{op, static_cast<int32_t>(stage),
                        static_cast<int32_t>(mb), static_cast<int32_t>(peer)};
}

/// torch's constructor checks, restated.
bool validPerTorch(Kind kind, int64_t p, int64_t m, int64_t v) {
  switch (kind) {
  case Kind::GPipe:
    return v == 1;
  case Kind::OneFOneB:
    return v == 1 && m >= p; // Schedule1F1B: n_microbatches >= num_stages
  case Kind::Interleaved1F1B: {
    int64_t rounds = m / p > 1 ? m / p : 1; // number_of_rounds
    return m % rounds == 0;
  }
  case Kind::ZeroBubbleV:
    return v == 2; // "ZBV requires exactly 2 stages per rank"
  }
  return false;
}

/// Stage -> rank as a table: loop deals stages round-robin; V walks down the
/// ranks and back up, turning at either end (torch's
/// generate_stage_to_rank_mapping(style="v")).
std::vector<int64_t> stageTable(Kind kind, int64_t p, int64_t v) {
  std::vector<int64_t> table;
  if (kind != Kind::ZeroBubbleV) {
    for (int64_t s = 0; s < p * v; ++s)
      table.push_back(s % p);
    return table;
  }
  int64_t r = 0, dir = 1;
  for (int64_t s = 0; s < p * v; ++s) {
    table.push_back(r);
    if ((s + 1) % p == 0)
      dir = -dir; // stay on the turning rank for the next stage
    else
      r += dir;
  }
  return table;
}

//===----------------------------------------------------------------------===//
// Reference compute orders
//===----------------------------------------------------------------------===//

/// Schedule1F1B._step_microbatches: warm up with min(m, p - r) forwards,
/// then backward-then-forward pairs while forwards remain, then the rest of
/// the backwards.
std::vector<PipelineAction> ref1F1B(int64_t r, int64_t p, int64_t m) {
  std::vector<PipelineAction> out;
  int64_t warm = std::min(m, p - r), fwd = 0, bwd = 0;
  while (fwd < warm)
    out.push_back(act(Op::Forward, r, fwd++));
  while (true) {
    out.push_back(act(Op::Backward, r, bwd++));
    if (fwd == m)
      break;
    out.push_back(act(Op::Forward, r, fwd++));
  }
  while (bwd < m)
    out.push_back(act(Op::Backward, r, bwd++));
  return out;
}

/// ScheduleInterleaved1F1B in closed form: with R = max(1, m / p) rounds of
/// n = m / R microbatches, the k-th forward of a rank runs chunk (k / n) mod
/// v on microbatch (k / (n v)) n + k mod n, the k-th backward chunk
/// v-1 - (k / n) mod v on the same microbatch formula; the rank warms up
/// with min((v-1) n + 2 (p-1-r), m v) forwards, then alternates forward and
/// backward, then drains the backwards.
std::vector<PipelineAction> refInterleaved(int64_t r, int64_t p, int64_t m,
                                           int64_t v) {
  int64_t rounds = std::max<int64_t>(1, m / p), n = m / rounds;
  int64_t total = m * v;
  int64_t warm = std::min((v - 1) * n + 2 * (p - 1 - r), total);
  auto mbOf = [&](int64_t k) { return (k / (n * v)) * n + k % n; };
  auto fwd = [&](int64_t k) {
    return act(Op::Forward, ((k / n) % v) * p + r, mbOf(k));
  };
  auto bwd = [&](int64_t k) {
    return act(Op::Backward, (v - 1 - (k / n) % v) * p + r, mbOf(k));
  };
  std::vector<PipelineAction> out;
  for (int64_t k = 0; k < warm; ++k)
    out.push_back(fwd(k));
  for (int64_t j = 0; j < total - warm; ++j) {
    out.push_back(fwd(warm + j));
    out.push_back(bwd(j));
  }
  for (int64_t j = total - warm; j < total; ++j)
    out.push_back(bwd(j));
  return out;
}

std::vector<PipelineAction> refGPipe(int64_t r, int64_t m) {
  std::vector<PipelineAction> out;
  for (int64_t mb = 0; mb < m; ++mb)
    out.push_back(act(Op::Forward, r, mb));
  for (int64_t mb = 0; mb < m; ++mb)
    out.push_back(act(Op::Backward, r, mb));
  return out;
}

//===----------------------------------------------------------------------===//
// Literal replay of torch's _add_send_recv
//===----------------------------------------------------------------------===//

Order refLowering(Order compute, const std::vector<int64_t> &rankOf) {
  int64_t p = static_cast<int64_t>(compute.size());
  int64_t numStages = static_cast<int64_t>(rankOf.size());
  Order out(p);
  std::vector<std::set<std::tuple<int, int, int>>> prev(p);
  auto has = [&](int64_t r, Op op, int64_t s, int64_t mb) {
    return prev[r].count({static_cast<int>(op), static_cast<int>(s),
                          static_cast<int>(mb)}) > 0;
  };
  auto add = [&](int64_t r, const PipelineAction &a) {
    out[r].push_back(a);
    prev[r].insert({static_cast<int>(a.op), a.stage, a.microbatch});
  };
  std::vector<size_t> next(p, 0);
  bool left = true;
  while (left) {
    left = false;
    bool progress = false;
    for (int64_t r = 0; r < p; ++r) {
      if (next[r] == compute[r].size())
        continue;
      left = true;
      PipelineAction a = compute[r][next[r]];
      int64_t s = a.stage, mb = a.microbatch;
      bool ready = true;
      if (a.op == Op::Forward && s != 0)
        ready =
            has(r, Op::RecvActivation, s, mb) || has(r, Op::Forward, s - 1, mb);
      if ((a.op == Op::Backward || a.op == Op::BackwardInput) &&
          s != numStages - 1)
        ready = has(r, Op::RecvGrad, s, mb) ||
                has(r, Op::BackwardInput, s + 1, mb) ||
                has(r, Op::Backward, s + 1, mb);
      if (!ready)
        continue;
      add(r, a);
      if (a.op == Op::Forward && s != numStages - 1 &&
          rankOf[s + 1] != rankOf[s]) {
        add(r, act(Op::SendActivation, s, mb, rankOf[s + 1]));
        add(rankOf[s + 1], act(Op::RecvActivation, s + 1, mb, r));
      }
      if ((a.op == Op::Backward || a.op == Op::BackwardInput) && s != 0 &&
          rankOf[s - 1] != rankOf[s]) {
        add(r, act(Op::SendGrad, s, mb, rankOf[s - 1]));
        add(rankOf[s - 1], act(Op::RecvGrad, s - 1, mb, r));
      }
      ++next[r];
      progress = true;
    }
    if (left && !progress) {
      ADD_FAILURE() << "reference lowering is stuck";
      return out;
    }
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Naive rendezvous interpreter
//===----------------------------------------------------------------------===//

/// Runs all ranks in lock step; a send or receive completes only in a step
/// in which its peer's next action is the matching receive or send. Returns
/// the step at which each compute action (op, stage, mb) completed, or an
/// empty map on deadlock.
std::map<std::tuple<int, int, int>, int64_t> interpret(const Order &ranks) {
  std::map<std::tuple<int, int, int>, int64_t> when;
  int64_t p = static_cast<int64_t>(ranks.size());
  std::vector<size_t> pc(p, 0);
  auto matches = [](const PipelineAction &x, const PipelineAction &y) {
    if (x.op == Op::SendActivation)
      return y.op == Op::RecvActivation && y.stage == x.stage + 1 &&
             y.microbatch == x.microbatch;
    if (x.op == Op::SendGrad)
      return y.op == Op::RecvGrad && y.stage == x.stage - 1 &&
             y.microbatch == x.microbatch;
    return false;
  };
  int64_t step = 0;
  while (true) {
    bool done = true, progress = false;
    ++step;
    for (int64_t r = 0; r < p; ++r) {
      if (pc[r] == ranks[r].size())
        continue;
      done = false;
      const PipelineAction &a = ranks[r][pc[r]];
      if (a.isCompute()) {
        when[{static_cast<int>(a.op), a.stage, a.microbatch}] = step;
        ++pc[r];
        progress = true;
        continue;
      }
      if (!a.isSend())
        continue; // receives complete with their send
      int64_t q = a.peer;
      if (pc[q] < ranks[q].size() && matches(a, ranks[q][pc[q]])) {
        ++pc[r];
        ++pc[q];
        progress = true;
      }
    }
    if (done)
      return when;
    if (!progress)
      return {};
  }
}

//===----------------------------------------------------------------------===//
// The sweep
//===----------------------------------------------------------------------===//

void checkOne(Kind kind, int64_t p, int64_t m, int64_t v) {
  std::string at = where(kind, p, m, v);
  PipelineScheduleConfig config{kind, p, m, v};
  auto checked = checkPipelineScheduleConfig(config);
  bool valid = validPerTorch(kind, p, m, v);
  ASSERT_EQ(checked.ok(), valid)
      << at << (checked.ok() ? "" : ": " + checked.error().message);
  if (!valid) {
    EXPECT_FALSE(buildPipelineSchedule(config).ok()) << at;
    return;
  }
  auto schedule = buildPipelineSchedule(config);
  ASSERT_TRUE(schedule.ok()) << at << ": " << schedule.error().message;
  const Order &ranks = schedule->ranks;
  ASSERT_EQ(static_cast<int64_t>(ranks.size()), p) << at;
  int64_t numStages = p * v;
  std::vector<int64_t> table = stageTable(kind, p, v);
  for (int64_t s = 0; s < numStages; ++s)
    ASSERT_EQ(schedule->rankOfStage(s), table[s]) << at << " stage " << s;
  for (int64_t r = 0; r < p; ++r) {
    std::vector<int64_t> expected;
    for (int64_t s = 0; s < numStages; ++s)
      if (table[s] == r)
        expected.push_back(s);
    ASSERT_EQ(stagesOfRank(placementOf(kind), p, v, r), expected) << at;
  }

  // Exactly one F and one B, or one I and one W, per (stage, microbatch),
  // each on its stage's rank.
  bool split = kind == Kind::ZeroBubbleV;
  std::map<std::tuple<int, int, int>, int> count;
  Order compute(p);
  for (int64_t r = 0; r < p; ++r)
    for (const PipelineAction &a : ranks[r]) {
      ASSERT_EQ(table[a.stage], r) << at << ": " << formatPipelineAction(a);
      if (a.isCompute()) {
        ++count[{static_cast<int>(a.op), a.stage, a.microbatch}];
        compute[r].push_back(a);
      }
    }
  for (int64_t s = 0; s < numStages; ++s)
    for (int64_t mb = 0; mb < m; ++mb) {
      auto n = [&](Op op) {
        auto it = count.find(
            {static_cast<int>(op), static_cast<int>(s), static_cast<int>(mb)});
        return it == count.end() ? 0 : it->second;
      };
      ASSERT_EQ(n(Op::Forward), 1) << at << " stage " << s << " mb " << mb;
      ASSERT_EQ(n(Op::Backward), split ? 0 : 1)
          << at << " s" << s << " mb" << mb;
      ASSERT_EQ(n(Op::BackwardInput), split ? 1 : 0) << at;
      ASSERT_EQ(n(Op::BackwardWeight), split ? 1 : 0) << at;
    }

  // The compute order against torch's algorithms.
  auto order = buildPipelineComputeOrder(config);
  ASSERT_TRUE(order.ok()) << at;
  EXPECT_EQ(*order, compute) << at
                             << ": compute order differs between "
                                "buildPipelineComputeOrder and the "
                                "schedule";
  for (int64_t r = 0; r < p; ++r) {
    if (kind == Kind::OneFOneB) {
      ASSERT_EQ(compute[r], ref1F1B(r, p, m)) << at << " rank " << r;
    }
    if (kind == Kind::Interleaved1F1B) {
      ASSERT_EQ(compute[r], refInterleaved(r, p, m, v)) << at << " rank " << r;
    }
    if (kind == Kind::GPipe) {
      ASSERT_EQ(compute[r], refGPipe(r, m)) << at << " rank " << r;
    }
  }

  // Sends and receives where torch's lowering puts them.
  Order lowered = refLowering(compute, table);
  for (int64_t r = 0; r < p; ++r)
    ASSERT_EQ(ranks[r], lowered[r]) << at << " rank " << r << "\n"
                                    << formatPipelineSchedule(*schedule);

  // Runs under rendezvous; dependencies hold in global time.
  auto when = interpret(ranks);
  ASSERT_FALSE(when.empty()) << at << ": the naive interpreter deadlocks";
  auto t = [&](Op op, int64_t s, int64_t mb) {
    return when.at(
        {static_cast<int>(op), static_cast<int>(s), static_cast<int>(mb)});
  };
  Op back = split ? Op::BackwardInput : Op::Backward;
  for (int64_t s = 0; s < numStages; ++s)
    for (int64_t mb = 0; mb < m; ++mb) {
      if (s > 0) {
        ASSERT_GT(t(Op::Forward, s, mb), t(Op::Forward, s - 1, mb)) << at;
      }
      if (s + 1 < numStages) {
        ASSERT_GT(t(back, s, mb), t(back, s + 1, mb)) << at;
      }
      ASSERT_GT(t(back, s, mb), t(Op::Forward, s, mb)) << at;
      if (split) {
        ASSERT_GT(t(Op::BackwardWeight, s, mb), t(back, s, mb)) << at;
      }
    }

  // The simulator agrees, and the bubble is the textbook one.
  auto sim = simulatePipelineSchedule(*schedule);
  ASSERT_TRUE(sim.ok()) << at << ": " << sim.error().message;
  int64_t work = (split ? 3 : 3) * m * v; // F + B, or F + I + W, per stage
  for (int64_t r = 0; r < p; ++r)
    ASSERT_EQ(sim->busy[r], work) << at;
  double textbook = textbookBubbleFraction(config);
  double measured = sim->bubbleFraction;
  switch (kind) {
  case Kind::GPipe:
  case Kind::OneFOneB:
    EXPECT_EQ(sim->makespan, 3 * (m + p - 1)) << at;
    EXPECT_NEAR(measured, textbook, 1e-12) << at;
    break;
  case Kind::Interleaved1F1B:
    // Exact when every round fills the pipeline; with fewer microbatches
    // than ranks torch's rounds are short, and the bubble lies between the
    // interleaved and the plain 1F1B figures.
    if (m >= p) {
      EXPECT_EQ(sim->makespan, 3 * (v * m + p - 1)) << at;
      EXPECT_NEAR(measured, textbook, 1e-12) << at;
    } else {
      EXPECT_GE(measured, textbook - 1e-12) << at;
      EXPECT_LE(measured, double(p - 1) / double(m + p - 1) + 1e-12) << at;
    }
    break;
  case Kind::ZeroBubbleV:
    if (m >= 2 * p - 1) {
      EXPECT_EQ(sim->makespan, 6 * m + p - 1) << at;
      EXPECT_NEAR(measured, textbook, 1e-12) << at;
    } else {
      EXPECT_GE(measured, textbook - 1e-12) << at;
    }
    break;
  }
  // In-flight activations: 1F1B holds at most p - r on rank r, GPipe m.
  for (int64_t r = 0; r < p; ++r) {
    if (kind == Kind::OneFOneB) {
      EXPECT_EQ(sim->peakActivations[r], std::min(m, p - r)) << at;
    }
    if (kind == Kind::GPipe) {
      EXPECT_EQ(sim->peakActivations[r], m) << at;
    }
  }
}

TEST(PipelineSchedule, Sweep) {
  int64_t built = 0;
  for (Kind kind : kKinds)
    for (int64_t p = 1; p <= 8; ++p)
      for (int64_t m = 1; m <= 24; ++m)
        for (int64_t v = 1; v <= 4; ++v) {
          checkOne(kind, p, m, v);
          if (HasFatalFailure())
            return;
          built += validPerTorch(kind, p, m, v);
        }
  EXPECT_GT(built, 1000);
}

//===----------------------------------------------------------------------===//
// Fixed examples
//===----------------------------------------------------------------------===//

Order computeOf(const PipelineSchedule &s) {
  Order out(s.ranks.size());
  for (size_t r = 0; r < s.ranks.size(); ++r)
    for (const PipelineAction &a : s.ranks[r])
      if (a.isCompute())
        out[r].push_back(a);
  return out;
}

std::string rankText(const std::vector<PipelineAction> &ops) {
  std::string out;
  for (const PipelineAction &a : ops) {
    if (!out.empty())
      out += ' ';
    out += formatPipelineAction(a);
  }
  return out;
}

// The worked example of docs/pipeline.md (p = 4, m = 8), worked out by hand
// from torch's algorithms for the same sizes.
TEST(PipelineSchedule, WorkedExample) {
  auto oneF = buildPipelineSchedule({Kind::OneFOneB, 4, 8, 1});
  ASSERT_TRUE(oneF.ok());
  Order c = computeOf(*oneF);
  EXPECT_EQ(rankText(c[0]), "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 "
                            "0B4 0B5 0B6 0B7");
  EXPECT_EQ(rankText(c[3]), "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 "
                            "3F6 3B6 3F7 3B7");
  auto inter = buildPipelineSchedule({Kind::Interleaved1F1B, 4, 8, 2});
  ASSERT_TRUE(inter.ok());
  c = computeOf(*inter);
  EXPECT_EQ(rankText(c[0]), "0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 0F6 4B0 "
                            "0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 0B2 0B3 "
                            "4B4 4B5 4B6 4B7 0B4 0B5 0B6 0B7");
  EXPECT_EQ(rankText(c[3]), "3F0 3F1 3F2 3F3 7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 "
                            "3F4 3B0 3F5 3B1 3F6 3B2 3F7 3B3 7F4 7B4 7F5 7B5 "
                            "7F6 7B6 7F7 7B7 3B4 3B5 3B6 3B7");
  auto zbv = buildPipelineSchedule({Kind::ZeroBubbleV, 4, 8, 2});
  ASSERT_TRUE(zbv.ok());
  c = computeOf(*zbv);
  EXPECT_EQ(rankText(c[3]),
            "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 4I0 4W0 3F4 3I0 3W0 4F4 4I1 4W1 "
            "3F5 3I1 3W1 4F5 4I2 4W2 3F6 3I2 3W2 4F6 4I3 4W3 3F7 3I3 3W3 4F7 "
            "4I4 4W4 3I4 4I5 3I5 4I6 3I6 4I7 3I7 3W4 4W5 4W6 4W7 3W5 3W6 3W7");
  // With comms: the last 1F1B rank receives activations and sends gradients.
  EXPECT_EQ(rankText(std::vector<PipelineAction>(oneF->ranks[3].begin(),
                                                 oneF->ranks[3].begin() + 6)),
            "3RECV_F0 3F0 3RECV_F1 3B0 3SEND_B0 3F1");
  EXPECT_EQ(oneF->ranks[3][4].peer, 2);
}

//===----------------------------------------------------------------------===//
// Broken schedules
//===----------------------------------------------------------------------===//

size_t find(const std::vector<PipelineAction> &ops, Op op, int stage, int mb) {
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].op == op && ops[i].stage == stage && ops[i].microbatch == mb)
      return i;
  ADD_FAILURE() << "no such action";
  return 0;
}

std::string expectError(const Result<PipelineSimulation> &r,
                        const std::vector<std::string> &needles) {
  EXPECT_FALSE(r.ok());
  if (r.ok())
    return "";
  for (const std::string &n : needles)
    EXPECT_NE(r.error().message.find(n), std::string::npos)
        << "message \"" << r.error().message << "\" should mention \"" << n
        << "\"";
  return r.error().message;
}

// Two sends swapped on one rank: rank 1 of 1F1B (p = 4, m = 8) sends
// microbatch 1's activation before microbatch 0's. Both still follow their
// forwards, so only the cross-rank order is wrong: rank 1 waits in SEND_F1
// for rank 2, which waits in RECV_F0 for rank 1.
TEST(PipelineSchedule, SwappedSendsDeadlock) {
  auto s = buildPipelineSchedule({Kind::OneFOneB, 4, 8, 1});
  ASSERT_TRUE(s.ok());
  auto &ops = s->ranks[1];
  size_t first = find(ops, Op::SendActivation, 1, 0);
  size_t second = find(ops, Op::SendActivation, 1, 1);
  PipelineAction moved = ops[first];
  ops.erase(ops.begin() + first);
  ops.insert(ops.begin() + second, moved); // now right after SEND_F(1, 1)
  size_t at1 = find(ops, Op::SendActivation, 1, 1);
  size_t at2 = find(s->ranks[2], Op::RecvActivation, 2, 0);
  std::string msg =
      expectError(simulatePipelineSchedule(*s),
                  {"deadlock",
                   "rank 1 is blocked at its action " + std::to_string(at1) +
                       " (1SEND_F1 to rank 2)",
                   "rank 2 is blocked at its action " + std::to_string(at2) +
                       " (2RECV_F0 from rank 1)",
                   "cycle: rank 1 -> rank 2 -> rank 1"});
  // The naive interpreter agrees.
  EXPECT_TRUE(interpret(s->ranks).empty());
  // Rank 0, stuck behind the cycle, is counted but is not part of it.
  EXPECT_NE(msg.find("of 4 ranks stuck"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("cycle: rank 0"), std::string::npos) << msg;
}

// The same on interleaved_1f1b's wrap-around link: rank 3 (stage 3) sends
// microbatch 1 to rank 0 (stage 4) before microbatch 0. Rank 0 already waits
// for microbatch 0 of stage 4 before its next forward of stage 0 (torch's
// lowering posts that receive early), so the wait runs all the way round
// the ring: a four-rank cycle, named in full.
TEST(PipelineSchedule, DeadlockInterleaved) {
  auto s = buildPipelineSchedule({Kind::Interleaved1F1B, 4, 8, 2});
  ASSERT_TRUE(s.ok());
  auto &ops = s->ranks[3];
  size_t first = find(ops, Op::SendActivation, 3, 0);
  size_t second = find(ops, Op::SendActivation, 3, 1);
  PipelineAction moved = ops[first];
  ops.erase(ops.begin() + first);
  ops.insert(ops.begin() + second, moved);
  size_t at0 = find(s->ranks[0], Op::RecvActivation, 4, 0);
  size_t send0 = find(ops, Op::SendActivation, 3, 0);
  expectError(simulatePipelineSchedule(*s),
              {"deadlock",
               "rank 0 is blocked at its action " + std::to_string(at0) +
                   " (4RECV_F0 from rank 3) until rank 3 reaches its action " +
                   std::to_string(send0) + " (3SEND_F0 to rank 0)",
               "rank 3 is blocked at its action " +
                   std::to_string(find(ops, Op::RecvActivation, 3, 1)) +
                   " (3RECV_F1 from rank 2)",
               "cycle: rank 0 -> rank 3 -> rank 2 -> rank 1 -> rank 0"});
  EXPECT_TRUE(interpret(s->ranks).empty());
}

TEST(PipelineSchedule, MalformedLists) {
  auto base = buildPipelineSchedule({Kind::OneFOneB, 2, 2, 1});
  ASSERT_TRUE(base.ok());
  // rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
  // rank 1: 1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1
  ASSERT_EQ(rankText(base->ranks[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
  ASSERT_EQ(rankText(base->ranks[1]),
            "1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1");
  ASSERT_TRUE(simulatePipelineSchedule(*base).ok());

  auto edit = [&](auto f) {
    PipelineSchedule s = *base;
    f(s);
    return simulatePipelineSchedule(s);
  };
  expectError(edit([](PipelineSchedule &s) { s.ranks.pop_back(); }),
              {"1 rank programs for 2 pp ranks"});
  expectError(
      edit([](PipelineSchedule &s) { s.ranks[0][0] = act(Op::Forward, 1, 0); }),
      {"rank 0's action 0 (1F0) runs stage 1, which is on rank 1"});
  expectError(
      edit([](PipelineSchedule &s) { s.ranks[0][0] = act(Op::Forward, 0, 5); }),
      {"names stage 0 microbatch 5"});
  expectError(edit([](PipelineSchedule &s) {
                // B before its F.
                std::swap(s.ranks[1][1], s.ranks[1][3]);
              }),
              {"rank 1's action 1 (1B0) runs before the forward of stage 1 "
               "microbatch 0"});
  expectError(edit([](PipelineSchedule &s) {
                // F before its input arrived.
                std::swap(s.ranks[1][0], s.ranks[1][1]);
              }),
              {"rank 1's action 0 (1F0) runs before its input"});
  expectError(edit([](PipelineSchedule &s) {
                // The send before the forward that produces it.
                std::swap(s.ranks[0][0], s.ranks[0][1]);
              }),
              {"sends before the forward ran"});
  expectError(edit([](PipelineSchedule &s) { s.ranks[0][1].peer = 0; }),
              {"names peer rank 0; stage 0's neighbour is on rank 1"});
  expectError(edit([](PipelineSchedule &s) {
                s.ranks[1].insert(s.ranks[1].begin() + 3,
                                  act(Op::RecvActivation, 1, 1, 0));
              }),
              {"rank 1's action 3 (1RECV_F1 from rank 0) repeats RECV_F of "
               "stage 1 microbatch 1"});
  expectError(edit([](PipelineSchedule &s) {
                // Remove a receive and the compute that needs it.
                s.ranks[0].erase(s.ranks[0].begin() + 6, s.ranks[0].end());
              }),
              {"stage 0 microbatch 1 (rank 0) has no backward"});
  expectError(edit([](PipelineSchedule &s) {
                s.ranks[0].erase(s.ranks[0].begin() + 6); // 0RECV_B1
                s.ranks[0].pop_back();                    // 0B1
                s.ranks[0].push_back(act(Op::Backward, 0, 1));
              }),
              {"runs before its output gradient"});
  expectError(edit([](PipelineSchedule &s) {
                s.ranks[1].pop_back(); // 1SEND_B1 and so 0RECV_B1 unmatched
              }),
              {"never sends its input gradient to rank 0"});
  expectError(edit([](PipelineSchedule &s) {
                s.ranks[0].push_back(act(Op::SendGrad, 0, 0, 1));
              }),
              {"is not needed: the first stage sends no gradient"});
  expectError(edit([](PipelineSchedule &s) {
                s.ranks[0][0].peer = 1; // compute naming a peer
              }),
              {"is compute but names a peer"});

  // W before its I, and I without W, on a split schedule.
  auto zb = buildPipelineSchedule({Kind::ZeroBubbleV, 1, 1, 2});
  ASSERT_TRUE(zb.ok());
  ASSERT_EQ(rankText(zb->ranks[0]), "0F0 1F0 1I0 1W0 0I0 0W0");
  PipelineSchedule z = *zb;
  std::swap(z.ranks[0][2], z.ranks[0][3]);
  expectError(simulatePipelineSchedule(z),
              {"(1W0) runs before the input gradient (I) of stage 1"});
  z = *zb;
  z.ranks[0].pop_back();
  expectError(simulatePipelineSchedule(z),
              {"stage 0 microbatch 0 (rank 0) has an input gradient (I) but "
               "no weight gradient (W)"});
}

//===----------------------------------------------------------------------===//
// Bad configurations
//===----------------------------------------------------------------------===//

void expectBad(PipelineScheduleConfig c, const std::string &needle) {
  auto r = buildPipelineSchedule(c);
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_NE(r.error().message.find(needle), std::string::npos)
      << "message \"" << r.error().message << "\" should mention \"" << needle
      << "\"";
}

TEST(PipelineSchedule, BadConfigs) {
  expectBad({Kind::OneFOneB, 0, 4, 1}, "at least 1 rank, got 0");
  expectBad({Kind::OneFOneB, -3, 4, 1}, "got -3");
  expectBad({Kind::GPipe, 2, 0, 1}, "microbatches must be at least 1, got 0");
  expectBad({Kind::Interleaved1F1B, 2, 4, 0},
            "stages_per_rank must be at least 1, got 0");
  expectBad({Kind::OneFOneB, 4, 3, 1},
            "schedule 1f1b needs at least as many microbatches as pp ranks");
  expectBad({Kind::OneFOneB, 4, 4, 2},
            "schedule 1f1b runs one stage per rank, got stages_per_rank 2");
  expectBad({Kind::GPipe, 4, 4, 3}, "schedule gpipe runs one stage per rank");
  expectBad({Kind::Interleaved1F1B, 4, 9, 2},
            "got 9 microbatches for 4 ranks (2 rounds); 8 or 10 would do");
  expectBad({Kind::Interleaved1F1B, 4, 13, 2}, "12 or 15 would do");
  expectBad({Kind::ZeroBubbleV, 4, 8, 1},
            "zbv places exactly 2 stages on each rank");
  expectBad({Kind::ZeroBubbleV, 4, 8, 3}, "got stages_per_rank 3");
  // Sizes: products that overflow, and ones merely too large, are refused
  // before anything is allocated.
  expectBad({Kind::GPipe, int64_t(1) << 40, int64_t(1) << 40, 1},
            "(stage, microbatch) pairs");
  expectBad({Kind::Interleaved1F1B, int64_t(1) << 62, 1, 4},
            "(stage, microbatch) pairs");
  expectBad({Kind::GPipe, 1024, 1025, 1}, "more than 2^20");
  EXPECT_TRUE(checkPipelineScheduleConfig({Kind::GPipe, 1024, 1024, 1}).ok());

  EXPECT_EQ(*parsePipelineScheduleKind("interleaved_1f1b"),
            Kind::Interleaved1F1B);
  for (Kind k : kKinds)
    EXPECT_EQ(*parsePipelineScheduleKind(pipelineScheduleKindName(k)), k);
  auto bad = parsePipelineScheduleKind("1F1B");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message,
            "unknown pipeline schedule \"1F1B\"; expected one of gpipe, 1f1b, "
            "interleaved_1f1b, zbv");

  PipelineSchedule empty;
  empty.config = {Kind::OneFOneB, 2, 0, 1};
  expectError(simulatePipelineSchedule(empty), {"microbatches"});
  auto ok = buildPipelineSchedule({Kind::OneFOneB, 2, 2, 1});
  ASSERT_TRUE(ok.ok());
  PipelineCosts negative;
  negative.forward = -1;
  expectError(simulatePipelineSchedule(*ok, negative), {"costs"});
  // An absurdly long list is refused before simulating it.
  PipelineSchedule longer = *ok;
  longer.ranks[0].resize(1000, act(Op::Forward, 0, 0));
  expectError(simulatePipelineSchedule(longer), {"need at most"});
}

//===----------------------------------------------------------------------===//
// Costs and speed
//===----------------------------------------------------------------------===//

TEST(PipelineSchedule, Costs) {
  // Unequal costs move the bubble: 1F1B's idle is (p-1)(F+B) per rank.
  auto s = buildPipelineSchedule({Kind::OneFOneB, 4, 8, 1});
  ASSERT_TRUE(s.ok());
  PipelineCosts costs;
  costs.forward = 2;
  costs.backward = 5;
  auto sim = simulatePipelineSchedule(*s, costs);
  ASSERT_TRUE(sim.ok());
  EXPECT_EQ(sim->makespan, (8 + 3) * 7);
  EXPECT_NEAR(sim->bubbleFraction, 3.0 / 11.0, 1e-12);
  // Zero-cost W: zbv's weight gradients fill nothing, and nothing breaks.
  auto z = buildPipelineSchedule({Kind::ZeroBubbleV, 4, 8, 2});
  ASSERT_TRUE(z.ok());
  PipelineCosts noW;
  noW.backwardWeight = 0;
  ASSERT_TRUE(simulatePipelineSchedule(*z, noW).ok());
}

// torch accepts ScheduleInterleaved1F1B with one stage per rank; it is not
// Schedule1F1B: 2(p-1-r) warm-up forwards instead of p-1-r, so it holds
// nearly twice the activations for the same bubble (docs/pipeline.md).
TEST(PipelineSchedule, InterleavedWithOneStageIsNot1F1B) {
  auto inter = buildPipelineSchedule({Kind::Interleaved1F1B, 4, 8, 1});
  auto plain = buildPipelineSchedule({Kind::OneFOneB, 4, 8, 1});
  ASSERT_TRUE(inter.ok() && plain.ok());
  EXPECT_NE(computeOf(*inter), computeOf(*plain));
  auto a = simulatePipelineSchedule(*inter);
  auto b = simulatePipelineSchedule(*plain);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->makespan, b->makespan);
  EXPECT_EQ(a->peakActivations, (std::vector<int64_t>{7, 5, 3, 1}));
  EXPECT_EQ(b->peakActivations, (std::vector<int64_t>{4, 3, 2, 1}));
}

// Large schedules build and simulate (no time bound here: unit tests run
// under sanitizers and on loaded machines; speed belongs in a benchmark).
// On the 2-core VM, Release, each takes about 2 ms (pp 256) to 0.3 s (pp 64,
// v 8, 512 microbatches: 2^18 stage-microbatches).
TEST(PipelineSchedule, LargeSchedulesBuildAndSimulate) {
  for (PipelineScheduleConfig c :
       {PipelineScheduleConfig{Kind::Interleaved1F1B, 256, 16, 2},
        PipelineScheduleConfig{Kind::ZeroBubbleV, 256, 16, 2},
        PipelineScheduleConfig{Kind::Interleaved1F1B, 64, 512, 8}}) {
    auto s = buildPipelineSchedule(c);
    ASSERT_TRUE(s.ok()) << where(c.kind, c.ranks, c.microbatches,
                                 c.stagesPerRank);
    auto sim = simulatePipelineSchedule(*s);
    ASSERT_TRUE(sim.ok()) << sim.error().message;
    EXPECT_GT(sim->bubbleFraction, 0.0);
    EXPECT_LT(sim->bubbleFraction, 1.0);
  }
}

} // namespace
