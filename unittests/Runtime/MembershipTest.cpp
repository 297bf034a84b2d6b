//===- MembershipTest.cpp - Heartbeats, quorum and epoch CAS in Redis -----===//
//
// runtime.ft.membership: the membership layer of fault-tolerant replicas
// (docs/fault-tolerance.md, "Membership") against a real redis-server that
// each test starts on a free loopback port (--save '' --appendonly no unless
// a test needs persistence) and stops by its pid:
//
// - the epoch compare-and-set: competing proposers (threads, and forked
//   processes released at one instant) on one expected epoch, exactly one
//   wins and every loser sees the winner's quorum;
// - the quorum rule on every live subset of 1-5 groups and every
//   min_replicas: a quorum forms iff |live| >= min_replicas and
//   2 |live| > groups, so two disjoint live sets never both form one;
// - heartbeat expiry: a group that stops refreshing, and a forked process
//   killed with signal 9, are seen dead within expiry + 1 s (the measured
//   latencies are printed);
// - two jobs on one server do not see each other's keys;
// - the store unreachable, killed, hung, restarted with and without
//   persistence: a clear error naming redis://HOST:PORT, never a hang.
//
// Skipped, with a line saying so, when redis-server is not installed.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Membership.h"

#include <gtest/gtest.h>
#include <hiredis.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

long long msSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t)
      .count();
}

