//===- Session.h - One rank executing its plan ----------------------------===//
//
// The C++ embedding API. A trainer opens a Session on its rank's plan, fills
// the parameter shards, registers compute callbacks and calls step():
//
//   auto s = Session::open(planPath, sessionOptionsFromEnv().value());
//   s->initParameters([](TensorView &shard) { ... fill from global coords });
//   s->onCompute([](ComputeCall &call) { ... forward/backward of call.unit });
//   for (...) s->step();
//
// The session owns the parameter shards, gradients, optimizer state and
// gathered buffers, all sized from the plan; the trainer owns activations and
// the model's math. Callbacks receive spans with their global boxes.
//
// The plan is the contract: the session runs its instructions in the plan's
// order with the plan's counts, one worker thread per stream, honouring deps,
// and issues the collectives of one communicator in program order. It checks
// at open what it can: version (the reader), rank, world size, and that every
// collective's count equals what its buffers pack to.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_SESSION_H
#define MESHPLAN_RUNTIME_SESSION_H

#include "meshplan/Checkpoint/Cast.h"
#include "meshplan/Checkpoint/Checkpoint.h"
#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Runtime/Backend.h"
#include "meshplan/Runtime/Device.h"
#include "meshplan/Runtime/Store.h"

#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace meshplan::plan {
class PreparedTemplate;
}

namespace meshplan::runtime {

/// A buffer as a callback sees it: its bytes and its place in the tensor.
struct TensorView {
  const plan::Buffer *buffer = nullptr; ///< id, dtype, shapes, box, tensor
  std::span<std::byte> bytes;
  /// float8 buffers: the tensorwise scale (value = stored / scale).
  /// Sessions on a device: unset; see deviceScale.
  std::optional<float> scale;
  /// Sessions on a device (SessionOptions::device): `bytes` is device
  /// memory, and a float8 buffer's scale is the float at deviceScale, in
  /// device memory, valid for work enqueued on the call's stream.
  bool onDevice = false;
  const float *deviceScale = nullptr;

