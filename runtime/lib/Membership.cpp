//===- Membership.cpp - Replica groups, heartbeats and the quorum epoch ---===//
//
// Every decision is made by the store: liveness by key expiry, the epoch by
// one Lua script run atomically by Redis (a script's keys do not change, and
// no key expires, while it runs), so no process ever writes what it read
// earlier. The client only formats keys, runs scripts and reports errors
// that name the store (docs/fault-tolerance.md, "Membership").
//
// Connections: a hiredis context is not thread-safe, so the calling threads
// share one (behind a mutex) and the heartbeat thread has its own. A context
// that failed is dropped; the next call reconnects and first checks that the
// store still holds the job, so a store restarted without persistence is an
// error, never a silent restart at epoch 0.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Membership.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <unistd.h>

namespace meshplan::runtime {

namespace {

// The epoch compare-and-set. KEYS[1] is the epoch, KEYS[2..N+1] the N
// groups' heartbeat keys in group order; ARGV: expected epoch, min_replicas,
// nominal group count, the quorum key prefix, the synced key prefix, the
// committed key prefix, the incarnations' key prefix, the steps' key prefix
// and the last committed step's key. Returns {status, epoch, members}: 1 =
// installed, 0 = the epoch is not the expected one (the store's epoch and
// members), -1 = no quorum (the live count and groups). The epoch is compared
// and stepped as a string / by INCR, never as a Lua double.
//
// Installing epoch E + 1 also records, in the same script, which of its
// members hold the job's committed state ("synced:E+1"): the first epoch's
// members all start from the initial parameters; after that, the members
// of E if a step committed in E (every rank of every member voted ok on it,
// which a joiner whose heal failed never does), else E's own synced groups,
// in both cases those still members at the same incarnation. The others are
// joiners and heal. Fixed at installation, so every rank reads the same
// sources; a group that joined E and healed without a step committing in E
// heals again (a safe over-estimate), a joiner whose heal failed is never
// taken for a source, and neither is a group restarted (a new incarnation,
// read from its heartbeat's value) while the epoch still listed it.
// "inc:E+1" records each member's incarnation, "steps:E+1" the steps the job
// had committed ("" before the first): a joiner's step counter.
constexpr const char *kProposeScript = R"lua(
local cur = redis.call('GET', KEYS[1]) or '0'
if cur ~= ARGV[1] then
  return {0, cur, redis.call('GET', ARGV[4] .. cur) or ''}
end
local live, incs = {}, {}
for i = 2, #KEYS do
  local hb = redis.call('GET', KEYS[i])
  if hb then
    live[#live + 1] = tostring(i - 2)
    incs[#incs + 1] = string.match(hb, '^incarnation (%d+)') or '0'
  end
end
local n = #live
local members = table.concat(live, ',')
if n < tonumber(ARGV[2]) or 2 * n <= tonumber(ARGV[3]) then
  return {-1, tostring(n), members}
end
local base = nil
local baseInc = {}
if cur ~= '0' then
  if redis.call('EXISTS', ARGV[6] .. cur) == 1 then
    base = redis.call('GET', ARGV[4] .. cur) or ''
  else
    base = redis.call('GET', ARGV[5] .. cur) or ''
  end
  local m, k = {}, {}
  for g in string.gmatch(redis.call('GET', ARGV[4] .. cur) or '', '[^,]+') do
    m[#m + 1] = g
  end
  for c in string.gmatch(redis.call('GET', ARGV[7] .. cur) or '', '[^,]+') do
    k[#k + 1] = c
  end
  for j, g in ipairs(m) do baseInc[g] = k[j] end
end
local synced = live
if base then
  local had = {}
  for g in string.gmatch(base, '[^,]+') do had[g] = true end
  synced = {}
  for j, g in ipairs(live) do
    if had[g] and (baseInc[g] or '0') == incs[j] then
      synced[#synced + 1] = g
    end
  end
end
redis.call('INCR', KEYS[1])
local nxt = redis.call('GET', KEYS[1])
redis.call('SET', ARGV[4] .. nxt, members)
redis.call('SET', ARGV[5] .. nxt, table.concat(synced, ','))
redis.call('SET', ARGV[7] .. nxt, table.concat(incs, ','))
redis.call('SET', ARGV[8] .. nxt, redis.call('GET', ARGV[9]) or '')
return {1, nxt, members}
)lua";

// Everything a rank adopting epoch E needs, at one instant. KEYS: quorum:E,
// synced:E, inc:E, steps:E.
constexpr const char *kEpochScript = R"lua(
return {redis.call('GET', KEYS[1]) or '', redis.call('GET', KEYS[2]) or '',
        redis.call('GET', KEYS[3]) or '', redis.call('GET', KEYS[4]) or ''}
)lua";

// The current epoch and its members in one atomic read (two GETs could
// straddle an epoch change). KEYS[1]: the epoch; ARGV[1]: the quorum prefix.
constexpr const char *kReadQuorumScript = R"lua(
local e = redis.call('GET', KEYS[1]) or '0'
return {e, redis.call('GET', ARGV[1] .. e) or ''}
)lua";

// Every group's heartbeat TTL in milliseconds at one instant (-2: expired).
constexpr const char *kLiveScript = R"lua(
local ttl = {}
for i = 1, #KEYS do ttl[i] = redis.call('PTTL', KEYS[i]) end
return ttl
)lua";

// A step's commit vote. KEYS: the epoch, the step's ok set, its failed
// flag, the epoch's committed flag; ARGV: the voter's epoch, its rank, "1"
// (ok) or "0", the keys' expiry in seconds, the ok votes that commit the step
// (0: not known), the step. Recorded only while the epoch is the voter's: the
// compare-and-set above moves the epoch in a script of its own, so a step's
// votes are final once its epoch has moved. The vote that completes a step
// marks the epoch committed and records the step as the job's last
// committed one (KEYS[5]; both read when the next epoch is installed).
constexpr const char *kVoteScript = R"lua(
local cur = redis.call('GET', KEYS[1]) or '0'
if cur ~= ARGV[1] then return 0 end
if ARGV[3] == '1' then
  redis.call('SADD', KEYS[2], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
  local need = tonumber(ARGV[5])
  if need > 0 and redis.call('SCARD', KEYS[2]) >= need and
     redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('SET', KEYS[4], '1')
    redis.call('SET', KEYS[5], ARGV[6])
  end
else
  redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[4])
end
return 1
)lua";

// The epoch and one step's votes at one instant.
constexpr const char *kTallyScript = R"lua(
return {redis.call('GET', KEYS[1]) or '0', redis.call('SCARD', KEYS[2]),
        redis.call('EXISTS', KEYS[3])}
)lua";

/// How long a step's vote keys live: long past any step, short enough that
/// a long job does not fill the store.
constexpr int kVoteExpirySeconds = 3600;

using Reply = RedisReply;

bool validJobName(const std::string &job) {
  if (job.empty() || job.size() > 128)
    return false;
  return std::all_of(job.begin(), job.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
  });
}