/// A loopback port nothing listens on right now.
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string redisServerPath() {
  for (const char *p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"})
    if (::access(p, X_OK) == 0)
      return p;
  return "";
}

/// A direct hiredis client, to look at and plant keys behind the API's back.
class RawClient {
public:
  explicit RawClient(int port) {
    timeval tv{2, 0};
    ctx = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (ctx && !ctx->err)
      redisSetTimeout(ctx, tv);
  }
  ~RawClient() {
    if (ctx)
      redisFree(ctx);
  }
  bool ok() const { return ctx && !ctx->err; }
  /// The reply as text (arrays joined by '\n'); nullopt on any failure.
  std::optional<std::string> cmd(const std::vector<std::string> &args) {
    if (!ok())
      return std::nullopt;
    std::vector<const char *> argv;
    std::vector<size_t> lens;
    for (const std::string &a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto *r = static_cast<redisReply *>(redisCommandArgv(
        ctx, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (!r)
      return std::nullopt;
    std::string out = text(r);
    bool err = r->type == REDIS_REPLY_ERROR;
    freeReplyObject(r);
    if (err)
      return std::nullopt;
    return out;
  }

private:
  static std::string text(const redisReply *r) {
    switch (r->type) {
    case REDIS_REPLY_INTEGER:
      return std::to_string(r->integer);
    case REDIS_REPLY_NIL:
      return "(nil)";
    case REDIS_REPLY_ARRAY: {
      std::string s;
      for (size_t i = 0; i < r->elements; ++i) {
        if (i)
          s += '\n';
        s += text(r->element[i]);
      }
      return s;
    }
    default:
      return std::string(r->str, r->len);
    }
  }
  redisContext *ctx = nullptr;
};

/// A private redis-server on a loopback port, stopped by its pid.
class RedisServer {
public:
  RedisServer() {
    dir = std::filesystem::temp_directory_path() /
          ("meshplan-ft-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter++));
    std::filesystem::create_directories(dir);
  }
  ~RedisServer() {
    stop(SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  /// Starts the server (on `port`, or a free one); waits until it answers.
  bool start(bool persistent = false, int onPort = 0) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      port = onPort ? onPort : freePort();
      std::string log = (dir / "redis.log").string();
      std::vector<std::string> args = {redisServerPath(),
                                       "--bind",
                                       "127.0.0.1",
                                       "--port",
                                       std::to_string(port),
                                       "--dir",
                                       dir.string(),
                                       "--daemonize",
                                       "no",
                                       "--save",
                                       ""};
      if (persistent) {
        args.insert(args.end(),
                    {"--appendonly", "yes", "--appendfsync", "always"});
      } else {
        args.insert(args.end(), {"--appendonly", "no"});
      }
      std::vector<char *> argv;
      for (std::string &a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      pid = ::fork();
      if (pid == 0) {
        int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
          ::dup2(fd, 1);
          ::dup2(fd, 2);
        }
        ::execv(argv[0], argv.data());
        ::_exit(127);
      }
      for (int i = 0; i < 100; ++i) {
        RawClient c(port);
        if (c.cmd({"PING"}) == std::optional<std::string>("PONG"))
          return true;
        if (::waitpid(pid, nullptr, WNOHANG) == pid) {
          pid = -1;
          break; // port taken between freePort and bind: try another
        }
        std::this_thread::sleep_for(50ms);
      }
      stop(SIGKILL);
      if (onPort)
        break;
    }
    return false;
  }

  void stop(int sig) {
    if (pid <= 0)
      return;
    ::kill(pid, sig);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  void signal(int sig) { ::kill(pid, sig); }

  int port = 0;
  pid_t pid = -1;
  std::filesystem::path dir;

private:
  static inline int counter = 0;
};

MembershipOptions options(int port, const std::string &job, int group,
                          int groups, int minReplicas,
                          std::chrono::milliseconds expiry = 2000ms) {
  MembershipOptions o;
  o.port = port;
  o.job = job;
  o.replicaGroup = group;
  o.numGroups = groups;
  o.minReplicas = minReplicas;
  o.heartbeatExpiry = expiry;
  return o;
}

std::unique_ptr<Membership> mustConnect(const MembershipOptions &o) {
  auto m = Membership::connect(o);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? std::move(m.value()) : nullptr;
}

class MembershipTest : public ::testing::Test {
protected:
  void SetUp() override {
    if (redisServerPath().empty())
      GTEST_SKIP() << "redis-server is not installed (scripts/setup.sh "
                      "installs Debian's redis-server); the membership "
                      "tests need a real store";
    ASSERT_TRUE(redis.start())
        << "redis-server did not start; see " << (redis.dir / "redis.log");
  }
  RedisServer redis;
};

//===----------------------------------------------------------------------===//
// Options and an unreachable store
//===----------------------------------------------------------------------===//

TEST(MembershipOptionsTest, BadOptionsAreRefusedBeforeConnecting) {
  // Port 1: nothing is contacted, the options fail first.
  auto m = Membership::connect(options(1, "job", 0, 3, 4));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().message, "membership: min_replicas 4 must be in 1..3 "
                               "(the job has 3 replica groups)");
  m = Membership::connect(options(1, "job", 3, 3, 1));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().message, "membership: replica group 3 is not in 0..2");
  m = Membership::connect(options(1, "a}b", 0, 3, 1));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("job name \"a}b\""), std::string::npos);
  MembershipOptions o = options(1, "job", 0, 3, 1, 100ms);
  o.heartbeatPeriod = 100ms;
  m = Membership::connect(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("must be below the expiry"),
            std::string::npos);
}

TEST(MembershipOptionsTest, UnreachableStoreIsOneClearError) {
  int port = freePort(); // nothing listens there
  MembershipOptions o = options(port, "job", 0, 3, 2);
  o.connectTimeout = 1000ms;
  auto start = Clock::now();
  auto m = Membership::connect(o);
  long long ms = msSince(start);
  ASSERT_FALSE(m.ok());
  std::string name = "redis://127.0.0.1:" + std::to_string(port);
  EXPECT_EQ(m.error().message, "cannot reach the membership store " + name +
                                   ": Connection refused (connect timeout "
                                   "1000 ms)");
  EXPECT_LT(ms, 1500) << "the error must come within the connect timeout";
}

TEST(MembershipOptionsTest, SilentStoreIsOneClearError) {
  // A socket that listens but never answers (the kernel completes the TCP
  // handshake; nobody reads): bounded by the I/O timeout, not a hang.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  int port = ntohs(a.sin_port);
  MembershipOptions o = options(port, "job", 0, 3, 2);
  o.connectTimeout = 500ms;
  o.ioTimeout = 500ms;
  auto start = Clock::now();
  auto m = Membership::connect(o);
  long long ms = msSince(start);
  ::close(fd);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().message,
            "membership store redis://127.0.0.1:" + std::to_string(port) +
                ": recording the job: no reply within 500 ms (the store is "
                "hung or unreachable)");
  EXPECT_LT(ms, 1500);
}

//===----------------------------------------------------------------------===//
// The epoch compare-and-set
//===----------------------------------------------------------------------===//

TEST_F(MembershipTest, FirstQuorumAndRepeatedProposal) {
  std::vector<std::unique_ptr<Membership>> groups;
  for (int g = 0; g < 3; ++g) {
    groups.push_back(mustConnect(options(redis.port, "first", g, 3, 2)));
    ASSERT_TRUE(groups.back());
    ASSERT_TRUE(groups.back()->startHeartbeat().ok());
  }
  auto q = groups[1]->currentQuorum();
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(*q, (Quorum{0, {}}));

  auto p = groups[2]->proposeNextEpoch(0);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->won);
  EXPECT_EQ(p->quorum, (Quorum{1, {0, 1, 2}}));

  // The same expected epoch again: the epoch has moved, nothing changes.
  p = groups[0]->proposeNextEpoch(0);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_FALSE(p->won);
  EXPECT_EQ(p->quorum, (Quorum{1, {0, 1, 2}}));
  q = groups[0]->currentQuorum();
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, (Quorum{1, {0, 1, 2}}));

  // An expected epoch ahead of the store means the store went backwards.
  p = groups[0]->proposeNextEpoch(5);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("behind the expected epoch 5"),
            std::string::npos)
      << p.error().message;
}

