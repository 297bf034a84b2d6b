//===- VerifyTest.cpp - Cross-rank verification ---------------------------===//
//
// Synthesized plan sets (PlanTestHelpers.h) verify; then one rank is mutated
// and the verifier must report exactly that rank and instruction.
//
//===----------------------------------------------------------------------===//

#include "PlanTestHelpers.h"

#include "meshplan/Plan/Verify.h"

#include <chrono>
#include <filesystem>
#include <fstream>

using namespace plantest;

namespace {

/// The structural checks (Verify.h (a)-(c)): the synthesized sets move
/// placeholder buffers (a gathered buffer no collective writes when its
/// redistribution is local), so no facts, no (d); what planned sets compute
/// is verified in test/planner/verify-step.test and verify.mutation.*.
VerifyResult verified(const std::vector<Plan> &plans) {
  Result<VerifyResult> r = verifyPlans(plans, PlanSetFacts{});
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : VerifyResult{};
}

size_t indexOf(const Plan &p, const std::string &id) {
  for (size_t i = 0; i < p.program.size(); ++i)
    if (p.program[i].id == id)
      return i;
  ADD_FAILURE() << "no instruction " << id;
  return 0;
}

/// Indices of the collectives on `comm` in program order.
std::vector<size_t> collectivesOn(const Plan &p, const std::string &comm) {
  std::vector<size_t> out;
  for (size_t i = 0; i < p.program.size(); ++i)
    if (isCollective(p.program[i].op) && p.program[i].comm == comm)
      out.push_back(i);
  return out;
}

/// Removes instruction i, rewiring deps on it to its own deps.
void dropInstruction(Plan &p, size_t i) {
  Instruction gone = p.program[i];
  p.program.erase(p.program.begin() + i);
  for (Instruction &in : p.program) {
    std::vector<std::string> deps;
    for (const std::string &d : in.deps) {
      if (d == gone.id)
        deps.insert(deps.end(), gone.deps.begin(), gone.deps.end());
      else
        deps.push_back(d);
    }
    in.deps = deps;
  }
}

struct MeshCase {
  int64_t a, b, c;
};
/// Every group has >= 3 members, so a single mutated rank is in the minority
/// and is the one blamed (with 2 members either side may be the odd one;
/// see TwoMemberGroupsNameBothRanks).
const MeshCase kMeshes[] = {{3, 3, 3}, {4, 4, 4}, {3, 4, 5}};

TEST(Verify, SynthesizedPlanSetsVerify) {
  for (MeshCase m : {MeshCase{2, 2, 2}, MeshCase{2, 4, 2}, MeshCase{4, 4, 4},
                     MeshCase{1, 2, 4}, MeshCase{3, 4, 5}}) {
    std::vector<Plan> plans = synthesize(mixedOptions(m.a, m.b, m.c, 2));
    VerifyResult r = verified(plans);
    EXPECT_TRUE(r.ok()) << r.failure->message;
    EXPECT_EQ(r.stats.ranks, m.a * m.b * m.c);
    EXPECT_GT(r.stats.collectives, 0);
  }
  // A permuted device order and sparse rank ids.
  SynthOptions o = mixedOptions(2, 2, 4);
  o.order = std::vector<int64_t>{};
  for (int64_t i = 0; i < 16; ++i)
    o.order->push_back(100 + (i * 7) % 16);
  VerifyResult r = verified(synthesize(o));
  EXPECT_TRUE(r.ok()) << r.failure->message;
}

TEST(Verify, StatsCountGroups) {
  // a=2,b=2,c=2: groups of c: 4, of a: 4, of b: 4, of (a,b,c): 1, of (b,c): 2.
  VerifyResult r = verified(synthesize(mixedOptions(2, 2, 2)));
  ASSERT_TRUE(r.ok()) << r.failure->message;
  EXPECT_EQ(r.stats.communicators, 4 + 4 + 4 + 1 + 2);
  EXPECT_EQ(r.stats.collectives, 8 * 7);
  EXPECT_EQ(r.stats.instructions, 8 * (7 + 7 * 2));
}

TEST(Verify, ChangedCountDtypeReduceIsBlamedOnTheMutatedRank) {
  for (MeshCase m : kMeshes) {
    int64_t n = m.a * m.b * m.c;
    for (int64_t rank : {int64_t(0), n / 2, n - 1}) {
      for (int what = 0; what < 4; ++what) {
        std::vector<Plan> plans = synthesize(mixedOptions(m.a, m.b, m.c));
        Plan &p = plans[rank];
        std::string id = what == 2 ? "L0.grad.s0" : "L0.wo.s0";
        if (what == 3)
          id = "L0.norm.s0";
        size_t i = indexOf(p, id);
        std::string field;
        switch (what) {
        case 0:
          p.program[i].count += 1;
          field = "count";
          break;
        case 1:
          p.program[i].dtype = DType::BFloat16;
          field = "dtype bfloat16";
          break;
        case 2:
          p.program[i].reduce = ReduceOp::Avg;
          field = "reduce avg";
          break;
        case 3:
          p.program[i].reduce = ReduceOp::Sum; // was max
          field = "reduce sum";
          break;
        }
        // Groups of size 1 have no one to disagree with.
        const Communicator *c = p.findCommunicator(p.program[i].comm);
        if (c->ranks.size() < 2)
          continue;
        VerifyResult r = verified(plans);
        ASSERT_FALSE(r.ok()) << id;
        EXPECT_EQ(r.failure->kind, FailureKind::Divergence);
        EXPECT_EQ(r.failure->rank, rank) << r.failure->message;
        EXPECT_EQ(r.failure->index, int64_t(i)) << r.failure->message;
        EXPECT_EQ(r.failure->instruction, id);
        EXPECT_EQ(r.failure->comm, p.program[i].comm);
        EXPECT_NE(r.failure->message.find(field), std::string::npos)
            << r.failure->message;
      }
    }
  }
}

TEST(Verify, DivergenceMessageFormat) {
  std::vector<Plan> plans = synthesize(mixedOptions(2, 2, 2));
  size_t i = indexOf(plans[5], "L0.wq.s0");
  plans[5].program[i].count = 7;
  VerifyResult r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->message,
            "rank 5 /program/0 \"L0.wq.s0\": collective #1 on communicator "
            "\"g:c\" has count 7, but rank 4 has count 768 (rank 4 "
            "/program/0 \"L0.wq.s0\": all_gather float32 count=768)");
}

