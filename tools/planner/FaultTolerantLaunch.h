//===- FaultTolerantLaunch.h - meshplan run --fault-tolerant ----*- C++ -*-===//
//
// The launcher's fault-tolerant mode (issue 15 item 7, docs/fault-tolerance.md
// "Launcher"): the membership store (a private redis-server, or --store
// redis://HOST:PORT), the ranks' MESHPLAN_FT_* environment, and the restart
// policy, per replica group like torchelastic's agent is per job:
//
//   - a rank of group g exits non-zero or by a signal: the launcher stops
//     g's other ranks (SIGTERM to their process groups, SIGKILL after
//     --grace), deletes g's heartbeat key so the survivors see g dead at
//     once, waits until they have installed an epoch without g (at most two
//     heartbeat expiries), and restarts g's ranks with
//     MESHPLAN_FT_INCARNATION + 1, at most --max-restarts times; the other
//     groups run on untouched;
//   - a group out of restarts is given up; when the groups left cannot make
//     a quorum (min_replicas and a strict majority of the job's nominal
//     group count), the whole job is stopped: "quorum cannot be met: ...";
//   - every epoch change in the store is printed, diffing its members.
//
// Which group a rank belongs to is what the rank wrote to
// meshplan:{JOB}:rank:{R} when its session opened. The process mechanics
// (fork, pipes, signals, reaping) stay in RunCommand.cpp's Job, which the
// Supervisor drives through RankControl.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_FAULTTOLERANTLAUNCH_H
#define MESHPLAN_TOOLS_PLANNER_FAULTTOLERANTLAUNCH_H

