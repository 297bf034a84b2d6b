//===- Membership.h - Replica groups, heartbeats and the quorum epoch -----===//
//
// Which replica groups of a fault-tolerant job are alive, and which quorum
// (epoch + member groups) the job currently trains in. All of it lives in a
// Redis server, never in a process's memory, so that any rank (or a restarted
// one) reads the same answer (docs/fault-tolerance.md, "Membership"):
//
//   meshplan:{JOB}:config        "groups=N min_replicas=M", set once per job
//   meshplan:{JOB}:hb:{G}        group G's heartbeat; expires unless refreshed
//   meshplan:{JOB}:epoch         the current epoch (absent = 0, no quorum)
//   meshplan:{JOB}:quorum:{E}    epoch E's member groups, "0,2,3"
//
// The epoch moves only through one Lua script that compares it with the
// caller's expected epoch, applies the quorum rule to the heartbeats alive at
// that instant and writes the next epoch with its members, atomically. The
// rule: at least min_replicas groups AND a strict majority of the job's
// nominal group count, so two disjoint halves of a partitioned job can never
// both form a quorum.
//
//   auto m = Membership::connect(opts);          // one clear error if down
//   m.value()->startHeartbeat();
//   auto q = m.value()->currentQuorum();         // {epoch, sorted members}
//   if (!m.value()->deadGroups(*q)->empty())
//     m.value()->proposeNextEpoch(q->epoch);     // CAS: one proposer wins
//
// Errors are values and name the store ("redis://127.0.0.1:6379"); nothing
// blocks longer than the options' timeouts. A Membership may be used from
// several threads (its store calls are serialized); its heartbeat thread has
// a connection of its own, since hiredis contexts are not thread-safe.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_MEMBERSHIP_H
#define MESHPLAN_RUNTIME_MEMBERSHIP_H

#include "meshplan/Core/Result.h"
#include "meshplan/Runtime/Redis.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace meshplan::runtime {

struct MembershipOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  /// Names the job's keys; [A-Za-z0-9._-], at most 128 characters. Two jobs
  /// on one server must use different names (`meshplan run` makes one up).
  std::string job;
  /// This process's replica group, 0 <= replicaGroup < numGroups.
  int replicaGroup = 0;
  /// The job's nominal replica-group count: the majority is taken of it, not
  /// of the groups alive, which is what rules out split brain.
  int numGroups = 1;
  /// The fewest live groups a quorum may have (1..numGroups).
  int minReplicas = 1;
  /// A group whose heartbeat is older than this is dead (issue 15: default
  /// 2 s, docs/fault-tolerance.md).
  std::chrono::milliseconds heartbeatExpiry{2000};
  /// How often the heartbeat thread refreshes the key; 0 = expiry / 4, so
  /// three refreshes in a row may be late before the group is declared dead.
  std::chrono::milliseconds heartbeatPeriod{0};
  /// Bound on reaching the store (TCP connect).
  std::chrono::milliseconds connectTimeout{2000};
  /// Bound on each store round trip once connected (a hung server).
  std::chrono::milliseconds ioTimeout{2000};
  /// How often waitForChange polls the epoch.
  std::chrono::milliseconds pollInterval{20};
  /// This process's group's incarnation (a restarted group's is higher),
  /// written into the heartbeat's value: the epoch script never takes a
  /// group restarted since the last epoch for one holding the job's state.
  int64_t incarnation = 0;
};

/// One epoch's quorum. Epoch 0 is the state before any quorum formed; it has
/// no members.
struct Quorum {
  int64_t epoch = 0;
  std::vector<int> members; ///< replica groups, ascending
  bool operator==(const Quorum &) const = default;
};

/// The answer of proposeNextEpoch: `won` when this call installed `quorum`;
/// otherwise `quorum` is what the store holds now (someone else moved the
/// epoch past the expected one first).
struct EpochProposal {
  bool won = false;
  Quorum quorum;
};