// Which members hold the committed state, fixed with each epoch: the heal's
// sources (docs/fault-tolerance.md, "Healing"). One rank per group, so a
// step commits with 1 ok vote per member.
TEST_F(MembershipTest, SyncedGroupsAreThoseHoldingTheCommittedState) {
  std::vector<std::unique_ptr<Membership>> g;
  for (int i = 0; i < 3; ++i) {
    g.push_back(mustConnect(options(redis.port, "synced", i, 3, 1)));
    ASSERT_TRUE(g.back());
    ASSERT_TRUE(g.back()->startHeartbeat().ok());
  }
  auto install = [&](int proposer, int64_t expected) {
    auto p = g[size_t(proposer)]->proposeNextEpoch(expected);
    EXPECT_TRUE(p.ok() && p->won) << (p.ok() ? "lost" : p.error().message);
    return p.ok() ? p->quorum : Quorum{};
  };
  auto synced = [&](int64_t epoch) {
    auto s = g[0]->syncedOf(epoch);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return s.ok() ? *s : std::vector<int>{99};
  };
  auto vote = [&](int group, int64_t epoch, int64_t step, bool ok,
                  int64_t committing) {
    auto v = g[size_t(group)]->voteStep(epoch, step, group, ok, committing);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_TRUE(*v);
  };

  // The first epoch: everyone starts from the initial parameters.
  EXPECT_EQ(install(0, 0), (Quorum{1, {0, 1, 2}}));
  EXPECT_EQ(synced(1), (std::vector<int>{0, 1, 2}));
  // Group 1 lost before any step of epoch 1 committed.
  ASSERT_TRUE(g[1]->leaveGroup().ok());
  EXPECT_EQ(install(0, 1), (Quorum{2, {0, 2}}));
  EXPECT_EQ(synced(2), (std::vector<int>{0, 2}));
  // It comes back: a joiner, although it was a member of epoch 1.
  ASSERT_TRUE(g[1]->startHeartbeat().ok());
  EXPECT_EQ(install(1, 2), (Quorum{3, {0, 1, 2}}));
  EXPECT_EQ(synced(3), (std::vector<int>{0, 2}));
  // Its heal fails (it votes the step failed), and source 2 dies: the next
  // epoch's only source is group 0, never the joiner that did not heal.
  vote(0, 3, 5, true, 3);
  vote(1, 3, 5, false, 3);
  vote(2, 3, 5, true, 3);
  ASSERT_TRUE(g[2]->leaveGroup().ok());
  EXPECT_EQ(install(1, 3), (Quorum{4, {0, 1}}));
  EXPECT_EQ(synced(4), (std::vector<int>{0}));
  // A step commits in epoch 4 (every member's ok vote): both hold it.
  vote(0, 4, 5, true, 2);
  vote(1, 4, 5, true, 2);
  ASSERT_TRUE(g[2]->startHeartbeat().ok());
  EXPECT_EQ(install(2, 4), (Quorum{5, {0, 1, 2}}));
  EXPECT_EQ(synced(5), (std::vector<int>{0, 1}));
  // Two of three ok votes, then group 0 is lost: no commit in epoch 5, so
  // its synced groups carry over, less the lost one.
  vote(1, 5, 6, true, 3);
  vote(2, 5, 6, true, 3);
  ASSERT_TRUE(g[0]->leaveGroup().ok());
  EXPECT_EQ(install(1, 5), (Quorum{6, {1, 2}}));
  EXPECT_EQ(synced(6), (std::vector<int>{1}));
  EXPECT_EQ(synced(0), (std::vector<int>{}));
  EXPECT_EQ(synced(7), (std::vector<int>{}));
}

