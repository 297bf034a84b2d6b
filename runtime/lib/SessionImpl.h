//===- SessionImpl.h - A session's state, shared by its executors -*- C++
//-*-===//
//
// Internal to the runtime. Session::Impl holds the bound plan (buffers,
// instructions resolved to buffer indices, per-collective boxes), the
// backend and its communicators, and the device the plan runs on
// (DeviceState: the inline host device for host buffers). Binding.cpp binds
// the plan, Execution.cpp runs its instructions on the device,
// ExecutionSetUp.cpp sets the device up, Session.cpp runs the passes of a
// step, FaultTolerance.cpp and SessionCheckpoint.cpp the rest.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_LIB_SESSIONIMPL_H
#define MESHPLAN_RUNTIME_LIB_SESSIONIMPL_H

#include "meshplan/Runtime/Session.h"

#include "DeviceMemory.h"
#include "StepTrace.h"
#include "StreamGraph.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/MeshView.h"
#include "meshplan/Runtime/Membership.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace meshplan::runtime {

using plan::Instruction;

/// The device of sessions without one (HostDevice.cpp):
/// every enqueued call runs at once on host memory, on the calling thread
/// (Device::completesOnEnqueue).
std::shared_ptr<Device> createInlineHostDevice();

namespace detail {

struct BufferState {
  const plan::Buffer *meta = nullptr;
  Layout layout;
  int64_t numel = 0;
  std::vector<std::byte> data;
  bool live = false;
  bool persistent = false;
};

/// A buffer's length in bytes.
inline size_t bytesOf(const BufferState &s) {
  return size_t(s.numel * plan::dtypeBytes(s.meta->dtype));
}

/// One (input, output) pair of a collective, resolved.
struct Pair {
  int in = -1, out = -1;
  /// Padded chunk shape and its offset in the packed block (elements).
  std::vector<int64_t> padded;
  int64_t chunk = 0, at = 0;
  /// The box each member holds of the layout the chunk packs (all-gather:
  /// the input's; reduce-scatter: the output's; others: this rank's only).
  std::vector<ShardBox> members;
  /// all_to_all: every member's input and output boxes.
  std::vector<ShardBox> inBoxes, outBoxes;
  /// permute: the keys this rank sends its shard to and receives from.
  int64_t sendTo = -1, recvFrom = -1;
};

struct Bound {
  const Instruction *in = nullptr;
  int index = 0;
  std::vector<int> inputs, outputs, deps;
  int comm = -1;     ///< index into the plan's communicators
  int sequence = -1; ///< position among its communicator's collectives
  std::vector<Pair> pairs;
  /// The buffers already are the collective's packed blocks (one pair, one
  /// dtype, no padding, member boxes contiguous in key order): no staging.
  bool direct = false;
};

using Clock = std::chrono::steady_clock;

/// The fault-tolerant side of a session (docs/fault-tolerance.md).
struct FaultTolerance {
  std::unique_ptr<Membership> membership;
  int axis = -1;          ///< the managed axis: its coordinates are the groups
  int group = 0;          ///< this rank's coordinate on it
  int64_t numGroups = 0;  ///< its size
  int64_t groupRanks = 0; ///< ranks per group
  /// The ranks along the managed axis with this rank's other coordinates,
  /// by group (core's groupOf): where its data's and its heal's peers are.
  std::vector<int64_t> alongAxis;
  Quorum quorum; ///< the epoch this rank trains in (0: none yet)
  /// The last epoch ensureQuorum examined: epochs are walked in order.
  int64_t walked = 0;
  /// An epoch the watcher gave up (a member died and no quorum can form
  /// without it): its rendezvous end too (GroupSpec::cancelled).
  std::shared_ptr<std::atomic<int64_t>> abandonedEpoch =
      std::make_shared<std::atomic<int64_t>>(0);
  /// Per instruction: runs after the commit (an optimizer update, or after
  /// one in its stream's, its communicator's or its deps' order).
  std::vector<char> afterCommit;
  /// Per stream: the instructions before the commit, and after it.
  std::vector<std::vector<int>> beforeOrder, afterOrder;
  std::vector<int64_t> dataRanks;
  /// Batch shares of missing groups run one pass each, and the
  /// fault_tolerant all-reduces sum the shares in group order
  /// (Communicator::allReduceShares): the sums of the full job, bit for
  /// bit. Possible when the part before the commit writes no persistent
  /// buffer, and its fault_tolerant collectives are sum or avg all-reduces
  /// over the managed axis alone whose results nothing before the commit
  /// reads (docs/fault-tolerance.md, "Exact sums").
  bool sharesApart = false;
  /// This step, with groups missing: per member of the fault_tolerant
  /// groups (live groups, ascending), the groups whose shares it brings.
  std::vector<std::vector<int64_t>> shareLayout;
  /// The pass running (an index into dataRanks), and each deferred
  /// all-reduce's packed input of the earlier passes, by instruction.
  size_t sharePass = 0;
  std::unique_ptr<std::mutex> stashMutex = std::make_unique<std::mutex>();
  std::map<int, std::vector<std::vector<std::byte>>> shareStash;
  int64_t discarded = 0, heals = 0;
  /// The last heal of this epoch failed: this rank's steps cannot commit.
  std::optional<Error> healFailure;
};

/// One attempt at a step: which instructions completed, each
/// communicator's next turn, and every instruction's [start, end).
struct StepState {
  std::vector<std::pair<Clock::time_point, Clock::time_point>> spans;
  std::vector<char> done;
  std::vector<int> turn;
  /// Instructions being executed now (sized by runPass; under its mutex).
  std::vector<char> running{};
  /// Times a stream thread woke and found its instruction not ready
  /// (StepProfile::needlessWakeups).
  int64_t needlessWakeups = 0;
};

/// What a pass over (part of) the program came to.
struct PassOutcome {
  /// Fatal: the session is unusable.
  std::optional<Error> failure;
  /// Fault-tolerant sessions: a collective of a fault_tolerant communicator
  /// failed; the pass went on without the later ones, and the step cannot
  /// commit.
  std::optional<Error> faultTolerantFailure;
};

/// The intersection of two boxes (empty when they do not overlap).
ShardBox intersect(const ShardBox &a, const ShardBox &b);
bool sameBox(const ShardBox &a, const ShardBox &b);
/// Row-major index of `offset` inside a packed box, and whether the region
/// [offset, offset + size) is one contiguous run of it.
std::pair<int64_t, bool> packedStart(const plan::Buffer &b,
                                     const std::vector<int64_t> &offset,
                                     const std::vector<int64_t> &size);
/// The float8 scale of a buffer with one (1 otherwise), from its amax.
float scaleOf(const std::vector<BufferState> &buffers,
              const std::unordered_map<std::string, int> &ids,
              const plan::Buffer &b);

/// Where a step's time went, from each instruction's [start, end)
/// (Session.cpp). `streams` and `commSequence` give the orders an instruction
/// waits on besides its deps (StepProfile::instructionReady).
StepProfile profileOf(
    const std::vector<Bound> &program,
    const std::vector<std::pair<Clock::time_point, Clock::time_point>> &spans,
    const std::vector<std::vector<int>> &streams,
    const std::vector<std::vector<int>> &commSequence, Clock::time_point start,
    Clock::time_point end);

/// Whether a sorted list of replica groups holds `g`.
inline bool containsGroup(const std::vector<int> &groups, int g) {
  return std::binary_search(groups.begin(), groups.end(), g);
}

/// The device a session's plan runs on (ExecutionSetUp.cpp): where its
/// buffers are and what orders its streams. Host sessions: the inline host
/// device, no arena (each BufferState holds its bytes), empty stream and
/// event handles, no packing blocks (each collective allocates its own).
struct DeviceState {
  std::shared_ptr<Device> device;
  std::unique_ptr<DeviceArena> arena; ///< null: host buffers
  /// Which events each instruction waits for and records.
  StreamGraph graph;
  std::vector<DeviceStream> streams; ///< per plan stream
  std::vector<DeviceEvent> events;   ///< per graph event
  /// SessionOptions::deviceTiming: timing events recorded before and after
  /// each instruction's work, per program index.
  std::vector<DeviceEvent> timingBefore, timingAfter;
  /// Per plan stream: its collectives' packing blocks, in device memory
  /// (stream order serializes their uses).
  std::vector<std::byte *> sendScratch, recvScratch;
  /// A device float per (instruction, buffer) whose float8 scale the
  /// instruction computes from the buffer's amax.
  std::map<std::pair<int, int>, float *> scales;
  /// Device allocations besides the arena, released with the state.
  std::vector<void *> allocations;
  ~DeviceState();
};

} // namespace detail