  const std::string &id() const { return buffer->id; }
  /// The model tensor this buffer holds a version of ("" for none).
  const std::string &tensor() const { return buffer->tensor; }
  plan::DType dtype() const { return buffer->dtype; }
  const std::vector<int64_t> &globalShape() const {
    return buffer->globalShape;
  }
  const std::vector<int64_t> &offset() const { return buffer->offset; }
  const std::vector<int64_t> &localShape() const { return buffer->localShape; }
  int64_t numElements() const;
  template <typename T> std::span<T> as() const {
    return {reinterpret_cast<T *>(bytes.data()), bytes.size() / sizeof(T)};
  }
};

class Session;

/// One `compute` instruction: run forward or backward of `unit`.
struct ComputeCall {
  /// "forward" or "backward"; a zero-bubble pipeline's split backward is
  /// "backward_input" then "backward_weight".
  std::string phase;
  std::string unit; ///< the FSDP unit, e.g. "layers.3"
  int64_t microbatch = 0;
  int64_t step = 1; ///< 1-based, as the optimizer counts
  /// The parameters the instruction reads (gathered, or local shards), in
  /// plan order; float8 ones carry their scale. Under pipeline parallelism
  /// the activations it reads (a stage's input, an output gradient) come
  /// among them too, in the plan's order (docs/pipeline.md, "Planning").
  std::vector<TensorView> params;
  /// backward: the gradients it writes. The callback ADDS its contribution:
  /// they hold zeros at the first microbatch and the sum of the earlier
  /// microbatches after (gradient accumulation). A pipeline stage's output
  /// activation (forward) or its input's gradient (backward) comes among
  /// them, in the plan's order.
  std::vector<TensorView> grads;
  /// Fault tolerance with replica groups missing: the batch shares this
  /// call processes, as indices into FaultToleranceState::dataRanks (the
  /// ranks whose data they are). One share per call where the session runs
  /// a pass per share, so that the sums equal the full job's bit for bit
  /// (docs/fault-tolerance.md, "Exact sums"); every share where it cannot,
  /// the callback adding them into the same gradients. Empty without fault
  /// tolerance: the rank's own data.
  std::vector<int64_t> shares;
  Session *session = nullptr;
  /// Sessions on a device: the stream of the compute instruction. The
  /// callback enqueues its work on it and returns (the views are device
  /// memory, ready in stream order); it may also synchronize it
  /// (Session::device()) and work on the host, at the cost of overlap.
  DeviceStream stream;
};

using ComputeCallback = std::function<Result<void>(ComputeCall &)>;

/// Fault-tolerant replica groups (docs/fault-tolerance.md): the plan's mesh
/// has one managed axis, whose coordinates are the replica groups.
struct FaultToleranceOptions {
  /// The membership store: redis://HOST:PORT.
  StoreAddress store;
  /// The fewest live groups a quorum may have.
  int minReplicas = 1;
  /// A group whose heartbeat is older than this is dead.
  std::chrono::milliseconds heartbeatExpiry{2000};
  /// This rank's group's incarnation (the launcher's restart count).
  int64_t incarnation = 0;
};

/// What SessionOptions::trace records: steps [firstStep, lastStep]
/// (1-based, as stepsDone() after them) into dir/rank<R>.json
/// (docs/observability.md). The directory is created if absent.
struct StepTraceOptions {
  std::string dir;
  int64_t firstStep = 1;
  int64_t lastStep = std::numeric_limits<int64_t>::max();
};

struct SessionOptions {
  int64_t rank = 0;
  int64_t worldSize = 1;
  /// The launcher's variable that gave worldSize ("SLURM_NTASKS" under
  /// srun), named when the plan's mesh has another size.
  std::string worldSizeVariable = "WORLD_SIZE";
  StoreAddress store;
  /// Every rendezvous, collective and wait gives up after this long.
  std::chrono::milliseconds timeout{60000};
  /// "gloo" (host buffers) or "nccl" (CUDA devices; refused by builds
  /// without the CUDA backend, and by this executor until it runs plans on
  /// devices: docs/cuda.md).
  std::string backend = "gloo";
  /// This process's index on its machine (LOCAL_RANK): its CUDA device.
  int64_t localRank = 0;
  /// Namespace of this job's keys in the store.
  std::string job = "meshplan";
  /// Reduce in the members' key order (BackendOptions::keyOrderReductions).
  bool keyOrderReductions = true;
  /// Set: the job's replica groups may die and come back while the others
  /// train (docs/fault-tolerance.md).
  std::optional<FaultToleranceOptions> faultTolerance;
  /// Set: the plan runs on this device (docs/cuda.md, "Executor on
  /// devices"): buffers in one arena sized from the plan, each plan stream a
  /// device stream, instructions enqueued without waiting. A host backend's
  /// (Gloo's) collectives are staged through host memory; a device
  /// backend's (NCCL's) run on the device buffers. Unset: host buffers.
  std::shared_ptr<Device> device;
  /// On a device: time every instruction on the device as well (two timing
  /// events around it), into StepProfile::deviceStart/deviceEnd. Around
  /// the runtime's own kernels (casts, float8, sums, the optimizer) the
  /// stream is held until the instruction is enqueued (Device::hold), so
  /// that their spans are the device's work alone; a collective's or a
  /// compute callback's span also includes waiting for the host to enqueue.
  /// Serializes host and device per instruction: for measuring, not for
  /// speed; off by default.
  bool deviceTiming = false;
  /// Set: record what every step in its range did, per instruction, into
  /// a trace file per rank (docs/observability.md; `meshplan trace --merge`
  /// shows them). Every rank of the job must set the same options.
  std::optional<StepTraceOptions> trace;
  /// Creates the backend named by `backend` when it lives outside this
  /// library: the NCCL backend is in MeshplanRuntimeNccl
  /// (cudaSessionOptions in meshplan/Runtime/CudaDevice.h sets it). Unset:
  /// "gloo" is built in, and "nccl" is refused.
  std::function<Result<std::unique_ptr<Backend>>(const BackendOptions &)>
      makeBackend;
};

/// Options from the environment that `meshplan run`, torchrun or Slurm set:
/// RANK, WORLD_SIZE, LOCAL_RANK and MESHPLAN_STORE, or what torchrun or srun
/// give instead (LauncherEnvironment.h), MESHPLAN_TIMEOUT (seconds,
/// default 60), MESHPLAN_JOB, MESHPLAN_REDUCTION_ORDER ("key", the default,
/// or "gloo"), MESHPLAN_BACKEND ("gloo", the default, or "nccl"). Fault
/// tolerance, when MESHPLAN_FT_STORE (redis://HOST:PORT) is set:
/// MESHPLAN_FT_MIN_REPLICAS (default 1), MESHPLAN_FT_HEARTBEAT_MS (default
/// 2000), MESHPLAN_FT_INCARNATION (default 0); `meshplan run
/// --fault-tolerant` sets them. Errors name the variable.
Result<SessionOptions> sessionOptionsFromEnv();

/// Where a fault-tolerant rank stands (Session::faultTolerance()).
struct FaultToleranceState {
  int64_t epoch = 0;           ///< the quorum this rank trains in
  std::vector<int> liveGroups; ///< its replica groups, ascending
  int64_t numGroups = 0;       ///< the managed axis's size
  int group = 0;               ///< this rank's replica group
  /// The ranks whose share of the batch this rank processes in the current
  /// step: itself first, then, for each missing group assigned to it, the
  /// rank of that group with this rank's other coordinates (its data).
  std::vector<int64_t> dataRanks;
  int64_t stepsDiscarded = 0; ///< steps redone in a new epoch so far
  int64_t heals = 0;          ///< times this rank sent or received state
};

/// Where one step's time went, in seconds, from the executor's own clocks
/// around every instruction (steady_clock).
struct StepProfile {
  double wall = 0;      ///< step() from entry to return
  double callbacks = 0; ///< inside the trainer's compute callbacks (sum)
  double kernels = 0;   ///< local ops: casts, float8, sums, optimizer (sum)
  /// Time during which some collective of the plan was running (the union
  /// of their intervals over all streams).
  double collectives = 0;
  /// The part of `collectives` during which no callback or kernel ran: the
  /// communication the schedule did not hide.
  double exposedCollectives = 0;
  /// wall minus the time anything above was running: the executor's own
  /// cost (thread hand-offs, dependency waits, bookkeeping).
  double overhead = 0;
  /// Parallel to the plan's program: when each instruction started and
  /// ended, in seconds from the step's start (both 0 for one that did not
  /// run). The trainer's pipeline bubble reads the compute stream's spans
  /// from them (docs/pipeline.md, "Measured bubble").
  std::vector<double> instructionStart, instructionEnd;
  /// Parallel to the plan's program: when the instruction became ready, in
  /// seconds from the step's start: the latest end among its stream's
  /// previous instruction, its deps and its communicator's previous
  /// collective (0 when it has none, or did not run). start - ready is the
  /// executor's hand-off, which the trainer gives the cost model as its
  /// dispatch latency (CostModel::dispatchSeconds).
  std::vector<double> instructionReady;
  /// Times a stream's thread woke and found its next instruction still
  /// waiting. The executor wakes a stream only once its instruction can run,
  /// so this stays at (nearly) zero; each needless wake-up costs a context
  /// switch, and on oversubscribed cores a scheduler slice of the thread it
  /// preempted (docs/runtime.md, "Waking only the stream that can run").
  int64_t needlessWakeups = 0;
  /// On a device with SessionOptions::deviceTiming, parallel to the plan's
  /// program: when the device started and finished the work each
  /// instruction enqueued, in seconds from the earliest such start (device
  /// clocks: comparable with each other, not with instructionStart, which is
  /// when the host enqueued). Empty otherwise.
  std::vector<double> deviceStart, deviceEnd;
  /// With gradient clipping (the plan's optimizer has max_norm): the step's
  /// global gradient norm, the same bits on every rank (NaN when some
  /// gradient element was not finite), the coefficient every gradient was
  /// multiplied by, and whether the updates were skipped (a non-finite norm:
  /// every rank skips alike, the weights and states stay as they were).
  std::optional<double> gradNorm;
  float clipCoefficient = 1.0f;
  bool updateSkipped = false;
  /// With SessionOptions::trace: the seconds this step spent recording
  /// itself (copying its times; on the range's last step, also writing the
  /// file), at the end of step(), after `wall` was taken (a caller's own
  /// timing of step() includes it). 0 for a step outside the range.
  double traceRecording = 0;
};

class Session {
public:
  /// close()s.
  ~Session();
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  /// Opens a plan: checks it is this rank's plan on a mesh of WORLD_SIZE
  /// ranks, binds every instruction to its buffers and checks counts, and
  /// connects to the store. No communicator is created yet.
  static Result<std::unique_ptr<Session>> open(plan::Plan plan,
                                               const SessionOptions &options);
  /// A plan file, or a plan directory (its rank<RANK>.json).
  static Result<std::unique_ptr<Session>>
  openPath(const std::string &path, const SessionOptions &options);
  /// The plan of options.rank, instantiated in-process.
  static Result<std::unique_ptr<Session>>
  openTemplate(const plan::PreparedTemplate &tmpl,
               const SessionOptions &options);