TEST(Verify, DroppedCollectiveIsBlamedOnTheMutatedRank) {
  for (MeshCase m : kMeshes) {
    int64_t n = m.a * m.b * m.c;
    for (const char *id : {"L0.wq.s0", "L0.grad.s0", "L0.wo.s0"}) {
      std::vector<Plan> plans = synthesize(mixedOptions(m.a, m.b, m.c));
      int64_t rank = n - 1;
      Plan &p = plans[rank];
      size_t i = indexOf(p, id);
      std::string comm = p.program[i].comm;
      if (p.findCommunicator(comm)->ranks.size() < 2)
        continue;
      // The next collective on the same comm now sits at the dropped one's
      // position.
      std::vector<size_t> before = collectivesOn(p, comm);
      size_t pos = std::find(before.begin(), before.end(), i) - before.begin();
      dropInstruction(p, i);
      VerifyResult r = verified(plans);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.failure->kind, FailureKind::Divergence);
      EXPECT_EQ(r.failure->rank, rank) << r.failure->message;
      EXPECT_EQ(r.failure->comm, comm);
      std::vector<size_t> after = collectivesOn(p, comm);
      if (pos < after.size())
        EXPECT_EQ(r.failure->index, int64_t(after[pos])) << r.failure->message;
      else
        EXPECT_EQ(r.failure->index, -1) << r.failure->message;
    }
  }
}