/// What the store holds on one step of one epoch (the commit vote,
/// docs/fault-tolerance.md "Commit or discard").
struct StepTally {
  int64_t epoch = 0;   ///< the store's current epoch
  int64_t okVotes = 0; ///< ranks that voted ok on (votedEpoch, step)
  bool failed = false; ///< some rank voted failed
};

/// What the store recorded when it installed an epoch (Membership::
/// epochRecord): everything a rank adopting it needs, read at one instant.
struct EpochRecord {
  int64_t epoch = 0;
  std::vector<int> members; ///< ascending
  /// Each member's incarnation when the epoch was installed, by member.
  std::vector<int64_t> incarnations;
  /// The members holding the job's committed state (see syncedOf).
  std::vector<int> synced;
  /// The last step the job had committed when the epoch was installed
  /// (none before the first commit): a joiner's step counter.
  std::optional<int64_t> stepsCommitted;
  /// Whether group `g` at incarnation `inc` is a member.
  bool hasMember(int g, int64_t inc) const {
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == g)
        return incarnations[i] == inc;
    return false;
  }
};

/// A heartbeat key still alive, with how long it has left.
struct LiveGroup {
  int group = 0;
  std::chrono::milliseconds ttl{0};
};

class Membership {
public:
  /// Checks the options, connects and records the job's configuration (or
  /// checks it against what another process recorded: every process of a
  /// job must agree on numGroups and minReplicas, or the majority argument
  /// fails). An unreachable store is one error naming redis://HOST:PORT,
  /// returned within connectTimeout.
  static Result<std::unique_ptr<Membership>>
  connect(const MembershipOptions &options);

  ~Membership();
  Membership(const Membership &) = delete;
  Membership &operator=(const Membership &) = delete;

  /// Starts a thread that refreshes this group's heartbeat every
  /// heartbeatPeriod and, in the same round trip, reads the epoch (see
  /// observedEpoch). Writes the first heartbeat before returning, so the
  /// group is live when this returns successfully. Several ranks of one
  /// group may refresh the same key.
  Result<void> startHeartbeat();
  /// Stops refreshing; the key then expires on its own (another rank of the
  /// group may still be refreshing it, so it is not deleted).
  void stopHeartbeat();
  /// The last error of the heartbeat thread, or none when its last refresh
  /// succeeded.
  std::optional<Error> heartbeatError() const;

  /// The current epoch and its members, read atomically.
  Result<Quorum> currentQuorum();
  /// The atomic compare-and-set: when the store's epoch is expectedEpoch and
  /// the live groups satisfy the quorum rule, installs expectedEpoch + 1 with
  /// the live groups as members and returns it with won = true. When the
  /// epoch is already past expectedEpoch, returns the store's quorum with
  /// won = false. When the rule fails: an error "no quorum: 1 of 3 replica
  /// groups live, min_replicas 2".
  Result<EpochProposal> proposeNextEpoch(int64_t expectedEpoch);
  /// Polls until the epoch differs from `epoch`, then returns the new
  /// quorum; an error when the deadline passes first.
  Result<Quorum> waitForChange(int64_t epoch,
                               std::chrono::steady_clock::time_point deadline);

  /// The heartbeat keys alive now, ascending by group, with their TTLs.
  Result<std::vector<LiveGroup>> liveGroups();
  /// The members of `quorum` whose heartbeat has expired, ascending.
  Result<std::vector<int>> deadGroups(const Quorum &quorum);
  /// Epoch `epoch`'s members as the store recorded them (empty for epoch 0
  /// or an epoch never installed).
  Result<std::vector<int>> membersOf(int64_t epoch);
  /// The members of epoch `epoch` that held the job's committed state when
  /// it was installed (the heal's sources; the other members heal from
  /// them). Recorded with the epoch, atomically: the first epoch's members,
  /// then those of the previous epoch if one of its steps committed
  /// (voteStep with committingVotes), else the previous epoch's synced
  /// groups, in both cases the ones still members. Empty for epoch 0 or an
  /// epoch never installed.
  Result<std::vector<int>> syncedOf(int64_t epoch);
  /// Epoch `epoch`'s members, their incarnations, its synced groups and the
  /// steps committed before it, in one read (empty for epoch 0 or an epoch
  /// never installed).
  Result<EpochRecord> epochRecord(int64_t epoch);

