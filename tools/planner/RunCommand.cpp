//===- RunCommand.cpp - meshplan run: the launcher
//--------------------------===//
//
// One process, no threads: the ranks' stdout and stderr pipes, and a
// signalfd for SIGCHLD and the signals the launcher forwards, are multiplexed
// with poll(). Each rank runs in a session (and process group) of its own,
// as torchrun's start_new_session does: a Ctrl-C on the terminal reaches the
// launcher only, which forwards it once, and stopping a rank signals its
// whole group, so a shell's `sleep` cannot outlive the job holding a pipe.
//
//===----------------------------------------------------------------------===//

#include "RunCommand.h"

#include "FaultTolerantLaunch.h"
#include "MeshSetup.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <memory>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>
#include <unordered_map>

extern char **environ;

using namespace meshplan::cli;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxProcsPerNode = 4096;
constexpr int64_t kMaxNodes = 65536;
// The runtime accepts MESHPLAN_TIMEOUT up to a day; --grace shares the cap.
constexpr double kMaxSeconds = 86400;
/// A line longer than this is passed on in pieces, each with the prefix, so a
/// rank that never prints a newline cannot grow the launcher's memory.
constexpr size_t kMaxLine = 64 * 1024;
constexpr const char *kUsage =
    "meshplan run -n N [options] -- PROGRAM [ARGS...]";

using Clock = std::chrono::steady_clock;

//===----------------------------------------------------------------------===//
// Flags
//===----------------------------------------------------------------------===//

std::string inQuotes(const std::string &s) { return "\"" + s + "\""; }

int64_t parseInt(const std::string &flag, const std::string &text, int64_t lo,
                 int64_t hi, const std::string &note = "") {
  int64_t value = 0;
  const char *end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < lo ||
      value > hi)
    throw CliError(flag + ": must be an integer from " + std::to_string(lo) +
                   " to " + std::to_string(hi) + note + ", not " +
                   inQuotes(text));
  return value;
}

/// Seconds as plain decimal digits ("30", "0.5"): no sign, exponent, inf or
/// hex, so the value exported to the ranks parses the same everywhere.
double parseSeconds(const std::string &flag, const std::string &text,
                    bool allowZero) {
  bool digit = false, dot = false, ok = !text.empty();
  for (char c : text) {
    if (c >= '0' && c <= '9')
      digit = true;
    else if (c == '.' && !dot)
      dot = true;
    else
      ok = false;
  }
  double value = ok && digit ? std::strtod(text.c_str(), nullptr) : -1;
  if (!ok || !digit || value > kMaxSeconds || value < 0 ||
      (!allowZero && value == 0))
    throw CliError(flag + ": must be a number of seconds " +
                   (allowZero ? ">= 0" : "> 0") + " (at most 86400), not " +
                   inQuotes(text));
  return value;
}

struct Store {
  std::string address; ///< exported as MESHPLAN_STORE
  std::string fileDir; ///< file: store's directory; empty for redis
  bool defaultDir = false;
};

/// Checks the syntax only; the file: directory is created later, once every
/// flag is known to be good.
Store parseStore(const std::optional<std::string> &flag, int64_t nnodes) {
  Store store;
  if (!flag) {
    if (nnodes > 1)
      throw CliError("--store: --nnodes " + std::to_string(nnodes) +
                     " needs a store every node reaches: give --store "
                     "redis://HOST:PORT (the default file: store is local)");
    store.defaultDir = true;
    return store;
  }
  const std::string &text = *flag;
  if (text.rfind("file:", 0) == 0) {
    if (nnodes > 1)
      throw CliError("--store: --nnodes " + std::to_string(nnodes) +
                     " needs a store every node reaches: give --store "
                     "redis://HOST:PORT (a file: store is local)");
    store.fileDir = text.substr(5);
    if (store.fileDir.empty())
      throw CliError("--store: " + inQuotes(text) +
                     " names no directory; "
                     "expected file:DIR");
    return store;
  }
  if (text.rfind("redis://", 0) == 0) {
    std::string rest = text.substr(8);
    size_t colon = rest.rfind(':');
    std::string host =
        colon == std::string::npos ? rest : rest.substr(0, colon);
    bool hostOk = !host.empty();
    if (hostOk && host.front() == '[') // [IPv6]
      hostOk = host.size() > 2 && host.back() == ']' &&
               host.find_first_not_of("0123456789abcdefABCDEF:.", 1) ==
                   host.size() - 1;
    else
      for (char c : host)
        hostOk &= std::isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                  c == '-' || c == '_';
    if (!hostOk || colon == std::string::npos)
      throw CliError("--store: " + inQuotes(text) +
                     " is not redis://HOST:PORT");
    std::string port = rest.substr(colon + 1);
    int64_t value = 0;
    const char *end = port.data() + port.size();
    auto [ptr, ec] = std::from_chars(port.data(), end, value);
    if (port.empty() || ec != std::errc() || ptr != end || value < 1 ||
        value > 65535)
      throw CliError("--store: port " + inQuotes(port) + " of " +
                     inQuotes(text) + " is not an integer from 1 to 65535");
    store.address = text;
    return store;
  }
  throw CliError("--store: " + inQuotes(text) +
                 " is not file:DIR or redis://HOST:PORT");
}