using namespace detail;

struct Session::Impl {
  plan::Plan plan;
  SessionOptions options;
  std::shared_ptr<const Mesh> mesh;
  std::optional<View> root;
  std::vector<BufferState> buffers;
  std::unordered_map<std::string, int> bufferIds;
  std::vector<Bound> program;
  std::vector<std::vector<int>> streams; ///< instruction indices per stream
  std::vector<std::vector<int>> commSequence; ///< collectives per comm
  std::unique_ptr<Backend> backend;
  /// SessionOptions::trace: records the traced steps (StepTrace.h).
  std::unique_ptr<StepTraceRecorder> trace;
  std::vector<std::unique_ptr<Communicator>> comms; ///< lazily, per comm
  std::map<std::string, std::unique_ptr<Communicator>> trainerComms;
  std::mutex commMutex;
  ComputeCallback fallback;
  std::map<std::pair<std::string, std::string>, ComputeCallback> callbacks;
  int64_t steps = 0;
  /// Session::setLr: the rate of every later step instead of the plan's.
  std::optional<double> lrOverride;
  /// This step's gradient clipping, until reportOptimizerStep copies it into
  /// the profile (clip_grad writes them; the updates read skipUpdates).
  std::optional<double> gradNorm;
  float clipCoefficient = 1.0f;
  bool skipUpdates = false;
  int64_t checkpointsSaved = 0; ///< numbers the store keys of each save
  /// loadCheckpoint's staging region, kept for the next load (stagingFor).
  std::shared_ptr<std::byte> loadStaging;
  size_t loadStagingBytes = 0;
  StepProfile profile;
  bool broken = false;
  bool closed = false;
  Session *self = nullptr;
  std::optional<FaultTolerance> ft;
  /// Where the plan runs (setUpExecutor; set for every open session).
  std::unique_ptr<DeviceState> dev;
  /// The plan runs on SessionOptions::device (not on host buffers).
  bool onDevice() const { return options.device != nullptr; }

