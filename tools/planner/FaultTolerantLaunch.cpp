//===- FaultTolerantLaunch.cpp - meshplan run --fault-tolerant ------------===//
//
// The Supervisor is driven by RunCommand.cpp's one-threaded poll loop: every
// call here is short, and the store is read with a 500 ms bound per round
// trip, so a hung store delays the ranks' output by at most that.
//
//===----------------------------------------------------------------------===//

#include "FaultTolerantLaunch.h"

#include "MeshSetup.h"
#include "RunOptions.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <random>
#include <sstream>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace meshplan::cli;
using namespace meshplan::cli::ft;
namespace fs = std::filesystem;
using meshplan::runtime::RedisConnection;
using meshplan::runtime::RedisReply;

namespace {

constexpr int64_t kMaxRestarts = 1000;
/// A node that joins a running job starts its returning ranks at a multiple
/// of this (above any count of restarts), so that no incarnation repeats.
constexpr int64_t kJoinIncarnationStride = 10000;
constexpr int64_t kMaxGroups = 65536;
constexpr int64_t kMinHeartbeatMs = 100;
constexpr int64_t kMaxHeartbeatMs = 3600000;
constexpr auto kPollEvery = std::chrono::milliseconds(50);
constexpr auto kReconnectEvery = std::chrono::seconds(1);
constexpr const char *kRedisServers[] = {"/usr/bin/redis-server",
                                         "/usr/local/bin/redis-server"};

std::string inQuotes(const std::string &s) { return "\"" + s + "\""; }

int64_t parseFlagInt(const std::string &flag, const std::string &text,
                     int64_t lo, int64_t hi) {
  int64_t value = 0;
  const char *end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < lo ||
      value > hi)
    throw CliError(flag + ": must be an integer from " + std::to_string(lo) +
                   " to " + std::to_string(hi) + ", not " + inQuotes(text));
  return value;
}

bool validJobName(const std::string &job) {
  if (job.empty() || job.size() > 128)
    return false;
  return std::all_of(job.begin(), job.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' ||
           c == '_' || c == '-';
  });
}

std::string freshJobName() {
  std::random_device rd;
  char suffix[9];
  std::snprintf(suffix, sizeof suffix, "%08x", rd());
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count();
  return "ft-" + std::to_string(::getpid()) + "-" + std::to_string(ms) + "-" +
         suffix;
}

std::string joinInts(const std::vector<int64_t> &xs) {
  std::string s;
  for (size_t i = 0; i < xs.size(); ++i)
    s += (i ? ", " : "") + std::to_string(xs[i]);
  return s;
}

/// "replica 1" or "replicas 0, 2".
std::string replicas(const std::vector<int64_t> &gs) {
  return (gs.size() == 1 ? "replica " : "replicas ") + joinInts(gs);
}

/// "exited with signal 9 (SIGKILL)" / "exited with status 7".
std::string exitText(int status, bool withName) {
  if (WIFEXITED(status))
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    std::string s = "exited with signal " + std::to_string(sig);
    if (withName) {
      const char *abbrev = sigabbrev_np(sig);
      s += std::string(" (") + (abbrev ? std::string("SIG") + abbrev : "?") +
           (WCOREDUMP(status) ? ", core dumped" : "") + ")";
    }
    return s;
  }
  return "ended with wait status " + std::to_string(status);
}

bool exitedOk(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// A short-lived connection for the checks before anything starts: its
/// answer to PING, or nullopt with the reason in `error`.
std::optional<std::string> ping(RedisConnection &c, const std::string &host,
                                int port, std::chrono::milliseconds timeout,
                                std::string *error) {
  meshplan::Result<void> up = c.connect(host, port, timeout, timeout);
  if (!up) {
    *error = up.error().message;
    return std::nullopt;
  }
  meshplan::Result<RedisReply> r = c.command({"PING"});
  if (!r) {
    *error = r.error().message;
    return std::nullopt;
  }
  return r.value().str;
}

std::optional<std::vector<int>> parseMembers(const std::string &text) {
  std::vector<int> out;
  if (text.empty())
    return out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || p != item.data() + item.size() || v < 0)
      return std::nullopt;
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<int64_t> parseInt64(const std::string &text) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size())
    return std::nullopt;
  return v;
}