// A group restarted while an epoch still lists it (two groups of three lost
// at once: nobody could install the loss epoch) holds none of the job's
// state: the next epoch records its new incarnation and never counts it
// among the synced groups, and records the steps committed so far, which a
// joiner takes as its counter (docs/fault-tolerance.md, "Epochs").
TEST_F(MembershipTest, RestartedGroupIsNeverSyncedAndEpochsRecordSteps) {
  std::vector<std::unique_ptr<Membership>> g;
  for (int i = 0; i < 3; ++i) {
    g.push_back(mustConnect(options(redis.port, "inc", i, 3, 1)));
    ASSERT_TRUE(g.back());
    ASSERT_TRUE(g.back()->startHeartbeat().ok());
  }
  auto p = g[0]->proposeNextEpoch(0);
  ASSERT_TRUE(p.ok() && p->won);
  auto r1 = g[0]->epochRecord(1);
  ASSERT_TRUE(r1.ok()) << r1.error().message;
  EXPECT_EQ(r1->members, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(r1->incarnations, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(r1->synced, (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(r1->stepsCommitted);
  EXPECT_TRUE(r1->hasMember(1, 0));
  EXPECT_FALSE(r1->hasMember(1, 1));
  // Step 4 commits in epoch 1 (one rank per group).
  for (int i = 0; i < 3; ++i) {
    auto v = g[size_t(i)]->voteStep(1, 4, i, true, 3);
    ASSERT_TRUE(v.ok() && *v);
  }
  // Groups 1 and 2 die and come back at incarnation 1 before any epoch
  // could leave them out.
  for (int i : {1, 2}) {
    g[size_t(i)].reset();
    auto o = options(redis.port, "inc", i, 3, 1);
    o.incarnation = 1;
    g[size_t(i)] = mustConnect(o);
    ASSERT_TRUE(g[size_t(i)]);
    ASSERT_TRUE(g[size_t(i)]->startHeartbeat().ok());
  }
  p = g[1]->proposeNextEpoch(1);
  ASSERT_TRUE(p.ok() && p->won);
  auto r2 = g[2]->epochRecord(2);
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  EXPECT_EQ(r2->members, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(r2->incarnations, (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(r2->synced, (std::vector<int>{0}));
  EXPECT_EQ(r2->stepsCommitted, std::optional<int64_t>(4));
  EXPECT_TRUE(r2->hasMember(2, 1));
  // An epoch never installed has no record.
  auto r9 = g[0]->epochRecord(9);
  ASSERT_TRUE(r9.ok());
  EXPECT_TRUE(r9->members.empty());
}

TEST_F(MembershipTest, CompetingThreadsExactlyOneWinsEachEpoch) {
  constexpr int kGroups = 4, kRounds = 40;
  std::vector<std::unique_ptr<Membership>> ms;
  for (int g = 0; g < kGroups; ++g) {
    ms.push_back(mustConnect(options(redis.port, "race", g, kGroups, 3)));
    ASSERT_TRUE(ms.back());
    ASSERT_TRUE(ms.back()->startHeartbeat().ok());
  }
  std::vector<std::optional<EpochProposal>> got(kGroups);
  std::vector<std::string> errors(kGroups);
  std::barrier<> sync(kGroups + 1);
  std::atomic<int64_t> expected{0};
  std::vector<std::thread> threads;
  for (int g = 0; g < kGroups; ++g)
    threads.emplace_back([&, g] {
      for (int r = 0; r < kRounds; ++r) {
        sync.arrive_and_wait(); // released together
        auto p = ms[g]->proposeNextEpoch(expected.load());
        if (p.ok())
          got[g] = *p;
        else
          errors[g] = p.error().message;
        sync.arrive_and_wait(); // results ready
        sync.arrive_and_wait(); // checked
      }
    });
  for (int r = 0; r < kRounds; ++r) {
    for (auto &x : got)
      x.reset();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    int winners = 0;
    for (int g = 0; g < kGroups; ++g) {
      // EXPECT, not ASSERT: returning here would leave the threads waiting
      // at the barrier.
      EXPECT_TRUE(got[g].has_value()) << "group " << g << ": " << errors[g];
      if (!got[g])
        continue;
      winners += got[g]->won;
      EXPECT_EQ(got[g]->quorum, (Quorum{r + 1, {0, 1, 2, 3}}))
          << "round " << r << ", group " << g;
    }
    EXPECT_EQ(winners, 1) << "round " << r;
    expected = r + 1;
    sync.arrive_and_wait();
  }
  for (auto &t : threads)
    t.join();
}

TEST_F(MembershipTest, CompetingProcessesExactlyOneWins) {
  // Four processes propose epoch 1 at one instant (a shared release time);
  // each reports by exit status: 10 won, 11 lost and saw the winner's
  // quorum, 1 anything else. The heartbeats are planted directly so that the
  // parent has no threads when it forks.
  constexpr int kProcs = 4;
  {
    RawClient raw(redis.port);
    for (int g = 0; g < kProcs; ++g)
      ASSERT_TRUE(raw.cmd({"SET", "meshplan:{procs}:hb:" + std::to_string(g),
                           "planted", "PX", "60000"}));
  }
  auto release = std::chrono::system_clock::now() + 500ms;
  std::vector<pid_t> pids;
  for (int g = 0; g < kProcs; ++g) {
    pid_t pid = ::fork();
    if (pid == 0) {
      auto m = Membership::connect(options(redis.port, "procs", g, kProcs, 3));
      if (!m.ok())
        ::_exit(1);
      std::this_thread::sleep_until(release);
      auto p = m.value()->proposeNextEpoch(0);
      if (!p.ok() || p->quorum != Quorum{1, {0, 1, 2, 3}})
        ::_exit(1);
      ::_exit(p->won ? 10 : 11);
    }
    pids.push_back(pid);
  }
  int won = 0, lost = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    won += WEXITSTATUS(status) == 10;
    lost += WEXITSTATUS(status) == 11;
  }
  EXPECT_EQ(won, 1);
  EXPECT_EQ(lost, kProcs - 1);
}

//===----------------------------------------------------------------------===//
// The quorum rule
//===----------------------------------------------------------------------===//

TEST_F(MembershipTest, NoQuorumBelowMinReplicas) {
  auto m = mustConnect(options(redis.port, "few", 0, 3, 2));
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->startHeartbeat().ok());
  auto p = m->proposeNextEpoch(0);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().message,
            "no quorum: 1 of 3 replica groups live, min_replicas 2 (live: 0)");
  auto q = m->currentQuorum();
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->epoch, 0) << "a refused proposal must not move the epoch";
}

TEST_F(MembershipTest, NoQuorumWithoutAStrictMajority) {
  // 4 groups, min_replicas 1: 2 live is half, not a majority. The other
  // half, proposing on its own, is refused too: no split brain.
  std::vector<std::unique_ptr<Membership>> ms;
  for (int g = 0; g < 4; ++g)
    ms.push_back(mustConnect(options(redis.port, "halves", g, 4, 1)));
  ASSERT_TRUE(ms[0]->startHeartbeat().ok());
  ASSERT_TRUE(ms[1]->startHeartbeat().ok());
  auto p = ms[0]->proposeNextEpoch(0);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().message,
            "no quorum: 2 of 4 replica groups live, min_replicas 1, a strict "
            "majority needs 3 (live: 0, 1)");
  ms[0]->stopHeartbeat();
  ms[1]->stopHeartbeat();
  RawClient raw(redis.port);
  ASSERT_TRUE(
      raw.cmd({"DEL", "meshplan:{halves}:hb:0", "meshplan:{halves}:hb:1"}));
  ASSERT_TRUE(ms[2]->startHeartbeat().ok());
  ASSERT_TRUE(ms[3]->startHeartbeat().ok());
  p = ms[3]->proposeNextEpoch(0);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("2 of 4 replica groups live"),
            std::string::npos);
  ASSERT_TRUE(ms[1]->startHeartbeat().ok());
  p = ms[3]->proposeNextEpoch(0);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->quorum, (Quorum{1, {1, 2, 3}}));
}