//===----------------------------------------------------------------------===//
// The store directory
//===----------------------------------------------------------------------===//

/// Owns the file: store's directory for the job's lifetime. Stale keys from
/// an earlier job would break Gloo's FileStore rendezvous, so the directory
/// must start empty, and what the job wrote is removed when it ends: the
/// whole directory when the launcher made it, its contents otherwise.
class StoreDir {
public:
  StoreDir() = default;
  StoreDir(const StoreDir &) = delete;
  StoreDir &operator=(const StoreDir &) = delete;
  ~StoreDir() {
    if (path.empty())
      return;
    std::error_code ec;
    if (created) {
      fs::remove_all(path, ec);
      return;
    }
    for (auto it = fs::directory_iterator(path, ec);
         !ec && it != fs::directory_iterator(); it.increment(ec))
      fs::remove_all(it->path(), ec);
  }

  void makeTemporary() {
    const char *tmp = std::getenv("TMPDIR");
    std::string base = tmp && *tmp ? tmp : "/tmp";
    std::error_code ec;
    base = fs::absolute(base, ec).string();
    std::string templ = base + "/meshplan-run-XXXXXX";
    if (!mkdtemp(templ.data()))
      throw CliError("TMPDIR: cannot create a store directory in " +
                     inQuotes(base) + ": " + std::strerror(errno) +
                     " (set TMPDIR or give --store file:DIR)");
    path = templ;
    created = true;
  }

  void use(const std::string &dir) {
    std::error_code ec;
    fs::path p = fs::absolute(dir, ec);
    if (ec)
      throw CliError("--store: " + inQuotes(dir) + ": " + ec.message());
    p = p.lexically_normal();
    auto st = fs::status(p, ec);
    if (fs::exists(st)) {
      if (!fs::is_directory(st))
        throw CliError("--store: " + inQuotes(p.string()) +
                       " exists and is not a directory");
      auto it = fs::directory_iterator(p, ec);
      if (ec)
        throw CliError("--store: cannot read " + inQuotes(p.string()) + ": " +
                       ec.message());
      if (it != fs::directory_iterator())
        throw CliError("--store: directory " + inQuotes(p.string()) +
                       " is not empty; stale keys would break the "
                       "rendezvous: give an empty or new directory");
      path = p.string();
      return;
    }
    if (!fs::create_directories(p, ec) || ec)
      throw CliError("--store: cannot create directory " +
                     inQuotes(p.string()) + ": " +
                     (ec ? ec.message() : "unknown error"));
    path = p.string();
    created = true;
  }

  std::string path;
  bool created = false;
};

//===----------------------------------------------------------------------===//
// The guardian
//===----------------------------------------------------------------------===//

/// A small process that outlives a launcher killed by SIGKILL, which runs no
/// code of its own: it then kills what the ranks left running (each rank has
/// the launcher's death as its parent-death signal, but the processes a rank
/// started do not) and removes the store directory. The launcher tells it
/// each rank's process group and the directory through a pipe, and "exit"
/// when it ends normally; end of file without "exit" means the launcher
/// died. It ignores the terminal's signals (its own session) and holds no
/// descriptor but the pipe's read end.
class Guardian {
public:
  Guardian() = default;
  Guardian(const Guardian &) = delete;
  Guardian &operator=(const Guardian &) = delete;
  ~Guardian() { finish(); }

  /// Forks the guardian; on failure the job runs without one.
  void start() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0)
      return;
    pid_t child = ::fork();
    if (child < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return;
    }
    if (child == 0) {
      ::close(fds[1]);
      run(fds[0]); // never returns
    }
    ::close(fds[0]);
    pid = child;
    fd = fds[1];
  }
  pid_t process() const { return pid; }
  void watchGroup(pid_t group) { send("P " + std::to_string(group)); }
  /// `whole`: the launcher made the directory; else only its contents.
  void watchDirectory(const std::string &dir, bool whole) {
    send(std::string(whole ? "D " : "C ") + dir);
  }
  /// The launcher ends normally: the guardian exits and is reaped.
  void finish() {
    if (fd < 0)
      return;
    send("exit");
    ::close(fd);
    fd = -1;
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }

private:
  void send(const std::string &line) {
    if (fd < 0)
      return;
    std::string text = line + "\n";
    const char *p = text.data();
    size_t left = text.size();
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return;
      p += n;
      left -= size_t(n);
    }
  }

  [[noreturn]] static void run(int in) {
    ::setsid();
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE})
      ::signal(sig, SIG_IGN);
    // Nothing of the launcher's but the pipe: a rank's output pipe held
    // here would keep the launcher's reader waiting.
    for (int fd = 3; fd < 1024; ++fd)
      if (fd != in)
        ::close(fd);
    std::vector<pid_t> groups;
    std::string dir, buffer;
    bool whole = false, done = false;
    char chunk[4096];
    while (!done) {
      ssize_t n = ::read(in, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      buffer.append(chunk, size_t(n));
      size_t nl;
      while ((nl = buffer.find('\n')) != std::string::npos) {
        std::string line = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        if (line == "exit")
          done = true;
        else if (line.rfind("P ", 0) == 0)
          groups.push_back(pid_t(std::strtol(line.c_str() + 2, nullptr, 10)));
        else if (line.size() > 2)
          dir = line.substr(2), whole = line[0] == 'D';
      }
    }
    if (!done) {
      for (pid_t g : groups)
        if (g > 1)
          ::killpg(g, SIGKILL);
      std::error_code ec;
      if (whole)
        fs::remove_all(dir, ec);
      else if (!dir.empty())
        for (auto it = fs::directory_iterator(dir, ec);
             !ec && it != fs::directory_iterator(); it.increment(ec))
          fs::remove_all(it->path(), ec);
    }
    ::_exit(0);
  }

  pid_t pid = -1;
  int fd = -1;
};

//===----------------------------------------------------------------------===//
// Output
//===----------------------------------------------------------------------===//

/// A stream of the launcher that failed (EPIPE: its reader went away) is
/// dropped; the job goes on and is still stopped or finished properly.
bool streamBroken[3] = {false, false, false};

void writeAll(int fd, const char *data, size_t size) {
  while (size > 0 && !streamBroken[fd]) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else if (n < 0 && errno != EINTR) {
      streamBroken[fd] = true;
    }
  }
}

void message(const std::string &text) {
  std::string line = "meshplan run: " + text + "\n";
  writeAll(STDERR_FILENO, line.data(), line.size());
}

std::string signalName(int sig) {
  const char *abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "unknown signal";
}

std::string describeStatus(int status) {
  if (WIFEXITED(status))
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" +
           signalName(sig) + (WCOREDUMP(status) ? ", core dumped" : "") + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

//===----------------------------------------------------------------------===//
// Ranks
//===----------------------------------------------------------------------===//

struct Rank {
  int64_t rank = 0;
  pid_t pid = -1;
  bool reaped = false;
  bool execFailed = false;
  int fds[2] = {-1, -1}; ///< read ends of the rank's stdout and stderr
  std::string pending[2];
  std::string prefix;

  bool hasOpenPipes() const { return fds[0] >= 0 || fds[1] >= 0; }
};

void closeFd(int &fd) {
  if (fd >= 0)
    ::close(fd);
  fd = -1;
}

/// Passes complete lines of `rank`'s stream `s` on, prefixed; at EOF (or when
/// the line grows too long) the partial last line too, with a newline.
void emitLines(Rank &rank, int s, bool flushPartial) {
  std::string &buf = rank.pending[s];
  std::string out;
  size_t start = 0;
  while (true) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos)
      break;
    out += rank.prefix;
    out.append(buf, start, nl + 1 - start);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (!buf.empty() && (flushPartial || buf.size() >= kMaxLine)) {
    out += rank.prefix;
    out += buf;
    out += '\n';
    buf.clear();
  }
  writeAll(s == 0 ? STDOUT_FILENO : STDERR_FILENO, out.data(), out.size());
}