/// With --nnodes > 1, the job's config key already there means another
/// node's ranks got there first, or this node is restarted into a job that
/// trains on: how many of the job's replica groups heartbeat (config value
/// "groups=N min_replicas=M"). When some do, this node joins, and
/// config.joinIncarnation is set from a per-job counter, so that two nodes
/// that rejoin never pick the same incarnation.
int64_t joinRunningJob(RedisConnection &c, Config &config,
                       const std::string &configValue) {
  std::optional<int64_t> groups;
  if (configValue.rfind("groups=", 0) == 0)
    groups = parseInt64(configValue.substr(7, configValue.find(' ') - 7));
  if (!groups || *groups < 1 || *groups > kMaxGroups)
    return 0;
  std::vector<std::string> args = {"EXISTS"};
  for (int64_t g = 0; g < *groups; ++g)
    args.push_back("meshplan:{" + config.job + "}:hb:" + std::to_string(g));
  auto integer = [&](const std::vector<std::string> &command) -> int64_t {
    meshplan::Result<RedisReply> r = c.command(command);
    return r && r.value().isInteger() ? r.value().integer : 0;
  };
  int64_t live = integer(args);
  if (live == 0)
    return 0;
  int64_t joins = integer({"INCR", "meshplan:{" + config.job + "}:node-joins"});
  if (joins < 1)
    return 0;
  config.joinIncarnation = joins * kJoinIncarnationStride;
  return live;
}

} // namespace

int meshplan::cli::freeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

//===----------------------------------------------------------------------===//
// Flags
//===----------------------------------------------------------------------===//

std::optional<Config> ft::parseFlags(const RunOptions &o, int64_t nnodes) {
  if (!o.faultTolerant) {
    for (auto [flag, given] : {std::pair<const char *, bool>{
                                   "--max-restarts", o.maxRestarts.has_value()},
                               {"--min-replicas", o.minReplicas.has_value()},
                               {"--heartbeat-ms", o.heartbeatMs.has_value()},
                               {"--job", o.job.has_value()}})
      if (given)
        throw CliError(std::string(flag) +
                       ": only with --fault-tolerant (it configures the "
                       "restarts of replica groups)");
    return std::nullopt;
  }
  Config c;
  c.nnodes = nnodes;
  if (o.maxRestarts)
    c.maxRestarts =
        parseFlagInt("--max-restarts", *o.maxRestarts, 0, kMaxRestarts);
  if (o.minReplicas)
    c.minReplicas =
        parseFlagInt("--min-replicas", *o.minReplicas, 1, kMaxGroups);
  if (o.heartbeatMs)
    c.heartbeatMs = parseFlagInt("--heartbeat-ms", *o.heartbeatMs,
                                 kMinHeartbeatMs, kMaxHeartbeatMs);
  if (o.store) {
    // RunCommand.cpp's parseStore has checked the syntax of a redis:// one.
    if (o.store->rfind("redis://", 0) != 0)
      throw CliError("--store: --fault-tolerant keeps the replica groups' "
                     "membership in Redis: give redis://HOST:PORT (or no "
                     "--store for a private redis-server), not " +
                     inQuotes(*o.store));
    std::string rest = o.store->substr(8);
    size_t colon = rest.rfind(':');
    c.host = rest.substr(0, colon);
    c.port = static_cast<int>(*parseInt64(rest.substr(colon + 1)));
  }
  if (o.job) {
    if (!validJobName(*o.job))
      throw CliError("--job: " + inQuotes(*o.job) +
                     " must be 1-128 characters of [A-Za-z0-9._-]");
    c.job = *o.job;
    c.jobGiven = true;
  } else if (nnodes > 1) {
    throw CliError("--job: --fault-tolerant with --nnodes " +
                   std::to_string(nnodes) +
                   " needs one job name that every node's launcher is "
                   "given (--job NAME)");
  } else {
    c.job = freshJobName();
  }
  return c;
}

//===----------------------------------------------------------------------===//
// The store
//===----------------------------------------------------------------------===//

StoreServer::~StoreServer() { stop(); }

std::string StoreServer::url() const {
  return "redis://" + hostName + ":" + std::to_string(portNumber);
}

void StoreServer::stop() {
  if (serverPid > 0) {
    ::kill(serverPid, SIGKILL);
    while (::waitpid(serverPid, nullptr, 0) < 0 && errno == EINTR) {
    }
    serverPid = -1;
  }
  if (!dir.empty()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    dir.clear();
  }
}