TEST(Verify, FewerCollectivesIsADivergence) {
  std::vector<Plan> plans = synthesize(mixedOptions(2, 2, 2));
  Plan &p = plans[3];
  dropInstruction(p, indexOf(p, "L0.wk.s0")); // the last one on g:c
  VerifyResult r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->rank, 3);
  EXPECT_EQ(r.failure->index, -1);
  EXPECT_EQ(r.failure->message,
            "rank 3: collective #2 on communicator \"g:c\" is missing: rank 3 "
            "issues only 1 collectives on \"g:c\", but rank 2 issues "
            "/program/18 \"L0.wk.s0\": all_gather float32 count=144");
  // And one extra collective on one rank is blamed on that rank.
  plans = synthesize(mixedOptions(2, 2, 4));
  Instruction extra = plans[6].program[indexOf(plans[6], "L0.wk.s0")];
  extra.id = "extra";
  plans[6].program.push_back(extra);
  r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->rank, 6);
  EXPECT_EQ(r.failure->instruction, "extra");
}

TEST(Verify, TwoMemberGroupsNameBothRanks) {
  std::vector<Plan> plans = synthesize(mixedOptions(2, 2, 2));
  plans[4].program[indexOf(plans[4], "L0.grad.s0")].count = 5;
  VerifyResult r = verified(plans);
  ASSERT_FALSE(r.ok());
  // Group g:a of rank 4 is {0, 4}: the report names both.
  EXPECT_EQ(std::min(r.failure->rank, r.failure->otherRank), 0);
  EXPECT_EQ(std::max(r.failure->rank, r.failure->otherRank), 4);
}

TEST(Verify, SwappedCollectivesAreBlamedOnTheMutatedRank) {
  for (MeshCase m : kMeshes) {
    if (m.c < 2)
      continue;
    std::vector<Plan> plans = synthesize(mixedOptions(m.a, m.b, m.c));
    int64_t rank = (m.a * m.b * m.c) / 3;
    Plan &p = plans[rank];
    size_t i = indexOf(p, "L0.wq.s0"), j = indexOf(p, "L0.wk.s0");
    std::swap(p.program[i], p.program[j]);
    VerifyResult r = verified(plans);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.failure->kind, FailureKind::Divergence);
    EXPECT_EQ(r.failure->rank, rank) << r.failure->message;
    EXPECT_EQ(r.failure->index, int64_t(i)) << r.failure->message;
    EXPECT_EQ(r.failure->instruction, "L0.wk.s0");
  }
}

TEST(Verify, CollectiveOnACommTheRankIsNotInIsRejected) {
  std::vector<Plan> plans = synthesize(mixedOptions(2, 2, 2));
  // Point rank 2's collective at a communicator only other ranks define.
  Plan p = plans[2];
  p.program[indexOf(p, "L0.wq.s0")].comm = "g:x";
  Result<void> ok = validatePlan(p);
  ASSERT_FALSE(ok.ok());
  EXPECT_EQ(ok.error().message,
            "/program/0/comm: unknown communicator \"g:x\"");
  // Or define it with another rank's group.
  p = plans[2];
  p.communicators[0] = plans[0].communicators[0];
  ok = validatePlan(p);
  ASSERT_FALSE(ok.ok());
  EXPECT_EQ(ok.error().message,
            "/communicators/0/ranks: this plan's rank 2 is not a member of "
            "communicator \"g:c\"");
}

TEST(Verify, StreamsWaitingOnEachOther) {
  std::vector<Plan> plans = synthesize(mixedOptions(2, 2, 2));
  Plan &p = plans[1];
  // The first compute (waits for L0.wq.s0 on comm) is made a dep of the
  // first comm instruction: comm waits for compute waits for comm.
  p.program[indexOf(p, "L0.wq.s0")].deps.push_back("L0.wq.use");
  VerifyResult r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->kind, FailureKind::StreamCycle);
  EXPECT_EQ(r.failure->rank, 1);
  EXPECT_EQ(r.failure->message,
            "rank 1: wait cycle among its own instructions:\n"
            "  /program/0 \"L0.wq.s0\" (stream \"comm\") waits for /program/1 "
            "\"L0.wq.use\" (deps)\n"
            "  /program/1 \"L0.wq.use\" (stream \"compute\") waits for "
            "/program/0 \"L0.wq.s0\" (deps)");
  // A longer cycle through stream order on both streams.
  plans = synthesize(mixedOptions(2, 2, 2));
  plans[4].program[indexOf(plans[4], "L0.wq.s0")].deps.push_back("L0.grad.use");
  r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->kind, FailureKind::StreamCycle);
  EXPECT_EQ(r.failure->rank, 4);
}