TEST_F(MembershipTest, QuorumRuleOnEveryLiveSubset) {
  // Every group count 1-5, every min_replicas, every live subset (heartbeat
  // keys planted directly): a quorum forms exactly when the rule says, and
  // no two disjoint subsets of one group count both form one.
  RawClient raw(redis.port);
  int job = 0;
  for (int n = 1; n <= 5; ++n) {
    for (int minR = 1; minR <= n; ++minR) {
      std::vector<unsigned> formed;
      for (unsigned mask = 0; mask < (1u << n); ++mask) {
        std::string name = "rule" + std::to_string(job++);
        std::vector<int> live;
        for (int g = 0; g < n; ++g)
          if (mask & (1u << g)) {
            live.push_back(g);
            ASSERT_TRUE(raw.cmd(
                {"SET", "meshplan:{" + name + "}:hb:" + std::to_string(g),
                 "planted", "PX", "60000"}));
          }
        auto m = mustConnect(options(redis.port, name, 0, n, minR));
        ASSERT_TRUE(m);
        auto p = m->proposeNextEpoch(0);
        int k = static_cast<int>(live.size());
        bool expect = k >= minR && 2 * k > n;
        ASSERT_EQ(p.ok(), expect)
            << n << " groups, min_replicas " << minR << ", live mask " << mask
            << ": " << (p.ok() ? "formed" : p.error().message);
        if (p.ok()) {
          EXPECT_TRUE(p->won);
          EXPECT_EQ(p->quorum, (Quorum{1, live}));
          formed.push_back(mask);
        }
      }
      for (unsigned a : formed)
        for (unsigned b : formed)
          EXPECT_NE(a & b, 0u) << "disjoint quorums " << a << " and " << b
                               << " of " << n << " groups: split brain";
    }
  }
}

//===----------------------------------------------------------------------===//
// Heartbeats and detection
//===----------------------------------------------------------------------===//