std::optional<int64_t> parseInt64(const std::string &s) {
  if (s.empty())
    return std::nullopt;
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size())
    return std::nullopt;
  return v;
}

/// "0,2,3" -> {0, 2, 3}; nullopt when malformed.
std::optional<std::vector<int>> parseMembers(const std::string &s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos)
      comma = s.size();
    std::optional<int64_t> g = parseInt64(s.substr(pos, comma - pos));
    if (!g || *g < 0 || *g > 1'000'000)
      return std::nullopt;
    out.push_back(static_cast<int>(*g));
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string joinGroups(const std::vector<int> &groups) {
  std::string s;
  for (int g : groups)
    s += (s.empty() ? "" : ", ") + std::to_string(g);
  return s;
}

} // namespace

//===----------------------------------------------------------------------===//
// Connections and commands
//===----------------------------------------------------------------------===//

Membership::Membership(const MembershipOptions &o) : opts(o) {
  store = "redis://" + opts.host + ":" + std::to_string(opts.port);
  // The heartbeat's value only helps a person reading the store (liveness
  // is the TTL); taken here, not once per program, since a forked child
  // has its own pid.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // The incarnation leads: the epoch script reads it (a restarted group
  // holds none of the state its predecessor had).
  holder = "incarnation " + std::to_string(opts.incarnation) + " " +
           std::string(host) + " pid " + std::to_string(getpid());
  period =
      opts.heartbeatPeriod.count() > 0
          ? opts.heartbeatPeriod
          : std::max(std::chrono::milliseconds(1), opts.heartbeatExpiry / 4);
}