/// Two ranks, two communicators over both: rank 0 issues a then b, rank 1
/// b then a. Each communicator's sequence matches, but neither can run.
std::vector<Plan> crossedPair(bool crossed) {
  std::vector<Plan> plans;
  for (int64_t rank : {0, 1}) {
    Plan p;
    p.mesh.axes = {{"x", 2, false}};
    p.rank = rank;
    p.streams = {"comm"};
    for (const char *id : {"a", "b"}) {
      Communicator c;
      c.id = id;
      c.ranks = {0, 1};
      c.key = rank;
      p.communicators.push_back(c);
    }
    p.buffers.push_back(
        {"buf", BufferKind::Scratch, DType::Float32, {4}, {4}, {0}});
    for (const char *comm : {"a", "b"}) {
      Instruction in;
      in.id = std::string("ar.") + comm;
      in.stream = "comm";
      in.op = OpKind::AllReduce;
      in.comm = comm;
      in.dtype = DType::Float32;
      in.count = 4;
      in.reduce = ReduceOp::Sum;
      p.program.push_back(in);
    }
    if (crossed && rank == 1)
      std::swap(p.program[0], p.program[1]);
    plans.push_back(p);
  }
  return plans;
}

TEST(Verify, CrossRankDeadlock) {
  VerifyResult ok = verified(crossedPair(false));
  EXPECT_TRUE(ok.ok()) << ok.failure->message;
  VerifyResult r = verified(crossedPair(true));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->kind, FailureKind::Deadlock);
  EXPECT_EQ(r.failure->message,
            "deadlock: 4 instructions on 2 ranks can never run; wait cycle:\n"
            "  rank 0 /program/0 \"ar.a\" (all_reduce #1 on \"a\", stream "
            "\"comm\") issued; waits for rank 1 to issue its #1 on \"a\": "
            "rank 1 /program/1 \"ar.a\" (all_reduce #1 on \"a\", stream "
            "\"comm\")\n"
            "  rank 1 /program/1 \"ar.a\" (all_reduce #1 on \"a\", stream "
            "\"comm\") waits for the previous instruction on its stream: "
            "rank 1 /program/0 \"ar.b\" (all_reduce #1 on \"b\", stream "
            "\"comm\")\n"
            "  rank 1 /program/0 \"ar.b\" (all_reduce #1 on \"b\", stream "
            "\"comm\") issued; waits for rank 0 to issue its #1 on \"b\": "
            "rank 0 /program/1 \"ar.b\" (all_reduce #1 on \"b\", stream "
            "\"comm\")\n"
            "  rank 0 /program/1 \"ar.b\" (all_reduce #1 on \"b\", stream "
            "\"comm\") waits for the previous instruction on its stream: "
            "rank 0 /program/0 \"ar.a\" (all_reduce #1 on \"a\", stream "
            "\"comm\")");
}

TEST(Verify, CrossRankDeadlockThroughDepsAcrossStreams) {
  // 64 ranks: rank R issues the world all-gather before its c-group
  // all-gather (on another stream, made to wait for it); its c-peers do the
  // c-group first and the world gather after.
  std::vector<Plan> plans = synthesize(mixedOptions(4, 4, 4));
  int64_t rank = 37;
  Plan &p = plans[rank];
  size_t wq = indexOf(p, "L0.wq.s0");
  p.program[wq].deps.push_back("L0.wo.s0");
  p.program[wq].stream = "compute"; // so stream order does not cycle locally
  VerifyResult r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->kind, FailureKind::Deadlock) << r.failure->message;
  EXPECT_NE(r.failure->message.find("rank 37 "), std::string::npos)
      << r.failure->message;
}