  /// Called for every compute instruction without a more specific callback.
  void onCompute(ComputeCallback callback);
  /// Called for compute instructions of this phase and unit.
  void onCompute(const std::string &phase, const std::string &unit,
                 ComputeCallback callback);

  /// Fills every parameter shard (param_shard buffers); the callback sees
  /// each shard with its global box. Optimizer state starts at zero.
  Result<void>
  initParameters(const std::function<Result<void>(TensorView &)> &init);
  /// Copies this rank's box out of a whole tensor (row-major, the buffer's
  /// dtype) into the persistent buffer `id`.
  Result<void> copyIn(const std::string &id, std::span<const std::byte> whole);

  /// Runs one training step. On failure the error names the instruction and,
  /// for a collective, the communicator and the collective's number; the
  /// session is then unusable (peers may be gone).
  ///
  /// Fault-tolerant: the step runs in the current quorum's epoch, with the
  /// fault_tolerant communicators over its live groups; it commits only when
  /// every rank of every live group finished it (a vote in the store), and
  /// is otherwise discarded and redone in the next epoch, so it returns
  /// once the step has committed. A failure within this rank's own group is
  /// an error, as above (the group leaves; the launcher restarts it).
  Result<void> step();
  /// Fault-tolerant sessions: the epoch, the live groups and this step's
  /// data assignment; nullopt otherwise.
  std::optional<FaultToleranceState> faultTolerance() const;
  /// Fault-tolerant sessions: one round trip to the membership store; its
  /// error (naming the store) when it is unreachable or has lost the job's
  /// state. A trainer whose own collective failed asks it: a peer that
  /// stopped because the store lost the job closes its connections, and
  /// the store, not the closed connection, is then the cause to report.
  /// Without fault tolerance: nothing to check.
  Result<void> checkMembershipStore();
  /// Steps completed so far.
  int64_t stepsDone() const;
  /// Continues a run in a fresh session: the next step() is step
  /// `steps + 1` (the optimizer's bias correction and the stochastic
  /// rounding's key use it). The trainer restores the parameter and
  /// optimizer shards (tensor(id).bytes) before the next step.
  Result<void> resumeAfter(int64_t steps);
  /// The profile of the last completed step.
  const StepProfile &lastStepProfile() const;
  /// The learning rate the next step() runs with: setLr's, else the plan's
  /// (its lr_schedule at step stepsDone() + 1); nullopt without optimizer.
  std::optional<double> lr() const;
  /// Sets the rate of every later step, overriding the plan's schedule (a
  /// trainer with its own scheduler calls it before each step); nullopt
  /// returns to the plan's schedule. Every rank must set the same value
  /// (verify cannot see it). In [0, 1e6].
  Result<void> setLr(std::optional<double> lr);