std::optional<std::string> StoreServer::open(Config &config) {
  if (!config.host.empty()) {
    hostName = config.host;
    portNumber = config.port;
    RedisConnection c;
    std::string error;
    std::optional<std::string> pong =
        ping(c, hostName, portNumber, std::chrono::milliseconds(2000), &error);
    bool exists = false;
    std::optional<std::string> finished, stopped;
    // One node: a job name with keys in the store is in use, refused. Several
    // nodes: the other nodes' ranks may record the job (its config key)
    // before this launcher looks, so only a job that has ended is refused
    // (its completion key, which nothing writes before a group has ended,
    // or the key a launcher writes when the job can no longer form a
    // quorum), and a running one is joined (joinRunningJob: a restarted
    // node).
    if (pong == "PONG" && config.jobGiven) {
      auto get = [&](const std::string &key) -> std::optional<std::string> {
        meshplan::Result<RedisReply> r = c.command({"GET", key});
        if (r && r.value().isString())
          return r.value().str;
        return std::nullopt;
      };
      std::string prefix = "meshplan:{" + config.job + "}:";
      if (config.nnodes > 1) {
        finished = get(prefix + "finished");
        stopped = get(prefix + "stopped");
        exists = finished || stopped;
        if (!exists)
          if (std::optional<std::string> cfg = get(prefix + "config"))
            joinRunningJob(c, config, *cfg);
      } else {
        exists = get(prefix + "config").has_value();
      }
    }
    c.close();
    if (!pong)
      throw CliError("--store: cannot reach " + url() + ": " + error +
                     " (--fault-tolerant keeps the membership there; "
                     "checked with PING, 2000 ms)");
    if (*pong != "PONG")
      throw CliError("--store: " + url() + " answered PING with " +
                     inQuotes(*pong) + ", not PONG");
    if (exists)
      throw CliError(
          "--job: job " + inQuotes(config.job) + " already has keys in " +
          url() +
          (config.nnodes <= 1 ? std::string(" (a new run needs a new job name)")
           : finished
               ? std::string(" and has finished (none of its replica groups "
                             "is alive; a new run needs a new job name)")
               : " and was stopped (" + *stopped +
                     "; a new run needs a new job name)"));
    return std::nullopt;
  }

  std::string server;
  for (const char *p : kRedisServers)
    if (::access(p, X_OK) == 0) {
      server = p;
      break;
    }
  if (server.empty())
    return std::string("--fault-tolerant needs a Redis server for the "
                       "replica groups' membership: redis-server is not "
                       "installed (/usr/bin/redis-server; Debian's package "
                       "redis-server), and no --store redis://HOST:PORT was "
                       "given");
  const char *tmp = std::getenv("TMPDIR");
  std::string base = tmp && *tmp ? tmp : "/tmp";
  std::string templ = base + "/meshplan-redis-XXXXXX";
  if (!::mkdtemp(templ.data()))
    return "cannot create a directory for the private redis-server in " +
           inQuotes(base) + ": " + std::strerror(errno);
  dir = templ;
  std::string log = dir + "/redis.log";
  hostName = "127.0.0.1";
  pid_t launcher = ::getpid();
  for (int attempt = 0; attempt < 5; ++attempt) {
    portNumber = freeLoopbackPort();
    std::vector<std::string> args = {server,
                                     "--port",
                                     std::to_string(portNumber),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir,
                                     "--daemonize",
                                     "no"};
    std::vector<char *> argv;
    for (std::string &a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    int logFd =
        ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int nullFd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t pid = ::fork();
    if (pid == 0) {
      // Own session: a Ctrl-C on the terminal must not stop the store under
      // the ranks; dies with the launcher even if it is SIGKILLed.
      ::setsid();
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher)
        ::_exit(127);
      if (nullFd >= 0)
        ::dup2(nullFd, STDIN_FILENO);
      if (logFd >= 0) {
        ::dup2(logFd, STDOUT_FILENO);
        ::dup2(logFd, STDERR_FILENO);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (logFd >= 0)
      ::close(logFd);
    if (nullFd >= 0)
      ::close(nullFd);
    if (pid < 0)
      return std::string("cannot start redis-server: fork: ") +
             std::strerror(errno);
    serverPid = pid;
    for (int i = 0; i < 200; ++i) { // up to 10 s
      RedisConnection c;
      std::string error;
      std::optional<std::string> pong =
          ping(c, hostName, portNumber, std::chrono::milliseconds(200), &error);
      c.close();
      if (pong == "PONG")
        return std::nullopt;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        serverPid = -1;
        break; // the port was taken between the probe and the bind?
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (serverPid > 0) {
      stop();
      return "the private redis-server on port " + std::to_string(portNumber) +
             " did not answer PING within 10 s";
    }
  }
  std::string tail;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);)
    if (!line.empty())
      tail = line;
  return "cannot start the private redis-server (" + server +
         "): it exited on 5 loopback ports; its last line: " +
         (tail.empty() ? "(none)" : tail);
}

//===----------------------------------------------------------------------===//
// The supervisor
//===----------------------------------------------------------------------===//

Supervisor::Supervisor(const Config &config, const StoreServer &store,
                       std::vector<int64_t> ranks, Clock::duration grace,
                       RankControl &control, Say say)
    : config(config), storeUrl(store.url()), storeHost(store.host()),
      storePort(store.port()), serverPid(store.pid()), ranks(std::move(ranks)),
      grace(grace), control(control), say(std::move(say)) {
  for (int64_t r : this->ranks) {
    incarnation[r] = 0;
    groups[-(r + 1)].ranks = {r};
  }
  if (config.joinIncarnation > 0) {
    // This node joins a running job: its ranks that registered in it before
    // (their rank keys outlive them) are a restarted group and start at the
    // fresh incarnation; a rank that never ran keeps 0, its group-mates'.
    std::vector<int64_t> returning;
    for (int64_t r : this->ranks) {
      bool nil = true;
      if (command({"GET", key("rank:" + std::to_string(r))}, &nil) && !nil) {
        incarnation[r] = config.joinIncarnation;
        returning.push_back(r);
      }
    }
    this->say("joining the running job " + inQuotes(config.job) +
              (returning.empty()
                   ? std::string("")
                   : ": rank" + std::string(returning.size() > 1 ? "s " : " ") +
                         joinInts(returning) +
                         " ran in it before, restarted "
                         "at incarnation " +
                         std::to_string(config.joinIncarnation)));
  }
}

Supervisor::~Supervisor() = default;

const std::vector<std::string> &Supervisor::variableNames() {
  static const std::vector<std::string> names = {
      "MESHPLAN_FT_STORE", "MESHPLAN_JOB", "MESHPLAN_FT_MIN_REPLICAS",
      "MESHPLAN_FT_HEARTBEAT_MS", "MESHPLAN_FT_INCARNATION"};
  return names;
}

std::vector<std::string> Supervisor::environment(int64_t rank) const {
  auto it = incarnation.find(rank);
  return {"MESHPLAN_FT_STORE=" + storeUrl, "MESHPLAN_JOB=" + config.job,
          "MESHPLAN_FT_MIN_REPLICAS=" + std::to_string(config.minReplicas),
          "MESHPLAN_FT_HEARTBEAT_MS=" + std::to_string(config.heartbeatMs),
          "MESHPLAN_FT_INCARNATION=" +
              std::to_string(it == incarnation.end() ? 0 : it->second)};
}

std::string Supervisor::key(const std::string &suffix) const {
  return "meshplan:{" + config.job + "}:" + suffix;
}

std::string Supervisor::groupName(int64_t gid) const {
  return gid >= 0 ? "replica " + std::to_string(gid)
                  : "rank " + std::to_string(-gid - 1) +
                        " (not yet registered in a replica group)";
}

bool Supervisor::connected() {
  if (conn.connected())
    return true;
  Clock::time_point now = Clock::now();
  if (now < nextConnect)
    return false;
  nextConnect = now + kReconnectEvery;
  meshplan::Result<void> up =
      conn.connect(storeHost, storePort, std::chrono::milliseconds(500),
                   std::chrono::milliseconds(500));
  if (!up) {
    dropConnection(up.error().message);
    return false;
  }
  if (storeErrorReported) {
    say("membership store " + storeUrl + " answers again");
    storeErrorReported = false;
  }
  return true;
}

void Supervisor::dropConnection(const std::string &why) {
  if (!storeErrorReported)
    say("membership store " + storeUrl + ": " + why +
        " (retrying every second; epoch changes and replica groups are not "
        "seen meanwhile)");
  storeErrorReported = true;
  conn.close();
  nextConnect = Clock::now() + kReconnectEvery;
}

std::optional<std::string>
Supervisor::command(const std::vector<std::string> &args, bool *isNil) {
  if (!connected())
    return std::nullopt;
  meshplan::Result<RedisReply> got = conn.command(args);
  if (!got) {
    dropConnection(got.error().message);
    return std::nullopt;
  }
  const RedisReply &r = got.value();
  std::optional<std::string> out;
  if (isNil)
    *isNil = r.isNil();
  if (r.isString() || r.type == RedisReply::Type::Status || r.isInteger() ||
      r.isNil())
    out = r.text();
  else if (r.isError())
    say("membership store " + storeUrl + ": " + args[0] + ": " + r.str);
  return out;
}

void Supervisor::readConfig() {
  if (nominalGroups)
    return;
  bool nil = false;
  std::optional<std::string> v = command({"GET", key("config")}, &nil);
  if (!v || nil)
    return;
  // "groups=N min_replicas=M"
  std::stringstream ss(*v);
  std::string item;
  while (ss >> item) {
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      continue;
    std::optional<int64_t> n = parseInt64(item.substr(eq + 1));
    if (item.compare(0, eq, "groups") == 0)
      nominalGroups = n;
    else if (item.compare(0, eq, "min_replicas") == 0)
      configMinReplicas = n;
  }
}

void Supervisor::readRankKeys() {
  std::vector<int64_t> unknown;
  for (int64_t r : ranks)
    if (!rankGroup.count(r))
      unknown.push_back(r);
  if (unknown.empty() || !connected())
    return;
  std::vector<std::string> args = {"MGET"};
  for (int64_t r : unknown)
    args.push_back(key("rank:" + std::to_string(r)));
  meshplan::Result<RedisReply> got = conn.command(args);
  if (!got) {
    dropConnection(got.error().message);
    return;
  }
  const RedisReply *reply = &got.value();
  std::vector<std::pair<int64_t, int64_t>> found;
  if (reply->isArray() && reply->elements.size() == unknown.size())
    for (size_t i = 0; i < unknown.size(); ++i) {
      const RedisReply *e = &reply->elements[i];
      if (!e->isString())
        continue;
      std::optional<int64_t> g = parseInt64(e->str);
      if (g && *g >= 0 && *g < kMaxGroups)
        found.push_back({unknown[i], *g});
    }

  for (auto [r, g] : found) {
    rankGroup[r] = g;
    groups.erase(-(r + 1)); // the group of one is over
    auto [slot, fresh] = groups.try_emplace(g);
    Group &group = slot->second;
    if (fresh) // at the incarnation its ranks started at (0 unless rejoining)
      group.incarnation = incarnation[r];
    group.ranks.push_back(r);
    std::sort(group.ranks.begin(), group.ranks.end());
    if (group.phase == Phase::Running) {
      if (incarnation[r] != group.incarnation && control.running(r)) {
        // The group was restarted while this rank was still starting: it
        // belongs to the group's previous incarnation.
        say("rank " + std::to_string(r) + " registered in replica " +
            std::to_string(g) + " at incarnation " +
            std::to_string(incarnation[r]) + ", but the group is at " +
            std::to_string(group.incarnation) + ": restarting the rank alone");
        realign.insert(r);
        control.signalRank(r, SIGTERM);
      }
    } else if (control.running(r)) {
      // The group is being stopped, or given up: this rank goes too.
      control.signalRank(r, SIGTERM);
      if (group.phase == Phase::Waiting) {
        group.phase = Phase::Stopping;
        group.killed = false;
        group.killAt = Clock::now() + grace;
      }
    }
  }
}

std::string Supervisor::elsewhere(int64_t gid) {
  // Every node runs as many ranks as this one (-n), node k the ranks
  // k * n .. k * n + n - 1; the other nodes' ranks' keys outlive them.
  auto nprocs = static_cast<int64_t>(ranks.size());
  if (config.nnodes <= 1 || nprocs == 0 || !connected())
    return "";
  std::vector<int64_t> others;
  for (int64_t r = 0; r < config.nnodes * nprocs; ++r)
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end())
      others.push_back(r);
  std::vector<std::string> args = {"MGET"};
  for (int64_t r : others)
    args.push_back(key("rank:" + std::to_string(r)));
  meshplan::Result<RedisReply> got = conn.command(args);
  if (!got) {
    dropConnection(got.error().message);
    return "";
  }
  const RedisReply *reply = &got.value();
  std::map<int64_t, std::vector<int64_t>> byNode;
  if (reply->isArray() && reply->elements.size() == others.size())
    for (size_t i = 0; i < others.size(); ++i) {
      const RedisReply *e = &reply->elements[i];
      if (e->isString() && parseInt64(e->str) == gid)
        byNode[others[i] / nprocs].push_back(others[i]);
    }
  std::string out;
  for (auto &[node, rs] : byNode)
    out += (out.empty() ? "" : " and ") +
           std::string(rs.size() > 1 ? "ranks " : "rank ") + joinInts(rs) +
           " on node " + std::to_string(node);
  return out;
}

