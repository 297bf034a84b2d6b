//===- FaultTolerance.cpp - Replica groups that leave and rejoin ----------===//
//
// A fault-tolerant session's side of docs/fault-tolerance.md: joining the
// membership store's quorum, adopting an epoch (its fault_tolerant
// communicators and data assignment), healing joiners from live groups, the
// commit vote of each step and the watcher that moves the epoch on.
//
//===----------------------------------------------------------------------===//

#include "BoxCopy.h"
#include "SessionImpl.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/MeshView.h"
#include "meshplan/Runtime/Membership.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace meshplan::runtime {

using plan::BufferKind;
using plan::DType;
using plan::Instruction;
using plan::OpKind;
namespace k = kernels;

//===----------------------------------------------------------------------===//
// Fault tolerance (docs/fault-tolerance.md)
//===----------------------------------------------------------------------===//

namespace {
std::string groupList(const std::vector<int> &groups) {
  std::string s;
  for (int g : groups)
    s += (s.empty() ? "" : ", ") + std::to_string(g);
  return s;
}
} // namespace

/// MESHPLAN_FT_LOG=1: one line per protocol event on stderr (the epoch a
/// rank adopts, its heals, votes and their outcomes, the epochs it
/// proposes), with the wall-clock time: what a person
/// needs to follow a recovery across ranks (docs/fault-tolerance.md).
static void ftLog(int64_t rank, const std::string &what) {
  static const bool on = [] {
    const char *v = std::getenv("MESHPLAN_FT_LOG");
    return v && *v && std::string(v) != "0";
  }();
  if (!on)
    return;
  // Wall-clock time (seconds within the hour), so that the lines of
  // several ranks sort into one story.
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count() %
            3600000000LL;
  char head[64];
  std::snprintf(head, sizeof head, "ft-log %9.4f rank %lld: ", us / 1e6,
                static_cast<long long>(rank));
  std::string line = head + what + "\n";
  (void)!::write(2, line.data(), line.size());
}