#include "meshplan/Runtime/Redis.h"

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace meshplan::cli {

struct RunOptions;

/// A TCP port that was free on the loopback a moment ago (bound to port 0
/// and released, as torchrun picks MASTER_PORT for a standalone job); 0 when
/// none could be had. The private redis-server's port and MASTER_PORT.
int freeLoopbackPort();

namespace ft {

using Clock = std::chrono::steady_clock;

/// The fault-tolerant flags, parsed and checked.
struct Config {
  int64_t maxRestarts = 3;
  int64_t minReplicas = 1;
  int64_t heartbeatMs = 2000;
  /// The store given with --store redis://HOST:PORT; empty host: start a
  /// private redis-server.
  std::string host;
  int port = 0;
  /// The job's name in the store ([A-Za-z0-9._-], at most 128 characters).
  std::string job;
  /// Whether --job named it (then it may already be in use by another node).
  bool jobGiven = false;
  /// --nnodes.
  int64_t nnodes = 1;
  /// Set by StoreServer::open when this node joins a job that is already
  /// running (a restarted node): the incarnation at which this node's ranks
  /// that ran in the job before start, so that they never meet the
  /// rendezvous keys their dead predecessors left in the store. 0 otherwise.
  int64_t joinIncarnation = 0;
};

/// Checks the fault-tolerant flags; a CliError (exit 2) for a bad one, for
/// one given without --fault-tolerant, or for a store that is not
/// redis://. Returns nullopt when --fault-tolerant is not given. Connects to
/// nothing.
std::optional<Config> parseFlags(const RunOptions &options, int64_t nnodes);

/// The membership store: a private redis-server on a free loopback port
/// (stopped by its pid when this is destroyed), or the --store server,
/// pinged with a short timeout before anything starts.
class StoreServer {
public:
  StoreServer() = default;
  StoreServer(const StoreServer &) = delete;
  StoreServer &operator=(const StoreServer &) = delete;
  ~StoreServer();

  /// Starts the private server or pings the given one. An unreachable
  /// --store, or a --job that already has keys there, is a CliError (with
  /// --nnodes > 1, only when none of the job's replica groups heartbeats:
  /// otherwise this node joins the running job); a private server that
  /// cannot be started is an error message (exit 1).
  std::optional<std::string> open(Config &config);
  /// The private server's pid (-1 for an external store or once it died).
  pid_t pid() const { return serverPid; }
  /// The private server was reaped by the launcher's waitpid(-1).
  void reaped() { serverPid = -1; }
  std::string url() const;
  const std::string &host() const { return hostName; }
  int port() const { return portNumber; }
  /// Stops the private server (SIGKILL, then reaps it); idempotent.
  void stop();

private:
  std::string hostName;
  int portNumber = 0;
  pid_t serverPid = -1;
  std::string dir; ///< the private server's working directory and log
};

/// What the Supervisor needs from the process side (RunCommand.cpp's Job).
class RankControl {
public:
  virtual ~RankControl() = default;
  /// The rank's process has been started and not yet reaped.
  virtual bool running(int64_t rank) const = 0;
  /// Signals the rank's process group (what it started goes too).
  virtual void signalRank(int64_t rank, int sig) = 0;
  /// Starts the rank again (its environment from Supervisor::environment).
  /// False when it could not be started; the Job has then reported it and
  /// stopped everything.
  virtual bool restartRank(int64_t rank) = 0;
  /// Stops the whole job (SIGTERM, --grace, SIGKILL) with this exit code.
  virtual void stopJob(int exitCode) = 0;
  /// The whole job is being stopped (a signal, a failure): no restarts.
  virtual bool stopping() const = 0;
};

class Supervisor {
public:
  using Say = std::function<void(const std::string &)>;
  Supervisor(const Config &config, const StoreServer &store,
             std::vector<int64_t> ranks, Clock::duration grace,
             RankControl &control, Say say);
  ~Supervisor();
  Supervisor(const Supervisor &) = delete;
  Supervisor &operator=(const Supervisor &) = delete;

  /// The variables a (re)started rank gets besides the launcher's usual ones.
  std::vector<std::string> environment(int64_t rank) const;
  /// The variable names environment() sets (inherited values are dropped).
  static const std::vector<std::string> &variableNames();

  /// A rank the launcher started has exited (before the Job's own report,
  /// which it replaces while the job is not stopping).
  void onRankExit(int64_t rank, int status);
  /// A child that is not a rank was reaped; true when it was the private
  /// redis-server (then the job is stopped: its membership is gone).
  bool onOtherChild(pid_t pid, int status);
  /// Polls the store (every 50 ms), prints epoch changes, moves failed
  /// groups on (SIGKILL after the grace, restart). Call on every loop turn.
  void tick();
  /// How long the Job may sleep in poll() before calling tick() again.
  Clock::duration untilNextTick() const;
  /// A group is being stopped or waits to be restarted: the job is not over
  /// even when every process has exited.
  bool pending() const;
  /// At the end: 1 when a rank of a group not given up did not exit 0.
  int finalExitCode() const;

private:
  /// Finished: the group failed (or waited to be restarted) after another
  /// group completed the job; it is not restarted, and its exit does not
  /// count against the job's.
  enum class Phase { Running, Stopping, Waiting, GivenUp, Finished };
  struct Group {
    std::vector<int64_t> ranks; ///< this node's ranks of the group
    Phase phase = Phase::Running;
    int64_t restarts = 0;
    int64_t incarnation = 0;
    bool killed = false;
    bool heartbeatDeleted = false;
    Clock::time_point killAt, restartBy;
    /// What the launcher saw last: "rank 2 exited with signal 9".
    std::string lastFailure;
  };

  bool connected();
  void dropConnection(const std::string &why);
  /// One command; nullopt (and the connection dropped) on an error.
  std::optional<std::string> command(const std::vector<std::string> &args,
                                     bool *isNil = nullptr);
  std::string key(const std::string &suffix) const;
  void pollStore();
  void readConfig();
  void readRankKeys();
  void readEpochs();
  void printEpoch(int64_t epoch, const std::vector<int> &members);
  /// With --nnodes > 1: where the group's ranks on other nodes ran, "ranks
  /// 4, 5 on node 2" (from their rank keys); empty when unknown.
  std::string elsewhere(int64_t gid);
  /// The group key of a rank: its replica group, or -(rank + 1) while the
  /// rank has not registered (a group of one).
  int64_t groupOf(int64_t rank) const;
  void failGroup(int64_t gid, int64_t rank, int status);
  /// A rank of group `gid` exited 0: once all have, the job is complete.
  void noteCompleted(int64_t gid, Group &group);
  void advance(int64_t gid, Group &group);
  void restart(int64_t gid, Group &group);
  void checkQuorum();
  /// Whether the groups now running could form a quorum on their own (the
  /// rule of Membership::proposeNextEpoch, over the nominal group count).
  bool runningCanFormQuorum();
  std::string groupName(int64_t gid) const;

  Config config;
  std::string storeUrl, storeHost;
  int storePort;
  pid_t serverPid;
  std::vector<int64_t> ranks;
  Clock::duration grace;
  RankControl &control;
  Say say;

  runtime::RedisConnection conn; ///< to the membership store
  Clock::time_point nextPoll{}, nextConnect{};
  bool storeErrorReported = false;

  std::map<int64_t, int64_t> rankGroup;   ///< registered ranks
  std::map<int64_t, int64_t> incarnation; ///< per rank
  std::map<int64_t, int> lastStatus;      ///< per rank, latest start
  std::map<int64_t, Group> groups;        ///< by group key
  /// Ranks stopped because they registered into a group of another
  /// incarnation; restarted alone with the group's incarnation.
  std::set<int64_t> realign;
  std::optional<int64_t> nominalGroups;     ///< from the config key
  std::optional<int64_t> configMinReplicas; ///< from the config key
  /// The first replica group every rank of which exited 0: the job is done,
  /// and no group is restarted any more.
  std::optional<int64_t> completedBy;
  int64_t lastEpoch = 0;
  std::vector<int> lastMembers;
  bool gaveUpJob = false;
};

} // namespace ft
} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_FAULTTOLERANTLAUNCH_H