TEST_F(MembershipTest, StoppedHeartbeatIsSeenDeadAfterExpiry) {
  constexpr auto kExpiry = 1000ms;
  std::vector<std::unique_ptr<Membership>> ms;
  for (int g = 0; g < 3; ++g) {
    ms.push_back(mustConnect(options(redis.port, "expiry", g, 3, 2, kExpiry)));
    ASSERT_TRUE(ms.back()->startHeartbeat().ok());
  }
  auto p = ms[0]->proposeNextEpoch(0);
  ASSERT_TRUE(p.ok()) << p.error().message;
  std::this_thread::sleep_for(600ms); // several refreshes: all stay live
  auto live = ms[0]->liveGroups();
  ASSERT_TRUE(live.ok());
  ASSERT_EQ(live->size(), 3u);
  for (const LiveGroup &l : *live) {
    EXPECT_GT(l.ttl, 0ms);
    EXPECT_LE(l.ttl, kExpiry);
  }

  ms[1]->stopHeartbeat();
  auto stopped = Clock::now();
  long long latency = -1;
  while (msSince(stopped) < 5000) {
    auto dead = ms[0]->deadGroups(p->quorum);
    ASSERT_TRUE(dead.ok()) << dead.error().message;
    if (!dead->empty()) {
      latency = msSince(stopped);
      EXPECT_EQ(*dead, std::vector<int>{1});
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  std::printf("[ measured ] heartbeat expiry %lld ms, period %lld ms: a "
              "group whose heartbeat stopped is seen dead after %lld ms\n",
              static_cast<long long>(kExpiry.count()),
              static_cast<long long>(kExpiry.count() / 4), latency);
  ASSERT_GE(latency, 0) << "group 1 was never seen dead";
  // The last refresh was about one period before the stop at most (a
  // loaded machine may delay it; the bound only catches a key that did not
  // get the expiry it should).
  EXPECT_GE(latency, (kExpiry / 2).count());
  EXPECT_LT(latency, (kExpiry + 1000ms).count());

  // The survivors form the next epoch without it.
  auto next = ms[2]->proposeNextEpoch(1);
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_EQ(next->quorum, (Quorum{2, {0, 2}}));
}

TEST_F(MembershipTest, KilledProcessIsSeenDeadAfterExpiry) {
  // Group 1 is a forked process heartbeating at the default expiry (2 s);
  // it is killed with signal 9, which runs no cleanup at all.
  auto self = mustConnect(options(redis.port, "kill", 0, 3, 2));
  ASSERT_TRUE(self);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    auto m = Membership::connect(options(redis.port, "kill", 1, 3, 2));
    if (!m.ok() || !m.value()->startHeartbeat().ok())
      ::_exit(1);
    char byte = 1;
    if (::write(ready[1], &byte, 1) != 1)
      ::_exit(1);
    while (true)
      ::pause();
  }
  ::close(ready[1]);
  pollfd pfd{ready[0], POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1) << "the child never heartbeated";
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);

  ASSERT_TRUE(self->startHeartbeat().ok());
  auto other = mustConnect(options(redis.port, "kill", 2, 3, 2));
  ASSERT_TRUE(other->startHeartbeat().ok());
  auto p = self->proposeNextEpoch(0);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_EQ(p->quorum, (Quorum{1, {0, 1, 2}}));
  std::this_thread::sleep_for(700ms); // the child has refreshed since

  ::kill(child, SIGKILL);
  auto killed = Clock::now();
  ::waitpid(child, nullptr, 0);
  long long latency = -1;
  while (msSince(killed) < 6000) {
    auto dead = self->deadGroups(p->quorum);
    ASSERT_TRUE(dead.ok()) << dead.error().message;
    if (!dead->empty()) {
      latency = msSince(killed);
      EXPECT_EQ(*dead, std::vector<int>{1});
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  std::printf("[ measured ] default expiry 2000 ms (period 500 ms): a "
              "process killed by signal 9 is seen dead after %lld ms\n",
              latency);
  ASSERT_GE(latency, 0) << "the killed group was never seen dead";
  EXPECT_GE(latency, 2000 / 2);
  EXPECT_LT(latency, 2000 + 1000);

  auto next = other->proposeNextEpoch(1);
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_TRUE(next->won);
  EXPECT_EQ(next->quorum, (Quorum{2, {0, 2}}));
}

TEST_F(MembershipTest, ObservedEpochFollowsTheStoreWithoutACall) {
  MembershipOptions o = options(redis.port, "observe", 0, 2, 2, 400ms);
  auto a = mustConnect(o);
  o.replicaGroup = 1;
  auto b = mustConnect(o);
  // c, a second rank of group 1, makes no call after startHeartbeat: what
  // it observes comes from its heartbeat thread alone.
  auto c = mustConnect(o);
  ASSERT_TRUE(a->startHeartbeat().ok());
  ASSERT_TRUE(b->startHeartbeat().ok());
  ASSERT_TRUE(c->startHeartbeat().ok());
  EXPECT_FALSE(c->epochChangedSince(0));

  // A waiter blocked on epoch 0 wakes when a proposes.
  std::optional<Result<Quorum>> waited;
  auto waitStart = Clock::now();
  long long waitedMs = -1;
  std::thread waiter([&] {
    waited = b->waitForChange(0, Clock::now() + 5s);
    waitedMs = msSince(waitStart);
  });
  std::this_thread::sleep_for(200ms);
  auto proposed = Clock::now();
  auto p = a->proposeNextEpoch(0);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(a->epochChangedSince(0)) << "the proposer knows at once";
  waiter.join();
  ASSERT_TRUE(waited->ok()) << waited->error().message;
  EXPECT_EQ(waited->value(), (Quorum{1, {0, 1}}));
  EXPECT_LT(waitedMs, 200 + 1000);

  // c learns through its heartbeat thread, within about one period.
  long long seen = -1;
  while (msSince(proposed) < 2000) {
    if (c->epochChangedSince(0)) {
      seen = msSince(proposed);
      break;
    }
    std::this_thread::sleep_for(1ms);
  }
  std::printf("[ measured ] another process's epoch change reaches "
              "epochChangedSince after %lld ms (period 100 ms)\n",
              seen);
  ASSERT_GE(seen, 0);
  EXPECT_LT(seen, 1000);
  EXPECT_EQ(c->observedEpoch(), 1);

  // Nothing changes: waitForChange gives up at its deadline.
  auto start = Clock::now();
  auto none = b->waitForChange(1, Clock::now() + 150ms);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("epoch 1 did not change within"),
            std::string::npos)
      << none.error().message;
  EXPECT_LT(msSince(start), 600);
}

//===----------------------------------------------------------------------===//
// Namespacing
//===----------------------------------------------------------------------===//

TEST_F(MembershipTest, TwoJobsOnOneStoreDoNotInterfere) {
  std::vector<std::unique_ptr<Membership>> a, b;
  for (int g = 0; g < 2; ++g) {
    a.push_back(mustConnect(options(redis.port, "job-a", g, 2, 2)));
    ASSERT_TRUE(a.back()->startHeartbeat().ok());
  }
  // Job b has the same group count; only its group 0 is alive. Job a's
  // group 1 heartbeat must not count for it.
  b.push_back(mustConnect(options(redis.port, "job-b", 0, 2, 2)));
  ASSERT_TRUE(b.back()->startHeartbeat().ok());

  auto pa = a[0]->proposeNextEpoch(0);
  ASSERT_TRUE(pa.ok()) << pa.error().message;
  EXPECT_EQ(pa->quorum, (Quorum{1, {0, 1}}));
  auto pb = b[0]->proposeNextEpoch(0);
  ASSERT_FALSE(pb.ok());
  EXPECT_EQ(pb.error().message, "no quorum: 1 of 2 replica groups live, "
                                "min_replicas 2 (live: 0)");
  auto qb = b[0]->currentQuorum();
  ASSERT_TRUE(qb.ok());
  EXPECT_EQ(*qb, (Quorum{0, {}}));
  auto lb = b[0]->liveGroups();
  ASSERT_TRUE(lb.ok());
  ASSERT_EQ(lb->size(), 1u);
  EXPECT_EQ((*lb)[0].group, 0);

  // Every key either job wrote is under its own prefix.
  RawClient raw(redis.port);
  auto keys = raw.cmd({"KEYS", "*"});
  ASSERT_TRUE(keys);
  std::istringstream in(*keys);
  std::set<std::string> all;
  for (std::string k; std::getline(in, k);) {
    all.insert(k);
    EXPECT_TRUE(k.starts_with("meshplan:{job-a}:") ||
                k.starts_with("meshplan:{job-b}:"))
        << k;
  }
  EXPECT_EQ(all, (std::set<std::string>{
                     "meshplan:{job-a}:config", "meshplan:{job-a}:epoch",
                     "meshplan:{job-a}:hb:0", "meshplan:{job-a}:hb:1",
                     "meshplan:{job-a}:inc:1", "meshplan:{job-a}:quorum:1",
                     "meshplan:{job-a}:steps:1", "meshplan:{job-a}:synced:1",
                     "meshplan:{job-b}:config", "meshplan:{job-b}:hb:0"}));

  // A process of job a with another group count is refused: the majority
  // rule is only sound if every process counts the same groups.
  auto wrong = Membership::connect(options(redis.port, "job-a", 0, 3, 2));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().message,
            "membership store redis://127.0.0.1:" + std::to_string(redis.port) +
                ": job \"job-a\" was started with groups=2 min_replicas=2, "
                "this process has groups=3 min_replicas=2 (every process of a "
                "job must agree; a new run needs a new job name)");
}