  Result<void> bind();
  /// Runs the instructions of `order` (per stream), continuing `state`.
  /// With `soft`, a fault_tolerant communicator's failure is recorded, not
  /// fatal.
  /// `run` executes one instruction (default: enqueue()).
  PassOutcome runPass(StepState &state,
                      const std::vector<std::vector<int>> &order, bool soft,
                      const std::function<Result<void>(Bound &)> &run = {});
  Result<void> setUpFaultTolerance();
  Result<void> faultTolerantStep();
  /// Records a fault-tolerant attempt of step `step` in epoch `epoch` when
  /// it is traced (SessionOptions::trace): a committed one from `profile`,
  /// a discarded one from `state`'s spans since `start`.
  Result<void> traceAttempt(int64_t step, int64_t epoch, bool committed,
                            Clock::time_point start, const StepState &state);
  /// Returns once this rank is in the store's current quorum, with that
  /// epoch adopted (and any joining group healed). `moveOn`: the adopted
  /// epoch failed; wait for (or install) a later one.
  Result<void> ensureQuorum(bool moveOn);
  Result<void> adopt(const EpochRecord &rec);
  /// An error once the launcher has recorded that a replica group completed
  /// the job (Membership::jobFinished): a rank still waiting to rejoin then
  /// has nothing left to rejoin.
  Result<void> checkJobFinished();
  /// The heal's communicator while a heal runs (under commMutex): the
  /// watcher aborts it when the epoch moves.
  Communicator *healComm = nullptr;
  Result<void> heal(const Quorum &q, const std::vector<int> &sources,
                    const std::vector<int> &joiners);
  /// The commit vote's outcome: true = commit.
  Result<bool> awaitCommit(int64_t epoch, int64_t step);
  /// Runs beside the part of a step before its commit: installs the next
  /// epoch once a group of `epoch` is dead, and aborts `epoch`'s
  /// fault_tolerant communicators once the epoch has moved, until `stop`.
  struct Stop {
    std::mutex mutex;
    std::condition_variable wake;
    bool stopped = false;
  };
  void watchEpoch(int64_t epoch, Stop &stop);
  GroupSpec groupSpecOf(int comm);
  int64_t incarnation() const {
    return options.faultTolerance ? options.faultTolerance->incarnation : 0;
  }
  Result<void> bindCollective(Bound &b);