/// Reads what is available (the pipes are non-blocking), at most `rounds`
/// chunks; closes at EOF. The poll loop passes a bound, so that a rank that
/// writes as fast as the launcher reads cannot keep it from the other
/// ranks' pipes and from its signals (their writers would block).
void drainStream(Rank &rank, int s, int rounds = INT32_MAX) {
  char chunk[65536];
  while (rank.fds[s] >= 0 && rounds-- > 0) {
    ssize_t n = ::read(rank.fds[s], chunk, sizeof chunk);
    if (n > 0) {
      rank.pending[s].append(chunk, static_cast<size_t>(n));
      emitLines(rank, s, false);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return;
    emitLines(rank, s, true); // EOF or error
    closeFd(rank.fds[s]);
  }
}

std::vector<std::string> baseEnvironment() {
  // What this launcher sets for each rank, torchrun's names included: a
  // value from an enclosing launcher must not leak through.
  static const char *const kOurs[] = {"RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "GROUP_RANK",
                                      "NODE_RANK",
                                      "GROUP_WORLD_SIZE",
                                      "ROLE_RANK",
                                      "ROLE_NAME",
                                      "ROLE_WORLD_SIZE",
                                      "TORCHELASTIC_RESTART_COUNT",
                                      "TORCHELASTIC_MAX_RESTARTS",
                                      "TORCHELASTIC_RUN_ID",
                                      "TORCHELASTIC_USE_AGENT_STORE",
                                      "MESHPLAN_STORE"};
  std::vector<std::string> env;
  for (char **e = environ; e && *e; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    if (std::find(std::begin(kOurs), std::end(kOurs), key) == std::end(kOurs))
      env.push_back(entry);
  }
  return env;
}

/// Everything the child needs between fork and exec, prepared beforehand:
/// only async-signal-safe calls happen in the child.
struct ChildSetup {
  sigset_t oldMask;
  struct sigaction oldPipe;
  rlimit oldFiles;
  int devNull = -1;
  pid_t launcher = 0;
};

[[noreturn]] void execChild(const ChildSetup &setup, int out, int err,
                            int execErr, char *const *argv, char *const *envp) {
  // Own session: the terminal's Ctrl-C goes to the launcher only, and the
  // launcher can signal the rank together with everything it started.
  ::setsid();
  // Die with the launcher even if it is SIGKILLed; the check closes the race
  // with a launcher that died before prctl.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  int e = 0;
  if (::getppid() != setup.launcher)
    ::_exit(127);
  if (::dup2(setup.devNull, STDIN_FILENO) < 0 ||
      ::dup2(out, STDOUT_FILENO) < 0 || ::dup2(err, STDERR_FILENO) < 0)
    goto fail;
  ::sigaction(SIGPIPE, &setup.oldPipe, nullptr);
  ::sigprocmask(SIG_SETMASK, &setup.oldMask, nullptr);
  ::setrlimit(RLIMIT_NOFILE, &setup.oldFiles);
  ::execvpe(argv[0], argv, envp);
fail:
  e = errno;
  while (::write(execErr, &e, sizeof e) < 0 && errno == EINTR) {
  }
  ::_exit(127);
}

/// The whole job: spawning, the poll loop, stopping, reaping. With
/// --fault-tolerant, a Supervisor (FaultTolerantLaunch.h) decides what a
/// failed rank means and restarts ranks through the RankControl calls.
class Job : public ft::RankControl {
public:
  Job(int64_t nprocs, int64_t nodeRank, int64_t nnodes, double grace,
      std::vector<std::string> program)
      : nprocs(nprocs), nodeRank(nodeRank), nnodes(nnodes), grace(grace),
        program(std::move(program)) {}

  int run(const std::string &storeAddress,
          const std::optional<std::string> &timeout, const rlimit &childFiles,
          const ft::Config *ftConfig = nullptr,
          ft::StoreServer *ftStore = nullptr);

  /// --master-addr, --master-port as given (checked).
  struct {
    std::optional<std::string> addr, port;
  } master;
  /// Told each rank's process group (null: no guardian).
  Guardian *guardian = nullptr;

  // RankControl
  bool running(int64_t rank) const override {
    const Rank *r = find(rank);
    return r && r->pid > 0 && !r->reaped;
  }
  void signalRank(int64_t rank, int sig) override {
    Rank *r = find(rank);
    if (r && r->pid > 0 && (!r->reaped || r->hasOpenPipes()))
      ::killpg(r->pid, sig);
  }
  bool restartRank(int64_t rank) override;
  void stopJob(int code) override {
    if (exitCode == 0)
      exitCode = code;
    stop(SIGTERM);
  }
  bool stopping() const override { return stoppingAll; }

private:
  Rank *find(int64_t rank) {
    int64_t i = rank - nodeRank * nprocs;
    return i >= 0 && i < static_cast<int64_t>(ranks.size())
               ? &ranks[static_cast<size_t>(i)]
               : nullptr;
  }
  const Rank *find(int64_t rank) const {
    return const_cast<Job *>(this)->find(rank);
  }
  std::vector<std::string> environmentOf(const Rank &rank) const;
  bool spawn(Rank &rank, const std::vector<std::string> &env);
  void reap();
  void onExit(Rank &rank, int status);
  void stop(int sig);
  void signalLive(int sig);
  void handleSignals();
  Clock::duration graceDuration() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(grace));
  }

  int64_t nprocs, nodeRank, nnodes;
  double grace;
  std::vector<std::string> program;
  std::vector<Rank> ranks;
  std::unordered_map<pid_t, Rank *> byPid;
  ChildSetup setup;
  int sigFd = -1;
  int exitCode = 0;
  bool stoppingAll = false; ///< the launcher has signalled the ranks
  std::vector<std::string> baseEnv;
  ft::StoreServer *ftStore = nullptr;
  std::unique_ptr<ft::Supervisor> supervisor;
  bool killed = false; ///< ... and sent SIGKILL
  Clock::time_point killAt, drainUntil;
  bool draining = false;
};