void Supervisor::printEpoch(int64_t epoch, const std::vector<int> &members) {
  std::vector<int64_t> joined, lost, live(members.begin(), members.end());
  for (int g : members)
    if (!std::binary_search(lastMembers.begin(), lastMembers.end(), g))
      joined.push_back(g);
  for (int g : lastMembers)
    if (!std::binary_search(members.begin(), members.end(), g))
      lost.push_back(g);
  std::string total = nominalGroups ? std::to_string(*nominalGroups) : "?";
  std::string tail =
      "; " + std::to_string(members.size()) + " of " + total + " live";
  std::string text = "epoch " + std::to_string(epoch) + ": ";
  if (lastMembers.empty() || lastEpoch == 0) {
    text += replicas(live) + " live";
  } else {
    std::vector<std::string> parts;
    if (!joined.empty())
      parts.push_back(replicas(joined) + " joined");
    if (!lost.empty()) {
      auto reason = [&](int64_t g) {
        auto it = groups.find(g);
        if (it != groups.end() && !it->second.lastFailure.empty())
          return it->second.lastFailure;
        std::string where = elsewhere(g);
        return where.empty() ? std::string("heartbeat expired")
                             : "heartbeat of " + where + " expired";
      };
      std::string why;
      if (lost.size() == 1) {
        why = reason(lost[0]);
      } else {
        for (size_t i = 0; i < lost.size(); ++i)
          why += (i ? "; replica " : "replica ") + std::to_string(lost[i]) +
                 ": " + reason(lost[i]);
      }
      parts.push_back(replicas(lost) + " lost (" + why + ")");
    }
    if (parts.empty())
      parts.push_back("same " + replicas(live) + " live");
    for (size_t i = 0; i < parts.size(); ++i)
      text += (i ? ", " : "") + parts[i];
  }
  say(text + tail);
  for (int64_t g : joined) {
    auto it = groups.find(g);
    if (it != groups.end())
      it->second.lastFailure.clear();
  }
  lastEpoch = epoch;
  lastMembers = members;
}

