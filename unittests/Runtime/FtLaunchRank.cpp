//===- FtLaunchRank.cpp - A rank for runtime.ft.launcher ------------------===//
//
// A stand-in for a fault-tolerant rank, started by `meshplan run
// --fault-tolerant` in test/launcher/fault-tolerant.sh. It speaks the
// launcher's contract (docs/fault-tolerance.md, "Launcher") with the real
// Membership class and nothing else of the runtime:
//
//   - reads RANK, WORLD_SIZE, MESHPLAN_FT_STORE, MESHPLAN_JOB,
//     MESHPLAN_FT_MIN_REPLICAS, MESHPLAN_FT_HEARTBEAT_MS and
//     MESHPLAN_FT_INCARNATION; its replica group is RANK / --ranks-per-group;
//   - registers meshplan:{JOB}:rank:{R} and heartbeats;
//   - forms the first quorum once every group is live, or, restarted, gets
//     its group into the quorum by proposing the next epoch;
//   - runs --steps steps of --step-ms each; after every step it proposes the
//     next epoch when a member's heartbeat has expired or a live group is
//     not a member (a refused proposal, "no quorum", is ignored);
//   - with --kill-rank R --kill-step K, rank R kills itself with SIGKILL at
//     step K, in incarnation 0 only;
//   - appends "start ..." and "done ..." lines to DIR/rank-R.log (--log).
//
// Exit codes: 0 done, 2 bad arguments or environment, 3 the store failed,
// 4 the group could not join a quorum within 20 s.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Membership.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <unistd.h>

using namespace meshplan::runtime;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void fail(int code, const std::string &what) {
  std::cerr << "FtLaunchRank: " << what << std::endl;
  std::exit(code);
}

long envInt(const char *name, long fallback, bool required = false) {
  const char *v = std::getenv(name);
  if (!v || !*v) {
    if (required)
      fail(2, std::string(name) + " is not set (run me with meshplan run "
                                  "--fault-tolerant)");
    return fallback;
  }
  char *end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end)
    fail(2, std::string(name) + "=" + v + " is not an integer");
  return x;
}

std::string envString(const char *name) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    fail(2, std::string(name) + " is not set (run me with meshplan run "
                                "--fault-tolerant)");
  return v;
}

std::string join(const std::vector<int> &xs) {
  std::string s;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i)
      s += ',';
    s += std::to_string(xs[i]);
  }
  return s;
}

bool contains(const std::vector<int> &xs, int x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

} // namespace

int main(int argc, char **argv) {
  long ranksPerGroup = 1, steps = 10, stepMs = 200, killRank = -1,
       killStep = -1;
  std::string logDir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc)
      fail(2, "missing value after " + a);
    std::string v = argv[++i];
    if (a == "--ranks-per-group")
      ranksPerGroup = std::stol(v);
    else if (a == "--steps")
      steps = std::stol(v);
    else if (a == "--step-ms")
      stepMs = std::stol(v);
    else if (a == "--kill-rank")
      killRank = std::stol(v);
    else if (a == "--kill-step")
      killStep = std::stol(v);
    else if (a == "--log")
      logDir = v;
    else
      fail(2, "unknown argument " + a);
  }

  long rank = envInt("RANK", 0, true);
  long world = envInt("WORLD_SIZE", 0, true);
  long incarnation = envInt("MESHPLAN_FT_INCARNATION", 0, true);
  if (ranksPerGroup < 1 || world % ranksPerGroup != 0)
    fail(2, "WORLD_SIZE " + std::to_string(world) +
                " is not a multiple of --ranks-per-group");
  std::string store = envString("MESHPLAN_FT_STORE");
  if (store.rfind("redis://", 0) != 0 || store.rfind(':') < 8)
    fail(2, "MESHPLAN_FT_STORE=" + store + " is not redis://HOST:PORT");

  MembershipOptions o;
  o.host = store.substr(8, store.rfind(':') - 8);
  o.port = std::stoi(store.substr(store.rfind(':') + 1));
  o.job = envString("MESHPLAN_JOB");
  o.replicaGroup = static_cast<int>(rank / ranksPerGroup);
  o.numGroups = static_cast<int>(world / ranksPerGroup);
  o.minReplicas = static_cast<int>(envInt("MESHPLAN_FT_MIN_REPLICAS", 1));
  o.heartbeatExpiry =
      std::chrono::milliseconds(envInt("MESHPLAN_FT_HEARTBEAT_MS", 2000));
  int group = o.replicaGroup;

  std::ofstream log;
  if (!logDir.empty())
    log.open(logDir + "/rank-" + std::to_string(rank) + ".log", std::ios::app);
  auto note = [&](const std::string &line) {
    if (log.is_open())
      log << line << std::endl;
  };
  note("start rank " + std::to_string(rank) + " group " +
       std::to_string(group) + " incarnation " + std::to_string(incarnation) +
       " pid " + std::to_string(::getpid()) + " store " + store);

  auto m = Membership::connect(o);
  if (!m.ok())
    fail(3, m.error().message);
  Membership &ms = *m.value();
  if (auto r = ms.registerRank(rank); !r.ok())
    fail(3, r.error().message);
  if (auto r = ms.startHeartbeat(); !r.ok())
    fail(3, r.error().message);

  // Into a quorum: the first one once every group is live; a restarted
  // group proposes the next epoch, which takes in every live group.
  Clock::time_point deadline = Clock::now() + 20s;
  Quorum q;
  while (true) {
    auto cur = ms.currentQuorum();
    if (!cur.ok())
      fail(3, cur.error().message);
    q = *cur;
    if (contains(q.members, group))
      break;
    if (Clock::now() > deadline)
      fail(4, "replica " + std::to_string(group) +
                  " could not join a quorum within 20 s (epoch " +
                  std::to_string(q.epoch) + ": " + join(q.members) + ")");
    auto live = ms.liveGroups();
    if (!live.ok())
      fail(3, live.error().message);
    if (q.epoch > 0 || static_cast<int>(live->size()) == o.numGroups)
      (void)ms.proposeNextEpoch(q.epoch); // "no quorum": try again
    std::this_thread::sleep_for(50ms);
  }
  std::cout << "rank " << rank << " (replica " << group << ", incarnation "
            << incarnation << ") in epoch " << q.epoch << ": "
            << join(q.members) << std::endl;

  for (long step = 1; step <= steps; ++step) {
    if (incarnation == 0 && rank == killRank && step == killStep) {
      note("kill rank " + std::to_string(rank) + " at step " +
           std::to_string(step));
      std::raise(SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(stepMs));
    auto cur = ms.currentQuorum();
    if (!cur.ok())
      fail(3, cur.error().message);
    auto dead = ms.deadGroups(*cur);
    auto live = ms.liveGroups();
    if (!dead.ok() || !live.ok())
      fail(3, (!dead.ok() ? dead.error() : live.error()).message);
    bool joiner = std::any_of(live->begin(), live->end(), [&](const auto &g) {
      return !contains(cur->members, g.group);
    });
    if (!dead->empty() || joiner)
      (void)ms.proposeNextEpoch(cur->epoch); // "no quorum" is ignored
  }
  note("done rank " + std::to_string(rank) + " incarnation " +
       std::to_string(incarnation));
  ms.stopHeartbeat();
  return 0;
}