bool Job::spawn(Rank &rank, const std::vector<std::string> &env) {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, execErr[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) < 0 || ::pipe2(err, O_CLOEXEC) < 0 ||
      ::pipe2(execErr, O_CLOEXEC) < 0) {
    message("cannot start rank " + std::to_string(rank.rank) +
            ": pipe: " + std::strerror(errno));
    for (int fd : {out[0], out[1], err[0], err[1], execErr[0], execErr[1]})
      if (fd >= 0)
        ::close(fd);
    return false;
  }
  std::vector<char *> argv, envp;
  for (const std::string &a : program)
    argv.push_back(const_cast<char *>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string &e : env)
    envp.push_back(const_cast<char *>(e.c_str()));
  envp.push_back(nullptr);

  pid_t pid = ::fork();
  if (pid == 0)
    execChild(setup, out[1], err[1], execErr[1], argv.data(), envp.data());
  int forkErrno = errno;
  ::close(out[1]), ::close(err[1]), ::close(execErr[1]);
  if (pid < 0) {
    ::close(out[0]), ::close(err[0]), ::close(execErr[0]);
    message("cannot start rank " + std::to_string(rank.rank) +
            ": fork: " + std::strerror(forkErrno));
    return false;
  }
  rank.pid = pid;
  byPid[pid] = &rank;
  if (guardian)
    guardian->watchGroup(pid); // the rank's session and group leader
  rank.fds[0] = out[0];
  rank.fds[1] = err[0];
  for (int fd : rank.fds)
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  // Blocks until the child has exec'd (EOF: the pipe was CLOEXEC) or
  // reported why it could not.
  int childErrno = 0;
  ssize_t n;
  do
    n = ::read(execErr[0], &childErrno, sizeof childErrno);
  while (n < 0 && errno == EINTR);
  ::close(execErr[0]);
  if (n == static_cast<ssize_t>(sizeof childErrno)) {
    rank.execFailed = true;
    message("rank " + std::to_string(rank.rank) + ": cannot execute '" +
            program[0] + "': " + std::strerror(childErrno));
    exitCode = childErrno == ENOENT ? 127 : 126;
    return false;
  }
  return true;
}

void Job::onExit(Rank &rank, int status) {
  rank.reaped = true;
  // The rank's last lines come before the launcher's verdict on it.
  drainStream(rank, 0);
  drainStream(rank, 1);
  if (rank.execFailed)
    return;
  if (supervisor && !stoppingAll) {
    supervisor->onRankExit(rank.rank, status);
    return;
  }
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (stoppingAll) {
    if (!ok)
      message("rank " + std::to_string(rank.rank) + " " +
              describeStatus(status) + " (stopped by the launcher)");
    return;
  }
  if (ok)
    return;
  message("rank " + std::to_string(rank.rank) + " " + describeStatus(status));
  exitCode = 1;
  stop(SIGTERM);
}

void Job::reap() {
  // The ranks are the launcher's only children.
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid <= 0)
      return;
    if (guardian && pid == guardian->process()) {
      guardian = nullptr; // it died: the job goes on without one
      continue;
    }
    auto it = byPid.find(pid);
    if (it != byPid.end() && !it->second->reaped)
      onExit(*it->second, status);
    else if (it == byPid.end() && supervisor &&
             supervisor->onOtherChild(pid, status) && ftStore)
      ftStore->reaped(); // the private redis-server
  }
}

/// Signals the process group of every rank that may still run something: an
/// unreaped rank (its group exists, so the id is not reused), or a reaped one
/// whose pipes are still open (something it started is alive).
void Job::signalLive(int sig) {
  for (Rank &rank : ranks)
    if (rank.pid > 0 && (!rank.reaped || rank.hasOpenPipes()))
      ::killpg(rank.pid, sig);
}

/// A rank the kernel holds stopped (SIGSTOP, SIGTSTP, a debugger): it runs
/// nothing and answers no peer, so the job's failure is likely its doing.
bool isStopped(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE *f = std::fopen(path.c_str(), "r");
  if (!f)
    return false;
  char buf[512] = {0};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  // "PID (COMM) STATE ...": COMM may hold ')' and spaces; the state follows
  // the last ')'.
  const char *close = std::strrchr(buf, ')');
  return n > 0 && close && close[1] == ' ' &&
         (close[2] == 'T' || close[2] == 't');
}

void Job::stop(int sig) {
  if (stoppingAll)
    return;
  stoppingAll = true;
  for (Rank &rank : ranks)
    if (rank.pid > 0 && !rank.reaped && isStopped(rank.pid))
      message("rank " + std::to_string(rank.rank) +
              " is stopped (SIGSTOP or a debugger: process state T): it "
              "cannot take part in the job's collectives");
  signalLive(sig);
  // A stopped process keeps the signal pending until it runs again; wake
  // it, so that it ends now rather than at the grace period's SIGKILL.
  if (sig != SIGKILL)
    signalLive(SIGCONT);
  killAt = Clock::now() + graceDuration();
}

void Job::handleSignals() {
  signalfd_siginfo info;
  while (true) {
    ssize_t n = ::read(sigFd, &info, sizeof info);
    if (n < 0 && errno == EINTR)
      continue;
    if (n != static_cast<ssize_t>(sizeof info))
      return; // EAGAIN: all read
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD)
      continue; // reaped at the top of the loop
    if (!stoppingAll) {
      message("received " + signalName(sig) + "; stopping the ranks");
      exitCode = 128 + sig;
      stop(sig); // forwarded as is: SIGINT is KeyboardInterrupt in Python
    } else if (!killed) {
      message("received " + signalName(sig) +
              " while stopping; killing the ranks");
      signalLive(SIGKILL);
      killed = true;
    }
  }
}