void Supervisor::readEpochs() {
  bool nil = false;
  std::optional<std::string> v = command({"GET", key("epoch")}, &nil);
  if (!v)
    return;
  std::optional<int64_t> epoch = nil ? 0 : parseInt64(*v);
  if (!epoch || *epoch <= lastEpoch)
    return;
  readConfig();
  // Every epoch in between, so that each change is printed once, in order.
  int64_t from = std::max(lastEpoch + 1, *epoch - 1000);
  for (int64_t e = from; e <= *epoch; ++e) {
    std::optional<std::string> m =
        command({"GET", key("quorum:" + std::to_string(e))}, &nil);
    if (!m)
      return; // the store went away: try again on the next poll
    std::optional<std::vector<int>> members = parseMembers(nil ? "" : *m);
    if (!members) {
      say("membership store " + storeUrl + ": the quorum of epoch " +
          std::to_string(e) + " is malformed: " + inQuotes(*m));
      members = std::vector<int>{};
    }
    printEpoch(e, *members);
  }
}

void Supervisor::pollStore() {
  Clock::time_point now = Clock::now();
  if (now < nextPoll)
    return;
  nextPoll = now + kPollEvery;
  readConfig();
  readRankKeys();
  readEpochs();
}

int64_t Supervisor::groupOf(int64_t rank) const {
  auto it = rankGroup.find(rank);
  return it != rankGroup.end() ? it->second : -(rank + 1);
}