//===----------------------------------------------------------------------===//
// The store failing mid-run
//===----------------------------------------------------------------------===//

TEST_F(MembershipTest, StoreKilledMidRunIsAClearError) {
  MembershipOptions o = options(redis.port, "storekill", 0, 1, 1, 400ms);
  o.connectTimeout = 500ms;
  o.ioTimeout = 500ms;
  auto m = mustConnect(o);
  ASSERT_TRUE(m->startHeartbeat().ok());
  ASSERT_TRUE(m->proposeNextEpoch(0).ok());
  std::string name = "redis://127.0.0.1:" + std::to_string(redis.port);

  redis.stop(SIGKILL);
  auto start = Clock::now();
  auto q = m->currentQuorum();
  long long ms = msSince(start);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message.find(name), std::string::npos)
      << q.error().message;
  EXPECT_LT(ms, 1500);
  std::printf("[ measured ] store killed: the next call fails after %lld ms: "
              "%s\n",
              ms, q.error().message.c_str());
  // Every later call fails the same way (reconnecting, refused).
  for (int i = 0; i < 3; ++i) {
    auto again = m->currentQuorum();
    ASSERT_FALSE(again.ok());
    EXPECT_NE(again.error().message.find(name), std::string::npos);
  }
  // The heartbeat thread reports it too, and stops promptly.
  std::this_thread::sleep_for(300ms);
  std::optional<Error> hb = m->heartbeatError();
  ASSERT_TRUE(hb.has_value());
  EXPECT_NE(hb->message.find(name), std::string::npos) << hb->message;
  start = Clock::now();
  m->stopHeartbeat();
  EXPECT_LT(msSince(start), 1500);

  // A fresh, empty store on the same address: the job's state is gone, and
  // that is an error, not a silent restart at epoch 0.
  ASSERT_TRUE(redis.start(false, redis.port));
  q = m->currentQuorum();
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().message,
            "membership store " + name +
                " no longer holds job \"storekill\" (its keys are gone: the "
                "store was restarted without persistence or flushed); the "
                "job's epoch and quorum are lost");
}