int Job::run(const std::string &storeAddress,
             const std::optional<std::string> &timeout,
             const rlimit &childFiles, const ft::Config *ftConfig,
             ft::StoreServer *ftStore) {
  setup.launcher = ::getpid();
  setup.oldFiles = childFiles;

  // Signals are taken from a signalfd, so they must be blocked; the child
  // restores the old mask before exec.
  // A signal the launcher was started with ignored (nohup, `cmd &` in a
  // script) stays ignored: blocking it would have it queued.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) == 0 &&
        current.sa_handler != SIG_IGN)
      sigaddset(&mask, sig);
  }
  ::sigprocmask(SIG_BLOCK, &mask, &setup.oldMask);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &setup.oldPipe);
  sigFd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  setup.devNull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (sigFd < 0 || setup.devNull < 0) {
    message(std::string("cannot set up: ") + std::strerror(errno));
    return 1;
  }

  std::vector<std::string> &env = baseEnv;
  env = baseEnvironment();
  env.push_back("WORLD_SIZE=" + std::to_string(nnodes * nprocs));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nprocs));
  env.push_back("GROUP_RANK=" + std::to_string(nodeRank));
  env.push_back("NODE_RANK=" + std::to_string(nodeRank));
  env.push_back("GROUP_WORLD_SIZE=" + std::to_string(nnodes));
  env.push_back("MESHPLAN_STORE=" + storeAddress);
  // torchrun's names for the same facts: one role ("default", torchrun's),
  // the restart budget (--fault-tolerant's per group; none otherwise) and
  // the run's id (--fault-tolerant's job name; else "none", as torchrun's
  // static rendezvous).
  // TORCHELASTIC_USE_AGENT_STORE stays unset: no store of torch's runs at
  // MASTER_ADDR:MASTER_PORT, so torch's env:// makes rank 0 host one.
  env.push_back("ROLE_NAME=default");
  env.push_back("ROLE_WORLD_SIZE=" + std::to_string(nnodes * nprocs));
  env.push_back("TORCHELASTIC_MAX_RESTARTS=" +
                std::to_string(ftConfig ? ftConfig->maxRestarts : 0));
  env.push_back("TORCHELASTIC_RUN_ID=" +
                (ftConfig ? ftConfig->job : std::string("none")));
  // What torch.distributed's env:// rendezvous reads, as torchrun sets it,
  // so that a plain torch program runs under `meshplan run` too. One node:
  // the loopback and a free port. Several: the caller's MASTER_ADDR and
  // MASTER_PORT pass through (node 0's address; torchrun's
  // --rdzv-endpoint), and are not invented.
  auto has = [&](const char *key) {
    std::string prefix = std::string(key) + "=";
    return std::any_of(env.begin(), env.end(), [&](const std::string &e) {
      return e.rfind(prefix, 0) == 0;
    });
  };
  if (master.addr || master.port) {
    std::erase_if(env, [](const std::string &e) {
      return e.rfind("MASTER_ADDR=", 0) == 0 || e.rfind("MASTER_PORT=", 0) == 0;
    });
    env.push_back("MASTER_ADDR=" + master.addr.value_or("127.0.0.1"));
    if (master.port)
      env.push_back("MASTER_PORT=" + *master.port);
    else if (int port = freeLoopbackPort())
      env.push_back("MASTER_PORT=" + std::to_string(port));
  } else if (nnodes == 1 && !has("MASTER_ADDR") && !has("MASTER_PORT")) {
    if (int port = freeLoopbackPort()) {
      env.push_back("MASTER_ADDR=127.0.0.1");
      env.push_back("MASTER_PORT=" + std::to_string(port));
    }
  }
  if (timeout) {
    std::erase_if(env, [](const std::string &e) {
      return e.rfind("MESHPLAN_TIMEOUT=", 0) == 0;
    });
    env.push_back("MESHPLAN_TIMEOUT=" + *timeout);
  }

  ranks.resize(static_cast<size_t>(nprocs));
  std::vector<int64_t> globalRanks;
  for (int64_t local = 0; local < nprocs; ++local) {
    Rank &rank = ranks[static_cast<size_t>(local)];
    rank.rank = nodeRank * nprocs + local;
    rank.prefix = "[rank " + std::to_string(rank.rank) + "] ";
    globalRanks.push_back(rank.rank);
  }
  if (ftConfig) {
    const auto &names = ft::Supervisor::variableNames();
    std::erase_if(env, [&](const std::string &e) {
      return std::find(names.begin(), names.end(), e.substr(0, e.find('='))) !=
             names.end();
    });
    this->ftStore = ftStore;
    supervisor = std::make_unique<ft::Supervisor>(
        *ftConfig, *ftStore, globalRanks, graceDuration(), *this, message);
  }

  for (Rank &rank : ranks) {
    if (!spawn(rank, environmentOf(rank))) {
      if (exitCode == 0)
        exitCode = 1;
      stop(SIGTERM);
      break;
    }
  }

  std::vector<pollfd> pfds;
  std::vector<std::pair<Rank *, int>> owners;
  while (true) {
    reap();
    if (supervisor)
      supervisor->tick();
    bool allReaped = std::all_of(ranks.begin(), ranks.end(), [](const Rank &r) {
      return r.pid < 0 || r.reaped;
    });
    // A replica group being stopped or waiting for its restart keeps the
    // job going although none of its processes runs.
    if (supervisor && supervisor->pending())
      allReaped = false;
    bool anyOpen = std::any_of(ranks.begin(), ranks.end(),
                               [](const Rank &r) { return r.hasOpenPipes(); });
    if (allReaped && !anyOpen)
      break;
    Clock::time_point now = Clock::now();
    if (stoppingAll && !killed && now >= killAt) {
      signalLive(SIGKILL);
      killed = true;
    }
    // Every rank is gone but something it started still holds a pipe: wait
    // one grace period for it, then kill its group and stop reading.
    if (allReaped && !draining) {
      draining = true;
      drainUntil = now + std::max(graceDuration(),
                                  Clock::duration(std::chrono::seconds(1)));
    }
    if (draining && now >= drainUntil) {
      signalLive(SIGKILL);
      for (Rank &rank : ranks)
        for (int s = 0; s < 2; ++s)
          if (rank.fds[s] >= 0) {
            drainStream(rank, s);
            if (rank.fds[s] >= 0) {
              emitLines(rank, s, true);
              closeFd(rank.fds[s]);
            }
          }
      break;
    }

    Clock::duration wait = std::chrono::seconds(1);
    if (stoppingAll && !killed)
      wait = std::min(wait, killAt - now);
    if (draining)
      wait = std::min(wait, drainUntil - now);
    if (supervisor)
      wait = std::min(wait, supervisor->untilNextTick());
    int timeoutMs = static_cast<int>(
        std::chrono::ceil<std::chrono::milliseconds>(wait).count());

    pfds.clear();
    owners.clear();
    pfds.push_back({sigFd, POLLIN, 0});
    owners.push_back({nullptr, 0});
    for (Rank &rank : ranks)
      for (int s = 0; s < 2; ++s)
        if (rank.fds[s] >= 0) {
          pfds.push_back({rank.fds[s], POLLIN, 0});
          owners.push_back({&rank, s});
        }
    int n = ::poll(pfds.data(), pfds.size(), std::max(timeoutMs, 0));
    if (n < 0 && errno != EINTR) {
      message(std::string("poll: ") + std::strerror(errno));
      if (exitCode == 0)
        exitCode = 1;
      stop(SIGKILL);
      continue;
    }
    for (size_t i = 1; i < pfds.size(); ++i)
      if (pfds[i].revents)
        drainStream(*owners[i].first, owners[i].second, 16);
    if (pfds[0].revents)
      handleSignals();
  }
  ::close(sigFd);
  ::close(setup.devNull);
  if (supervisor && exitCode == 0)
    exitCode = supervisor->finalExitCode();
  return exitCode;
}