void Supervisor::onRankExit(int64_t rank, int status) {
  lastStatus[rank] = status;
  if (control.stopping() || gaveUpJob)
    return; // the Job reports it
  // A rank that registered just before it died belongs to its group.
  readRankKeys();
  int64_t gid = groupOf(rank);
  Group &group = groups[gid];
  std::string r = "rank " + std::to_string(rank);

  if (realign.erase(rank)) {
    say(r + " " + exitText(status, true) + " (stopped by the launcher)");
    if (group.phase == Phase::Running) {
      incarnation[rank] = group.incarnation;
      if (control.restartRank(rank))
        say(r + " restarted in replica " + std::to_string(gid) +
            " (incarnation " + std::to_string(group.incarnation) + ")");
    }
    return;
  }
  if (group.phase != Phase::Running) {
    if (!exitedOk(status))
      say(r + " " + exitText(status, true) + " (stopped by the launcher)");
    return;
  }
  if (exitedOk(status)) {
    noteCompleted(gid, group);
    return;
  }
  failGroup(gid, rank, status);
}

void Supervisor::noteCompleted(int64_t gid, Group &group) {
  if (completedBy || gid < 0 || group.phase != Phase::Running)
    return;
  for (int64_t r : group.ranks) {
    auto s = lastStatus.find(r);
    if (control.running(r) || s == lastStatus.end() || !exitedOk(s->second))
      return;
  }
  // Every rank of the group completed the job: a group still rejoining
  // can never catch up. The ranks read this key while they wait for a
  // quorum, and end; no group is restarted from now on.
  completedBy = gid;
  command({"SET", key("finished"), "replica " + std::to_string(gid)});
}