Membership::~Membership() { stopHeartbeat(); }

std::string Membership::key(const std::string &suffix) const {
  // {JOB} is also a Redis Cluster hash tag: all of a job's keys map to one
  // slot, as a multi-key script needs on a cluster (only a standalone
  // server is tested).
  return "meshplan:{" + opts.job + "}:" + suffix;
}

std::string Membership::configValue() const {
  return "groups=" + std::to_string(opts.numGroups) +
         " min_replicas=" + std::to_string(opts.minReplicas);
}

namespace {

/// Runs one command on a connected connection. A transport failure drops
/// the connection and is an error naming the store, as is an error reply.
Result<Reply> run(RedisConnection &c, const std::string &store,
                  const std::string &what,
                  const std::vector<std::string> &args) {
  Result<Reply> reply = c.command(args);
  if (!reply)
    return makeError("membership store " + store + ": " + what + ": " +
                     reply.error().message);
  if (reply.value().isError())
    return makeError("membership store " + store + ": " + what +
                     ": the store replied: " + reply.value().text());
  return reply;
}

} // namespace

Result<void> Membership::ensureConnected(Connection &c, bool firstConnect) {
  if (c.connected())
    return {};
  // Keep-alive probes notice a peer that vanished without closing the
  // connection (a partition) even when we are not waiting on a reply.
  Result<void> up = c.connect(opts.host, opts.port, opts.connectTimeout,
                              opts.ioTimeout, /*keepAlive=*/true);
  if (!up)
    return makeError("cannot reach the membership store " + store + ": " +
                     up.error().message + " (connect timeout " +
                     std::to_string(opts.connectTimeout.count()) + " ms)");

  std::string cfgKey = key("config");
  if (firstConnect) {
    // The first process of the job records its configuration; the others
    // must agree (NX: never overwritten).
    auto set = run(c, store, "recording the job",
                   {"SET", cfgKey, configValue(), "NX"});
    if (!set)
      return set.error();
  }
  auto got = run(c, store, "reading the job", {"GET", cfgKey});
  if (!got)
    return got.error();
  if (got.value().isNil()) {
    c.close();
    lost = true;
    return makeError(
        "membership store " + store + " no longer holds job \"" + opts.job +
        "\" (its keys are gone: the store was restarted without persistence "
        "or flushed); the job's epoch and quorum are lost");
  }
  std::string recorded = got.value().text();
  if (recorded != configValue()) {
    c.close();
    return makeError("membership store " + store + ": job \"" + opts.job +
                     "\" was started with " + recorded + ", this process has " +
                     configValue() +
                     " (every process of a job must agree; a new run needs a "
                     "new job name)");
  }
  return {};
}

Result<void> Membership::noteEpoch(int64_t epoch) {
  int64_t seen = observed.load(std::memory_order_acquire);
  while (epoch > seen && !observed.compare_exchange_weak(
                             seen, epoch, std::memory_order_acq_rel))
    ;
  if (epoch < seen)
    lost = true;
  if (epoch < seen)
    return makeError("membership store " + store + ": job \"" + opts.job +
                     "\" is at epoch " + std::to_string(epoch) +
                     ", but this process already saw epoch " +
                     std::to_string(seen) +
                     " (the store lost its state: restarted without "
                     "persistence or flushed)");
  return {};
}

//===----------------------------------------------------------------------===//
// connect
//===----------------------------------------------------------------------===//