  /// Leaves every communicator this rank created: a barrier on each, in the
  /// plan's order (then the trainer's, by id), so that no rank tears down a
  /// connection its peers still use (a rank whose last collective finishes
  /// early would otherwise break its peers' collectives by exiting). Skipped
  /// after a failed step: peers may be gone. Idempotent; the destructor
  /// calls it.
  Result<void> close();

  /// Saves every parameter shard and optimizer state as a checkpoint at
  /// `dir` (docs/checkpoint-format.md). Collective: every rank calls it at
  /// the same point. Each rank writes the boxes it owns into its own data
  /// file in parallel; rank 0 gathers the chunk records through the store
  /// and commits, so the directory appears atomically, complete or not at
  /// all (a previous checkpoint at `dir` stays loadable until then). Every
  /// rank returns the same outcome. `info` records the model, the spec and
  /// the training state (its step is this session's steps done when 0).
  /// Test hook: MESHPLAN_TEST_SLOW_CHECKPOINT_MS=N sleeps N ms at each phase
  /// boundary (test/trainer/checkpoint-kill.sh kills ranks in between).
  Result<void> saveCheckpoint(const std::string &dir,
                              ckpt::CheckpointInfo info);
  /// Loads this rank's box of every parameter and optimizer state from a
  /// checkpoint written under any layout of the same model: it reads only
  /// the checksum blocks its boxes intersect and verifies them; nothing is
  /// changed unless every box loads. Returns the recorded training state
  /// (resumeAfter(state.step) continues the run). Not collective.
  /// `options`: a tensor stored in another floating-point dtype than the
  /// plan's is refused unless dtypeCast (then converted, round to nearest
  /// even); resetOptimizerState starts the optimizer state at zero and
  /// returns step 0, as a fresh AdamW (docs/checkpoint-format.md, "Dtype
  /// casts").
  Result<ckpt::TrainingState>
  loadCheckpoint(const std::string &dir, const ckpt::LoadOptions &options = {});

