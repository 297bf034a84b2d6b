//===- bench-fault-tolerance.cpp - The figures of fault-tolerant replicas -===//
//
// Issue 15's three figures, in one run, on real forked ranks, a private
// redis-server (Debian's /usr/bin/redis-server on a free loopback port, --save
// '' --appendonly no, stopped by its pid) and a Gloo FileStore per job:
//
// 1. Per-step cost of fault tolerance. The same hand-built HSDP plan (mesh
//    rep x shard, rep managed; 4 units of 256 x 256 float32: all_gather over
//    shard, forward, backward, reduce_scatter over shard, all_reduce over the
//    fault_tolerant rep communicator, AdamW) run by two sessions in the same
//    processes, one with SessionOptions::faultTolerance and one without, in
//    alternating blocks of 30 steps. Every compute callback does a fixed
//    small amount of work. Three layouts: 2 groups x 1 rank (one process per
//    core of a 2-core machine), 3 x 1 (the smallest layout that survives a
//    lost group; its rep all_reduce runs the same algorithm with and without
//    fault tolerance, where a 2-member one does not) and 3 x 2 (the issue's
//    test layout, 6 processes: oversubscribed 3x on 2 cores, so waiting for
//    the slowest rank costs more). Rank 0 prints the median step of each and
//    the difference, and breaks it down: the commit window (from the end of a
//    probe callback that runs after the last all_reduce to the start of one
//    that runs after the last optimizer update: with fault tolerance it holds
//    voteStep, awaitCommit's stepTally polling, and the second pass's start)
//    against the same window without; the vote alone (every rank leaves a
//    barrier, votes and polls with awaitCommit's backoff, and with the
//    backoff capped at 100 and 50 us); the store's round trips; the medians of
//    the StepProfile's parts; and minor page faults per step.
// 2. Time from a kill to the survivors' next committed step. 3 groups x 2
//    ranks step continuously; the parent kills both ranks of group 1 with
//    SIGKILL and takes the time just before; each survivor records when its
//    first step of a later epoch returned. At the default heartbeat expiry
//    (2 s) and at 500 ms; "bare" (nobody deletes the dead group's heartbeat
//    key: it expires) and "key deleted" (the parent deletes it right after
//    the kill, as `meshplan run --fault-tolerant` does when it sees the
//    group's processes exit). Target: <= expiry + 1 s.
// 3. Healing throughput of 1 GiB. A plan whose persistent state is 1 GiB per
//    rank (4 param_shard + 4 optimizer_state buffers of 128 MiB, whole on
//    every rank; 3 groups x 1 rank). A joining group's first step() heals it
//    from one source (groups 0 and 2 train; group 2 is killed, its key
//    deleted, and group 1 joins: sources {0}) and from two (groups 0 and 1
//    train, group 2 joins: sources {0, 1}, striped). The heal time is from
//    the joiner's step() entry to its first compute callback (which runs
//    right after the heal: everything between is the heal, from proposing
//    the epoch and the heal group's rendezvous to the in-place copy), against
//    a plain loopback TCP transfer of the same 1 GiB (two processes, one
//    socket, send/recv) and, for the striped heal, two senders of 512 MiB
//    each into one receiver, alternately in the same run. Target: heal / raw
//    over one socket >= 0.5 (the "a raw loopback TCP transfer"); the
//    striped heal against the two raw senders is printed, not judged. The
//    joiner's state is checked against the sources' afterwards. Memory: at most
//    about 5 GiB at a time.
//
// Medians of --reps repetitions (default 3; figure 1: of the steps of
// --blocks blocks of 30). Exit 0 when every figure meets its target (figure
// 1: the layouts of one rank per group; 3 x 2 is printed, not judged), 1
// when one does not (or an error), 77 without redis-server.
//
//   build/bin/bench-fault-tolerance [--reps N] [--blocks N] [--only 1|2|3]
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/Mesh.h"
#include "meshplan/Runtime/Membership.h"
#include "meshplan/Runtime/Session.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;
namespace pl = meshplan::plan;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kMaxRanks = 8;
constexpr int kMaxSamples = 1 << 14;
/// The vote alone is timed with these backoff caps (awaitCommit's first).
constexpr int kCaps = 3;
constexpr int kCapUs[kCaps] = {500, 100, 50};
constexpr int kParts = 5;
const char *kPartNames[kParts] = {"outside the executor's clock", "callbacks",
                                  "kernels", "collectives",
                                  "executor overhead (incl. the vote)"};

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

/// This process's minor page faults so far.
int64_t minorFaults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

std::string formatted(const char *format, ...)
    __attribute__((format(printf, 1, 2)));
std::string formatted(const char *format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  return buf;
}

double median(std::vector<double> v) {
  if (v.empty())
    return -1;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

//===----------------------------------------------------------------------===//
// Shared memory between the parent and the forked ranks
//===----------------------------------------------------------------------===//

struct Shared {
  std::atomic<int64_t> steps[kMaxRanks];
  std::atomic<int64_t> stopStep;
  std::atomic<int64_t> killNs; ///< figure 2: the parent's time of the kill
  // Figure 1 (rank 0 writes): per-step seconds, plain then fault-tolerant.
  int64_t samples;
  double stepPlain[kMaxSamples], stepFt[kMaxSamples];
  double windowPlain[kMaxSamples], windowFt[kMaxSamples];
  double rttVote, rttTally;
  int64_t faults[2]; ///< minor page faults in the timed steps, plain and ft
  /// Per step, plain and ft: step() outside the executor's clock, then the
  /// StepProfile's callbacks, kernels, collectives and overhead.
  double parts[2][5][kMaxSamples];
  /// The vote after a barrier, and tallies per vote, by backoff cap.
  double voteAlone[3], tallies[3];
  // Figure 2 (each survivor writes).
  double recovery[kMaxRanks];
  int64_t discarded[kMaxRanks];
  int64_t epochAfter[kMaxRanks];
  // Figure 3 (the joiner writes).
  double heal, healStep;
  int healOk;
  int64_t healEpoch;
};
Shared *shared = nullptr;

//===----------------------------------------------------------------------===//
// redis-server
//===----------------------------------------------------------------------===//

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Whether something answers "+PONG" on the port.
bool pings(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0) {
    const char ping[] = "PING\r\n";
    char buf[16] = {};
    if (::write(fd, ping, sizeof(ping) - 1) == ssize_t(sizeof(ping) - 1) &&
        ::read(fd, buf, sizeof(buf) - 1) > 0)
      ok = std::strncmp(buf, "+PONG", 5) == 0;
  }
  ::close(fd);
  return ok;
}