void Supervisor::failGroup(int64_t gid, int64_t rank, int status) {
  Group &group = groups[gid];
  std::string r = "rank " + std::to_string(rank);
  group.lastFailure = r + " " + exitText(status, false);
  say(r + " " + exitText(status, true));

  if (gid < 0) {
    // Not registered yet: nothing of it is in the store, and its group's
    // other ranks (unknown) may be waiting for it, so it is started again
    // alone with the same incarnation.
    if (group.restarts >= config.maxRestarts) {
      say(r +
          " failed before it registered in a replica group and has "
          "used its " +
          std::to_string(config.maxRestarts) + " restart" +
          (config.maxRestarts == 1 ? "" : "s") + "; stopping the job");
      gaveUpJob = true;
      control.stopJob(1);
      return;
    }
    ++group.restarts;
    say(r +
        " had not registered in a replica group: restarting it alone "
        "(restart " +
        std::to_string(group.restarts) + " of " +
        std::to_string(config.maxRestarts) + ")");
    control.restartRank(rank);
    return;
  }

  std::vector<int64_t> others;
  for (int64_t o : group.ranks)
    if (o != rank && control.running(o))
      others.push_back(o);
  if (completedBy) {
    say("replica " + std::to_string(gid) + " failed after replica " +
        std::to_string(*completedBy) + " completed the job: " +
        (others.empty()
             ? ""
             : "stopping its other ranks (" + joinInts(others) + "), ") +
        "not restarting it");
    group.phase = Phase::Finished;
    for (int64_t o : others)
      control.signalRank(o, SIGTERM);
    group.killed = false;
    group.killAt = Clock::now() + grace;
    return;
  }
  bool giveUp = group.restarts >= config.maxRestarts;
  std::string stopping =
      others.empty() ? ""
                     : "stopping its other ranks (" + joinInts(others) + "), ";
  if (giveUp) {
    say("replica " + std::to_string(gid) + " failed and has used its " +
        std::to_string(config.maxRestarts) + " restart" +
        (config.maxRestarts == 1 ? "" : "s") + ": " + stopping +
        "giving it up");
    group.phase = Phase::GivenUp;
  } else {
    say("replica " + std::to_string(gid) + " failed: " + stopping +
        "restarting it (restart " + std::to_string(group.restarts + 1) +
        " of " + std::to_string(config.maxRestarts) + ")");
    group.phase = Phase::Stopping;
  }
  for (int64_t o : others)
    control.signalRank(o, SIGTERM);
  group.killed = false;
  group.killAt = Clock::now() + grace;
  if (giveUp)
    checkQuorum();
  advance(gid, group);
}

void Supervisor::checkQuorum() {
  readConfig();
  int64_t n = nominalGroups.value_or(0);
  if (n <= 0)
    return; // no rank has connected yet: nothing to count
  int64_t m = configMinReplicas.value_or(config.minReplicas);
  std::vector<int64_t> gone;
  for (auto &[gid, g] : groups)
    if (gid >= 0 && g.phase == Phase::GivenUp)
      gone.push_back(gid);
  int64_t left = n - static_cast<int64_t>(gone.size());
  if (left >= m && 2 * left > n)
    return;
  std::string why = std::to_string(left) + " of " + std::to_string(n) +
                    " replica groups remain (" + replicas(gone) +
                    " given up), ";
  if (left < m)
    why += "min_replicas " + std::to_string(m);
  else
    why += "a strict majority of " + std::to_string(n) + " needs " +
           std::to_string(n / 2 + 1);
  say("quorum cannot be met: " + why + "; stopping the job");
  // The job is over for every node: a launcher started into it later (a
  // reused --job) is refused with the reason instead of joining it.
  command({"SET", key("stopped"), "quorum cannot be met: " + why});
  gaveUpJob = true;
  control.stopJob(1);
}

bool Supervisor::runningCanFormQuorum() {
  readConfig();
  int64_t n = nominalGroups.value_or(0);
  if (n <= 0)
    return true;
  int64_t m = configMinReplicas.value_or(config.minReplicas);
  int64_t running = 0;
  for (auto &[gid, g] : groups)
    running += gid >= 0 && g.phase == Phase::Running;
  return running >= m && 2 * running > n;
}