TEST(Verify, CommunicatorDefinitionsMustAgree) {
  // Rank 1 lists another member order for "a" (keys adjusted).
  std::vector<Plan> plans = crossedPair(false);
  plans[1].communicators[0].ranks = {1, 0};
  plans[1].communicators[0].key = 0;
  VerifyResult r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->kind, FailureKind::CommMismatch);
  EXPECT_EQ(r.failure->message,
            "rank 1: /communicators/0: communicator \"a\" is defined with "
            "color 0 and ranks [1,0], but rank 0 gives the same id and color "
            "to ranks [0,1]");
  plans[1].communicators[0].color = 5;
  r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->message,
            "rank 1: /communicators/0: communicator \"a\" is defined with "
            "ranks [1,0], but rank 0 defines it with ranks [0,1]");
  // Same members, different fault tolerance.
  plans = crossedPair(false);
  plans[1].communicators[1].faultTolerant = true;
  r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->message,
            "rank 1: /communicators/1: communicator \"b\" is defined with "
            "fault_tolerant true, but rank 0 defines it with false");
  // A member that does not define it at all.
  plans = crossedPair(false);
  plans[1].communicators.pop_back();
  plans[1].program.pop_back();
  r = verified(plans);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.failure->kind, FailureKind::CommMissing);
  EXPECT_EQ(r.failure->message,
            "rank 1 does not define communicator \"b\", but rank 0 defines it "
            "with member ranks [0,1]");
}

TEST(Verify, BadSets) {
  std::vector<Plan> plans = synthesize(mixedOptions(2, 2, 2));
  Result<VerifyResult> r = verifyPlans({});
  EXPECT_EQ(r.error().message, "the plan set is empty");
  std::vector<Plan> partial(plans.begin(), plans.begin() + 7);
  r = verifyPlans(partial);
  EXPECT_EQ(r.error().message,
            "no plan for rank 7 (the mesh has 8 ranks; the set has 7 plans)");
  partial.push_back(plans[0]);
  r = verifyPlans(partial);
  EXPECT_EQ(r.error().message, "two plans for rank 0");
  plans[3].mesh.axes[0].name = "z";
  VerifyResult v = verified(plans);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.failure->kind, FailureKind::MeshMismatch);
  EXPECT_EQ(v.failure->message,
            "rank 3: mesh z=2,b=2,c=2 differs from rank 0's mesh a=2,b=2,c=2");
}

class TempDir {
public:
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("meshplan-verify-" + std::to_string(::getpid()) + "-" +
            std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  void write(const std::string &name, const std::string &text) {
    std::ofstream(path / name) << text;
  }
  std::filesystem::path path;
  static inline int counter = 0;
};

TEST(Verify, Directories) {
  std::vector<Plan> plans = synthesize(mixedOptions(2, 2, 2));
  TempDir dir;
  for (const Plan &p : plans)
    dir.write("rank" + std::to_string(p.rank) + ".json", writePlan(p));
  dir.write("notes.txt", "ignored");
  Result<std::vector<Plan>> read = readPlanDirectory(dir.path.string(), 3);
  ASSERT_TRUE(read.ok()) << read.error().message;
  EXPECT_EQ(*read, plans);
  EXPECT_TRUE(verified(*read).ok());

  dir.write("index.json", R"({"format": "meshplan.plan-index", "version": 2,
                              "ranks": [0,1,2,3,4,5,6]})");
  read = readPlanDirectory(dir.path.string());
  std::string d = dir.path.string() + "/";
  EXPECT_EQ(read.error().message,
            d + "rank7.json is not listed in " + d + "index.json");
  dir.write("index.json", R"({"format": "meshplan.plan-index", "version": 2,
                              "ranks": [0,1,2,3,4,5,6,7,8]})");
  read = readPlanDirectory(dir.path.string());
  EXPECT_EQ(read.error().message, d + "index.json lists rank 8, but " + d +
                                      "rank8.json does not exist");
  // The index carries the plans' version: a version-1 index is refused.
  dir.write("index.json", R"({"format": "meshplan.plan-index", "version": 1,
                              "ranks": [0,1,2,3,4,5,6,7]})");
  read = readPlanDirectory(dir.path.string());
  EXPECT_EQ(read.error().message, d + "index.json: /version: expected 2");
  dir.write("index.json", R"({"format": "meshplan.plan-index", "version": 2,
                              "ranks": [0,1,2,3,4,5,6,7]})");
  read = readPlanDirectory(dir.path.string());
  ASSERT_TRUE(read.ok()) << read.error().message;

  std::string text = writePlan(plans[3]);
  text.replace(text.find("\"comm\":\"g:c\""), 12, "\"comm\":\"c9\"");
  dir.write("rank3.json", text);
  read = readPlanDirectory(dir.path.string());
  EXPECT_EQ(read.error().message,
            d + "rank3.json: /program/0/comm: unknown communicator \"c9\"");
  dir.write("rank3.json", writePlan(plans[4]));
  read = readPlanDirectory(dir.path.string());
  EXPECT_EQ(read.error().message, d + "rank3.json: /rank: the file is named "
                                      "for rank 3 but the plan is for rank 4");
  read = readPlanDirectory((dir.path / "missing").string());
  EXPECT_FALSE(read.ok());
}