struct Redis {
  pid_t pid = -1;
  int port = 0;
  bool start(const std::string &dir) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      port = freePort();
      std::vector<std::string> args = {"/usr/bin/redis-server",
                                       "--bind",
                                       "127.0.0.1",
                                       "--port",
                                       std::to_string(port),
                                       "--dir",
                                       dir,
                                       "--daemonize",
                                       "no",
                                       "--save",
                                       "",
                                       "--appendonly",
                                       "no"};
      std::vector<char *> argv;
      for (std::string &a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      std::string log = dir + "/redis.log";
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
        if (pings(port))
          return true;
        if (::waitpid(pid, nullptr, WNOHANG) == pid) {
          pid = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      stop();
    }
    return false;
  }
  void stop() {
    if (pid <= 0)
      return;
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

Redis redis;
std::string baseDir;
int jobCounter = 0;

//===----------------------------------------------------------------------===//
// Plans
//===----------------------------------------------------------------------===//

pl::Communicator commOver(const Mesh &mesh, const std::string &axis,
                          int64_t rank, bool faultTolerant) {
  auto g = pl::deriveGroup(mesh, {axis}, rank);
  if (!g) {
    std::fprintf(stderr, "deriveGroup: %s\n", g.error().message.c_str());
    std::exit(1);
  }
  return {axis,         g->ranks, g->color,
          g->key,       {axis},   "slice(" + axis + ")",
          faultTolerant};
}

pl::Buffer buffer(const std::string &id, pl::BufferKind kind,
                  std::vector<int64_t> global, std::vector<int64_t> local,
                  std::vector<int64_t> offset, const std::string &layout,
                  const std::string &tensor,
                  std::optional<int64_t> tensorId = std::nullopt) {
  return {id,     kind,   pl::DType::Float32, global,      local, offset,
          layout, tensor, tensorId,           std::nullopt};
}

pl::Instruction instr(const std::string &id, const std::string &stream,
                      pl::OpKind op, std::vector<std::string> inputs,
                      std::vector<std::string> outputs,
                      std::vector<std::string> deps) {
  pl::Instruction in;
  in.id = id;
  in.stream = stream;
  in.op = op;
  in.inputs = std::move(inputs);
  in.outputs = std::move(outputs);
  in.deps = std::move(deps);
  in.label = id;
  return in;
}

pl::Instruction computeInstr(const std::string &id, const std::string &phase,
                             const std::string &unit,
                             std::vector<std::string> inputs,
                             std::vector<std::string> outputs,
                             std::vector<std::string> deps) {
  pl::Instruction in = instr(id, "compute", pl::OpKind::Compute,
                             std::move(inputs), std::move(outputs), deps);
  in.phase = phase;
  in.unit = unit;
  return in;
}

pl::Instruction collective(const std::string &id, const std::string &stream,
                           pl::OpKind op, const std::string &comm,
                           int64_t count, const std::string &in,
                           const std::string &out,
                           std::vector<std::string> deps) {
  pl::Instruction i = instr(id, stream, op, {in}, {out}, std::move(deps));
  i.comm = comm;
  i.dtype = pl::DType::Float32;
  i.count = count;
  if (op != pl::OpKind::AllGather)
    i.reduce = ReduceOp::Avg;
  return i;
}

/// prefix + n (appending avoids GCC 12's false -Wrestrict on "u" + string).
std::string named(const char *prefix, int64_t n) {
  std::string s = prefix;
  s += std::to_string(n);
  return s;
}

constexpr int kUnits = 4;
constexpr int64_t kRows = 256, kCols = 256;

/// HSDP over mesh rep(G, managed) x shard(S): per unit, all_gather over
/// shard, forward, backward, reduce_scatter over shard, all_reduce over rep
/// (fault_tolerant), AdamW; plus the two probe callbacks around the commit.
pl::Plan hsdpPlan(int64_t groups, int64_t shards, int64_t rank) {
  pl::Plan p;
  p.mesh.axes = {MeshAxis{"rep", groups, true},
                 MeshAxis{"shard", shards, false}};
  p.rank = rank;
  auto mesh = Mesh::create(p.mesh.axes);
  p.communicators = {commOver(*mesh, "rep", rank, true),
                     commOver(*mesh, "shard", rank, false)};
  int64_t s = rank % shards, rows = kRows / shards, count = rows * kCols;
  std::vector<int64_t> g = {kRows, kCols}, local = {rows, kCols},
                       off = {s * rows, 0};
  std::vector<pl::Instruction> ag, fwd, bwd, rs, opt;
  std::vector<std::string> allReduces;
  for (int u = 0; u < kUnits; ++u) {
    std::string t = named("u", u);
    p.buffers.push_back(buffer(t, pl::BufferKind::ParamShard, g, local, off,
                               "[{shard}, {}]", t, u));
    p.buffers.push_back(buffer(t + ".gathered", pl::BufferKind::Gathered, g, g,
                               {0, 0}, "[{}, {}]", t));
    p.buffers.push_back(buffer(t + ".grad", pl::BufferKind::Gradient, g, g,
                               {0, 0}, "[{}, {}] partial(avg)={rep,shard}", t));
    p.buffers.push_back(buffer(t + ".reduced", pl::BufferKind::Gradient, g,
                               local, off, "[{shard}, {}] partial(avg)={rep}",
                               t));
    p.buffers.push_back(buffer(t + ".allreduced", pl::BufferKind::Gradient, g,
                               local, off, "[{shard}, {}]", t));
    for (const char *st : {".exp_avg", ".exp_avg_sq"})
      p.buffers.push_back(buffer(t + st, pl::BufferKind::OptimizerState, g,
                                 local, off, "[{shard}, {}]", t));
    ag.push_back(collective("ag." + t, "comm.ag", pl::OpKind::AllGather,
                            "shard", count, t, t + ".gathered", {}));
    fwd.push_back(computeInstr("fwd." + t, "forward", t, {t + ".gathered"}, {},
                               {"ag." + t}));
  }
  for (int u = kUnits - 1; u >= 0; --u) {
    std::string t = named("u", u);
    bwd.push_back(computeInstr("bwd." + t, "backward", t, {t + ".gathered"},
                               {t + ".grad"}, {"ag." + t}));
    bwd.push_back(instr("free." + t, "compute", pl::OpKind::Free,
                        {t + ".gathered"}, {}, {}));
    rs.push_back(collective("rs." + t, "comm.rs", pl::OpKind::ReduceScatter,
                            "shard", count, t + ".grad", t + ".reduced",
                            {"bwd." + t}));
    rs.push_back(collective("ar." + t, "comm.rs", pl::OpKind::AllReduce, "rep",
                            count, t + ".reduced", t + ".allreduced",
                            {"rs." + t}));
    allReduces.push_back("ar." + t);
    opt.push_back(
        instr("opt." + t, "compute", pl::OpKind::OptimizerUpdate,
              {t, t + ".allreduced", t + ".exp_avg", t + ".exp_avg_sq"},
              {t, t + ".exp_avg", t + ".exp_avg_sq"}, {"ar." + t}));
  }
  p.streams = {"comm.ag", "compute", "comm.rs"};
  for (auto *part : {&ag, &fwd, &bwd, &rs})
    p.program.insert(p.program.end(), part->begin(), part->end());
  p.program.push_back(computeInstr("probe.before", "forward", "probe.before",
                                   {}, {}, allReduces));
  p.program.insert(p.program.end(), opt.begin(), opt.end());
  p.program.push_back(
      computeInstr("probe.after", "forward", "probe.after", {}, {}, {}));
  p.optimizer = pl::OptimizerConfig{};
  return p;
}

constexpr int kHealTensors = 4;
constexpr int64_t kHealElems = int64_t(32) << 20; // 128 MiB of float32
constexpr int64_t kHealBytes = int64_t(2) * kHealTensors * kHealElems * 4;

/// 3 groups x 1 rank, 1 GiB of persistent state per rank (4 parameters and
/// 4 optimizer states of 128 MiB, whole on every rank), and one small
/// all_reduce over rep per step after a probe callback.
pl::Plan healPlan(int64_t rank) {
  pl::Plan p;
  p.mesh.axes = {MeshAxis{"rep", 3, true}};
  p.rank = rank;
  auto mesh = Mesh::create(p.mesh.axes);
  p.communicators = {commOver(*mesh, "rep", rank, true)};
  std::vector<int64_t> g = {kHealElems};
  for (int t = 0; t < kHealTensors; ++t) {
    std::string id = named("w", t);
    p.buffers.push_back(
        buffer(id, pl::BufferKind::ParamShard, g, g, {0}, "[{}]", id, t));
    p.buffers.push_back(buffer(id + ".state", pl::BufferKind::OptimizerState, g,
                               g, {0}, "[{}]", id));
  }
  std::vector<int64_t> small = {1024};
  p.buffers.push_back(buffer("g", pl::BufferKind::Gradient, small, small, {0},
                             "[{}] partial(avg)={rep}", "g"));
  p.buffers.push_back(buffer("g.avg", pl::BufferKind::Gradient, small, small,
                             {0}, "[{}]", "g"));
  p.streams = {"compute", "comm"};
  p.program.push_back(
      computeInstr("probe", "backward", "probe", {}, {"g"}, {}));
  p.program.push_back(collective("ar", "comm", pl::OpKind::AllReduce, "rep",
                                 1024, "g", "g.avg", {"probe"}));
  return p;
}

//===----------------------------------------------------------------------===//
// Ranks
//===----------------------------------------------------------------------===//

struct Job {
  std::string name, storeDir;
};

Job newJob(const std::string &what) {
  Job j;
  j.name = "ftb-" + std::to_string(::getpid()) + "-" + what + "-" +
           std::to_string(jobCounter++);
  j.storeDir = baseDir + "/" + j.name;
  fs::create_directories(j.storeDir);
  return j;
}

SessionOptions optionsFor(const Job &job, int64_t rank, int64_t world,
                          std::optional<std::chrono::milliseconds> expiry) {
  SessionOptions o;
  o.rank = rank;
  o.worldSize = world;
  o.store = {StoreAddress::Kind::File, job.storeDir, "", 0};
  o.timeout = std::chrono::milliseconds(60000);
  o.job = job.name;
  if (expiry) {
    FaultToleranceOptions f;
    f.store = {StoreAddress::Kind::Redis, "", "127.0.0.1", redis.port};
    f.minReplicas = 1;
    f.heartbeatExpiry = *expiry;
    o.faultTolerance = f;
  }
  return o;
}

[[noreturn]] void die(int rank, const std::string &what, const Error &e) {
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what.c_str(),
               e.message.c_str());
  std::fflush(nullptr);
  ::_exit(1);
}

/// A fixed small amount of work per callback: forward reads the gathered
/// weights and spins about 100k multiply-adds; backward adds a function of
/// them into the gradients.
volatile float sink = 0;
int64_t probeBeforeEnd = 0, probeAfterStart = 0;

void installCallbacks(Session &s) {
  s.onCompute([](ComputeCall &c) -> Result<void> {
    if (c.unit == "probe.before") {
      probeBeforeEnd = nowNs();
      return {};
    }
    if (c.unit == "probe.after") {
      probeAfterStart = nowNs();
      return {};
    }
    if (c.phase == "forward") {
      float acc = 0;
      for (TensorView &p : c.params)
        for (float x : p.as<float>())
          acc += x;
      for (int i = 0; i < 100000; ++i)
        acc = acc * 0.999f + 1e-3f;
      sink = acc;
    } else {
      for (size_t k = 0; k < c.grads.size(); ++k) {
        std::span<float> g = c.grads[k].as<float>();
        std::span<float> w = c.params[k].as<float>();
        for (size_t i = 0; i < g.size(); ++i)
          g[i] += 1e-3f * w[i] + 1e-4f;
      }
    }
    return {};
  });
}

Result<void> initHsdp(Session &s) {
  return s.initParameters([](TensorView &v) -> Result<void> {
    std::span<float> f = v.as<float>();
    for (size_t i = 0; i < f.size(); ++i)
      f[i] = float((i * 7 + size_t(*v.buffer->tensorId) * 13) % 101) * 1e-2f;
    return {};
  });
}

/// Forks fn in a child; returns its pid.
pid_t spawn(const std::function<int()> &fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = fn();
    } catch (const std::exception &e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  return pid;
}

/// Waits for every pid; true when each exited 0 (or is in `killed`).
bool reap(const std::vector<pid_t> &pids, const std::vector<pid_t> &killed) {
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    bool wasKilled =
        std::find(killed.begin(), killed.end(), pid) != killed.end();
    if (!wasKilled && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      std::fprintf(stderr, "a rank (pid %d) failed: %s %d\n", int(pid),
                   WIFEXITED(status) ? "status" : "signal",
                   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      ok = false;
    }
  }
  return ok;
}

//===----------------------------------------------------------------------===//
// Figure 1: per-step cost
//===----------------------------------------------------------------------===//

int stepCostRank(int64_t groups, int64_t shards, int64_t rank, const Job &ft,
                 const Job &plain, int blocks, int perBlock) {
  int64_t world = groups * shards;
  auto sFt = Session::open(
      hsdpPlan(groups, shards, rank),
      optionsFor(ft, rank, world, std::chrono::milliseconds(2000)));
  if (!sFt)
    die(int(rank), "open (fault-tolerant)", sFt.error());
  auto sPlain = Session::open(hsdpPlan(groups, shards, rank),
                              optionsFor(plain, rank, world, std::nullopt));
  if (!sPlain)
    die(int(rank), "open", sPlain.error());
  Session *sessions[2] = {sPlain->get(), sFt->get()};
  for (Session *s : sessions) {
    installCallbacks(*s);
    if (auto ok = initHsdp(*s); !ok)
      die(int(rank), "init", ok.error());
    for (int i = 0; i < 10; ++i) // warm-up: connections, first quorum
      if (auto ok = s->step(); !ok)
        die(int(rank), "warm-up step", ok.error());
  }
  int64_t n = 0;
  if (rank == 0)
    shared->faults[0] = shared->faults[1] = 0;
  for (int b = 0; b < blocks; ++b)
    for (int which = 0; which < 2; ++which) {
      Session &s = *sessions[which];
      for (int i = 0; i < perBlock; ++i) {
        int64_t a = nowNs(), faults = minorFaults();
        if (auto ok = s.step(); !ok)
          die(int(rank), "step", ok.error());
        double wall = double(nowNs() - a) * 1e-9;
        if (rank == 0)
          shared->faults[which] += minorFaults() - faults;
        double window = double(probeAfterStart - probeBeforeEnd) * 1e-9;
        int64_t k = b * perBlock + i;
        if (rank == 0 && k < kMaxSamples) {
          const StepProfile &pr = s.lastStepProfile();
          double parts[kParts] = {wall - pr.wall, pr.callbacks, pr.kernels,
                                  pr.collectives, pr.overhead};
          for (int q = 0; q < kParts; ++q)
            shared->parts[which][q][k] = parts[q];
          (which ? shared->stepFt : shared->stepPlain)[k] = wall;
          (which ? shared->windowFt : shared->windowPlain)[k] = window;
          n = std::max(n, k + 1);
        }
      }
    }
  {
    // The vote alone, as faultTolerantStep runs it after the step's last
    // all_reduce: every rank leaves a barrier on the plain session's rep x
    // shard communicators (so the ranks are as synchronized as after the
    // all_reduce), votes, and polls the tally with awaitCommit's backoff
    // until every rank's vote is in. On a job of its own, at epoch 0.
    MembershipOptions mo;
    mo.port = redis.port;
    mo.job = ft.name + "-vote";
    mo.replicaGroup = int(rank / shards);
    mo.numGroups = int(groups);
    auto m = Membership::connect(mo);
    if (!m)
      die(int(rank), "membership", m.error());
    auto rep = sessions[0]->planCommunicator("rep");
    auto shard = sessions[0]->planCommunicator("shard");
    if (!rep || !shard)
      die(int(rank), "communicator", (!rep ? rep : shard).error());
    // Interleaved: awaitCommit's backoff (20 us doubling to 500 us), and
    // the same capped at 100 us and at 50 us.
    std::vector<double> vote[kCaps], polls[kCaps];
    for (int i = 1; i <= 300 * kCaps; ++i) {
      int which = i % kCaps;
      if (auto ok = (*shard)->barrier(); !ok)
        die(int(rank), "barrier", ok.error());
      if (auto ok = (*rep)->barrier(); !ok)
        die(int(rank), "barrier", ok.error());
      int64_t a = nowNs();
      if (auto v = (*m)->voteStep(0, i, rank, true); !v)
        die(int(rank), "vote", v.error());
      auto pause = std::chrono::microseconds(20);
      int count = 0;
      while (true) {
        auto t = (*m)->stepTally(0, i);
        if (!t)
          die(int(rank), "tally", t.error());
        ++count;
        if (t->okVotes >= world)
          break;
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(
            pause * 2, std::chrono::microseconds(kCapUs[which]));
      }
      vote[which].push_back(double(nowNs() - a) * 1e-9);
      polls[which].push_back(count);
    }
    if (rank == 0)
      for (int k = 0; k < kCaps; ++k) {
        shared->voteAlone[k] = median(vote[k]);
        double sum = 0;
        for (double c : polls[k])
          sum += c;
        shared->tallies[k] = sum / double(polls[k].size());
      }
  }
  if (rank == 0) {
    shared->samples = n;
    // The store's round trips alone: a vote and a tally, on a job of its
    // own (epoch 0, nothing else running).
    MembershipOptions mo;
    mo.port = redis.port;
    mo.job = ft.name + "-rtt";
    auto m = Membership::connect(mo);
    if (!m)
      die(0, "membership", m.error());
    std::vector<double> vote, tally;
    for (int i = 1; i <= 300; ++i) {
      int64_t a = nowNs();
      if (auto v = (*m)->voteStep(0, i, 0, true); !v)
        die(0, "vote", v.error());
      int64_t b = nowNs();
      if (auto t = (*m)->stepTally(0, i); !t)
        die(0, "tally", t.error());
      int64_t c = nowNs();
      vote.push_back(double(b - a) * 1e-9);
      tally.push_back(double(c - b) * 1e-9);
    }
    shared->rttVote = median(vote);
    shared->rttTally = median(tally);
  }
  for (Session *s : sessions)
    if (auto ok = s->close(); !ok)
      die(int(rank), "close", ok.error());
  return 0;
}

struct StepCost {
  double plain, ft, windowPlain, windowFt, rttVote, rttTally;
  double faultsPlain, faultsFt; ///< minor page faults per step
  double parts[2][kParts];      ///< medians of Shared::parts
  double voteAlone[kCaps], tallies[kCaps];
};

std::optional<StepCost> measureStepCost(int64_t groups, int64_t shards,
                                        int blocks, int perBlock) {
  Job ft = newJob("cost-ft"), plain = newJob("cost-plain");
  std::vector<pid_t> pids;
  for (int64_t r = 0; r < groups * shards; ++r)
    pids.push_back(spawn([&, r] {
      return stepCostRank(groups, shards, r, ft, plain, blocks, perBlock);
    }));
  if (!reap(pids, {}))
    return std::nullopt;
  int64_t n = shared->samples;
  std::vector<double> p(shared->stepPlain, shared->stepPlain + n),
      f(shared->stepFt, shared->stepFt + n),
      wp(shared->windowPlain, shared->windowPlain + n),
      wf(shared->windowFt, shared->windowFt + n);
  StepCost c{median(p),
             median(f),
             median(wp),
             median(wf),
             shared->rttVote,
             shared->rttTally,
             double(shared->faults[0]) / double(n),
             double(shared->faults[1]) / double(n),
             {},
             {}};
  for (int w = 0; w < 2; ++w)
    for (int q = 0; q < kParts; ++q)
      c.parts[w][q] = median(
          std::vector<double>(shared->parts[w][q], shared->parts[w][q] + n));
  for (int k = 0; k < kCaps; ++k) {
    c.voteAlone[k] = shared->voteAlone[k];
    c.tallies[k] = shared->tallies[k];
  }
  return c;
}

//===----------------------------------------------------------------------===//
// Figure 2: kill to the next committed step
//===----------------------------------------------------------------------===//

constexpr int64_t kKillAtStep = 20, kStopStep = 60;

int killRank(int64_t rank, const Job &job, std::chrono::milliseconds expiry) {
  auto s =
      Session::open(hsdpPlan(3, 2, rank), optionsFor(job, rank, 6, expiry));
  if (!s)
    die(int(rank), "open", s.error());
  installCallbacks(**s);
  if (auto ok = initHsdp(**s); !ok)
    die(int(rank), "init", ok.error());
  std::vector<std::pair<int64_t, int64_t>> returns; // (ns, epoch)
  while ((*s)->stepsDone() < kStopStep) {
    if (auto ok = (*s)->step(); !ok)
      die(int(rank), "step", ok.error());
    returns.push_back({nowNs(), (*s)->faultTolerance()->epoch});
    shared->steps[rank].store((*s)->stepsDone());
  }
  int64_t kill = shared->killNs.load(); // the parent's kill time
  int64_t before = 0;
  double recovery = -1;
  for (auto [ns, epoch] : returns) {
    if (ns < kill) {
      before = epoch;
    } else if (epoch > before) {
      recovery = double(ns - kill) * 1e-9;
      break;
    }
  }
  shared->recovery[rank] = recovery;
  shared->discarded[rank] = (*s)->faultTolerance()->stepsDiscarded;
  shared->epochAfter[rank] = (*s)->faultTolerance()->epoch;
  if (auto ok = (*s)->close(); !ok)
    die(int(rank), "close", ok.error());
  return 0;
}

/// One kill run; the recovery seconds of the slowest survivor, or nullopt.
std::optional<double> measureKill(std::chrono::milliseconds expiry,
                                  bool deleteKey) {
  Job job = newJob("kill");
  for (int r = 0; r < kMaxRanks; ++r) {
    shared->steps[r] = 0;
    shared->recovery[r] = -1;
  }
  shared->killNs = std::numeric_limits<int64_t>::max();
  // The parent's client for group 1, which deletes its heartbeat key as the
  // launcher does (connected before the kill; never heartbeats).
  std::unique_ptr<Membership> leaver;
  std::vector<pid_t> pids;
  for (int64_t r = 0; r < 6; ++r)
    pids.push_back(spawn([&, r] { return killRank(r, job, expiry); }));
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  while (shared->steps[0].load() < kKillAtStep && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  if (deleteKey) {
    MembershipOptions mo;
    mo.port = redis.port;
    mo.job = job.name;
    mo.replicaGroup = 1;
    mo.numGroups = 3;
    mo.minReplicas = 1;
    mo.heartbeatExpiry = expiry;
    auto m = Membership::connect(mo);
    if (!m) {
      std::fprintf(stderr, "membership: %s\n", m.error().message.c_str());
      return std::nullopt;
    }
    leaver = std::move(*m);
  }
  shared->killNs = nowNs();
  ::kill(pids[2], SIGKILL);
  ::kill(pids[3], SIGKILL);
  if (deleteKey) {
    // As the launcher: once the group's processes are gone.
    ::waitpid(pids[2], nullptr, 0);
    ::waitpid(pids[3], nullptr, 0);
    if (auto ok = leaver->leaveGroup(); !ok)
      std::fprintf(stderr, "deleting the key: %s\n",
                   ok.error().message.c_str());
  }
  std::vector<pid_t> survivors = {pids[0], pids[1], pids[4], pids[5]};
  if (!deleteKey)
    reap({pids[2], pids[3]}, {pids[2], pids[3]});
  if (!reap(survivors, {}))
    return std::nullopt;
  double worst = -1;
  for (int r : {0, 1, 4, 5}) {
    if (shared->recovery[r] < 0)
      return std::nullopt;
    worst = std::max(worst, shared->recovery[r]);
  }
  return worst;
}

//===----------------------------------------------------------------------===//
// Figure 3: healing 1 GiB
//===----------------------------------------------------------------------===//

float healValue(int t, int64_t i) { return float((i * 31 + t * 977) % 65521); }

int healRank(int64_t rank, const Job &job, bool joiner) {
  auto s = Session::open(
      healPlan(rank), optionsFor(job, rank, 3, std::chrono::milliseconds(500)));
  if (!s)
    die(int(rank), "open", s.error());
  Session &session = **s;
  int64_t firstCallback = 0;
  session.onCompute([&](ComputeCall &c) -> Result<void> {
    if (!firstCallback)
      firstCallback = nowNs();
    for (TensorView &g : c.grads)
      std::fill(g.as<float>().begin(), g.as<float>().end(), 1.0f);
    return {};
  });
  // Sources hold the pattern (parameters and states); a joiner zeros.
  for (TensorView &v : session.parameters()) {
    int t = int(*v.buffer->tensorId);
    std::span<float> f = v.as<float>();
    for (int64_t i = 0; i < int64_t(f.size()); ++i)
      f[size_t(i)] = joiner ? 0.0f : healValue(t, i);
  }
  int state = 0;
  for (TensorView &v : session.optimizerState()) {
    std::span<float> f = v.as<float>();
    for (int64_t i = 0; i < int64_t(f.size()); ++i)
      f[size_t(i)] = joiner ? 0.0f : healValue(100 + state, i);
    ++state;
  }
  if (joiner) {
    int64_t a = nowNs();
    if (auto ok = session.step(); !ok)
      die(int(rank), "joiner's first step", ok.error());
    int64_t b = nowNs();
    shared->heal = double(firstCallback - a) * 1e-9;
    shared->healStep = double(b - a) * 1e-9;
    shared->healEpoch = session.faultTolerance()->epoch;
    bool ok = session.faultTolerance()->heals == 1;
    for (TensorView &v : session.parameters()) {
      int t = int(*v.buffer->tensorId);
      std::span<float> f = v.as<float>();
      for (int64_t i = 0; i < int64_t(f.size()); i += 4093)
        ok = ok && f[size_t(i)] == healValue(t, i);
    }
    state = 0;
    for (TensorView &v : session.optimizerState()) {
      std::span<float> f = v.as<float>();
      for (int64_t i = 0; i < int64_t(f.size()); i += 4093)
        ok = ok && f[size_t(i)] == healValue(100 + state, i);
      ++state;
    }
    shared->healOk = ok;
    shared->stopStep = session.stepsDone() + 3;
  }
  while (session.stepsDone() < shared->stopStep.load()) {
    if (auto ok = session.step(); !ok)
      die(int(rank), "step", ok.error());
    shared->steps[rank].store(session.stepsDone());
  }
  if (auto ok = session.close(); !ok)
    die(int(rank), "close", ok.error());
  return 0;
}

/// One heal of 1 GiB from `sources` (1 or 2) sources; the heal's seconds.
std::optional<double> measureHeal(int sources) {
  Job job = newJob("heal");
  for (int r = 0; r < kMaxRanks; ++r)
    shared->steps[r] = 0;
  shared->stopStep = std::numeric_limits<int64_t>::max();
  shared->healOk = 0;
  std::vector<pid_t> pids, killed;
  // Two sources: groups 0 and 1 train, 2 joins. One source: groups 0 and 2
  // train, 2 is killed (its key deleted), 1 joins.
  int other = sources == 2 ? 1 : 2, joinerGroup = sources == 2 ? 2 : 1;
  for (int g : {0, other})
    pids.push_back(spawn([&, g] { return healRank(g, job, false); }));
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  while ((shared->steps[0].load() < 3 || shared->steps[other].load() < 3) &&
         Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (sources == 1) {
    MembershipOptions mo;
    mo.port = redis.port;
    mo.job = job.name;
    mo.replicaGroup = 2;
    mo.numGroups = 3;
    mo.minReplicas = 1;
    mo.heartbeatExpiry = std::chrono::milliseconds(500);
    auto m = Membership::connect(mo);
    if (!m)
      return std::nullopt;
    ::kill(pids[1], SIGKILL);
    ::waitpid(pids[1], nullptr, 0);
    killed.push_back(pids[1]);
    (void)(*m)->leaveGroup();
  }
  pids.push_back(spawn([&] { return healRank(joinerGroup, job, true); }));
  bool ok = reap(pids, killed);
  if (!ok || !shared->healOk) {
    if (ok)
      std::fprintf(stderr, "the joiner's state differs from the sources'\n");
    return std::nullopt;
  }
  return shared->heal;
}

/// A plain loopback TCP transfer of 1 GiB into one receiver (this process)
/// from `senders` processes (each its share over its own socket); seconds
/// from the receiver's go to the last byte.
std::optional<double> rawTransfer(int senders, char *recvBuf) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listener, reinterpret_cast<sockaddr *>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(listener, reinterpret_cast<sockaddr *>(&a), &len);
  ::listen(listener, 8);
  int64_t share = kHealBytes / senders;
  std::vector<pid_t> pids;
  for (int k = 0; k < senders; ++k)
    pids.push_back(spawn([&] {
      std::vector<char> buf(size_t(share), 0);
      for (size_t i = 0; i < buf.size(); i += 4096)
        buf[i] = char(i >> 12);
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0)
        return 1;
      char go = 0;
      if (::read(fd, &go, 1) != 1)
        return 1;
      for (int64_t done = 0; done < share;) {
        ssize_t n =
            ::send(fd, buf.data() + done,
                   size_t(std::min<int64_t>(share - done, 64 << 20)), 0);
        if (n <= 0)
          return 1;
        done += n;
      }
      ::close(fd);
      return 0;
    }));
  std::vector<int> fds;
  for (int k = 0; k < senders; ++k)
    fds.push_back(::accept(listener, nullptr, nullptr));
  ::close(listener);
  int64_t start = nowNs();
  for (int fd : fds)
    if (::write(fd, "g", 1) != 1)
      return std::nullopt;
  // One thread per socket, each into its own part of the buffer.
  std::vector<std::thread> threads;
  std::atomic<bool> ok{true};
  for (int k = 0; k < senders; ++k)
    threads.emplace_back([&, k] {
      char *base = recvBuf + k * share;
      for (int64_t done = 0; done < share;) {
        ssize_t n =
            ::recv(fds[size_t(k)], base + done,
                   size_t(std::min<int64_t>(share - done, 64 << 20)), 0);
        if (n <= 0) {
          ok = false;
          return;
        }
        done += n;
      }
    });
  for (std::thread &t : threads)
    t.join();
  double seconds = double(nowNs() - start) * 1e-9;
  for (int fd : fds)
    ::close(fd);
  if (!reap(pids, {}) || !ok)
    return std::nullopt;
  return seconds;
}

} // namespace