void Supervisor::advance(int64_t gid, Group &group) {
  if (group.phase != Phase::Stopping && group.phase != Phase::GivenUp &&
      group.phase != Phase::Finished)
    return;
  if (gaveUpJob || control.stopping())
    return;
  bool anyRunning = std::any_of(group.ranks.begin(), group.ranks.end(),
                                [&](int64_t r) { return control.running(r); });
  Clock::time_point now = Clock::now();
  if (anyRunning) {
    if (!group.killed && now >= group.killAt) {
      for (int64_t r : group.ranks)
        if (control.running(r))
          control.signalRank(r, SIGKILL);
      group.killed = true;
    }
    return;
  }
  if (group.phase == Phase::GivenUp || group.phase == Phase::Finished) {
    // Every rank of it is gone: the survivors need not wait for the
    // heartbeat to expire.
    if (!group.heartbeatDeleted)
      command({"DEL", key("hb:" + std::to_string(gid))});
    group.heartbeatDeleted = true;
    return;
  }
  // Stopping -> Waiting: no rank of the group is left, so no one refreshes
  // its heartbeat; deleting it lets the survivors see the group dead now,
  // not one expiry later, and the restarted ranks cannot hide the loss.
  command({"DEL", key("hb:" + std::to_string(gid))});
  group.phase = Phase::Waiting;
  group.restartBy =
      now + 2 * std::chrono::milliseconds(config.heartbeatMs) + kPollEvery;
}

void Supervisor::restart(int64_t gid, Group &group) {
  ++group.restarts;
  ++group.incarnation;
  group.phase = Phase::Running;
  for (int64_t r : group.ranks)
    incarnation[r] = group.incarnation;
  std::vector<int64_t> started;
  for (int64_t r : group.ranks) {
    if (!control.restartRank(r))
      return; // the Job has reported it and stops everything
    started.push_back(r);
  }
  say("replica " + std::to_string(gid) + " restarted (incarnation " +
      std::to_string(group.incarnation) + "): rank" +
      (started.size() == 1 ? " " : "s ") + joinInts(started));
}

void Supervisor::tick() {
  if (control.stopping() || gaveUpJob)
    return;
  pollStore();
  for (auto &[gid, group] : groups) {
    if (control.stopping() || gaveUpJob)
      return;
    advance(gid, group);
    if (group.phase != Phase::Waiting)
      continue;
    if (completedBy) {
      say("replica " + std::to_string(gid) + " is not restarted: replica " +
          std::to_string(*completedBy) + " completed the job");
      group.phase = Phase::Finished;
      continue;
    }
    // Restart once the survivors have installed an epoch without the group
    // (or no quorum has formed yet, or two expiries have passed: the
    // survivors may be gone or not proposing), so that the loss and the
    // rejoin are two epochs and no one mistakes the new ranks for the old.
    bool out = lastEpoch == 0 ||
               !std::binary_search(lastMembers.begin(), lastMembers.end(),
                                   static_cast<int>(gid));
    // Nor need it wait when the groups still running cannot install an
    // epoch without it (two groups of three lost at once): the restarted
    // group carries its new incarnation into the store, so the survivors
    // never take it for its predecessor either way.
    if (out || !runningCanFormQuorum() || Clock::now() >= group.restartBy)
      restart(gid, group);
  }
}

Clock::duration Supervisor::untilNextTick() const {
  Clock::time_point now = Clock::now();
  Clock::duration wait = std::max(Clock::duration(0), nextPoll - now);
  for (const auto &[gid, group] : groups)
    if ((group.phase == Phase::Stopping || group.phase == Phase::GivenUp ||
         group.phase == Phase::Finished) &&
        !group.killed && group.killAt > now)
      wait = std::min(wait, group.killAt - now);
  return std::min<Clock::duration>(wait, kPollEvery);
}

bool Supervisor::pending() const {
  if (control.stopping() || gaveUpJob)
    return false;
  return std::any_of(groups.begin(), groups.end(), [](const auto &g) {
    return g.second.phase == Phase::Stopping ||
           g.second.phase == Phase::Waiting;
  });
}

bool Supervisor::onOtherChild(pid_t pid, int status) {
  if (pid != serverPid || pid <= 0)
    return false;
  serverPid = -1;
  if (!control.stopping() && !gaveUpJob) {
    say("the private membership store (redis-server, pid " +
        std::to_string(pid) + ") " + exitText(status, true) +
        ": the replica groups have lost their membership; stopping the job");
    gaveUpJob = true;
    control.stopJob(1);
  }
  return true;
}

int Supervisor::finalExitCode() const {
  for (int64_t r : ranks) {
    auto it = groups.find(groupOf(r));
    if (it != groups.end() && (it->second.phase == Phase::GivenUp ||
                               it->second.phase == Phase::Finished))
      continue;
    auto s = lastStatus.find(r);
    if (s != lastStatus.end() && !exitedOk(s->second))
      return 1;
  }
  return 0;
}