/// Verification-only reading keeps what verifyPlans reads (as
/// instantiate's verificationOnly) and verifies alike; every plan is still
/// validated in full, and the first bad file in rank order is reported.
TEST(Verify, DirectoriesForVerification) {
  std::vector<Plan> plans = synthesize(mixedOptions(2, 2, 2, 3));
  TempDir dir;
  for (const Plan &p : plans)
    dir.write("rank" + std::to_string(p.rank) + ".json", writePlan(p));
  for (unsigned threads : {1u, 2u}) {
    Result<std::vector<Plan>> read = readPlanDirectory(
        dir.path.string(), threads, PlanDetail::VerificationOnly);
    ASSERT_TRUE(read.ok()) << read.error().message;
    ASSERT_EQ(read->size(), plans.size());
    for (size_t i = 0; i < plans.size(); ++i) {
      const Plan &full = plans[i], &lean = (*read)[i];
      EXPECT_EQ(lean.mesh, full.mesh);
      EXPECT_EQ(lean.rank, full.rank);
      EXPECT_EQ(lean.communicators, full.communicators);
      EXPECT_EQ(lean.streams, full.streams);
      EXPECT_TRUE(lean.buffers.empty());
      EXPECT_FALSE(lean.estimates || lean.optimizer);
      ASSERT_EQ(lean.program.size(), full.program.size());
      for (size_t k = 0; k < full.program.size(); ++k) {
        Instruction expected;
        const Instruction &in = full.program[k];
        expected.id = in.id;
        expected.stream = in.stream;
        expected.op = in.op;
        expected.comm = in.comm;
        expected.dtype = in.dtype;
        expected.count = in.count;
        expected.reduce = in.reduce;
        expected.root = in.root;
        expected.deps = in.deps;
        EXPECT_EQ(lean.program[k], expected);
      }
    }
    // readPlanSet: the same plans plus the facts of the full ones, equal
    // to factsOf(plans) whichever thread interned what (compared resolved,
    // since indices depend on the order of interning).
    Result<PlanSet> set = readPlanSet(dir.path.string(), threads);
    ASSERT_TRUE(set.ok()) << set.error().message;
    PlanSetFacts want = factsOf(plans);
    ASSERT_EQ(set->facts.plans.size(), plans.size());
    auto text = [](const PlanSetFacts &f, int32_t s) {
      return s < 0 ? std::string("-") : f.strings[s];
    };
    auto buffer = [&](const PlanSetFacts &f, int32_t b) {
      const BufferFacts &x = f.buffers[b];
      return text(f, x.id) + "|" + text(f, x.tensor) + "|" + text(f, x.layout) +
             "|" + std::to_string(int(x.kind)) + "|" +
             std::to_string(int(x.dtype)) + "|" +
             std::to_string(x.tensorId.value_or(-1)) + "|" +
             std::to_string(x.globalShape.size());
    };
    for (size_t i = 0; i < plans.size(); ++i) {
      const PlanFacts &got = set->facts.plans[i], &exp = want.plans[i];
      ASSERT_EQ(got.buffers.size(), exp.buffers.size());
      for (size_t b = 0; b < got.buffers.size(); ++b)
        EXPECT_EQ(buffer(set->facts, got.buffers[b]),
                  buffer(want, exp.buffers[b]));
      EXPECT_EQ(got.operands, exp.operands);
      EXPECT_EQ(got.operandStart, exp.operandStart);
      EXPECT_EQ(got.inputCount, exp.inputCount);
      EXPECT_EQ(got.phase, exp.phase);
      EXPECT_EQ(got.microbatch, exp.microbatch);
      ASSERT_EQ(got.label.size(), exp.label.size());
      for (size_t k = 0; k < got.label.size(); ++k) {
        EXPECT_EQ(text(set->facts, got.label[k]), text(want, exp.label[k]));
        EXPECT_EQ(text(set->facts, got.unit[k]), text(want, exp.unit[k]));
      }
    }
    // ... and verify as the full plans do (whether or not these
    // placeholder programs pass (d)).
    Result<VerifyResult> c = verifyPlans(set->plans, set->facts);
    Result<VerifyResult> full = verifyPlans(plans);
    ASSERT_TRUE(c.ok() && full.ok());
    EXPECT_EQ(c->ok(), full->ok());
    if (!c->ok() && !full->ok()) {
      EXPECT_EQ(c->failure->message, full->failure->message);
    }
    VerifyResult a = verified(plans), b = verified(*read);
    EXPECT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a.stats.instructions, b.stats.instructions);
    EXPECT_EQ(a.stats.collectives, b.stats.collectives);
    EXPECT_EQ(a.stats.communicators, b.stats.communicators);
  }
  // A buffer error (which verification-only plans do not keep) is still
  // found, and of two bad files the first in rank order is named.
  std::string d = dir.path.string() + "/";
  for (int r : {6, 2}) {
    std::string text = writePlan(plans[r]);
    size_t at = text.find("\"layout\":\"");
    ASSERT_NE(at, std::string::npos);
    text.insert(at + 10, "x");
    dir.write("rank" + std::to_string(r) + ".json", text);
  }
  for (unsigned threads : {1u, 2u}) {
    Result<std::vector<Plan>> read = readPlanDirectory(
        dir.path.string(), threads, PlanDetail::VerificationOnly);
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.error().message.substr(0, d.size() + 22),
              d + "rank2.json: /buffers/0");
  }
}