int main(int argc, char **argv) {
  int reps = 3, blocks = 10, only = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--blocks" && i + 1 < argc)
      blocks = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc)
      only = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--blocks N] [--only 1|2|3]\n",
                   argv[0]);
      return 2;
    }
  }
  if (::access("/usr/bin/redis-server", X_OK) != 0) {
    std::printf("SKIP: /usr/bin/redis-server is not installed (Debian's "
                "redis-server package)\n");
    return 77;
  }
  void *mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  shared = new (mem) Shared();
  baseDir = (fs::temp_directory_path() /
             ("meshplan-bench-ft-" + std::to_string(::getpid())))
                .string();
  fs::create_directories(baseDir);
  if (!redis.start(baseDir)) {
    std::fprintf(stderr, "redis-server did not start (see %s/redis.log)\n",
                 baseDir.c_str());
    return 1;
  }
  std::vector<std::string> failures;
  bool error = false;

  if (!only || only == 1) {
    constexpr int kPerBlock = 30;
    std::printf("1. Per-step cost of fault tolerance (HSDP plan, %d units of "
                "%lld x %lld float32; medians of %d steps each, %d blocks "
                "alternating)\n",
                kUnits, (long long)kRows, (long long)kCols, blocks * kPerBlock,
                blocks);
    for (auto [g, s] : {std::pair<int64_t, int64_t>{2, 1}, {3, 1}, {3, 2}}) {
      auto c = measureStepCost(g, s, blocks, kPerBlock);
      if (!c) {
        error = true;
        continue;
      }
      double diff = (c->ft - c->plain) * 1e3,
             window = (c->windowFt - c->windowPlain) * 1e3;
      std::printf("   %lld groups x %lld rank%s: step %.3f ms plain, %.3f ms "
                  "fault-tolerant: %+.3f ms per step\n",
                  (long long)g, (long long)s, s == 1 ? "" : "s", c->plain * 1e3,
                  c->ft * 1e3, diff);
      std::printf("     commit window (after the last all_reduce to after "
                  "the updates): %.3f ms plain, %.3f ms fault-tolerant: "
                  "%+.3f ms\n",
                  c->windowPlain * 1e3, c->windowFt * 1e3, window);
      std::printf("       the vote alone (voteStep + stepTally polling, "
                  "after a barrier): %.3f ms, %.1f tallies per vote; round "
                  "trips: voteStep %.3f ms, stepTally %.3f ms\n",
                  c->voteAlone[0] * 1e3, c->tallies[0], c->rttVote * 1e3,
                  c->rttTally * 1e3);
      std::printf("       (the vote alone with the backoff capped at 100 us: "
                  "%.3f ms, %.1f tallies; at 50 us: %.3f ms, %.1f tallies)\n",
                  c->voteAlone[1] * 1e3, c->tallies[1], c->voteAlone[2] * 1e3,
                  c->tallies[2]);
      std::printf("     outside the commit window: %+.3f ms; minor page faults "
                  "per step (rank 0): %.0f plain, %.0f fault-tolerant\n",
                  diff - window, c->faultsPlain, c->faultsFt);
      std::printf("     medians of the step's parts (ms, plain / "
                  "fault-tolerant):");
      for (int q = 0; q < kParts; ++q)
        std::printf("%s %s %.3f / %.3f", q ? ";" : "", kPartNames[q],
                    c->parts[0][q] * 1e3, c->parts[1][q] * 1e3);
      std::printf("\n");
      std::fflush(stdout);
      if (s == 1 && diff >= 1.0)
        failures.push_back(formatted("per-step cost %.3f ms >= 1 ms (%lld "
                                     "groups x 1 rank)",
                                     diff, (long long)g));
    }
  }

  if (!only || only == 2) {
    std::printf("2. Kill (SIGKILL, both ranks of group 1 of 3 x 2) to the "
                "survivors' next committed step (slowest survivor; medians "
                "of %d)\n",
                reps);
    std::printf("   %-10s %-12s %10s %10s %9s\n", "expiry", "key", "median s",
                "max s", "target s");
    for (int expiryMs : {2000, 500})
      for (bool del : {false, true}) {
        std::vector<double> t;
        for (int r = 0; r < reps; ++r)
          if (auto x = measureKill(std::chrono::milliseconds(expiryMs), del))
            t.push_back(*x);
          else
            error = true;
        if (t.empty())
          continue;
        double target = expiryMs / 1000.0 + 1.0, m = median(t);
        std::printf("   %-10s %-12s %10.3f %10.3f %9.3f\n",
                    (std::to_string(expiryMs) + " ms").c_str(),
                    del ? "deleted" : "expires", m,
                    *std::max_element(t.begin(), t.end()), target);
        std::fflush(stdout);
        if (m > target)
          failures.push_back("kill to next step " + std::to_string(m) +
                             " s > " + std::to_string(target) + " s");
      }
  }

  if (!only || only == 3) {
    std::printf("3. Healing 1 GiB (4 params + 4 optimizer states of 128 MiB) "
                "against raw loopback TCP of the same bytes (medians of %d)\n",
                reps);
    // The receiver's buffer, touched once, and kept out of the forked
    // senders (MADV_DONTFORK): a page the parent shares copy-on-write with
    // a child costs a copy on every write, which would slow the raw
    // receiver down (session 9 measured 1.08 GiB/s that way) and flatter
    // the heal.
    char *recvBuf = static_cast<char *>(
        ::mmap(nullptr, size_t(kHealBytes), PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (recvBuf == MAP_FAILED ||
        ::madvise(recvBuf, size_t(kHealBytes), MADV_DONTFORK) != 0) {
      std::perror("mmap / madvise");
      return 1;
    }
    for (size_t i = 0; i < size_t(kHealBytes); i += 4096)
      recvBuf[i] = 1;
    std::vector<double> heal[2], raw[2];
    for (int r = 0; r < reps; ++r)
      for (int k = 0; k < 2; ++k) {
        if (auto x = rawTransfer(k + 1, recvBuf))
          raw[k].push_back(*x);
        else
          error = true;
        if (auto x = measureHeal(k + 1))
          heal[k].push_back(*x);
        else
          error = true;
      }
    // The issue's target compares a heal with "a raw loopback TCP transfer
    // of the same bytes": one socket. The striped heal is also printed
    // against two raw senders (the same shape), which is not judged.
    double gib = double(kHealBytes) / double(1 << 30);
    std::printf("   %-40s %8s %8s %7s %9s\n", "", "s", "GiB/s", "ratio",
                "vs 1 sock");
    double oneSocket =
        raw[0].empty() ? 0.0 : median(raw[0]); // the judged baseline
    for (int k = 0; k < 2; ++k) {
      if (heal[k].empty() || raw[k].empty())
        continue;
      double h = median(heal[k]), w = median(raw[k]);
      std::printf("   %-40s %8.3f %8.3f\n",
                  k ? "raw TCP, 2 senders x 512 MiB" : "raw TCP, 1 socket", w,
                  gib / w);
      std::printf("   %-40s %8.3f %8.3f %7.2f %9.2f\n",
                  k ? "heal from 2 sources (striped)" : "heal from 1 source", h,
                  gib / h, w / h, oneSocket / h);
      std::fflush(stdout);
      if (oneSocket / h < 0.5)
        failures.push_back("heal from " + std::to_string(k + 1) +
                           " source(s) / raw TCP over one socket " +
                           std::to_string(oneSocket / h) + " < 0.5");
    }
  }

  redis.stop();
  std::error_code ec;
  fs::remove_all(baseDir, ec);
  if (error)
    failures.push_back("a run failed (see above)");
  if (failures.empty()) {
    std::printf("PASS: per-step cost < 1 ms, kill to next step <= expiry + "
                "1 s, heal >= 0.5 of raw TCP\n");
    return 0;
  }
  std::printf("FAIL: ");
  for (size_t i = 0; i < failures.size(); ++i)
    std::printf("%s%s", i ? "; " : "", failures[i].c_str());
  std::printf("\n");
  return 1;
}