/// A store call retried while it fails (the store unreachable from a
/// partitioned group, or restarting) until `deadline`; then its last error,
/// which names the store. A store that lost the job's state is not retried.
template <typename F>
auto untilDeadline(const Membership &store, Clock::time_point deadline,
                   F &&call) -> decltype(call()) {
  while (true) {
    auto r = call();
    if (r || Clock::now() >= deadline || store.lostState())
      return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Result<void> Session::Impl::setUpFaultTolerance() {
  const FaultToleranceOptions &o = *options.faultTolerance;
  FaultTolerance f;
  for (int a = 0; a < mesh->numAxes(); ++a) {
    if (!mesh->axis(a).managed)
      continue;
    if (f.axis >= 0)
      return makeError("fault tolerance: the plan's mesh has two managed "
                       "axes (\"" +
                       mesh->axis(f.axis).name + "\", \"" + mesh->axis(a).name +
                       "\"); the replica groups are one axis's coordinates");
    f.axis = a;
  }
  if (f.axis < 0)
    return makeError("fault tolerance: the plan's mesh has no managed axis "
                     "(the spec's managed_axes), so nothing names the "
                     "replica groups");
  auto position = mesh->positionOf(plan.rank);
  if (!position)
    return position.error();
  f.group = static_cast<int>(mesh->coordinateAt(*position, f.axis));
  f.numGroups = mesh->axis(f.axis).size;
  f.groupRanks = mesh->size() / f.numGroups;
  auto ref = makeAxisRef(*mesh, f.axis, 1, f.numGroups);
  if (!ref)
    return ref.error();
  auto along = groupOf(*mesh, AxisRefList{*ref}, plan.rank);
  if (!along)
    return along.error();
  f.alongAxis = std::move(*along);

  // A fault_tolerant communicator changes members between epochs: only
  // collectives whose counts do not depend on the member count can run on
  // it, and all of them must come before the commit (the optimizer
  // updates), or a failed step could not be discarded.
  size_t n = program.size();
  f.afterCommit.assign(n, 0);
  // The gradient norm and the clip read the reduced gradients and decide
  // the update: they belong to the committed part of the step, with it.
  for (size_t i = 0; i < n; ++i)
    if (program[i].in->op == OpKind::OptimizerUpdate ||
        program[i].in->op == OpKind::GradNorm ||
        program[i].in->op == OpKind::ClipGradients)
      f.afterCommit[i] = 1;
  for (bool changed = true; changed;) {
    changed = false;
    auto mark = [&](int i) {
      if (!f.afterCommit[size_t(i)]) {
        f.afterCommit[size_t(i)] = 1;
        changed = true;
      }
    };
    // Everything after a post-commit instruction in its stream's or its
    // communicator's order, and everything that depends on one.
    for (const auto *orders : {&streams, &commSequence})
      for (const std::vector<int> &order : *orders) {
        bool seen = false;
        for (int i : order) {
          if (f.afterCommit[size_t(i)])
            seen = true;
          else if (seen)
            mark(i);
        }
      }
    for (size_t i = 0; i < n; ++i)
      for (int d : program[i].deps)
        if (f.afterCommit[size_t(d)])
          mark(static_cast<int>(i));
  }
  for (size_t i = 0; i < n; ++i) {
    const Bound &b = program[i];
    if (b.comm < 0 || !plan.communicators[size_t(b.comm)].faultTolerant)
      continue;
    const plan::Communicator &c = plan.communicators[size_t(b.comm)];
    if (c.axes.empty())
      return makeError("fault tolerance: communicator \"" + c.id +
                       "\" is fault_tolerant but names no axes, so its live "
                       "members cannot be derived");
    if (b.in->op != OpKind::AllReduce)
      return makeError("fault tolerance: " + describe(b) + " is a " +
                       std::string(plan::opKindName(b.in->op)) +
                       " on fault_tolerant communicator \"" + c.id +
                       "\"; only all_reduce runs on one (a managed axis only "
                       "replicates)");
    if (f.afterCommit[i])
      return makeError("fault tolerance: " + describe(b) +
                       " on fault_tolerant communicator \"" + c.id +
                       "\" runs after an optimizer update, so a failed step "
                       "could not be discarded");
  }
  f.beforeOrder.assign(streams.size(), {});
  f.afterOrder.assign(streams.size(), {});
  for (size_t s = 0; s < streams.size(); ++s)
    for (int i : streams[s])
      (f.afterCommit[size_t(i)] ? f.afterOrder : f.beforeOrder)[s].push_back(i);
  f.sharesApart = true;
  for (size_t i = 0; i < n && f.sharesApart; ++i) {
    const Bound &b = program[i];
    if (f.afterCommit[i])
      continue;
    for (int x : b.outputs)
      if (buffers[size_t(x)].persistent)
        f.sharesApart = false;
    if (b.comm < 0 || !plan.communicators[size_t(b.comm)].faultTolerant)
      continue;
    const plan::Communicator &c = plan.communicators[size_t(b.comm)];
    if (c.axes.size() != 1 || c.axes[0] != mesh->axis(f.axis).name ||
        (b.in->reduce != ReduceOp::Sum && b.in->reduce != ReduceOp::Avg))
      f.sharesApart = false;
    for (size_t j = 0; j < n; ++j)
      if (j != i && !f.afterCommit[j] && program[j].in->op != OpKind::Free)
        for (int x : program[j].inputs)
          if (std::find(b.outputs.begin(), b.outputs.end(), x) !=
              b.outputs.end())
            f.sharesApart = false;
  }

  MembershipOptions mo;
  mo.host = o.store.host;
  mo.port = o.store.port;
  mo.job = options.job;
  mo.replicaGroup = f.group;
  mo.numGroups = static_cast<int>(f.numGroups);
  mo.minReplicas = o.minReplicas;
  mo.heartbeatExpiry = o.heartbeatExpiry;
  mo.incarnation = o.incarnation;
  auto membership = Membership::connect(mo);
  if (!membership)
    return membership.error();
  MESHPLAN_TRY((*membership)->registerRank(plan.rank));
  MESHPLAN_TRY((*membership)->startHeartbeat());
  f.membership = std::move(*membership);
  ft = std::move(f);
  ftLog(plan.rank, "registered in replica group " + std::to_string(ft->group) +
                       " (incarnation " + std::to_string(o.incarnation) + ")");
  return {};
}

Result<void> Session::Impl::ensureQuorum(bool moveOn) {
  FaultTolerance &f = *ft;
  // A rank in a quorum keeps its epoch until a step is discarded: every rank
  // sees the same outcome of the same vote, so all ranks of the job change
  // epochs at the same step.
  if (f.quorum.epoch > 0 && !moveOn)
    return {};
  // Then it walks the epochs in order, from the one after the last it
  // examined, and adopts the first that lists its group at its incarnation,
  // however stale: never "the latest", which depends on when a rank reads.
  // So every rank of a group adopts the same epochs in the same order and
  // runs the same attempts (an attempt in an epoch that has ended fails
  // fast and is discarded), and their group's own collectives, which no
  // epoch change can abort, always meet (docs/fault-tolerance.md,
  // "Epochs"). A restarted group (a new incarnation) skips every epoch that
  // listed its predecessor, and joins through a new one.
  Membership &store = *f.membership;
  const auto expiry = options.faultTolerance->heartbeatExpiry;
  const auto poll = std::chrono::milliseconds(10);
  Clock::time_point start = Clock::now(), deadline = start + options.timeout;
  // The first quorum waits for every group to be live, a member that moves
  // on with nobody dead (a transient failure) for a dead group's heartbeat
  // to expire first, at most this long.
  Clock::time_point grace = start + 2 * expiry;
  Clock::time_point nextFinishedCheck = start;
  std::optional<Error> noQuorum;
  while (true) {
    auto q =
        untilDeadline(store, deadline, [&] { return store.currentQuorum(); });
    if (!q)
      return q.error();
    if (f.walked < q->epoch) {
      int64_t next = f.walked + 1;
      auto rec = untilDeadline(store, deadline,
                               [&] { return store.epochRecord(next); });
      if (!rec)
        return rec.error();
      f.walked = next;
      if (rec->hasMember(f.group, incarnation()))
        return adopt(*rec);
      if (f.quorum.epoch > 0)
        ftLog(plan.rank, "not in epoch " + std::to_string(next));
      continue;
    }
    // Every installed epoch examined: this rank waits for the next one, and
    // proposes it when the job needs it.
    Clock::time_point now = Clock::now();
    if (now >= nextFinishedCheck) {
      MESHPLAN_TRY(checkJobFinished());
      nextFinishedCheck = now + std::chrono::milliseconds(200);
    }
    bool propose = false;
    if (q->epoch == 0) {
      auto live =
          untilDeadline(store, deadline, [&] { return store.liveGroups(); });
      if (!live)
        return live.error();
      propose = int64_t(live->size()) == f.numGroups || now >= grace;
    } else if (f.quorum.epoch == q->epoch) {
      // A member of the latest epoch whose step was discarded.
      auto dead =
          untilDeadline(store, deadline, [&] { return store.deadGroups(*q); });
      if (!dead)
        return dead.error();
      propose = !dead->empty() || now >= grace;
    } else {
      propose = true; // this group (at its incarnation) joins
    }
    if (propose) {
      auto proposal = store.proposeNextEpoch(q->epoch);
      ftLog(plan.rank, "proposes epoch " + std::to_string(q->epoch + 1) + ": " +
                           (proposal ? (proposal->won ? "won" : "lost")
                                     : proposal.error().message));
      if (proposal)
        continue; // won or lost, the store has moved on: read it again
      if (store.lostState())
        return proposal.error();
      if (proposal.error().message.rfind("no quorum", 0) == 0)
        noQuorum = proposal.error();
      else if (now >= deadline)
        return proposal.error();
    }
    if (now >= deadline)
      return makeError("fault tolerance: replica group " +
                       std::to_string(f.group) + " found no quorum within " +
                       std::to_string(options.timeout.count() / 1000.0) +
                       " s (epoch " + std::to_string(q->epoch) + ")" +
                       (noQuorum ? ": " + noQuorum->message : std::string()));
    std::this_thread::sleep_for(poll);
  }
}

Result<void> Session::Impl::checkJobFinished() {
  Membership &store = *ft->membership;
  auto finished = store.jobFinished();
  if (!finished || !*finished)
    return {}; // a store that fails is reported by the callers' own calls
  return makeError("fault tolerance: the job has finished (" + **finished +
                   " completed every step) while replica group " +
                   std::to_string(ft->group) +
                   " was still rejoining; it has nothing left to do");
}

Result<void> Session::Impl::adopt(const EpochRecord &rec) {
  FaultTolerance &f = *ft;
  Quorum q{rec.epoch, rec.members};
  // The sources: the members the store recorded, with the epoch, as
  // holding the committed state (Membership::syncedOf); the others heal.
  std::vector<int> sources, joiners;
  for (int g : q.members)
    (containsGroup(rec.synced, g) ? sources : joiners).push_back(g);
  {
    // Only what changed is rebuilt: the fault_tolerant communicators of the
    // old epoch; every other group stays connected.
    std::lock_guard<std::mutex> lock(commMutex);
    for (size_t i = 0; i < comms.size(); ++i)
      if (plan.communicators[i].faultTolerant)
        comms[i].reset();
  }
  f.quorum = q;
  f.healFailure.reset();
  bool joining = containsGroup(joiners, f.group);
  // A joiner's step counter is the job's, as the store recorded it with
  // the epoch: the same on every rank of the group whether or not its heal
  // succeeds, so that the group's ranks run the same step (the same share
  // passes, below) in every attempt.
  if (joining && rec.stepsCommitted)
    steps = *rec.stepsCommitted;
  ftLog(plan.rank, "adopts epoch " + std::to_string(q.epoch) + " (members " +
                       groupList(q.members) + ", sources " +
                       groupList(sources) + ") at step " +
                       std::to_string(steps + 1));
  // The first quorum's members all start from the trainer's initial
  // parameters: nobody heals.
  if (joiners.empty())
    return {};
  if (sources.empty())
    return makeError("fault tolerance: epoch " + std::to_string(q.epoch) +
                     " has no group holding the committed state to heal its "
                     "groups " +
                     groupList(joiners) +
                     " from (every group that held it was lost)");
  // A heal that fails (a source or a joiner died mid-transfer) may leave the
  // joiner's buffers half written, which nothing reads: the joiner is no
  // source in the next epoch (it never voted a step of this one ok) and
  // trains only after a heal that succeeded. This rank votes the step failed,
  // so that nobody commits it. Unless the epoch has already ended, it moves
  // the job to the next one, where the heal starts again from the groups
  // then live; it first gives a dead peer's heartbeat the time to expire (at
  // most twice the expiry, as ensureQuorum does), so that the next epoch
  // leaves the dead source out instead of waiting for it in the heal group's
  // rendezvous.
  // A peer cut off mid-transfer sends nothing: the watcher ends the heal
  // once the epoch moves, as it ends a step's collectives.
  Stop stop;
  std::thread watcher([&] { watchEpoch(q.epoch, stop); });
  ftLog(plan.rank, "heal in epoch " + std::to_string(q.epoch) + " starts as " +
                       (joining ? "joiner" : "source"));
  Result<void> healed = heal(q, sources, joiners);
  {
    std::lock_guard<std::mutex> lock(stop.mutex);
    stop.stopped = true;
  }
  stop.wake.notify_all();
  watcher.join();
  ftLog(plan.rank, "heal in epoch " + std::to_string(q.epoch) + ": " +
                       (healed ? "ok" : healed.error().message));
  if (!healed) {
    f.healFailure = healed.error();
    Clock::time_point until =
        Clock::now() + 2 * options.faultTolerance->heartbeatExpiry;
    while (Clock::now() < until && !f.membership->epochChangedSince(q.epoch)) {
      auto dead = f.membership->deadGroups(q);
      if (!dead || !dead->empty())
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!f.membership->epochChangedSince(q.epoch)) {
      auto p = f.membership->proposeNextEpoch(q.epoch);
      ftLog(plan.rank, "after the failed heal, proposes epoch " +
                           std::to_string(q.epoch + 1) + ": " +
                           (p ? (p->won ? "won" : "lost") : p.error().message));
    }
  }
  return {};
}

/// Test hook (test/trainer/fault-tolerance.sh, case 7):
/// MESHPLAN_TEST_KILL_HEAL_SOURCE_AFTER = N makes a rank that is a heal's
/// source kill itself with SIGKILL once it has sent N buffers, in the middle
/// of the transfer. Not for production use.
static void maybeKillHealSourceForTests(int64_t buffersSent) {
  static const int64_t after = [] {
    const char *v = std::getenv("MESHPLAN_TEST_KILL_HEAL_SOURCE_AFTER");
    return v && *v ? std::max<int64_t>(0, std::atoll(v)) : int64_t(-1);
  }();
  if (after >= 0 && buffersSent >= after)
    std::raise(SIGKILL);
}

Result<void> Session::Impl::heal(const Quorum &q,
                                 const std::vector<int> &sources,
                                 const std::vector<int> &joiners) {
  FaultTolerance &f = *ft;
  // The heal group: this rank's peers along the managed axis (the ranks
  // holding the same shards) over the new epoch's groups, from core.
  LiveMembers live;
  MESHPLAN_TRY(live.set(
      *mesh, f.axis, std::vector<int64_t>(q.members.begin(), q.members.end())));
  auto derived =
      plan::deriveGroup(*mesh, {mesh->axis(f.axis).name}, plan.rank, &live);
  if (!derived)
    return derived.error();
  GroupSpec spec{"heal", derived->color, derived->ranks, derived->key, q.epoch};
  // A source or joiner that died before the rendezvous never comes: the
  // heal ends (and fails) once the epoch has moved or one of its groups'
  // heartbeat has expired, looked up at most every 200 ms.
  spec.cancelled =
      [&f, &q, next = Clock::now()]() mutable -> std::optional<std::string> {
    if (f.membership->epochChangedSince(q.epoch))
      return "epoch " + std::to_string(q.epoch) + " ended";
    if (Clock::now() < next)
      return std::nullopt;
    next = Clock::now() + std::chrono::milliseconds(200);
    auto dead = f.membership->deadGroups(q);
    if (dead && !dead->empty())
      return "replica groups " + groupList(*dead) + " of epoch " +
             std::to_string(q.epoch) + " died";
    return std::nullopt;
  };
  spec.connectTimeout = options.faultTolerance->heartbeatExpiry;
  auto comm = backend->createCommunicator(spec);
  if (!comm)
    return comm.error().within("healing in epoch " + std::to_string(q.epoch));
  Communicator &c = **comm;
  auto keyOf = [&](int group) {
    return int64_t(std::lower_bound(q.members.begin(), q.members.end(), group) -
                   q.members.begin());
  };
  bool joining = containsGroup(joiners, f.group);
  std::vector<int> persistent;
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].persistent)
      persistent.push_back(static_cast<int>(i));
  auto where = [&](int source, const std::string &what) {
    return "healing " + what + " from rank " +
           std::to_string(f.alongAxis[size_t(source)]) + " in epoch " +
           std::to_string(q.epoch);
  };
  // (The step counter, the optimizer's bias correction and the stochastic
  // rounding's key, comes from the store with the epoch: adopt.)
  {
    std::lock_guard<std::mutex> lock(commMutex);
    healComm = &c;
  }
  // Unregistered before the communicator goes, on every way out.
  struct Unregister {
    Session::Impl &m;
    ~Unregister() {
      std::lock_guard<std::mutex> lock(m.commMutex);
      m.healComm = nullptr;
    }
  } unregister{*this};
  // Striped: buffer i comes from source group i mod |sources|; each source
  // sends its buffers to every joiner in buffer order, and every joiner
  // receives in buffer order, so no two transfers wait on each other.
  //
  // A joiner receives straight into its buffers: its state means nothing
  // until a heal succeeds (a joiner whose heal failed is no source in the
  // next epoch, Membership::syncedOf, and never commits a step of this one),
  // so staging 1 GiB to keep it would only cost a second copy and the
  // page faults. The checksums run on a helper thread beside the transfers:
  // on a source ahead of the sends, on a joiner one buffer behind the
  // receives.
  std::vector<size_t> mine;
  for (size_t i = 0; i < persistent.size(); ++i)
    if (joining || sources[i % sources.size()] == f.group)
      mine.push_back(i);
  std::vector<uint32_t> crcs(persistent.size(), 0);
  std::mutex crcMutex;
  std::condition_variable crcReady;
  size_t crcDone = 0, crcQueued = joining ? 0 : mine.size();
  bool crcStop = false;
  std::thread crcWorker([&] {
    for (size_t k = 0; k < mine.size(); ++k) {
      {
        std::unique_lock<std::mutex> lock(crcMutex);
        crcReady.wait(lock, [&] { return crcStop || k < crcQueued; });
        if (crcStop)
          return;
      }
      const BufferState &b = buffers[size_t(persistent[mine[k]])];
      uint32_t crc = ckpt::crc32c(b.data.data(), b.data.size());
      std::lock_guard<std::mutex> lock(crcMutex);
      crcs[mine[k]] = crc;
      crcDone = k + 1;
      crcReady.notify_all();
    }
  });
  auto stopWorker = [&] {
    {
      std::lock_guard<std::mutex> lock(crcMutex);
      crcStop = true;
    }
    crcReady.notify_all();
    crcWorker.join();
  };
  std::vector<uint32_t> expected(persistent.size(), 0);
  int64_t buffersSent = 0;
  for (size_t k = 0; k < mine.size(); ++k) {
    size_t i = mine[k];
    BufferState &s = buffers[size_t(persistent[i])];
    int source = sources[i % sources.size()];
    std::string tag = "heal " + s.meta->id;
    if (joining) {
      auto got = c.recv(s.data.data(), keyOf(source), int64_t(s.data.size()),
                        DType::UInt8, tag);
      if (got)
        got = c.recv(&expected[i], keyOf(source), 4, DType::UInt8,
                     tag + " crc32c");
      if (!got) {
        stopWorker();
        return got.error().within(where(source, "\"" + s.meta->id + "\""));
      }
      std::lock_guard<std::mutex> lock(crcMutex);
      crcQueued = k + 1;
      crcReady.notify_all();
      continue;
    }
    maybeKillHealSourceForTests(buffersSent++);
    uint32_t crc;
    {
      std::unique_lock<std::mutex> lock(crcMutex);
      crcReady.wait(lock, [&] { return crcDone > k; });
      crc = crcs[i];
    }
    for (int j : joiners) {
      auto sent = c.send(s.data.data(), keyOf(j), int64_t(s.data.size()),
                         DType::UInt8, tag);
      if (sent)
        sent = c.send(&crc, keyOf(j), 4, DType::UInt8, tag + " crc32c");
      if (!sent) {
        stopWorker();
        return sent.error().within("healing group " + std::to_string(j));
      }
    }
  }
  crcWorker.join();
  if (joining) {
    for (size_t i : mine)
      if (crcs[i] != expected[i])
        return makeError(
            where(sources[i % sources.size()],
                  "\"" + buffers[size_t(persistent[i])].meta->id + "\"") +
            ": checksum mismatch (crc32c " + std::to_string(crcs[i]) +
            ", the source's " + std::to_string(expected[i]) + ")");
  }
  ++f.heals;
  return {};
}