std::vector<std::string> Job::environmentOf(const Rank &rank) const {
  std::vector<std::string> env = baseEnv;
  env.push_back("RANK=" + std::to_string(rank.rank));
  env.push_back("ROLE_RANK=" + std::to_string(rank.rank));
  env.push_back("LOCAL_RANK=" + std::to_string(rank.rank - nodeRank * nprocs));
  std::string restarts = "0";
  if (supervisor)
    for (std::string &e : supervisor->environment(rank.rank)) {
      // A restarted replica group's processes count as torchrun's restart.
      if (e.rfind("MESHPLAN_FT_INCARNATION=", 0) == 0)
        restarts = e.substr(e.find('=') + 1);
      env.push_back(std::move(e));
    }
  env.push_back("TORCHELASTIC_RESTART_COUNT=" + restarts);
  return env;
}

bool Job::restartRank(int64_t r) {
  Rank *rank = find(r);
  if (!rank || stoppingAll)
    return false;
  // What the previous process left in its pipes is passed on; something it
  // started that still holds them goes with its process group.
  for (int s = 0; s < 2; ++s)
    if (rank->fds[s] >= 0) {
      drainStream(*rank, s);
      if (rank->fds[s] >= 0) {
        ::killpg(rank->pid, SIGKILL);
        emitLines(*rank, s, true);
        closeFd(rank->fds[s]);
      }
    }
  byPid.erase(rank->pid);
  rank->pid = -1;
  rank->reaped = false;
  rank->execFailed = false;
  if (spawn(*rank, environmentOf(*rank)))
    return true;
  if (exitCode == 0)
    exitCode = 1;
  stop(SIGTERM);
  return false;
}