Result<std::unique_ptr<Membership>>
Membership::connect(const MembershipOptions &o) {
  auto bad = [](const std::string &what) {
    return makeError("membership: " + what);
  };
  if (!validJobName(o.job))
    return bad("job name \"" + o.job +
               "\" must be 1-128 characters of [A-Za-z0-9._-]");
  if (o.port < 1 || o.port > 65535)
    return bad("store port " + std::to_string(o.port) + " is not in 1..65535");
  if (o.host.empty())
    return bad("the store host is empty");
  if (o.numGroups < 1)
    return bad("the job needs at least one replica group (got " +
               std::to_string(o.numGroups) + ")");
  if (o.replicaGroup < 0 || o.replicaGroup >= o.numGroups)
    return bad("replica group " + std::to_string(o.replicaGroup) +
               " is not in 0.." + std::to_string(o.numGroups - 1));
  if (o.minReplicas < 1 || o.minReplicas > o.numGroups)
    return bad("min_replicas " + std::to_string(o.minReplicas) +
               " must be in 1.." + std::to_string(o.numGroups) +
               " (the job has " + std::to_string(o.numGroups) +
               " replica groups)");
  if (o.heartbeatExpiry.count() < 10)
    return bad("heartbeat expiry " + std::to_string(o.heartbeatExpiry.count()) +
               " ms is below 10 ms");
  if (o.heartbeatPeriod.count() < 0 || o.heartbeatPeriod >= o.heartbeatExpiry)
    return bad("heartbeat period " + std::to_string(o.heartbeatPeriod.count()) +
               " ms must be below the expiry (" +
               std::to_string(o.heartbeatExpiry.count()) + " ms)");
  if (o.connectTimeout.count() <= 0 || o.ioTimeout.count() <= 0 ||
      o.pollInterval.count() <= 0)
    return bad("the connect and I/O timeouts and the poll interval must be "
               "positive");

  // A store that dies closes our sockets, and writing to a closed socket
  // raises SIGPIPE, whose default action kills the process before the error
  // below could name the store. Ignore it unless the program chose its own
  // handler (as GlooBackend does).
  struct sigaction current{};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL)
    signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<Membership> m(new Membership(o));
  std::lock_guard<std::mutex> lock(m->callMutex);
  MESHPLAN_TRY(m->ensureConnected(m->main, /*firstConnect=*/true));
  return m;
}

//===----------------------------------------------------------------------===//
// Heartbeats
//===----------------------------------------------------------------------===//

Result<void> Membership::refreshHeartbeat(Connection &c) {
  MESHPLAN_TRY(ensureConnected(c));
  std::string hb = key("hb:" + std::to_string(opts.replicaGroup));
  std::string ms = std::to_string(opts.heartbeatExpiry.count());
  std::string epochKey = key("epoch");
  // One round trip: refresh the key and read the epoch.
  std::string what = "heartbeat of group " + std::to_string(opts.replicaGroup);
  Result<std::vector<Reply>> got =
      c.pipeline({{"SET", hb, holder, "PX", ms}, {"GET", epochKey}});
  if (!got)
    return makeError("membership store " + store + ": " + what + ": " +
                     got.error().message);
  const std::vector<Reply> &replies = got.value();
  for (const Reply &r : replies)
    if (r.isError())
      return makeError("membership store " + store + ": " + what +
                       ": the store replied: " + r.text());
  int64_t epoch = 0;
  if (!replies[1].isNil()) {
    std::optional<int64_t> e = parseInt64(replies[1].text());
    if (!e)
      return makeError("membership store " + store +
                       ": the epoch key holds \"" + replies[1].text() +
                       "\", not an integer");
    epoch = *e;
  }
  return noteEpoch(epoch);
}

Result<void> Membership::startHeartbeat() {
  std::lock_guard<std::mutex> lock(hbMutex);
  if (heartbeat.joinable())
    return {};
  // The first refresh runs here, before the thread exists, so a caller that
  // sees success knows its group is live.
  Result<void> first = refreshHeartbeat(heartbeatConn);
  if (!first)
    return first.error();
  hbStop = false;
  hbError.reset();
  heartbeat = std::thread([this] { heartbeatLoop(); });
  return {};
}

void Membership::heartbeatLoop() {
  auto next = std::chrono::steady_clock::now() + period;
  std::unique_lock<std::mutex> lock(hbMutex);
  while (!hbWake.wait_until(lock, next, [this] { return hbStop; })) {
    lock.unlock();
    Result<void> r = refreshHeartbeat(heartbeatConn);
    lock.lock();
    if (r)
      hbError.reset();
    else
      hbError = r.error();
    // Keep the cadence; after a slow refresh, wait a full period rather
    // than refreshing in a burst.
    next += period;
    auto now = std::chrono::steady_clock::now();
    if (next < now)
      next = now + period;
  }
}