Result<bool> Session::Impl::awaitCommit(int64_t epoch, int64_t step) {
  FaultTolerance &f = *ft;
  Membership &store = *f.membership;
  int64_t expected = f.groupRanks * int64_t(f.quorum.members.size());
  Clock::time_point start = Clock::now(), deadline = start + options.timeout;
  Clock::time_point nextDeadCheck = start + std::chrono::milliseconds(20);
  auto pause = std::chrono::microseconds(20);
  std::optional<Error> noQuorum;
  int64_t votes = 0;
  while (true) {
    auto t = untilDeadline(store, deadline,
                           [&] { return store.stepTally(epoch, step); });
    if (!t)
      return t.error();
    if (t->failed)
      return false;
    if (t->okVotes >= expected)
      return true;
    // The epoch moved: no vote can be added any more, and some are missing.
    if (t->epoch != epoch)
      return false;
    votes = t->okVotes;
    Clock::time_point now = Clock::now();
    if (now >= nextDeadCheck) {
      // A rank that never votes is dead, and so, once its heartbeat has
      // expired, is its group: any waiter then installs the next epoch,
      // which makes this step's votes final.
      auto dead = untilDeadline(store, deadline,
                                [&] { return store.deadGroups(f.quorum); });
      if (!dead)
        return dead.error();
      if (!dead->empty()) {
        MESHPLAN_TRY(checkJobFinished());
        auto proposal = store.proposeNextEpoch(epoch);
        ftLog(plan.rank, "awaitCommit: groups " + groupList(*dead) +
                             " dead, proposes epoch " +
                             std::to_string(epoch + 1) + ": " +
                             (proposal ? (proposal->won ? "won" : "lost")
                                       : proposal.error().message));
        if (!proposal)
          noQuorum = proposal.error();
      }
      nextDeadCheck = now + std::chrono::milliseconds(20);
    }
    if (now >= deadline)
      return makeError(
          "fault tolerance: step " + std::to_string(step) + " of epoch " +
          std::to_string(epoch) + ": " + std::to_string(votes) + " of " +
          std::to_string(expected) + " ranks voted within " +
          std::to_string(options.timeout.count() / 1000.0) + " s" +
          (noQuorum ? " (" + noQuorum->message + ")" : std::string()));
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2,
                                                std::chrono::microseconds(500));
  }
}