/// fds 0-2 must be open, or a pipe could land on them and be dup2'ed over.
void ensureStandardFds() {
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int nul = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (nul >= 0 && nul != fd) {
        ::dup2(nul, fd);
        ::close(nul);
      }
    }
}

} // namespace

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

std::vector<char *>
meshplan::cli::splitRunCommandLine(const CLI::App &runCmd, int argc,
                                   char **argv,
                                   std::vector<std::string> &program) {
  std::vector<char *> args(argv, argv + argc);
  if (argc < 2 || runCmd.get_name() != argv[1])
    return args;
  args.resize(2);
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      program.assign(argv + i + 1, argv + argc);
      return args;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      program.assign(argv + i, argv + argc);
      return args;
    }
    args.push_back(argv[i]);
    // "--store=X" and "-n4" carry their value; "--store X" and "-n 4" take
    // the next argument, whatever it looks like.
    bool attached = arg.rfind("--", 0) == 0 ? arg.find('=') != std::string::npos
                                            : arg.size() > 2;
    if (attached)
      continue;
    const CLI::Option *opt = runCmd.get_option_no_throw(arg);
    if (opt && opt->get_expected_min() > 0 && i + 1 < argc)
      args.push_back(argv[++i]);
  }
  return args;
}

int meshplan::cli::runLaunchCommand(const RunOptions &options) {
  // Every flag is checked before anything is created or started.
  if (options.nprocPerNode.empty())
    throw CliError("-n: the number of processes to start is required (" +
                   std::string(kUsage) + ")");
  int64_t nprocs = parseInt("-n", options.nprocPerNode, 1, kMaxProcsPerNode);
  int64_t nnodes = parseInt("--nnodes", options.nnodes, 1, kMaxNodes);
  int64_t nodeRank = parseInt("--node-rank", options.nodeRank, 0, nnodes - 1,
                              " (--nnodes " + std::to_string(nnodes) + ")");
  if (options.timeout)
    parseSeconds("--timeout", *options.timeout, false);
  double grace = parseSeconds("--grace", options.grace, true);
  Store store = parseStore(options.store, nnodes);
  if (options.masterPort)
    parseInt("--master-port", *options.masterPort, 1, 65535);
  if (options.masterAddr &&
      (options.masterAddr->empty() ||
       options.masterAddr->find_first_of(" \t\n=") != std::string::npos))
    throw CliError("--master-addr: " + inQuotes(*options.masterAddr) +
                   " is not a host name or address");
  std::optional<ft::Config> ftConfig = ft::parseFlags(options, nnodes);
  if (options.program.empty() || options.program[0].empty())
    throw CliError("PROGRAM: no program to run; usage: " + std::string(kUsage));

  ensureStandardFds();
  // Two pipes per rank, plus a few: raise the soft limit as far as allowed
  // (children get the old one back).
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  rlimit raised = files;
  rlim_t need = static_cast<rlim_t>(2 * nprocs + 64);
  if (raised.rlim_cur != RLIM_INFINITY && raised.rlim_cur < need) {
    raised.rlim_cur = raised.rlim_max == RLIM_INFINITY
                          ? need
                          : std::min<rlim_t>(need, raised.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &raised);
    ::getrlimit(RLIMIT_NOFILE, &raised);
    if (raised.rlim_cur < need)
      throw CliError("-n: " + std::to_string(nprocs) + " processes need " +
                     std::to_string(need) +
                     " file descriptors, but the limit is " +
                     std::to_string(raised.rlim_cur) + " (ulimit -n)");
  }

  // The membership store: the given one is pinged (a CliError when it does
  // not answer), or a private redis-server is started, stopped at return.
  ft::StoreServer ftStore;
  if (ftConfig)
    if (std::optional<std::string> error = ftStore.open(*ftConfig)) {
      message(*error);
      ::setrlimit(RLIMIT_NOFILE, &files);
      return 1;
    }

  StoreDir storeDir;
  if (store.defaultDir)
    storeDir.makeTemporary();
  else if (!store.fileDir.empty())
    storeDir.use(store.fileDir);
  if (!storeDir.path.empty())
    store.address = "file:" + storeDir.path;

  // Declared after storeDir: it finishes (exits without acting) before
  // storeDir cleans up.
  Guardian guardian;
  guardian.start();
  if (!storeDir.path.empty())
    guardian.watchDirectory(storeDir.path, storeDir.created);

  Job job(nprocs, nodeRank, nnodes, grace, options.program);
  job.master.addr = options.masterAddr;
  job.master.port = options.masterPort;
  if (guardian.process() > 0)
    job.guardian = &guardian;
  int code = job.run(store.address, options.timeout, files,
                     ftConfig ? &*ftConfig : nullptr, &ftStore);
  ftStore.stop();
  ::setrlimit(RLIMIT_NOFILE, &files);
  return code;
}