void Membership::stopHeartbeat() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(hbMutex);
    hbStop = true;
    t = std::move(heartbeat);
  }
  hbWake.notify_all();
  if (t.joinable())
    t.join();
  std::lock_guard<std::mutex> lock(hbMutex);
  heartbeatConn.close();
}

std::optional<Error> Membership::heartbeatError() const {
  std::lock_guard<std::mutex> lock(hbMutex);
  return hbError;
}

//===----------------------------------------------------------------------===//
// Quorum
//===----------------------------------------------------------------------===//

namespace {

/// Reads the {epoch, members} pair both scripts return.
Result<Quorum> parseQuorumPair(const Reply *r, size_t first,
                               const std::string &store) {
  auto bad = [&] {
    return makeError("membership store " + store +
                     ": malformed quorum reply (the job's keys were "
                     "overwritten by something else?)");
  };
  if (!r->isArray() || r->elements.size() < first + 2)
    return bad();
  std::optional<int64_t> epoch = parseInt64(r->elements[first].text());
  std::optional<std::vector<int>> members =
      parseMembers(r->elements[first + 1].text());
  if (!epoch || *epoch < 0 || !members)
    return bad();
  return Quorum{*epoch, std::move(*members)};
}

} // namespace

Result<Quorum> Membership::currentQuorum() {
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  auto r = run(main, store, "reading the quorum",
               {"EVAL", kReadQuorumScript, "1", key("epoch"), key("quorum:")});
  if (!r)
    return r.error();
  Result<Quorum> q = parseQuorumPair(&r.value(), 0, store);
  if (!q)
    return q;
  MESHPLAN_TRY(noteEpoch(q->epoch));
  return q;
}

Result<EpochProposal> Membership::proposeNextEpoch(int64_t expectedEpoch) {
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  std::vector<std::string> args = {
      "EVAL", kProposeScript, std::to_string(1 + opts.numGroups), key("epoch")};
  for (int g = 0; g < opts.numGroups; ++g)
    args.push_back(key("hb:" + std::to_string(g)));
  args.push_back(std::to_string(expectedEpoch));
  args.push_back(std::to_string(opts.minReplicas));
  args.push_back(std::to_string(opts.numGroups));
  args.push_back(key("quorum:"));
  args.push_back(key("synced:"));
  args.push_back(key("committed:"));
  args.push_back(key("inc:"));
  args.push_back(key("steps:"));
  args.push_back(key("laststep"));
  auto r = run(main, store,
               "proposing epoch " + std::to_string(expectedEpoch + 1), args);
  if (!r)
    return r.error();
  const Reply *reply = &r.value();
  if (!reply->isArray() || reply->elements.size() != 3 ||
      !reply->elements[0].isInteger())
    return makeError("membership store " + store +
                     ": malformed reply to the epoch proposal");
  int64_t status = reply->elements[0].integer;
  if (status == -1) {
    std::optional<std::vector<int>> live =
        parseMembers(reply->elements[2].text());
    size_t n = live ? live->size() : 0;
    std::string msg = "no quorum: " + std::to_string(n) + " of " +
                      std::to_string(opts.numGroups) +
                      " replica groups live, min_replicas " +
                      std::to_string(opts.minReplicas);
    if (static_cast<int>(n) >= opts.minReplicas)
      msg +=
          ", a strict majority needs " + std::to_string(opts.numGroups / 2 + 1);
    if (live && !live->empty())
      msg += " (live: " + joinGroups(*live) + ")";
    return makeError(msg);
  }
  Result<Quorum> q = parseQuorumPair(reply, 1, store);
  if (!q)
    return q.error();
  if (status == 0 && q->epoch < expectedEpoch)
    lost = true;
  if (status == 0 && q->epoch < expectedEpoch)
    return makeError("membership store " + store + ": job \"" + opts.job +
                     "\" is at epoch " + std::to_string(q->epoch) +
                     ", behind the expected epoch " +
                     std::to_string(expectedEpoch) +
                     " (the store lost its state: restarted without "
                     "persistence or flushed)");
  MESHPLAN_TRY(noteEpoch(q->epoch));
  return EpochProposal{status == 1, std::move(q.value())};
}