  /// Persistent buffers (parameter shards, optimizer state) by id. On a
  /// device the views are device memory (TensorView::onDevice); copyOut
  /// reads them on the host.
  Result<TensorView> tensor(const std::string &id);
  std::vector<TensorView> parameters();
  std::vector<TensorView> optimizerState();

  /// Copies a view of this session (a parameter, an optimizer state, or a
  /// compute call's view between steps) into host memory of the same size,
  /// waiting for the device where there is one.
  Result<void> copyOut(const TensorView &view, std::span<std::byte> host);
  /// The reverse: host bytes into the persistent buffer `view` shows (its
  /// shard, as copyOut gives it).
  Result<void> copyInto(const TensorView &view,
                        std::span<const std::byte> host);
  /// For a callback that computes on the host: on a device session, runs
  /// `body` on a copy of `call` whose views are host memory (copied from the
  /// device after the stream's earlier work, float8 scales read back into
  /// TensorView::scale), then copies what it wrote (the gradients, and a
  /// pipeline stage's output activation) back and waits for the copy. On a
  /// host session it just runs `body(call)`. It blocks the call's stream
  /// for the duration: for tests and CPU models, not for GPU trainers.
  Result<void> computeOnHost(ComputeCall &call, const ComputeCallback &body);
  /// The device the plan runs on; null for host buffers.
  Device *device() const;

  /// A communicator of the plan for the trainer's own collectives (the
  /// `trainer_<axis>` ones). It is a separate group from the one the plan's
  /// instructions use, so the trainer's collectives never interleave with
  /// the executor's. Created on first use; every member must ask for it.
  Result<Communicator *> trainerCommunicator(const std::string &id);

  /// The communicator the plan's instructions use (created now if not yet;
  /// every member must ask). For diagnostics and benchmarks: a trainer's
  /// collectives belong on trainerCommunicator().
  Result<Communicator *> planCommunicator(const std::string &id);

  const plan::Plan &plan() const;
  int64_t rank() const;
  /// Communicators created so far (ids), for tests and diagnostics.
  std::vector<std::string> createdCommunicators() const;

  struct Impl;

private:
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl;
};

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_SESSION_H