void Session::Impl::watchEpoch(int64_t epoch, Stop &stop) {
  FaultTolerance &f = *ft;
  Membership &store = *f.membership;
  const auto tick = std::chrono::milliseconds(10);
  const auto deadCheck = std::chrono::milliseconds(200);
  Clock::time_point nextDeadCheck = Clock::now() + deadCheck;
  bool aborted = false, abortEpoch = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(stop.mutex);
      if (stop.wake.wait_for(lock, tick, [&] { return stop.stopped; }))
        return;
    }
    // The heartbeat thread reads the epoch every period, and a proposal
    // below records what it installs: no store call here.
    if (!aborted && (abortEpoch || store.epochChangedSince(epoch))) {
      std::string why = store.epochChangedSince(epoch)
                            ? "epoch " + std::to_string(epoch) +
                                  " ended (the job moved to epoch " +
                                  std::to_string(store.observedEpoch()) + ")"
                            : "a replica group of epoch " +
                                  std::to_string(epoch) +
                                  " died and no quorum can form without it";
      // A communicator being created holds commMutex through its
      // rendezvous, which abort cannot end: try again at the next tick.
      std::unique_lock<std::mutex> lock(commMutex, std::try_to_lock);
      if (!lock.owns_lock())
        continue;
      for (size_t i = 0; i < comms.size(); ++i)
        if (comms[i] && plan.communicators[i].faultTolerant)
          comms[i]->abort(why);
      if (healComm)
        healComm->abort(why);
      aborted = true;
      ftLog(plan.rank, "watcher aborts: " + why);
    }
    if (!aborted && Clock::now() >= nextDeadCheck) {
      auto dead = store.deadGroups(f.quorum);
      if (dead && !dead->empty()) {
        // A dead member never votes: this epoch cannot commit a step, even
        // when no next epoch can form (too few groups left). Its
        // collectives end now, and the rank waits for a quorum in
        // ensureQuorum, where the wait is bounded and explained.
        abortEpoch = true;
        f.abandonedEpoch->store(epoch);
        auto p = store.proposeNextEpoch(epoch);
        ftLog(plan.rank,
              "watcher: groups " + groupList(*dead) + " dead, proposes epoch " +
                  std::to_string(epoch + 1) + ": " +
                  (p ? (p->won ? "won" : "lost") : p.error().message));
      }
      nextDeadCheck = Clock::now() + deadCheck;
    }
  }
}