Result<Quorum>
Membership::waitForChange(int64_t epoch,
                          std::chrono::steady_clock::time_point deadline) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    Result<Quorum> q = currentQuorum();
    if (!q || q->epoch != epoch)
      return q;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      return makeError(
          "membership store " + store + ": epoch " + std::to_string(epoch) +
          " did not change within " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(now - start)
                  .count()) +
          " ms");
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        opts.pollInterval, deadline - now));
  }
}

Result<std::vector<LiveGroup>> Membership::liveGroups() {
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  std::vector<std::string> args = {"EVAL", kLiveScript,
                                   std::to_string(opts.numGroups)};
  for (int g = 0; g < opts.numGroups; ++g)
    args.push_back(key("hb:" + std::to_string(g)));
  auto r = run(main, store, "reading the heartbeats", args);
  if (!r)
    return r.error();
  const Reply *reply = &r.value();
  if (!reply->isArray() ||
      reply->elements.size() != static_cast<size_t>(opts.numGroups))
    return makeError("membership store " + store +
                     ": malformed reply to the heartbeat read");
  std::vector<LiveGroup> live;
  for (int g = 0; g < opts.numGroups; ++g) {
    const Reply *e = &reply->elements[g];
    if (!e->isInteger())
      return makeError("membership store " + store +
                       ": malformed reply to the heartbeat read");
    // -2: no key (expired or never written). -1: a key without expiry,
    // which only a person could have written; it is alive.
    if (e->integer == -2)
      continue;
    live.push_back(LiveGroup{g, std::chrono::milliseconds(std::max<long long>(
                                    0, static_cast<long long>(e->integer)))});
  }
  return live;
}

Result<std::vector<int>> Membership::deadGroups(const Quorum &quorum) {
  Result<std::vector<LiveGroup>> live = liveGroups();
  if (!live)
    return live.error();
  std::vector<int> dead;
  for (int g : quorum.members)
    if (std::none_of(live->begin(), live->end(),
                     [&](const LiveGroup &l) { return l.group == g; }))
      dead.push_back(g);
  return dead;
}

Result<std::vector<int>> Membership::groupsOf(int64_t epoch, const char *prefix,
                                              const char *what) {
  if (epoch <= 0)
    return std::vector<int>{};
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  auto r = run(main, store,
               std::string("reading the ") + what + " of epoch " +
                   std::to_string(epoch),
               {"GET", key(prefix + std::to_string(epoch))});
  if (!r)
    return r.error();
  if (r.value().isNil())
    return std::vector<int>{};
  std::optional<std::vector<int>> members = parseMembers(r.value().text());
  if (!members)
    return makeError("membership store " + store + ": the " + what +
                     " of epoch " + std::to_string(epoch) + " is malformed");
  return std::move(*members);
}

Result<EpochRecord> Membership::epochRecord(int64_t epoch) {
  EpochRecord rec;
  rec.epoch = epoch;
  if (epoch <= 0)
    return rec;
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  std::string e = std::to_string(epoch);
  auto r = run(main, store, "reading epoch " + e,
               {"EVAL", kEpochScript, "4", key("quorum:" + e),
                key("synced:" + e), key("inc:" + e), key("steps:" + e)});
  if (!r)
    return r.error();
  const Reply *reply = &r.value();
  auto bad = [&] {
    return makeError("membership store " + store + ": the record of epoch " +
                     e + " is malformed");
  };
  if (!reply->isArray() || reply->elements.size() != 4)
    return bad();
  auto members = parseMembers(reply->elements[0].text());
  auto synced = parseMembers(reply->elements[1].text());
  if (!members || !synced)
    return bad();
  rec.members = std::move(*members);
  rec.synced = std::move(*synced);
  // Incarnations are listed in member order (not sorted); absent: all 0
  // (an epoch recorded before incarnations were).
  std::string incs = reply->elements[2].text();
  for (size_t pos = 0; pos < incs.size();) {
    size_t comma = incs.find(',', pos);
    if (comma == std::string::npos)
      comma = incs.size();
    std::optional<int64_t> v = parseInt64(incs.substr(pos, comma - pos));
    if (!v)
      return bad();
    rec.incarnations.push_back(*v);
    pos = comma + 1;
  }
  if (rec.incarnations.empty())
    rec.incarnations.assign(rec.members.size(), 0);
  if (rec.incarnations.size() != rec.members.size())
    return bad();
  std::string steps = reply->elements[3].text();
  if (!steps.empty()) {
    rec.stepsCommitted = parseInt64(steps);
    if (!rec.stepsCommitted)
      return bad();
  }
  return rec;
}