TEST(Verify, ScalesLinearly) {
  // 512 ranks x ~630 instructions: well under a second in a release build.
  std::vector<Plan> plans = synthesize(mixedOptions(8, 8, 8, 30));
  auto t0 = std::chrono::steady_clock::now();
  VerifyResult r = verified(plans);
  double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_TRUE(r.ok()) << r.failure->message;
  EXPECT_EQ(r.stats.ranks, 512);
  EXPECT_LT(s, 10.0);
}

} // namespace

namespace {
/// Writes a synthetic 1,024-rank set (mesh a=8,b=8,c=16, 48 layers: 1,008
/// instructions per rank) to $MESHPLAN_SYNTH_DIR, for timing `meshplan
/// verify`. Run with --gtest_also_run_disabled_tests
/// --gtest_filter=Verify.DISABLED_WriteSyntheticSet.
TEST(Verify, DISABLED_WriteSyntheticSet) {
  const char *out = std::getenv("MESHPLAN_SYNTH_DIR");
  ASSERT_NE(out, nullptr) << "set MESHPLAN_SYNTH_DIR";
  std::vector<Plan> plans = synthesize(mixedOptions(8, 8, 16, 48));
  auto t0 = std::chrono::steady_clock::now();
  VerifyResult r = verified(plans);
  double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_TRUE(r.ok()) << r.failure->message;
  std::printf("in-memory verify: %lld ranks, %lld instructions, %lld "
              "collectives: %.3f s\n",
              (long long)r.stats.ranks, (long long)r.stats.instructions,
              (long long)r.stats.collectives, s);
  std::filesystem::create_directories(out);
  for (const Plan &p : plans)
    std::ofstream(std::filesystem::path(out) /
                  ("rank" + std::to_string(p.rank) + ".json"))
        << writePlan(p);
}
} // namespace