Result<void> Session::Impl::faultTolerantStep() {
  FaultTolerance &f = *ft;
  int64_t step = steps + 1;
  auto fail = [&](const Error &e) -> Result<void> {
    // This rank's own group cannot go on (a peer of the group failed, or
    // the store is gone): the group leaves now rather than at the expiry.
    broken = true;
    ftLog(plan.rank, "fatal: " + e.message);
    (void)f.membership->leaveGroup();
    return e;
  };
  bool moveOn = false;
  while (true) {
    if (auto ok = ensureQuorum(moveOn); !ok)
      return fail(ok.error());
    moveOn = false;
    step = steps + 1; // a heal may have moved the counter
    int64_t epoch = f.quorum.epoch;
    // This step's data: each group missing from the quorum is processed
    // by one live group, chosen from the step and the live set; the ranks
    // of that group process the missing ranks' with their own coordinates.
    std::vector<int> missing;
    for (int g = 0; g < int(f.numGroups); ++g)
      if (!containsGroup(f.quorum.members, g))
        missing.push_back(g);
    f.dataRanks = {plan.rank};
    for (size_t i = 0; i < missing.size(); ++i) {
      size_t live = f.quorum.members.size();
      int assigned = f.quorum.members[(i + size_t(step)) % live];
      if (assigned == f.group)
        f.dataRanks.push_back(f.alongAxis[size_t(missing[i])]);
    }
    // With groups missing and shares kept apart: who brings which share to
    // the fault_tolerant all-reduces (every member computes the same), and
    // one pass per share of this rank's.
    f.shareLayout.clear();
    f.shareStash.clear();
    if (f.sharesApart && !missing.empty()) {
      size_t live = f.quorum.members.size();
      for (int g : f.quorum.members)
        f.shareLayout.push_back({int64_t(g)});
      for (size_t i = 0; i < missing.size(); ++i)
        f.shareLayout[(i + size_t(step)) % live].push_back(missing[i]);
    }
    size_t passes = f.shareLayout.empty() ? 1 : f.dataRanks.size();
    size_t n = program.size();
    Clock::time_point start = Clock::now();
    auto freshState = [&] {
      // A fresh attempt or share: no step-local buffer survives.
      for (BufferState &s : buffers)
        if (!s.persistent) {
          s.data = {};
          s.live = false;
        }
      return StepState{
          std::vector<std::pair<Clock::time_point, Clock::time_point>>(n),
          std::vector<char>(n, 0), std::vector<int>(commSequence.size(), 0)};
    };
    StepState state = freshState();
    // A peer cut off without closing its connections (a partition) would
    // hold a collective until the timeout; the watcher ends it as soon as
    // the job has moved to another epoch.
    Stop stop;
    std::thread watcher([&] { watchEpoch(epoch, stop); });
    PassOutcome before;
    std::optional<Error> faultTolerantFailure;
    for (f.sharePass = 0; f.sharePass < passes; ++f.sharePass) {
      if (f.sharePass > 0)
        state = freshState();
      before = runPass(state, f.beforeOrder, /*soft=*/true);
      if (before.faultTolerantFailure && !faultTolerantFailure)
        faultTolerantFailure = before.faultTolerantFailure;
      // Every pass runs after a fault_tolerant failure too, as the rest of
      // a pass does (runPass): the group's own collectives pair up only if
      // each of its ranks runs the same passes. The ranks of one group sit
      // in different replica groups' all-reduces, and one whose all-reduce
      // failed used to stop after its first pass while its partner, whose
      // all-reduce had completed, waited in the next pass's all-gather
      // until the timeout (runtime.ft.phases, heal-source, session 20).
      if (before.failure)
        break;
    }
    // The vote reports the first pass's failure: the cause.
    if (faultTolerantFailure)
      before.faultTolerantFailure = faultTolerantFailure;
    f.sharePass = 0;
    {
      std::lock_guard<std::mutex> lock(stop.mutex);
      stop.stopped = true;
    }
    stop.wake.notify_all();
    watcher.join();
    if (before.failure)
      return fail(*before.failure);
    bool ok = !before.faultTolerantFailure && !f.healFailure;
    auto voted =
        untilDeadline(*f.membership, Clock::now() + options.timeout, [&] {
          return f.membership->voteStep(epoch, step, plan.rank, ok,
                                        f.groupRanks *
                                            int64_t(f.quorum.members.size()));
        });
    if (!voted)
      return fail(voted.error());
    ftLog(plan.rank,
          "votes " + std::string(ok ? "ok" : "failed") + " on step " +
              std::to_string(step) + " of epoch " + std::to_string(epoch) +
              " (" + std::to_string(passes) + " passes)" +
              (*voted ? "" : ": stale") +
              (before.faultTolerantFailure
                   ? " [" + before.faultTolerantFailure->message + "]"
                   : ""));
    Result<bool> commit = *voted ? awaitCommit(epoch, step) : false;
    if (commit)
      ftLog(plan.rank, std::string(*commit ? "commits" : "discards") +
                           " step " + std::to_string(step) + " of epoch " +
                           std::to_string(epoch));
    if (!commit)
      return fail(commit.error());
    if (!*commit) {
      ++f.discarded;
      MESHPLAN_TRY(traceAttempt(step, epoch, false, start, state));
      moveOn = true;
      continue;
    }
    PassOutcome after = runPass(state, f.afterOrder, /*soft=*/false);
    if (after.failure)
      return fail(*after.failure);
    ++steps;
    profile = profileOf(program, state.spans, streams, commSequence, start,
                        Clock::now());
    profile.needlessWakeups = state.needlessWakeups;
    reportOptimizerStep(profile);
    return traceAttempt(step, epoch, true, start, state);
  }
}

std::optional<FaultToleranceState> Session::faultTolerance() const {
  if (!impl->ft)
    return std::nullopt;
  const FaultTolerance &f = *impl->ft;
  FaultToleranceState s;
  s.epoch = f.quorum.epoch;
  s.liveGroups = f.quorum.members;
  s.numGroups = f.numGroups;
  s.group = f.group;
  s.dataRanks =
      f.dataRanks.empty() ? std::vector<int64_t>{impl->plan.rank} : f.dataRanks;
  s.stepsDiscarded = f.discarded;
  s.heals = f.heals;
  return s;
}

Result<void> Session::checkMembershipStore() {
  if (!impl->ft)
    return {};
  Membership &m = *impl->ft->membership;
  auto q = m.currentQuorum();
  // A connection the store's restart closed fails once; the reconnect
  // then finds out whether the store still holds the job.
  if (!q && !m.lostState())
    q = m.currentQuorum();
  if (!q)
    return q.error();
  return {};
}

} // namespace meshplan::runtime