  // The executor (Execution.cpp, ExecutionSetUp.cpp).
  /// Gives the session its DeviceState: the inline host device, or
  /// SessionOptions::device with the arena, streams, events, scratch and
  /// scale slots, the persistent buffers zeroed.
  Result<void> setUpExecutor();
  Result<void> setUpStreams(DeviceState &state);
  /// Runs one instruction on its stream: the stream graph's waits, the
  /// instruction (timed with SessionOptions::deviceTiming), its record.
  Result<void> enqueue(Bound &b);
  Result<void> execute(Bound &b, DeviceStream s);
  Result<void> runCollective(Bound &b, DeviceStream s);
  Result<void> runTransfer(Bound &b, DeviceStream s);
  Result<void> runCompute(Bound &b, DeviceStream s);
  Result<void> runOptimizer(Bound &b, DeviceStream s);
  Result<void> runLocal(Bound &b, DeviceStream s);
  /// A collective's packing blocks in bytes: (send, receive).
  std::pair<size_t, size_t> stagingBytes(const Bound &b) const;
  /// Computes buffer's float8 scale for instruction b (from its amax, into
  /// the instruction's slot) and returns where it lands (null: the buffer
  /// has no scale).
  Result<const float *> scaleFor(const Bound &b, int buffer, DeviceStream s);
  /// Where a buffer's bytes are (host memory on host buffers).
  std::byte *address(int buffer);
  /// Makes a buffer about to be written live: zeroed (on host buffers,
  /// allocated so).
  Result<void> ensure(int buffer, DeviceStream s);
  /// Host buffers: allocates (zeroed) a buffer about to be written.
  void ensureOnHost(int buffer);
  /// Buffer `from`'s bytes into buffer `into`, which becomes live.
  Result<void> copyBuffer(int into, int from, DeviceStream s);
  /// `free`: the buffer is dead (on host buffers, its bytes released).
  void releaseBuffer(int buffer);
  /// Waits for every stream (and device communicator) of the session.
  Result<void> synchronizeDevice();
  /// The device's own spans of the last step (deviceTiming), into profile.
  Result<void> readDeviceTiming(StepProfile &profile);
  /// Whether deviceTiming holds the stream around this instruction: the
  /// runtime's own kernels, whose enqueueing never waits for the device.
  static bool holdsForTiming(const Bound &b);
  /// Session::initParameters on a device: each shard filled in host memory
  /// by `init`, then copied; optimizer state zeroed.
  Result<void>
  initOnDevice(const std::function<Result<void>(TensorView &)> &init);
  /// Host bytes into a buffer's device memory, and device bytes out to the
  /// host; both wait for the copy.
  Result<void> toDevice(int buffer, std::span<const std::byte> host);
  Result<void> fromDevice(const std::byte *device, std::span<std::byte> host);
  Result<Communicator *> communicator(int comm);
  /// A compute instruction's call without its views, and running the
  /// callback registered for it.
  ComputeCall callOf(const Bound &b) const;
  Result<void> invoke(ComputeCall &call);
  /// The rate of the coming step: setLr's, else the plan's schedule.
  double stepLr() const;
  void reportOptimizerStep(StepProfile &p);
  std::string describe(const Bound &b) const;
  /// Without fault tolerance, on the first failure of a step: a failure of
  /// this rank's own (a callback, a kernel) is reported in the store for
  /// the peers; a failed collective is explained by a peer's report when
  /// there is one (`error` then names the rank that failed first and its
  /// instruction). Either way the communicators are aborted, so that
  /// peers waiting on this rank fail now instead of at their timeout.
  void reportFailure(bool onCommunicator, Error &error);
  /// SessionDiagnosis.cpp: at a communicator's creation, its members
  /// compare the collectives each will issue on it; an error names the
  /// first that differs.
  Result<void> checkCollectiveSequence(int comm, Communicator &c);
  /// The store key where `rank` writes where it stands in `step` when its
  /// step fails on a peer.
  std::string progressKey(int64_t step, int64_t rank) const;
  /// After a collective of `comm` failed, or a wait timed out there: writes
  /// this rank's position, reads the other members' (waiting briefly for
  /// them) and appends to `error` who has not arrived and where the others
  /// stand. A null `state`: the trainer's collective on the communicator's
  /// trainer twin failed (in a callback or between steps). Not in
  /// fault-tolerant sessions.
  void diagnosePeers(const StepState *state, int comm, Error &error);
  /// diagnosePeers' text (without brackets; empty: nothing to add).
  std::string diagnosisOf(const StepState *state, int comm);
  /// The session's one diagnosis: started by the first failure, read by
  /// any other that comes while it runs or after.
  std::mutex diagnosisMutex;
  std::condition_variable diagnosisReady;
  bool diagnosisStarted = false;
  std::optional<std::string> diagnosis;
  /// Set when a trainer's collective failed (watchTrainerCommunicator): the
  /// callback's error that follows is a consequence of a peer's, not a
  /// cause, and reportFailure does not publish it as the step's failure.
  std::atomic<bool> trainerCollectiveFailed{false};
  /// diagnosePeers: "; it is inside "ID" with ranks [...], where rank R
  /// reported nothing ..." for `member`'s group of communicator `commId`,
  /// waiting until `until` for the group's members to report.
  std::string holdUp(const std::string &commId, int64_t member, int64_t step,
                     Clock::time_point until);
  std::unique_ptr<Communicator>
  watchTrainerCommunicator(std::unique_ptr<Communicator> comm, int index);
  /// Set by reportFailure: a communicator whose rendezvous is still waiting
  /// (it holds commMutex, so abort cannot reach it) gives up through its
  /// GroupSpec::cancelled.
  std::atomic<bool> stepFailed{false};
  TensorView view(int buffer);
  bool sharing(const Bound &b) const;
  Result<bool> allReduceShare(const Bound &b, Communicator &c, std::byte *data,
                              int64_t count, DType wire);
};
} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_LIB_SESSIONIMPL_H
