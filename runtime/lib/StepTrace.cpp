//===- StepTrace.cpp - Recording what each step did (executed traces) -----===//

#include "StepTrace.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

namespace meshplan::runtime {

namespace {

namespace fs = std::filesystem;

std::vector<char> bytesOf(const std::string &s) {
  return std::vector<char>(s.begin(), s.end());
}
std::string textOf(const std::vector<char> &v) {
  return std::string(v.begin(), v.end());
}

/// Seconds on this process's monotonic clock.
double now() {
  return std::chrono::duration<double>(SteadyClock::now().time_since_epoch())
      .count();
}

/// The kernel's host name: what decides whether two ranks share
/// CLOCK_MONOTONIC. Not MESHPLAN_HOSTNAME, which names the address peers
/// connect to (BackendOptions::hostname): network namespaces on one
/// machine have several addresses but one clock.
std::string hostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

/// The run's nonce: rank 0 draws it, the others read it. It stays in the
/// store, where a restarted process (incarnation > 0, rank 0's too) reads
/// it.
Result<std::string> agreeOnRun(Backend &store, int64_t rank,
                               int64_t incarnation) {
  if (rank == 0 && incarnation == 0) {
    std::random_device rd;
    uint64_t v = (uint64_t(rd()) << 32) ^ rd() ^
                 uint64_t(SteadyClock::now().time_since_epoch().count());
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", (unsigned long long)v);
    MESHPLAN_TRY(store.storeSet("trace/run", bytesOf(text)));
    return std::string(text);
  }
  auto got = store.storeGet("trace/run");
  if (!got)
    return got.error();
  return textOf(*got);
}

std::string clockRecord(const plan::RankTrace &t) {
  char text[128];
  std::snprintf(text, sizeof text, "%.9f %.9f ", t.clockOffset,
                t.clockUncertainty);
  return text + t.host;
}

/// A restarted process's clock: rank 0 answered pings only when the job
/// opened. On rank 0's host it shares its clock; on the host where this
/// rank's incarnation 0 ran (the launcher restarts a rank on its own node)
/// it takes the offset incarnation 0 measured, for the same
/// CLOCK_MONOTONIC; elsewhere the offset is unknown and the file says so.
Result<void> alignRestartedClock(Backend &store, plan::RankTrace &t) {
  auto host0 = store.storeGet("trace/host/0");
  if (!host0)
    return host0.error();
  if (textOf(*host0) == t.host)
    return {};
  auto earlier = store.storePeek("trace/clock/" + std::to_string(t.rank));
  if (!earlier)
    return earlier.error();
  if (*earlier) {
    std::string text = textOf(**earlier);
    char *end = nullptr;
    double offset = std::strtod(text.c_str(), &end);
    double uncertainty = std::strtod(end, &end);
    std::string host = *end == ' ' ? std::string(end + 1) : std::string();
    if (host == t.host) {
      t.clockOffset = offset;
      t.clockUncertainty = uncertainty;
      t.clockMethod = "incarnation 0's store ping (same host)";
      return {};
    }
  }
  t.clockOffset = 0;
  t.clockUncertainty = 0;
  t.clockMethod = "unknown";
  return {};
}

/// This rank's offset to rank 0's clock (seconds to add), its uncertainty
/// and the method's name. Rank 0 answers the pings of every rank on another
/// host, in rank order.
Result<void> alignClock(Backend &store, plan::RankTrace &t) {
  MESHPLAN_TRY(
      store.storeSet("trace/host/" + std::to_string(t.rank), bytesOf(t.host)));
  if (t.rank == 0) {
    for (int64_t r = 1; r < t.worldSize; ++r) {
      auto host = store.storeGet("trace/host/" + std::to_string(r));
      if (!host)
        return host.error();
      if (textOf(*host) == t.host)
        continue;
      auto ping = store.storeGet("trace/ping/" + std::to_string(r));
      if (!ping)
        return ping.error();
      char text[64];
      std::snprintf(text, sizeof text, "%.9f", now());
      MESHPLAN_TRY(
          store.storeSet("trace/pong/" + std::to_string(r), bytesOf(text)));
    }
    return {};
  }
  auto host0 = store.storeGet("trace/host/0");
  if (!host0)
    return host0.error();
  if (textOf(*host0) == t.host)
    return {}; // one CLOCK_MONOTONIC
  double sent = now();
  MESHPLAN_TRY(store.storeSet("trace/ping/" + std::to_string(t.rank), {'1'}));
  auto pong = store.storeGet("trace/pong/" + std::to_string(t.rank));
  if (!pong)
    return pong.error();
  double received = now();
  double theirs = std::strtod(textOf(*pong).c_str(), nullptr);
  t.clockOffset = theirs - (sent + received) / 2;
  t.clockUncertainty = (received - sent) / 2;
  t.clockMethod = "store ping";
  return {};
}

} // namespace

Result<std::unique_ptr<StepTraceRecorder>>
StepTraceRecorder::start(const plan::Plan &plan,
                         const StepTraceOptions &options, Backend &backend,
                         std::optional<int64_t> incarnation) {
  if (options.dir.empty())
    return makeError("trace: no directory given");
  if (options.firstStep < 1 || options.lastStep < options.firstStep)
    return makeError("trace: steps " + std::to_string(options.firstStep) + ":" +
                     std::to_string(options.lastStep) +
                     " are not a range of steps from 1");
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec || !fs::is_directory(options.dir))
    return makeError("trace: cannot create " + options.dir +
                     (ec ? ": " + ec.message() : ""));
  plan::RankTrace header = plan::rankTraceOf(plan);
  header.host = hostName();
  header.faultTolerant = incarnation.has_value();
  header.incarnation = incarnation.value_or(0);
  auto run = agreeOnRun(backend, header.rank, header.incarnation);
  if (!run)
    return run.error().within("trace: agreeing on the run");
  header.run = *run;
  if (header.incarnation > 0) {
    MESHPLAN_TRY(alignRestartedClock(backend, header));
  } else {
    MESHPLAN_TRY(alignClock(backend, header));
    // What a restarted process of this rank on this host will reuse.
    if (header.faultTolerant)
      MESHPLAN_TRY(
          backend.storeSet("trace/clock/" + std::to_string(header.rank),
                           bytesOf(clockRecord(header))));
  }
  return std::unique_ptr<StepTraceRecorder>(
      new StepTraceRecorder(std::move(header), options));
}

