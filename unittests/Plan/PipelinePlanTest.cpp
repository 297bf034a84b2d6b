//===- PipelinePlanTest.cpp - send / recv in plans and their verification -===//
//
// Pipeline stages exchange activations and activation gradients with
// `send` / `recv` on two-member communicators (docs/plan-format.md). Here
// each pp rank's action list from core's schedule builder becomes a plan
// (computes, sends and recvs in schedule order, one stream), and the plan
// set must verify; then one rank is broken the ways a hand-written or buggy
// schedule breaks, and the verifier must say how, naming both ranks.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/PipelineSchedule.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Plan/Verify.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

using namespace meshplan;
using namespace meshplan::plan;

namespace {

/// The communicator of the pair of pp ranks {a, b}.
std::string pairId(int64_t a, int64_t b) {
  return "pp." + std::to_string(std::min(a, b)) + "-" +
         std::to_string(std::max(a, b));
}

/// What one transfer carries: the activation of `stage`'s forward or the
/// input gradient of `stage`'s backward, for one microbatch. Sender and
/// receiver name it alike.
std::string tagOf(char what, int64_t stage, int64_t microbatch) {
  return std::string(1, what) + " s" + std::to_string(stage) + " mb" +
         std::to_string(microbatch);
}

/// One plan per pp rank; activations of `elements` float32 per microbatch.
/// With `p2pStream`, the transfers run on a stream of their own, as the
/// planner lays them out (dist-schedule): a compute depends on the recv of
/// its input, a send on the compute of its output.
std::vector<Plan> plansOf(const PipelineSchedule &schedule,
                          int64_t elements = 16, bool p2pStream = false) {
  int64_t p = schedule.config.ranks;
  std::vector<Plan> plans;
  for (int64_t rank = 0; rank < p; ++rank) {
    Plan plan;
    plan.mesh.axes = {{"pp", p, false}};
    plan.rank = rank;
    plan.streams = {"main"};
    if (p2pStream)
      plan.streams.push_back("p2p");
    // Instruction ids by (op, stage, microbatch), for the deps.
    std::map<std::tuple<int, int64_t, int64_t>, std::string> idOf;
    auto key = [](PipelineOp op, int64_t stage, int64_t mb) {
      return std::make_tuple(int(op), stage, mb);
    };
    std::map<std::string, int64_t> comms;
    auto commFor = [&](int64_t peer) {
      std::string id = pairId(rank, peer);
      if (!comms.count(id)) {
        Communicator c;
        c.id = id;
        c.ranks = {std::min(rank, peer), std::max(rank, peer)};
        c.key = rank < peer ? 0 : 1;
        comms[id] = static_cast<int64_t>(plan.communicators.size());
        plan.communicators.push_back(c);
      }
      return id;
    };
    auto buffer = [&](const std::string &id) {
      for (const Buffer &b : plan.buffers)
        if (b.id == id)
          return;
      Buffer b;
      b.id = id;
      b.kind = BufferKind::Activation;
      b.globalShape = b.localShape = {elements};
      b.offset = {0};
      b.layout = "[{}]";
      plan.buffers.push_back(b);
    };
    const std::vector<PipelineAction> &actions = schedule.ranks[size_t(rank)];
    for (size_t i = 0; i < actions.size(); ++i) {
      const PipelineAction &a = actions[i];
      Instruction in;
      in.id = "a" + std::to_string(i) + "." + formatPipelineAction(a);
      in.stream = "main";
      in.label = formatPipelineAction(a);
      if (a.isCompute()) {
        in.op = OpKind::Compute;
        in.phase = a.op == PipelineOp::Forward ? "forward" : "backward";
        in.unit = "stage" + std::to_string(a.stage);
        in.microbatch = a.microbatch;
        // Its input's recv, if any: listed before it.
        PipelineOp recvOp = a.op == PipelineOp::Forward
                                ? PipelineOp::RecvActivation
                                : PipelineOp::RecvGrad;
        if (auto it = idOf.find(key(recvOp, a.stage, a.microbatch));
            p2pStream && it != idOf.end())
          in.deps.push_back(it->second);
      } else {
        if (p2pStream) {
          in.stream = "p2p";
          // A send waits for the compute of what it sends.
          PipelineOp made = a.op == PipelineOp::SendActivation
                                ? PipelineOp::Forward
                                : PipelineOp::Backward;
          if (auto it = idOf.find(key(made, a.stage, a.microbatch));
              a.isSend() && it != idOf.end())
            in.deps.push_back(it->second);
        }
        bool send = a.isSend();
        bool activation = a.op == PipelineOp::SendActivation ||
                          a.op == PipelineOp::RecvActivation;
        // The stage whose output travels: a recv names its own stage.
        int64_t from = a.stage;
        if (a.op == PipelineOp::RecvActivation)
          from = a.stage - 1;
        else if (a.op == PipelineOp::RecvGrad)
          from = a.stage + 1;
        in.tag = tagOf(activation ? 'F' : 'B', from, a.microbatch);
        std::string buf = (activation ? "act." : "grad.") +
                          std::to_string(from) + "." +
                          std::to_string(a.microbatch);
        buffer(buf);
        in.op = send ? OpKind::Send : OpKind::Recv;
        in.comm = commFor(a.peer);
        in.peer = plan.communicators[size_t(comms[in.comm])].key == 0 ? 1 : 0;
        in.dtype = DType::Float32;
        in.count = elements;
        (send ? in.inputs : in.outputs).push_back(buf);
      }
      idOf[key(a.op, a.stage, a.microbatch)] = in.id;
      plan.program.push_back(in);
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

VerifyResult verified(const std::vector<Plan> &plans) {
  for (const Plan &p : plans) {
    Result<void> ok = validatePlan(p);
    EXPECT_TRUE(ok.ok()) << "rank " << p.rank << ": " << ok.error().message;
  }
  // These programs are schedules, not steps: their activations are
  // placeholders that no forward writes, so only the structural checks
  // (Verify.h (a)-(c)) apply; no facts, no (d). What planned pipelines
  // compute is verified on planned sets (test/planner/verify-step.test and
  // plan-pipeline.test).
  Result<VerifyResult> r = verifyPlans(plans, PlanSetFacts{});
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : VerifyResult{};
}

PipelineSchedule build(PipelineScheduleKind kind, int64_t p, int64_t m,
                       int64_t v) {
  Result<PipelineSchedule> s = buildPipelineSchedule({kind, p, m, v});
  EXPECT_TRUE(s.ok()) << s.error().message;
  return s.ok() ? *s : PipelineSchedule{};
}

/// Index of the first instruction of `plan` whose label is `label`.
size_t indexOf(const Plan &plan, const std::string &label) {
  for (size_t i = 0; i < plan.program.size(); ++i)
    if (plan.program[i].label == label)
      return i;
  ADD_FAILURE() << "no instruction labelled " << label;
  return 0;
}

TEST(PipelinePlan, EverySchedulesPlanSetVerifies) {
  int sets = 0;
  for (PipelineScheduleKind kind :
       {PipelineScheduleKind::GPipe, PipelineScheduleKind::OneFOneB,
        PipelineScheduleKind::Interleaved1F1B,
        PipelineScheduleKind::ZeroBubbleV})
    for (int64_t p : {1, 2, 3, 4})
      for (int64_t m : {1, 2, 4, 7, 8})
        for (int64_t v : {1, 2, 3}) {
          if (!checkPipelineScheduleConfig({kind, p, m, v}).ok())
            continue;
          PipelineSchedule s = build(kind, p, m, v);
          std::vector<Plan> plans = plansOf(s);
          VerifyResult r = verified(plans);
          ASSERT_TRUE(r.ok())
              << pipelineScheduleKindName(kind) << " p=" << p << " m=" << m
              << " v=" << v << ": " << r.failure->message;
          ++sets;
        }
  EXPECT_GT(sets, 40);
}

TEST(PipelinePlan, PlansWithSendAndRecvRoundTrip) {
  std::vector<Plan> plans =
      plansOf(build(PipelineScheduleKind::Interleaved1F1B, 4, 8, 2));
  for (const Plan &p : plans) {
    std::string text = writePlan(p);
    Result<Plan> back = parsePlan(text);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(*back, p);
    EXPECT_NE(text.find("\"op\":\"send\""), std::string::npos);
    EXPECT_NE(text.find("\"peer\":"), std::string::npos);
  }
}

// The broken set: two sends swapped on one rank. Rank 1 of a
// 4-stage 1F1B sends microbatch 1's activation before microbatch 0's; rank 2
// waits for microbatch 0's first. Transfers pair by tag, so neither can
// complete: the verifier reports the cycle through both ranks'
// instructions (the runtime would hang there, never deliver one
// microbatch's activation into the other's buffer).
TEST(PipelinePlan, SwappedSendsAreADeadlockNamingTheCycle) {
  std::vector<Plan> plans =
      plansOf(build(PipelineScheduleKind::OneFOneB, 4, 8, 1));
  Plan &r1 = plans[1];
  size_t a = indexOf(r1, "1SEND_F0"), b = indexOf(r1, "1SEND_F1");
  std::swap(r1.program[a], r1.program[b]);
  Result<VerifyResult> r = verifyPlans(plans);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_FALSE(r->ok());
  EXPECT_EQ(r->failure->kind, FailureKind::Deadlock) << r->failure->message;
  EXPECT_EQ(
      r->failure->message,
      "deadlock: 155 instructions on 4 ranks can never run; wait cycle:\n"
      "  rank 1 /program/3 \"a3.1RECV_F1\" (recv \"F s0 mb1\" on \"pp.0-1\", "
      "stream \"main\") waits for the previous instruction on its stream: "
      "rank 1 /program/2 \"a5.1SEND_F1\" (send \"F s1 mb1\" on \"pp.1-2\", "
      "stream \"main\")\n"
      "  rank 1 /program/2 \"a5.1SEND_F1\" (send \"F s1 mb1\" on \"pp.1-2\", "
      "stream \"main\") issued; waits for rank 2 to receive it: rank 2 "
      "/program/3 \"a3.2RECV_F1\" (recv \"F s1 mb1\" on \"pp.1-2\", stream "
      "\"main\")\n"
      "  rank 2 /program/3 \"a3.2RECV_F1\" (recv \"F s1 mb1\" on \"pp.1-2\", "
      "stream \"main\") waits for the previous instruction on its stream: "
      "rank 2 /program/2 \"a2.2SEND_F0\" (send \"F s2 mb0\" on \"pp.2-3\", "
      "stream \"main\")\n"
      "  rank 2 /program/2 \"a2.2SEND_F0\" (send \"F s2 mb0\" on \"pp.2-3\", "
      "stream \"main\") waits for the previous instruction on its stream: "
      "rank 2 /program/1 \"a1.2F0\" (compute, stream \"main\")\n"
      "  rank 2 /program/1 \"a1.2F0\" (compute, stream \"main\") waits for "
      "the previous instruction on its stream: rank 2 /program/0 "
      "\"a0.2RECV_F0\" (recv \"F s1 mb0\" on \"pp.1-2\", stream \"main\")\n"
      "  rank 2 /program/0 \"a0.2RECV_F0\" (recv \"F s1 mb0\" on \"pp.1-2\", "
      "stream \"main\") issued; waits for rank 1 to send it: rank 1 "
      "/program/5 \"a2.1SEND_F0\" (send \"F s1 mb0\" on \"pp.1-2\", stream "
      "\"main\")\n"
      "  rank 1 /program/5 \"a2.1SEND_F0\" (send \"F s1 mb0\" on \"pp.1-2\", "
      "stream \"main\") waits for the previous instruction on its stream: "
      "rank 1 /program/4 \"a4.1F1\" (compute, stream \"main\")\n"
      "  rank 1 /program/4 \"a4.1F1\" (compute, stream \"main\") waits for "
      "the previous instruction on its stream: rank 1 /program/3 "
      "\"a3.1RECV_F1\" (recv \"F s0 mb1\" on \"pp.0-1\", stream \"main\")");
}

// A communicator runs its transfers one at a time in program order (the
// runtime's rule for every operation on a communicator), whatever streams
// they are on: rank 0 sends "a" then "b", rank 1 receives "b" then "a",
// each on two streams. The streams alone would let both finish; the
// communicator's order cannot.
TEST(PipelinePlan, TransfersOnACommunicatorRunInProgramOrder) {
  auto make = [](int64_t rank, bool crossed) {
    Plan plan;
    plan.mesh.axes = {{"pp", 2, false}};
    plan.rank = rank;
    plan.streams = {"s0", "s1"};
    Communicator c;
    c.id = "pp.0-1";
    c.ranks = {0, 1};
    c.key = rank;
    plan.communicators.push_back(c);
    const char *tags[2] = {"a", "b"};
    if (crossed && rank == 1)
      std::swap(tags[0], tags[1]);
    for (int k = 0; k < 2; ++k) {
      Buffer b;
      b.id = std::string("buf.") + tags[k];
      b.kind = BufferKind::Activation;
      b.globalShape = b.localShape = {4};
      b.offset = {0};
      b.layout = "[{}]";
      plan.buffers.push_back(b);
      Instruction in;
      in.id = std::string(rank == 0 ? "send." : "recv.") + tags[k];
      in.stream = k == 0 ? "s0" : "s1";
      in.op = rank == 0 ? OpKind::Send : OpKind::Recv;
      in.comm = c.id;
      in.peer = 1 - rank;
      in.tag = tags[k];
      in.dtype = DType::Float32;
      in.count = 4;
      (rank == 0 ? in.inputs : in.outputs).push_back(b.id);
      plan.program.push_back(in);
    }
    return plan;
  };
  EXPECT_TRUE(verified({make(0, false), make(1, false)}).ok());
  Result<VerifyResult> r = verifyPlans({make(0, true), make(1, true)});
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_FALSE(r->ok());
  EXPECT_EQ(r->failure->kind, FailureKind::Deadlock);
  EXPECT_NE(
      r->failure->message.find("waits for the previous transfer on \"pp.0-1\""),
      std::string::npos)
      << r->failure->message;
}

// A recv whose send was dropped: named by both ranks and the tag.
TEST(PipelinePlan, AMissingSendIsNamed) {
  std::vector<Plan> plans =
      plansOf(build(PipelineScheduleKind::GPipe, 2, 2, 1));
  Plan &r0 = plans[0];
  r0.program.erase(r0.program.begin() + indexOf(r0, "0SEND_F1"));
  Result<VerifyResult> r = verifyPlans(plans);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_FALSE(r->ok());
  EXPECT_EQ(r->failure->kind, FailureKind::Divergence);
  EXPECT_EQ(r->failure->message,
            "rank 1 /program/2 \"a2.1RECV_F1\" (recv \"F s0 mb1\" on "
            "\"pp.0-1\") has no partner: rank 0 never sends a message tagged "
            "\"F s0 mb1\" on \"pp.0-1\"");
}

// Partners must move the same dtype and count.
TEST(PipelinePlan, PartnersMoveTheSameBytes) {
  std::vector<Plan> plans =
      plansOf(build(PipelineScheduleKind::GPipe, 2, 2, 1));
  Plan &r1 = plans[1];
  Instruction &recv = r1.program[indexOf(r1, "1RECV_F0")];
  recv.count = 8;
  r1.buffers[0].globalShape = r1.buffers[0].localShape = {8};
  Result<VerifyResult> r = verifyPlans(plans);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_FALSE(r->ok());
  EXPECT_EQ(r->failure->kind, FailureKind::Divergence);
  EXPECT_NE(r->failure->message.find("moves recv float32 count=8"),
            std::string::npos)
      << r->failure->message;
}

TEST(PipelinePlan, ValidationOfSendAndRecv) {
  std::vector<Plan> plans =
      plansOf(build(PipelineScheduleKind::GPipe, 2, 2, 1));
  const Plan good = plans[0];
  size_t s = indexOf(good, "0SEND_F0");
  auto errorOf = [&](auto edit) {
    Plan p = good;
    edit(p, p.program[s]);
    Result<void> ok = validatePlan(p);
    return ok.ok() ? std::string("<ok>") : ok.error().message;
  };
  std::string at = "/program/" + std::to_string(s);
  EXPECT_EQ(errorOf([](Plan &, Instruction &) {}), "<ok>");
  EXPECT_EQ(errorOf([](Plan &, Instruction &in) { in.peer = 0; }),
            at + "/peer: peer 0 is not the other member of \"pp.0-1\" (this "
                 "rank is key 0, so the peer is key 1)");
  EXPECT_EQ(errorOf([](Plan &, Instruction &in) { in.count = 15; }),
            at + "/count: count 15 is not the 16 elements of \"act.0.0\"");
  EXPECT_EQ(
      errorOf([](Plan &, Instruction &in) { in.dtype = DType::BFloat16; }),
      at + "/inputs/0: \"act.0.0\" is float32, the send moves bfloat16");
  EXPECT_EQ(errorOf([](Plan &, Instruction &in) { in.outputs = in.inputs; }),
            at + ": send needs one input and no outputs");
  // A pair is two members: a larger group cannot carry point to point.
  Plan wide = good;
  wide.mesh.axes = {{"pp", 3, false}};
  wide.communicators[0].ranks = {0, 1, 2};
  Result<void> ok = validatePlan(wide);
  ASSERT_FALSE(ok.ok());
  EXPECT_EQ(ok.error().message,
            at + "/comm: send needs a communicator of two members (a pair), "
                 "\"pp.0-1\" has 3");
}

TEST(PipelinePlan, ReaderErrors) {
  std::vector<Plan> plans =
      plansOf(build(PipelineScheduleKind::GPipe, 2, 2, 1));
  std::string text = writePlan(plans[0]);
  auto errorOf = [](const std::string &t) {
    Result<Plan> p = parsePlan(t);
    return p.ok() ? std::string("<ok>") : p.error().message;
  };
  auto replaced = [&](const std::string &from, const std::string &to) {
    std::string t = text;
    size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos)
      t.replace(at, from.size(), to);
    return t;
  };
  EXPECT_EQ(errorOf(text), "<ok>");
  std::string noTag = errorOf(replaced(",\"tag\":\"F s0 mb0\"", ""));
  EXPECT_NE(noTag.find("send needs \"tag\""), std::string::npos) << noTag;
  std::string noPeer = errorOf(replaced(",\"peer\":1", ""));
  EXPECT_NE(noPeer.find("send needs \"peer\""), std::string::npos) << noPeer;
  std::string stray =
      errorOf(replaced("\"op\":\"compute\"", "\"op\":\"compute\",\"peer\":1"));
  EXPECT_NE(stray.find("only send and recv take a peer"), std::string::npos)
      << stray;
}

/// Pointers to `plans`, as simulateTogether takes them.
std::vector<const Plan *> pointersTo(const std::vector<Plan> &plans) {
  std::vector<const Plan *> pointers;
  for (const Plan &p : plans)
    pointers.push_back(&p);
  return pointers;
}

/// Per plan, per instruction: 1e12 flops for a compute, 0 otherwise (1 s
/// per compute under teraflopModel()).
std::vector<std::vector<double>>
teraflopPerCompute(const std::vector<Plan> &plans) {
  std::vector<std::vector<double>> flops;
  for (const Plan &p : plans) {
    std::vector<double> f;
    for (const Instruction &in : p.program)
      f.push_back(in.op == OpKind::Compute ? 1e12 : 0);
    flops.push_back(std::move(f));
  }
  return flops;
}

/// The default cost model at 1e12 FLOP/s, fully used.
CostModel teraflopModel() {
  CostModel model;
  model.peakFlopsPerSecond = 1e12;
  model.mfu = 1;
  return model;
}

/// The bubble of a plan set laid out together (simulateTogether): the
/// compute stream's idle time over the pipeline's step, averaged over the
/// ranks, with forwards of 1 s, backwards of 2 s and free transfers.
double bubbleOf(const std::vector<Plan> &plans) {
  CostModel model = teraflopModel();
  model.intraNodeLatencySeconds = model.interNodeLatencySeconds = 1e-15;
  model.intraNodeBytesPerSecond = model.interNodeBytesPerSecond = 1e30;
  std::vector<const Plan *> pointers = pointersTo(plans);
  std::vector<std::vector<double>> flops;
  for (const Plan &p : plans) {
    std::vector<double> f;
    for (const Instruction &in : p.program)
      f.push_back(in.op != OpKind::Compute ? 0
                  : in.phase == "forward"  ? 1e12
                                           : 2e12);
    flops.push_back(std::move(f));
  }
  Result<std::vector<Schedule>> s = simulateTogether(pointers, flops, model);
  EXPECT_TRUE(s.ok()) << s.error().message;
  if (!s.ok())
    return -1;
  double step = 0, idle = 0;
  for (const Schedule &one : *s)
    step = std::max(step, one.stepSeconds);
  for (const Schedule &one : *s)
    idle += 1 - one.streamBusySeconds[0] / step;
  return idle / double(s->size());
}

// Laid out together with the transfers on a stream of their own (as the
// planner lays them out), the plans of gpipe, 1f1b and interleaved_1f1b take
// the textbook bubble, as core's simulator does: a compute waits for its
// input's transfer and nothing else. With the transfers in the compute
// stream's order (torch's action lists run blocking), 1F1B's RECV_F of the
// next forward, listed before the backward, holds that backward back.
TEST(PipelinePlan, PlansLaidOutTogetherTakeTheTextbookBubble) {
  struct Case {
    PipelineScheduleKind kind;
    int64_t p, m, v;
  };
  for (Case c : {Case{PipelineScheduleKind::GPipe, 2, 4, 1},
                 {PipelineScheduleKind::GPipe, 4, 8, 1},
                 {PipelineScheduleKind::OneFOneB, 2, 4, 1},
                 {PipelineScheduleKind::OneFOneB, 4, 8, 1},
                 {PipelineScheduleKind::OneFOneB, 4, 16, 1},
                 {PipelineScheduleKind::Interleaved1F1B, 2, 4, 2}}) {
    PipelineSchedule schedule = build(c.kind, c.p, c.m, c.v);
    double textbook = textbookBubbleFraction(schedule.config);
    EXPECT_NEAR(bubbleOf(plansOf(schedule, 16, /*p2pStream=*/true)), textbook,
                1e-9 * double(c.m))
        << pipelineScheduleKindName(c.kind) << " p " << c.p << " m " << c.m;
  }
  PipelineSchedule oneF1B = build(PipelineScheduleKind::OneFOneB, 4, 8, 1);
  EXPECT_NEAR(bubbleOf(plansOf(oneF1B)), 7.0 / 15.0, 1e-9);
  EXPECT_GT(7.0 / 15.0, textbookBubbleFraction(oneF1B.config) + 0.1);
  // Interleaved on p = 4 (v = 2, m = 8) is not there yet: on the one p2p
  // stream a send waits behind a recv listed before it (and the runtime
  // runs a communicator's operations in program order), where torch posts
  // both asynchronously. Better than in the compute stream's order, short
  // of the textbook (docs/pipeline.md, "Transfers").
  PipelineSchedule interleaved =
      build(PipelineScheduleKind::Interleaved1F1B, 4, 8, 2);
  double own = bubbleOf(plansOf(interleaved, 16, /*p2pStream=*/true));
  double inOrder = bubbleOf(plansOf(interleaved));
  std::printf("interleaved_1f1b p 4 m 8 v 2: bubble %.4f on a p2p stream, "
              "%.4f in compute order, textbook %.4f\n",
              own, inOrder, textbookBubbleFraction(interleaved.config));
  EXPECT_LT(own, inOrder);
  EXPECT_GT(own, textbookBubbleFraction(interleaved.config));
}

// A recv waits for the send of its tag on the peer's plan: the last stage's
// first forward starts after the first microbatch crossed every stage before
// it; a cycle across plans (two sends swapped on one rank) is an error
// naming the ranks.
TEST(PipelinePlan, SimulateTogetherWaitsForTheSend) {
  PipelineSchedule schedule = build(PipelineScheduleKind::OneFOneB, 4, 8, 1);
  std::vector<Plan> plans = plansOf(schedule);
  std::vector<const Plan *> pointers = pointersTo(plans);
  std::vector<std::vector<double>> flops = teraflopPerCompute(plans);
  CostModel model = teraflopModel();
  Result<std::vector<Schedule>> s = simulateTogether(pointers, flops, model);
  ASSERT_TRUE(s.ok()) << s.error().message;
  size_t first = indexOf(plans[3], "3F0");
  EXPECT_GE((*s)[3].start[first], 3.0);
  EXPECT_LT((*s)[3].start[first], 3.1);
  // Alone, the same plan starts at once: simulate() does not wait for peers.
  Result<Schedule> alone = simulate(plans[3], flops[3], model);
  ASSERT_TRUE(alone.ok());
  EXPECT_LT(alone->start[first], 0.1);

  // Rank 2 waits for stage 3's gradient of microbatch 0 before it sends
  // stage 3 the activation that gradient needs: a wait cycle across plans.
  std::vector<Plan> broken = plans;
  std::vector<Instruction> &program = broken[2].program;
  auto at = [&](OpKind op, const std::string &tag) {
    return std::find_if(
        program.begin(), program.end(),
        [&](const Instruction &in) { return in.op == op && in.tag == tag; });
  };
  auto recv = at(OpKind::Recv, "B s3 mb0"), send = at(OpKind::Send, "F s2 mb0");
  ASSERT_TRUE(recv != program.end() && send != program.end());
  Instruction moved = *recv;
  program.erase(recv);
  program.insert(at(OpKind::Send, "F s2 mb0"), moved);
  pointers = pointersTo(broken);
  Result<std::vector<Schedule>> cyc = simulateTogether(pointers, flops, model);
  ASSERT_FALSE(cyc.ok());
  EXPECT_NE(cyc.error().message.find("wait cycle across the plans"),
            std::string::npos)
      << cyc.error().message;
  EXPECT_NE(cyc.error().message.find("rank 2 /program/"), std::string::npos)
      << cyc.error().message;
  EXPECT_NE(cyc.error().message.find("rank 3 /program/"), std::string::npos)
      << cyc.error().message;
  // Mismatched lists are refused.
  EXPECT_FALSE(simulateTogether(pointers, {}, model).ok());
}

// Measured durations replayed (the trainer's measured bubble): an entry >= 0
// replaces the model's duration, a negative one keeps it, a recv's is
// ignored (its wait is what the layout predicts), and bad lists are errors
// that name the instruction.
TEST(PipelinePlan, SimulateTogetherReplaysMeasuredSeconds) {
  PipelineSchedule schedule = build(PipelineScheduleKind::OneFOneB, 2, 2, 1);
  std::vector<Plan> plans = plansOf(schedule);
  std::vector<const Plan *> pointers = pointersTo(plans);
  std::vector<std::vector<double>> flops = teraflopPerCompute(plans), seconds;
  for (const Plan &p : plans) {
    std::vector<double> sec;
    for (const Instruction &in : p.program) {
      // Stage 1's forwards measured at 3 s; every recv "measured" at 100 s.
      sec.push_back(in.op == OpKind::Recv ? 100
                    : p.rank == 1 && in.op == OpKind::Compute &&
                            in.phase == "forward"
                        ? 3
                        : -1);
    }
    seconds.push_back(std::move(sec));
  }
  CostModel model = teraflopModel();
  Result<std::vector<Schedule>> plain =
      simulateTogether(pointers, flops, model);
  Result<std::vector<Schedule>> replayed =
      simulateTogether(pointers, flops, model, seconds);
  ASSERT_TRUE(plain.ok() && replayed.ok());
  size_t f0 = indexOf(plans[1], "1F0"), f1 = indexOf(plans[1], "1F1");
  for (size_t i : {f0, f1}) {
    EXPECT_NEAR((*plain)[1].end[i] - (*plain)[1].start[i], 1.0, 1e-6);
    EXPECT_NEAR((*replayed)[1].end[i] - (*replayed)[1].start[i], 3.0, 1e-9);
  }
  // 1F1B, 2 stages, 2 microbatches, transfers nearly free: rank 0 runs
  // 0F0 0F1 0B0 0B1, rank 1 1F0 1B0 1F1 1B1, every compute 1 s, steps of
  // 6 s and 5 s. Both of stage 1's forwards are on the critical path, so 2 s
  // more each add 4 s to both; the recvs' 100 s are not taken.
  EXPECT_NEAR((*plain)[0].stepSeconds, 6.0, 1e-3);
  EXPECT_NEAR((*plain)[1].stepSeconds, 5.0, 1e-3);
  EXPECT_NEAR((*replayed)[0].stepSeconds, 10.0, 1e-3);
  EXPECT_NEAR((*replayed)[1].stepSeconds, 9.0, 1e-3);
  std::vector<std::vector<double>> shortList = seconds;
  shortList[1].pop_back();
  Result<std::vector<Schedule>> bad =
      simulateTogether(pointers, flops, model, shortList);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("rank 1"), std::string::npos)
      << bad.error().message;
  EXPECT_NE(bad.error().message.find("seconds has"), std::string::npos)
      << bad.error().message;
  std::vector<std::vector<double>> notFinite = seconds;
  notFinite[0][0] = std::numeric_limits<double>::quiet_NaN();
  bad = simulateTogether(pointers, flops, model, notFinite);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("/program/0"), std::string::npos)
      << bad.error().message;
  EXPECT_FALSE(simulateTogether(pointers, flops, model, {seconds[0]}).ok());
}

// CostModel::dispatchSeconds: every instruction starts that long after its
// stream's previous instruction and its deps have ended, except a recv laid
// out together with its send (it ends where the send's transfer does). The
// stream's busy time does not include it.
TEST(PipelinePlan, SimulateTogetherAddsDispatchLatency) {
  PipelineSchedule schedule = build(PipelineScheduleKind::OneFOneB, 2, 4, 1);
  std::vector<Plan> plans = plansOf(schedule);
  std::vector<const Plan *> pointers = pointersTo(plans);
  std::vector<std::vector<double>> flops = teraflopPerCompute(plans);
  CostModel model = teraflopModel();
  Result<std::vector<Schedule>> plain =
      simulateTogether(pointers, flops, model);
  model.dispatchSeconds = 0.25;
  Result<std::vector<Schedule>> dispatched =
      simulateTogether(pointers, flops, model);
  ASSERT_TRUE(plain.ok() && dispatched.ok());
  std::map<std::string, double> sendEnd; // by tag (unique in a pipeline)
  for (size_t p = 0; p < plans.size(); ++p)
    for (size_t i = 0; i < plans[p].program.size(); ++i)
      if (plans[p].program[i].op == OpKind::Send)
        sendEnd[plans[p].program[i].tag] = (*dispatched)[p].end[i];
  for (size_t p = 0; p < plans.size(); ++p) {
    const Plan &plan = plans[p];
    const Schedule &s = (*dispatched)[p];
    std::map<std::string, size_t> index;
    std::map<std::string, double> lastEnd; // per stream
    for (size_t i = 0; i < plan.program.size(); ++i) {
      const Instruction &in = plan.program[i];
      index[in.id] = i;
      double ready = lastEnd.count(in.stream) ? lastEnd[in.stream] : 0.0;
      for (const std::string &d : in.deps)
        ready = std::max(ready, s.end[index.at(d)]);
      if (in.op == OpKind::Recv)
        EXPECT_NEAR(s.start[i], std::max(ready, sendEnd.at(in.tag)), 1e-9)
            << in.id;
      else
        EXPECT_NEAR(s.start[i], ready + 0.25, 1e-9) << in.id;
      lastEnd[in.stream] = s.end[i];
    }
    EXPECT_EQ(s.streamBusySeconds, (*plain)[p].streamBusySeconds);
    EXPECT_GT(s.stepSeconds, (*plain)[p].stepSeconds + 0.25);
  }
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    model.dispatchSeconds = bad;
    Result<std::vector<Schedule>> refused =
        simulateTogether(pointers, flops, model);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("dispatch latency"),
              std::string::npos)
        << refused.error().message;
  }
}

} // namespace