  /// Records `meshplan:{JOB}:rank:{R}` = this process's group, which the
  /// launcher reads to know which processes make up a group.
  Result<void> registerRank(int64_t rank);
  /// Deletes this group's heartbeat key and stops refreshing it: a rank
  /// that knows its group is broken (a peer of its own group failed) makes
  /// the group dead at once instead of after the expiry.
  Result<void> leaveGroup();

  /// The commit vote of one step. Records this rank's vote on (epoch, step)
  /// only while the store's epoch is still `epoch` (one script: a vote and
  /// an epoch change never interleave, so once the epoch has moved, a step's
  /// votes are final). Returns false, recording nothing, when the epoch has
  /// already moved. `committingVotes` (every rank of every member): the ok
  /// vote that makes the step's ok votes reach it marks the epoch as one in
  /// which a step committed (see syncedOf) and records `step` as the job's
  /// last committed step (EpochRecord::stepsCommitted); 0 marks nothing.
  Result<bool> voteStep(int64_t epoch, int64_t step, int64_t rank, bool ok,
                        int64_t committingVotes = 0);
  /// What `meshplan:{JOB}:finished` holds (the launcher writes it once every
  /// rank of some replica group has exited 0, "replica 0"), or nothing: a
  /// rank that is still rejoining then will never catch up.
  Result<std::optional<std::string>> jobFinished();
  /// The store's epoch and the votes on (epoch, step), read atomically.
  Result<StepTally> stepTally(int64_t epoch, int64_t step);

  /// The highest epoch this process has seen (its own calls, and the
  /// heartbeat thread's read every period). An atomic load and no store
  /// round trip: cheap enough for a collective's wait loop to call on every
  /// poll, so ranks blocked in a collective of an old epoch give up at once.
  int64_t observedEpoch() const {
    return observed.load(std::memory_order_acquire);
  }
  bool epochChangedSince(int64_t epoch) const {
    return observedEpoch() != epoch;
  }

  /// True once the store was found to have lost the job's state
  /// (restarted without persistence, or flushed): no retry can help.
  bool lostState() const { return lost.load(std::memory_order_acquire); }

  /// "redis://HOST:PORT", as errors name it.
  const std::string &storeName() const { return store; }
  const MembershipOptions &options() const { return opts; }

private:
  /// One Redis connection. Not thread-safe: each thread uses its own.
  using Connection = RedisConnection;

  explicit Membership(const MembershipOptions &options);

  /// Connects `c` when it is not connected; after a reconnect, checks that
  /// the store still holds this job (a restarted store without persistence
  /// lost it, and silently starting over at epoch 0 would be wrong).
  Result<void> ensureConnected(Connection &c, bool firstConnect = false);
  /// Records an epoch read from the store; an error when it went backwards.
  Result<void> noteEpoch(int64_t epoch);
  /// The groups recorded under `prefix` + epoch ("0,2"); empty when none.
  Result<std::vector<int>> groupsOf(int64_t epoch, const char *prefix,
                                    const char *what);
  Result<void> refreshHeartbeat(Connection &c);
  void heartbeatLoop();

  std::string key(const std::string &suffix) const;
  std::string configValue() const;

  MembershipOptions opts;
  std::string store;
  std::string holder; ///< the heartbeat's value: "HOST pid PID"
  std::chrono::milliseconds period{0};

  std::mutex callMutex; ///< serializes calls on `main`
  Connection main;

  std::atomic<int64_t> observed{0};
  std::atomic<bool> lost{false};

  std::thread heartbeat;
  Connection heartbeatConn; ///< used by the heartbeat thread only
  mutable std::mutex hbMutex;
  std::condition_variable hbWake;
  bool hbStop = false;
  std::optional<Error> hbError;
};

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_MEMBERSHIP_H