Result<void> StepTraceRecorder::record(int64_t step,
                                       SteadyClock::time_point begun,
                                       const StepProfile &profile,
                                       int64_t epoch, bool committed) {
  if (!wants(step))
    return {};
  plan::ExecutedStep s;
  s.step = step;
  s.epoch = epoch;
  s.committed = committed;
  s.start = std::chrono::duration<double>(begun.time_since_epoch()).count() +
            trace.clockOffset;
  s.wall = profile.wall;
  s.ready = profile.instructionReady;
  s.begin = profile.instructionStart;
  s.end = profile.instructionEnd;
  size_t n = trace.instructions.size();
  s.ready.resize(n, 0);
  s.begin.resize(n, 0);
  s.end.resize(n, 0);
  // Kept as text: a fault-tolerant process rewrites its file after every
  // attempt, and formats each step once, not at every rewrite.
  steps.push_back(plan::writeRankTraceStep(trace, s));
  written = false;
  // A fault-tolerant process may be killed at any step: what it finished
  // is on disk after each attempt.
  if (step == options.lastStep || trace.faultTolerant)
    return write();
  return {};
}

Result<void> StepTraceRecorder::finish() {
  return written ? Result<void>() : write();
}

StepTraceRecorder::~StepTraceRecorder() {
  if (appendFd >= 0)
    ::close(appendFd);
}

Result<void> StepTraceRecorder::write() {
  std::string path =
      (fs::path(options.dir) / plan::rankTraceFileName(trace)).string();
  if (appendFd >= 0) {
    // A fault-tolerant file after its first write: the new steps replace
    // its closing "]}\n" in one write() (a rewrite and rename of the
    // whole file cost 1.3 ms a step on ext4, 8-11% of the tiny run's step).
    std::string tail;
    for (size_t k = inFile; k < steps.size(); ++k)
      tail += "," + steps[k];
    tail += "]}\n";
    ssize_t n = ::pwrite(appendFd, tail.data(), tail.size(), fileSize - 3);
    if (n != ssize_t(tail.size()))
      return makeError("trace: cannot write " + path + ": " +
                       (n < 0 ? std::strerror(errno) : "short write"));
    fileSize += int64_t(tail.size()) - 3;
    inFile = steps.size();
    written = true;
    return {};
  }
  std::string text = plan::writeRankTraceWith(trace, steps);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out.good()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return makeError("trace: cannot write " + path);
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return makeError("trace: cannot write " + path + ": " + ec.message());
  }
  written = true;
  // A fault-tolerant process appends its later steps to this file (the
  // header, epoch members included, never changes once written).
  if (trace.faultTolerant && !steps.empty()) {
    appendFd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (appendFd < 0)
      return makeError("trace: cannot write " + path + ": " +
                       std::strerror(errno));
    fileSize = int64_t(text.size());
    inFile = steps.size();
  }
  return {};
}

} // namespace meshplan::runtime
