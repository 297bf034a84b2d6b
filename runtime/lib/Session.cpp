//===- Session.cpp - The session API and its steps ------------------------===//
//
// Session's public functions and the pass that runs a step's instructions,
// a thread per plan stream. The rest of a session lives beside it: plan
// binding (Binding.cpp), the executor that runs each instruction on the
// session's device (Execution.cpp; the inline host device for host buffers)
// and its set-up (ExecutionSetUp.cpp), fault tolerance (FaultTolerance.cpp),
// checkpoints (SessionCheckpoint.cpp) and options from the environment
// (SessionOptions.cpp); SessionImpl.h holds the state they share.
//
// Execution: one thread per stream runs that stream's instructions in
// program order. An instruction starts when its deps have completed and, for
// a collective, when every earlier collective of its communicator (program
// order) has completed, so all members issue a communicator's collectives in
// the order the verifier checked. Every wait is bounded by the session's
// timeout; the first failure stops all streams.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Session.h"

#include "BoxCopy.h"
#include "SessionImpl.h"
#include "StagedCommunicator.h"

#include "meshplan/Plan/Template.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

namespace meshplan::runtime {

using plan::BufferKind;
using plan::DType;
using plan::Instruction;
using plan::OpKind;
namespace k = kernels;

int64_t TensorView::numElements() const { return product(buffer->localShape); }

std::string Session::Impl::describe(const Bound &b) const {
  std::string s = "instruction \"" + b.in->id + "\"";
  if (!b.in->label.empty())
    s += " (" + b.in->label + ")";
  return s;
}

/// The store key of a step's first failure (docs/runtime.md, "When a rank
/// fails").
static constexpr const char *kFailureKey = "step-failure";

void Session::Impl::reportFailure(bool onCommunicator, Error &error) {
  if (ft)
    return; // the replica groups' protocol handles failures
  stepFailed = true;
  if (onCommunicator) {
    auto peer = backend->storePeek(kFailureKey);
    if (peer && *peer && !(*peer)->empty())
      error = Error{"a peer failed first: " +
                    std::string((*peer)->begin(), (*peer)->end()) +
                    "; that ended this rank's step: " + error.message};
  } else if (!trainerCollectiveFailed) {
    // A callback's own error is the cause its peers name ("a peer failed
    // first"); one that is a trainer's collective timing out on a peer is
    // not, and would stop the peers' own diagnosis of who did not arrive.
    (void)backend->storeSet(
        kFailureKey,
        std::vector<char>(error.message.begin(), error.message.end()));
  }
  // A communicator being created holds commMutex through its rendezvous,
  // which abort cannot end: skip them then (they end at their timeout).
  std::unique_lock<std::mutex> lock(commMutex, std::try_to_lock);
  if (!lock.owns_lock())
    return;
  for (auto &comm : comms)
    if (comm)
      comm->abort(error.message);
  for (auto &[id, comm] : trainerComms)
    comm->abort(error.message);
}

TensorView Session::Impl::view(int buffer) {
  BufferState &s = buffers[buffer];
  TensorView v;
  v.buffer = s.meta;
  if (onDevice()) {
    // Device memory; a float8 scale is a device value (scaleFor).
    v.bytes = std::span<std::byte>(address(buffer), bytesOf(s));
    v.onDevice = true;
    return v;
  }
  v.bytes = std::span<std::byte>(s.data.data(), s.data.size());
  if (s.meta->scale)
    v.scale = scaleOf(buffers, bufferIds, *s.meta);
  return v;
}

/// Allocates (zeroed) a buffer about to be written.
void Session::Impl::ensureOnHost(int buffer) {
  BufferState &s = buffers[buffer];
  if (!s.live) {
    s.data.assign(size_t(s.numel * plan::dtypeBytes(s.meta->dtype)),
                  std::byte{0});
    s.live = true;
  }
}

Result<Communicator *> Session::Impl::communicator(int index) {
  std::lock_guard<std::mutex> lock(commMutex);
  if (!comms[index]) {
    auto comm = backend->createCommunicator(groupSpecOf(index));
    if (!comm)
      return comm.error();
    // Plans that disagree on this communicator's collectives fail here,
    // on every member, instead of hanging or aborting inside Gloo
    // (SessionDiagnosis.cpp). Host communicators only: the exchange uses
    // host buffers; fault-tolerant groups keep their own protocol.
    if (!ft && (*comm)->memoryKind() == MemoryKind::Host && (*comm)->size() > 1)
      if (auto same = checkCollectiveSequence(index, **comm); !same)
        return same.error();
    comms[index] = std::move(*comm);
    // On a device, a host backend's collectives go through host memory.
    if (onDevice() && comms[index]->memoryKind() == MemoryKind::Host)
      comms[index] = stageThroughHost(std::move(comms[index]), dev->device);
  }
  return comms[index].get();
}

/// A plan communicator as this rank creates it. A fault_tolerant one is the
/// group over the current quorum's live groups (core's groupOf with live
/// members), of the quorum's epoch, still averaging over its nominal size; the
/// others are the plan's, of this rank's group's incarnation.
GroupSpec Session::Impl::groupSpecOf(int index) {
  const plan::Communicator &c = plan.communicators[size_t(index)];
  GroupSpec g{c.id, c.color, c.ranks, c.key, 0};
  g.incarnation = incarnation();
  if (!ft) {
    // A rendezvous under way when this rank's step fails ends at once
    // (reportFailure) rather than at its timeout.
    g.cancelled = [this]() -> std::optional<std::string> {
      if (!stepFailed.load())
        return std::nullopt;
      return std::string("this rank's step failed");
    };
  }
  if (!ft || !c.faultTolerant)
    return g;
  LiveMembers live;
  std::vector<int64_t> groups(ft->quorum.members.begin(),
                              ft->quorum.members.end());
  auto set = live.set(*mesh, ft->axis, groups);
  auto derived = set ? plan::deriveGroup(*mesh, c.axes, plan.rank, &live)
                     : Result<plan::DerivedGroup>(set.error());
  // Checked at open: the communicator has axes and this rank is live.
  if (derived) {
    g.ranks = derived->ranks;
    g.color = derived->color;
    g.key = derived->key;
  }
  g.epoch = ft->quorum.epoch;
  g.incarnation = 0; // spans groups of different incarnations
  // A member that died before the group's rendezvous never comes: the
  // rendezvous ends once the job has moved on (the watcher beside the step
  // proposes the next epoch when a group's heartbeat expires).
  g.cancelled = [m = ft->membership.get(), epoch = g.epoch,
                 abandoned =
                     ft->abandonedEpoch]() -> std::optional<std::string> {
    if (abandoned->load() == epoch)
      return "a replica group of epoch " + std::to_string(epoch) +
             " died and no quorum can form without it";
    if (!m->epochChangedSince(epoch))
      return std::nullopt;
    return "epoch " + std::to_string(epoch) +
           " ended (the job moved to epoch " +
           std::to_string(m->observedEpoch()) + ")";
  };
  g.nominalSize = static_cast<int64_t>(c.ranks.size());
  // A member that gave the rendezvous up after publishing its address (its
  // epoch ended) never connects: bounded by the expiry, not the timeout.
  g.connectTimeout = options.faultTolerance->heartbeatExpiry;
  return g;
}

//===----------------------------------------------------------------------===//
// Session
//===----------------------------------------------------------------------===//

Session::Session(std::unique_ptr<Impl> i) : impl(std::move(i)) {
  impl->self = this;
}
Session::~Session() { (void)close(); }

Result<void> Session::close() {
  Impl &m = *impl;
  if (m.closed)
    return {};
  m.closed = true;
  // A run that stopped inside the traced range still leaves its trace.
  Result<void> traced = m.trace ? m.trace->finish() : Result<void>();
  if (m.broken)
    return traced;
  std::lock_guard<std::mutex> lock(m.commMutex);
  for (size_t i = 0; i < m.comms.size(); ++i)
    if (m.comms[i])
      if (auto ok = m.comms[i]->barrier(); !ok)
        return ok.error().within("closing communicator \"" +
                                 m.plan.communicators[i].id + "\"");
  for (auto &[id, comm] : m.trainerComms)
    if (auto ok = comm->barrier(); !ok)
      return ok.error().within("closing trainer communicator \"" + id + "\"");
  return traced;
}

Result<std::unique_ptr<Session>> Session::open(plan::Plan p,
                                               const SessionOptions &options) {
  auto impl = std::make_unique<Impl>();
  impl->plan = std::move(p);
  impl->options = options;
  MESHPLAN_TRY(impl->bind());
  BackendOptions bo;
  bo.store = options.store;
  bo.rank = options.rank;
  bo.worldSize = options.worldSize;
  bo.timeout = options.timeout;
  bo.job = options.job;
  bo.keyOrderReductions = options.keyOrderReductions;
  bo.localRank = options.localRank;
  Result<std::unique_ptr<Backend>> backend = makeError("no backend");
  if (options.makeBackend) {
    backend = options.makeBackend(bo);
  } else if (options.backend == "nccl") {
    // The NCCL backend lives in MeshplanRuntimeNccl (CUDA builds), which a
    // program links to run on GPUs; this library alone has no CUDA.
    if (!buildHasCudaBackend())
      return makeError("backend \"nccl\": this build has no CUDA backend "
                       "(configure with the CUDA toolkit installed and "
                       "MESHPLAN_CUDA=AUTO or ON; docs/cuda.md)");
    return makeError("backend \"nccl\": this program does not link the CUDA "
                     "backend (link MeshplanRuntimeNccl and open the session "
                     "with cudaSessionOptions from meshplan/Runtime/"
                     "CudaDevice.h; docs/cuda.md)");
  } else if (options.backend == "gloo") {
    backend = createGlooBackend(bo);
  } else {
    return makeError("backend \"" + options.backend +
                     "\": unknown (expected \"gloo\" or \"nccl\")");
  }
  if (!backend)
    return backend.error().within("store " + options.store.text());
  if ((*backend)->memoryKind() == MemoryKind::Device && !options.device)
    return makeError("backend \"" + std::string((*backend)->name()) +
                     "\" runs on device buffers: the session needs a device "
                     "(SessionOptions::device; docs/cuda.md)");
  impl->backend = std::move(*backend);
  if (options.trace) {
    // A fault-tolerant process records its incarnation, and each attempt
    // with its epoch (traceAttempt).
    auto recorder = StepTraceRecorder::start(
        impl->plan, *options.trace, *impl->backend,
        options.faultTolerance
            ? std::optional<int64_t>(options.faultTolerance->incarnation)
            : std::nullopt);
    if (!recorder)
      return recorder.error();
    impl->trace = std::move(*recorder);
  }
  if (options.faultTolerance)
    MESHPLAN_TRY(impl->setUpFaultTolerance());
  MESHPLAN_TRY(impl->setUpExecutor());
  // Every group this session may create, in the plan's communicator order
  // (the same on every rank): the plan's, then the trainer's separate ones
  // over the same members (trainerCommunicator). A backend whose group
  // creation is collective over the whole job (NCCL) creates them in this
  // order; Gloo ignores it.
  std::vector<GroupSpec> groups;
  for (const plan::Communicator &c : impl->plan.communicators)
    groups.push_back({c.id, c.color, c.ranks, c.key, 0});
  for (const plan::Communicator &c : impl->plan.communicators)
    groups.push_back({"trainer/" + c.id, c.color, c.ranks, c.key, 0});
  MESHPLAN_TRY(impl->backend->declareGroups(groups));
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Result<std::unique_ptr<Session>>
Session::openPath(const std::string &path, const SessionOptions &options) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    file = (std::filesystem::path(path) /
            ("rank" + std::to_string(options.rank) + ".json"))
               .string();
  auto p = plan::readPlanFile(file);
  if (!p)
    return p.error();
  auto s = open(std::move(*p), options);
  if (!s)
    return s.error().within(file);
  return s;
}

Result<std::unique_ptr<Session>>
Session::openTemplate(const plan::PreparedTemplate &tmpl,
                      const SessionOptions &options) {
  if (options.rank < 0 || options.rank >= tmpl.mesh().size())
    return makeError("rank " + std::to_string(options.rank) +
                     " is not in the template's mesh of " +
                     std::to_string(tmpl.mesh().size()) + " ranks");
  auto p = tmpl.instantiate(options.rank, /*withEstimates=*/false);
  if (!p)
    return p.error();
  return open(std::move(*p), options);
}

void Session::onCompute(ComputeCallback callback) {
  impl->fallback = std::move(callback);
}
void Session::onCompute(const std::string &phase, const std::string &unit,
                        ComputeCallback callback) {
  impl->callbacks[{phase, unit}] = std::move(callback);
}

Result<void>
Session::initParameters(const std::function<Result<void>(TensorView &)> &init) {
  if (impl->onDevice())
    return impl->initOnDevice(init);
  for (size_t i = 0; i < impl->buffers.size(); ++i) {
    BufferState &s = impl->buffers[i];
    if (s.meta->kind == BufferKind::OptimizerState) {
      std::fill(s.data.begin(), s.data.end(), std::byte{0});
      continue;
    }
    if (s.meta->kind != BufferKind::ParamShard)
      continue;
    TensorView v = impl->view(static_cast<int>(i));
    MESHPLAN_TRY(init(v));
  }
  return {};
}

Result<void> Session::copyIn(const std::string &id,
                             std::span<const std::byte> whole) {
  auto it = impl->bufferIds.find(id);
  if (it == impl->bufferIds.end() || !impl->buffers[it->second].persistent)
    return makeError("no persistent buffer \"" + id + "\" in the plan");
  BufferState &s = impl->buffers[it->second];
  int64_t bytes =
      product(s.meta->globalShape) * plan::dtypeBytes(s.meta->dtype);
  if (static_cast<int64_t>(whole.size()) != bytes)
    return makeError("\"" + id + "\": " + std::to_string(whole.size()) +
                     " bytes given, the whole tensor has " +
                     std::to_string(bytes));
  std::vector<int64_t> zero(s.meta->globalShape.size(), 0);
  BoxRef src{const_cast<std::byte *>(whole.data()), s.meta->dtype,
             &s.meta->globalShape, &zero};
  std::vector<std::byte> staging;
  std::byte *into = s.data.data();
  if (impl->onDevice()) {
    staging.resize(size_t(s.numel * plan::dtypeBytes(s.meta->dtype)));
    into = staging.data();
  }
  BoxRef dst{into, s.meta->dtype, &s.meta->localShape, &s.meta->offset};
  copyBox(src, dst, s.meta->offset, s.meta->localShape);
  if (impl->onDevice())
    return impl->toDevice(it->second, staging);
  return {};
}

Result<void> Session::copyOut(const TensorView &view,
                              std::span<std::byte> host) {
  if (host.size() != view.bytes.size())
    return makeError(
        "copyOut of \"" + view.id() + "\": " + std::to_string(host.size()) +
        " bytes given, the view has " + std::to_string(view.bytes.size()));
  if (!view.onDevice) {
    if (!host.empty())
      std::memcpy(host.data(), view.bytes.data(), host.size());
    return {};
  }
  if (!impl->onDevice())
    return makeError("copyOut of \"" + view.id() +
                     "\": a device view, but this session has no device");
  return impl->fromDevice(view.bytes.data(), host);
}

Result<void> Session::copyInto(const TensorView &view,
                               std::span<const std::byte> host) {
  auto it = impl->bufferIds.find(view.id());
  if (it == impl->bufferIds.end() || !impl->buffers[it->second].persistent)
    return makeError("no persistent buffer \"" + view.id() + "\" in the plan");
  if (host.size() != view.bytes.size())
    return makeError(
        "copyInto \"" + view.id() + "\": " + std::to_string(host.size()) +
        " bytes given, the shard has " + std::to_string(view.bytes.size()));
  if (impl->onDevice())
    return impl->toDevice(it->second, host);
  if (!host.empty())
    std::memcpy(impl->buffers[it->second].data.data(), host.data(),
                host.size());
  return {};
}

Device *Session::device() const { return impl->options.device.get(); }

namespace detail {
using SpanClock = std::chrono::steady_clock;
using Span = std::pair<SpanClock::time_point, SpanClock::time_point>;

/// Total length of the union of intervals (sorted in place).
double unionSeconds(std::vector<Span> &spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0;
  SpanClock::time_point start{}, end{};
  bool open = false;
  for (const Span &s : spans) {
    if (open && s.first <= end) {
      end = std::max(end, s.second);
      continue;
    }
    if (open)
      total += std::chrono::duration<double>(end - start).count();
    start = s.first;
    end = s.second;
    open = true;
  }
  if (open)
    total += std::chrono::duration<double>(end - start).count();
  return total;
}

/// Where a step's time went, from each instruction's span. `streams` and
/// `commSequence` give the orders an instruction waits on besides its deps
/// (StepProfile::instructionReady).
StepProfile profileOf(const std::vector<Bound> &program,
                      const std::vector<Span> &spans,
                      const std::vector<std::vector<int>> &streams,
                      const std::vector<std::vector<int>> &commSequence,
                      SpanClock::time_point start, SpanClock::time_point end) {
  StepProfile p;
  p.wall = std::chrono::duration<double>(end - start).count();
  std::vector<Span> comm, work, all;
  for (size_t i = 0; i < program.size(); ++i) {
    const Span &s = spans[i];
    double seconds = std::chrono::duration<double>(s.second - s.first).count();
    plan::OpKind op = program[i].in->op;
    if (op == plan::OpKind::Free || op == plan::OpKind::Wait)
      continue;
    all.push_back(s);
    if (isCollective(op)) {
      comm.push_back(s);
      continue;
    }
    work.push_back(s);
    (op == plan::OpKind::Compute ? p.callbacks : p.kernels) += seconds;
  }
  p.collectives = unionSeconds(comm);
  double busy = unionSeconds(all);
  p.exposedCollectives = std::max(0.0, busy - unionSeconds(work));
  p.overhead = std::max(0.0, p.wall - busy);
  p.instructionStart.assign(program.size(), 0.0);
  p.instructionEnd.assign(program.size(), 0.0);
  for (size_t i = 0; i < program.size() && i < spans.size(); ++i) {
    const Span &s = spans[i];
    if (s.first == SpanClock::time_point{} || s.second < s.first)
      continue; // did not run
    p.instructionStart[i] =
        std::chrono::duration<double>(s.first - start).count();
    p.instructionEnd[i] =
        std::chrono::duration<double>(s.second - start).count();
  }
  // Ready: the latest end of what the executor made it wait for.
  std::vector<int> before(program.size(), -1); // previous on its stream
  for (const std::vector<int> &stream : streams)
    for (size_t k = 1; k < stream.size(); ++k)
      before[size_t(stream[k])] = stream[k - 1];
  p.instructionReady.assign(program.size(), 0.0);
  for (size_t i = 0; i < program.size() && i < spans.size(); ++i) {
    const Bound &b = program[i];
    if (p.instructionEnd[i] == 0 && p.instructionStart[i] == 0)
      continue;
    double ready = 0;
    auto after = [&](int j) {
      if (j >= 0 && size_t(j) < program.size())
        ready = std::max(ready, p.instructionEnd[size_t(j)]);
    };
    after(before[i]);
    for (int d : b.deps)
      after(d);
    if (b.comm >= 0 && b.sequence > 0)
      after(commSequence[size_t(b.comm)][size_t(b.sequence - 1)]);
    p.instructionReady[i] = std::min(ready, p.instructionStart[i]);
  }
  return p;
}
} // namespace detail

PassOutcome
Session::Impl::runPass(StepState &state,
                       const std::vector<std::vector<int>> &order, bool soft,
                       const std::function<Result<void>(Bound &)> &run) {
  state.running.assign(state.done.size(), 0);
  // One condition variable per stream, woken only when the instruction that
  // stream waits for has become ready (or the pass failed): a finished
  // instruction wakes no thread that would go straight back to sleep. On
  // oversubscribed cores each needless wake-up can preempt the thread that
  // finished, which then waits a scheduler slice before its next
  // instruction (docs/runtime.md, "Waking only the stream that can run").
  std::mutex mutex;
  std::vector<std::condition_variable> wake(order.size());
  // Per stream: the instruction it waits for, -1 while it runs or is done.
  std::vector<int> waitingFor(order.size(), -1);
  PassOutcome out;
  auto ready = [&](const Bound &b) {
    if (out.failure)
      return true;
    for (int d : b.deps)
      if (!state.done[size_t(d)])
        return false;
    return b.comm < 0 ||
           commSequence[size_t(b.comm)][size_t(state.turn[size_t(b.comm)])] ==
               b.index;
  };
  // Under `mutex`: the streams other than `self` whose instruction is now
  // ready (all of them after a failure). Notified after the lock is released.
  auto readyStreams = [&](size_t self) {
    std::vector<size_t> runnable;
    for (size_t s = 0; s < waitingFor.size(); ++s)
      if (s != self && waitingFor[s] >= 0 &&
          ready(program[size_t(waitingFor[s])]))
        runnable.push_back(s);
    return runnable;
  };
  auto wakeAll = [&] {
    for (std::condition_variable &cv : wake)
      cv.notify_all();
  };
  auto deadline = [&] { return Clock::now() + options.timeout; };
  auto faultTolerantComm = [&](const Bound &b) {
    return soft && b.comm >= 0 &&
           plan.communicators[size_t(b.comm)].faultTolerant;
  };
  auto whereOf = [&](const Bound &b) {
    std::string where = describe(b);
    if (b.comm >= 0) {
      const plan::Communicator &c = plan.communicators[size_t(b.comm)];
      std::string ranks;
      for (int64_t r : c.ranks)
        ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      where = "collective #" + std::to_string(b.sequence + 1) + " of step " +
              std::to_string(steps + 1) + " on communicator \"" + c.id +
              "\" (ranks [" + ranks + "]), " + where;
    }
    return "rank " + std::to_string(plan.rank) + ": " + where;
  };

  // The communicator a stuck wait of `b` depends on: b's own, or the one
  // whose next collective comes first in program order.
  auto pendingComm = [&](const StepState &st, const Bound &b) {
    if (b.comm >= 0)
      return b.comm;
    int best = -1, first = INT32_MAX;
    for (size_t c = 0; c < commSequence.size(); ++c) {
      size_t turn = size_t(st.turn[c]);
      if (turn < commSequence[c].size() && commSequence[c][turn] < first) {
        first = commSequence[c][turn];
        best = int(c);
      }
    }
    return best;
  };

  auto worker = [&](size_t self) {
    for (int index : order[self]) {
      Bound &b = program[size_t(index)];
      bool skip = false;
      {
        std::unique_lock<std::mutex> lock(mutex);
        waitingFor[self] = index;
        bool first = true;
        bool inTime = false;
        while (true) {
          inTime = wake[self].wait_until(lock, deadline(), [&] {
            bool now = ready(b);
            state.needlessWakeups += !now && !first;
            first = false;
            return now;
          });
          // While some instruction runs (a collective waiting for a peer,
          // perhaps the one this waits for through others) its own timeout
          // reports, naming the communicator and the peers: a better error
          // than this wait's. Only a wait with nothing running is stuck.
          // Fault-tolerant sessions keep the plain timeout: their protocol
          // (docs/fault-tolerance.md) was proven with it, and a cut-off
          // group must give up its step on time.
          if (ft && !inTime)
            break;
          bool anyRunning = false;
          for (char r : state.running)
            anyRunning = anyRunning || r;
          if (inTime || !anyRunning)
            break;
        }
        waitingFor[self] = -1;
        if (!inTime) {
          std::string waiting;
          for (int d : b.deps)
            if (!state.done[size_t(d)])
              waiting += (waiting.empty() ? "" : ", ") +
                         ("\"" + program[size_t(d)].in->id + "\"");
          out.failure = makeError(
              describe(b) + " waited " +
              std::to_string(options.timeout.count() / 1000.0) + " s for " +
              (waiting.empty()
                   ? "its turn on communicator \"" + b.in->comm + "\""
                   : "its deps " + waiting));
          // Where the members of the communicator that holds this rank up
          // stand: b's own, or that of the first collective still to come.
          diagnosePeers(&state, pendingComm(state, b), *out.failure);
          lock.unlock();
          wakeAll();
          return;
        }
        if (out.failure)
          return;
        // After a fault-tolerant failure the step cannot commit: its
        // later fault-tolerant collectives are skipped (their peers may be
        // gone), everything else runs so that this rank's own group's
        // collectives still complete for its peers.
        skip = faultTolerantComm(b) && out.faultTolerantFailure.has_value();
        state.running[size_t(index)] = 1;
      }
      state.spans[size_t(index)].first = Clock::now();
      Result<void> ok = skip ? Result<void>() : run ? run(b) : enqueue(b);
      state.spans[size_t(index)].second = Clock::now();
      // A fault_tolerant collective skipped or failed leaves its outputs
      // unwritten, and the part of the step before the commit may read
      // them (a tensor-parallel norm's gradient is summed after its
      // replicas' all-reduce): they are made live, zeroed, so that the pass
      // runs on to the vote. The step cannot commit; nothing of it is kept.
      if ((skip || !ok) && faultTolerantComm(b))
        for (int x : b.outputs)
          if (Result<void> made =
                  ensure(x, dev->streams[size_t(
                                dev->graph.steps[size_t(b.index)].stream)]);
              !made && ok)
            ok = made;
      std::unique_lock<std::mutex> lock(mutex);
      if (!ok) {
        if (faultTolerantComm(b)) {
          if (!out.faultTolerantFailure)
            out.faultTolerantFailure = ok.error().within(whereOf(b));
        } else {
          if (!out.failure) {
            out.failure = ok.error().within(whereOf(b));
            if (b.comm >= 0)
              diagnosePeers(&state, b.comm, *out.failure);
            reportFailure(b.comm >= 0, *out.failure);
          }
          lock.unlock();
          wakeAll();
          return;
        }
      }
      state.done[size_t(index)] = 1;
      state.running[size_t(index)] = 0;
      if (b.comm >= 0)
        ++state.turn[size_t(b.comm)];
      std::vector<size_t> runnable = readyStreams(self);
      lock.unlock();
      for (size_t s : runnable)
        wake[s].notify_one();
    }
  };

  std::vector<std::thread> threads;
  for (size_t s = 1; s < order.size(); ++s)
    threads.emplace_back(worker, s);
  if (!order.empty())
    worker(0);
  for (std::thread &t : threads)
    t.join();
  return out;
}

Result<void> Session::step() {
  Impl &m = *impl;
  if (m.broken)
    return makeError("an earlier step failed; this session cannot run more");
  if (m.closed)
    return makeError("the session is closed");
  if (m.ft)
    return m.faultTolerantStep();
  size_t n = m.program.size();
  Clock::time_point stepStart = Clock::now();
  StepState state{
      std::vector<std::pair<Clock::time_point, Clock::time_point>>(n),
      std::vector<char>(n, 0), std::vector<int>(m.commSequence.size(), 0)};
  PassOutcome out = m.runPass(state, m.streams, /*soft=*/false);
  // The step ends when the device is done with it (on host buffers, it is
  // already); report the first failure, the host's (enqueueing) before the
  // device's.
  Result<void> done = m.synchronizeDevice();
  if (!out.failure && !done)
    out.failure = done.error().within("rank " + std::to_string(m.plan.rank) +
                                      ": step " + std::to_string(m.steps + 1));
  if (out.failure) {
    m.broken = true;
    return *out.failure;
  }
  ++m.steps;
  m.profile = profileOf(m.program, state.spans, m.streams, m.commSequence,
                        stepStart, Clock::now());
  m.profile.needlessWakeups = state.needlessWakeups;
  m.reportOptimizerStep(m.profile);
  if (auto timed = m.readDeviceTiming(m.profile); !timed) {
    m.broken = true;
    return timed.error().within("rank " + std::to_string(m.plan.rank) +
                                ": step " + std::to_string(m.steps));
  }
  if (m.trace && m.trace->wants(m.steps)) {
    Clock::time_point recording = Clock::now();
    MESHPLAN_TRY(m.trace->record(m.steps, stepStart, m.profile));
    m.profile.traceRecording =
        std::chrono::duration<double>(Clock::now() - recording).count();
  }
  return {};
}

Result<void> Session::Impl::traceAttempt(int64_t step, int64_t epoch,
                                         bool committed,
                                         Clock::time_point start,
                                         const StepState &state) {
  if (!trace || !trace->wants(step))
    return {};
  Clock::time_point recording = Clock::now();
  if (!trace->knowsEpoch(epoch)) {
    // The epoch's fault_tolerant communicators over its live groups, as
    // this rank creates them (groupSpecOf), so that merge links only
    // members of one epoch's group.
    std::map<std::string, std::vector<int64_t>> members;
    for (size_t c = 0; c < plan.communicators.size(); ++c)
      if (plan.communicators[c].faultTolerant)
        members[plan.communicators[c].id] = groupSpecOf(int(c)).ranks;
    trace->setEpochMembers(epoch, std::move(members));
  }
  // A committed step's profile is the session's; a discarded attempt's
  // (its part before the commit) is made here, only when traced.
  StepProfile discarded;
  if (!committed)
    discarded = profileOf(program, state.spans, streams, commSequence, start,
                          Clock::now());
  MESHPLAN_TRY(trace->record(step, start, committed ? profile : discarded,
                             epoch, committed));
  if (committed)
    profile.traceRecording =
        std::chrono::duration<double>(Clock::now() - recording).count();
  return {};
}

int64_t Session::stepsDone() const { return impl->steps; }

void Session::Impl::reportOptimizerStep(StepProfile &p) {
  p.gradNorm = gradNorm;
  p.clipCoefficient = clipCoefficient;
  p.updateSkipped = skipUpdates;
  gradNorm.reset();
  clipCoefficient = 1.0f;
  skipUpdates = false;
}

std::optional<double> Session::lr() const {
  if (!impl->plan.optimizer)
    return std::nullopt;
  return impl->stepLr();
}

Result<void> Session::setLr(std::optional<double> lr) {
  if (!impl->plan.optimizer)
    return makeError("the plan has no optimizer, so no learning rate");
  if (lr && !(*lr >= 0 && *lr <= 1e6))
    return makeError("a learning rate must be in [0, 1e6], got " +
                     std::to_string(*lr));
  impl->lrOverride = lr;
  return {};
}

Result<void> Session::resumeAfter(int64_t steps) {
  if (steps < 0)
    return makeError("resumeAfter: steps must be >= 0, not " +
                     std::to_string(steps));
  if (impl->steps != 0)
    return makeError("resumeAfter: this session has already run " +
                     std::to_string(impl->steps) + " steps");
  impl->steps = steps;
  return {};
}

const StepProfile &Session::lastStepProfile() const { return impl->profile; }

Result<TensorView> Session::tensor(const std::string &id) {
  auto it = impl->bufferIds.find(id);
  if (it == impl->bufferIds.end() || !impl->buffers[it->second].persistent)
    return makeError("no persistent buffer \"" + id + "\" in the plan");
  return impl->view(it->second);
}

std::vector<TensorView> Session::parameters() {
  std::vector<TensorView> out;
  for (size_t i = 0; i < impl->buffers.size(); ++i)
    if (impl->buffers[i].meta->kind == BufferKind::ParamShard)
      out.push_back(impl->view(static_cast<int>(i)));
  return out;
}

std::vector<TensorView> Session::optimizerState() {
  std::vector<TensorView> out;
  for (size_t i = 0; i < impl->buffers.size(); ++i)
    if (impl->buffers[i].meta->kind == BufferKind::OptimizerState)
      out.push_back(impl->view(static_cast<int>(i)));
  return out;
}

Result<Communicator *> Session::trainerCommunicator(const std::string &id) {
  std::lock_guard<std::mutex> lock(impl->commMutex);
  auto it = impl->trainerComms.find(id);
  if (it != impl->trainerComms.end())
    return it->second.get();
  const plan::Communicator *c = impl->plan.findCommunicator(id);
  if (!c)
    return makeError("the plan has no communicator \"" + id + "\"");
  GroupSpec g{"trainer/" + c->id, c->color, c->ranks, c->key, 0};
  g.incarnation = impl->incarnation();
  auto comm = impl->backend->createCommunicator(g);
  if (!comm)
    return comm.error();
  int index = int(c - impl->plan.communicators.data());
  impl->trainerComms[id] =
      impl->watchTrainerCommunicator(std::move(*comm), index);
  return impl->trainerComms[id].get();
}

Result<Communicator *> Session::planCommunicator(const std::string &id) {
  for (size_t i = 0; i < impl->plan.communicators.size(); ++i)
    if (impl->plan.communicators[i].id == id)
      return impl->communicator(static_cast<int>(i));
  return makeError("the plan has no communicator \"" + id + "\"");
}

const plan::Plan &Session::plan() const { return impl->plan; }
int64_t Session::rank() const { return impl->plan.rank; }

std::vector<std::string> Session::createdCommunicators() const {
  std::lock_guard<std::mutex> lock(impl->commMutex);
  std::vector<std::string> out;
  for (size_t i = 0; i < impl->comms.size(); ++i)
    if (impl->comms[i])
      out.push_back(impl->plan.communicators[i].id);
  return out;
}

} // namespace meshplan::runtime