Result<std::vector<int>> Membership::membersOf(int64_t epoch) {
  return groupsOf(epoch, "quorum:", "quorum");
}

Result<std::vector<int>> Membership::syncedOf(int64_t epoch) {
  return groupsOf(epoch, "synced:", "synced groups");
}

Result<void> Membership::registerRank(int64_t rank) {
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  auto r = run(main, store, "registering rank " + std::to_string(rank),
               {"SET", key("rank:" + std::to_string(rank)),
                std::to_string(opts.replicaGroup)});
  if (!r)
    return r.error();
  return {};
}

Result<void> Membership::leaveGroup() {
  stopHeartbeat();
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  auto r =
      run(main, store, "leaving group " + std::to_string(opts.replicaGroup),
          {"DEL", key("hb:" + std::to_string(opts.replicaGroup))});
  if (!r)
    return r.error();
  return {};
}

namespace {
std::string stepKey(int64_t epoch, int64_t step, const char *what) {
  return "step:" + std::to_string(epoch) + ":" + std::to_string(step) + ":" +
         what;
}
} // namespace

Result<bool> Membership::voteStep(int64_t epoch, int64_t step, int64_t rank,
                                  bool ok, int64_t committingVotes) {
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  auto r =
      run(main, store,
          "voting on step " + std::to_string(step) + " of epoch " +
              std::to_string(epoch),
          {"EVAL", kVoteScript, "5", key("epoch"),
           key(stepKey(epoch, step, "ok")), key(stepKey(epoch, step, "failed")),
           key("committed:" + std::to_string(epoch)), key("laststep"),
           std::to_string(epoch), std::to_string(rank), ok ? "1" : "0",
           std::to_string(kVoteExpirySeconds),
           std::to_string(std::max<int64_t>(0, committingVotes)),
           std::to_string(step)});
  if (!r)
    return r.error();
  if (!r.value().isInteger())
    return makeError("membership store " + store +
                     ": malformed reply to a step vote");
  return r.value().integer == 1;
}

Result<std::optional<std::string>> Membership::jobFinished() {
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  auto r = run(main, store, "reading whether the job ended",
               {"GET", key("finished")});
  if (!r)
    return r.error();
  if (r.value().isNil())
    return std::optional<std::string>();
  return std::optional<std::string>(r.value().text());
}

Result<StepTally> Membership::stepTally(int64_t epoch, int64_t step) {
  std::lock_guard<std::mutex> lock(callMutex);
  MESHPLAN_TRY(ensureConnected(main));
  auto r = run(main, store, "reading the votes on step " + std::to_string(step),
               {"EVAL", kTallyScript, "3", key("epoch"),
                key(stepKey(epoch, step, "ok")),
                key(stepKey(epoch, step, "failed"))});
  if (!r)
    return r.error();
  const Reply *reply = &r.value();
  std::optional<int64_t> current;
  if (reply->isArray() && reply->elements.size() == 3 &&
      reply->elements[1].isInteger() && reply->elements[2].isInteger())
    current = parseInt64(reply->elements[0].text());
  if (!current)
    return makeError("membership store " + store +
                     ": malformed reply to a step tally");
  MESHPLAN_TRY(noteEpoch(*current));
  return StepTally{*current, reply->elements[1].integer,
                   reply->elements[2].integer == 1};
}

} // namespace meshplan::runtime