TEST_F(MembershipTest, HungStoreIsATimeoutNotAHang) {
  MembershipOptions o = options(redis.port, "hung", 0, 1, 1);
  o.ioTimeout = 300ms;
  auto m = mustConnect(o);
  ASSERT_TRUE(m->startHeartbeat().ok());
  ASSERT_TRUE(m->proposeNextEpoch(0).ok());
  redis.signal(SIGSTOP);
  auto start = Clock::now();
  auto q = m->currentQuorum();
  long long ms = msSince(start);
  redis.signal(SIGCONT);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().message,
            "membership store redis://127.0.0.1:" + std::to_string(redis.port) +
                ": reading the quorum: no reply within 300 ms (the store is "
                "hung or unreachable)");
  EXPECT_LT(ms, 1000);
  // Once the store answers again, the next call reconnects and continues.
  q = m->currentQuorum();
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(*q, (Quorum{1, {0}}));
}

TEST_F(MembershipTest, StoreRestartedWithPersistenceContinues) {
  // With an append-only file synced on every write, a restarted store has
  // the job's state: after one failed call (the old connection), calls
  // reconnect and continue at the same epoch.
  redis.stop(SIGKILL);
  ASSERT_TRUE(redis.start(/*persistent=*/true));
  MembershipOptions o = options(redis.port, "durable", 0, 1, 1);
  auto m = mustConnect(o);
  ASSERT_TRUE(m->startHeartbeat().ok());
  ASSERT_TRUE(m->proposeNextEpoch(0).ok());
  auto p = m->proposeNextEpoch(1);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->quorum, (Quorum{2, {0}}));

  redis.stop(SIGKILL);
  ASSERT_TRUE(redis.start(true, redis.port));
  std::optional<Quorum> q;
  for (int i = 0; i < 2 && !q; ++i)
    if (auto r = m->currentQuorum(); r.ok())
      q = *r;
  ASSERT_TRUE(q.has_value()) << "no call succeeded after the restart";
  EXPECT_EQ(*q, (Quorum{2, {0}}));
  // The heartbeat thread reconnects on its own: the group is live again.
  std::this_thread::sleep_for(1200ms);
  auto live = m->liveGroups();
  ASSERT_TRUE(live.ok()) << live.error().message;
  ASSERT_EQ(live->size(), 1u);
  EXPECT_FALSE(m->heartbeatError().has_value());
  auto next = m->proposeNextEpoch(2);
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_EQ(next->quorum, (Quorum{3, {0}}));
}

} // namespace
