//===- RankTrainer.h - One rank of meshplan-train ---------------*- C++ -*-===//
//
// The distributed run's state on one rank: the session, the model's
// callbacks (Train.cpp) and what the run measures and prints besides the
// loss (--cost-model, the pipeline bubble, --device-timing: Figures.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_RANKTRAINER_H
#define MESHPLAN_TRAINER_RANKTRAINER_H

#include "Trainer.h"
#include "TrainerCollectives.h"

#include "meshplan/Plan/CostModel.h"
#include "meshplan/Runtime/Session.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace meshplan::trainer {

class MetricsFile;

using runtime::ComputeCall;
using runtime::Session;
using runtime::SessionOptions;
using runtime::StepProfile;

/// The median of `v` (the upper one of an even count; 0 when empty).
double median(std::vector<double> v);

/// The plan communicator over exactly `axis`, if the plan has one.
const plan::Communicator *commOverAxis(const plan::Plan &p,
                                       const std::string &axis);

/// --device-timing: the executor's host time per instruction (enqueueing
/// it, StepProfile::instructionStart/End) against the device time of the
/// work it enqueued (deviceStart/End), over the steps after the first, in
/// all and per kind of instruction. The plan's own instructions
/// (collectives, casts, float8, optimizer) are kept apart from the compute
/// callbacks, whose host side is the model itself.
struct DeviceTimes {
  struct Kind {
    std::vector<double> host, device; ///< per instruction, one per step
    int64_t count = 0;                ///< per step
  };
  std::map<std::string, Kind> kinds;
  std::vector<double> hostPerStep, devicePerStep, deviceBusy, callbacks;
  int64_t instructions = 0;

  void add(const plan::Plan &p, const StepProfile &prof);
  void print(double stepSeconds) const;
};

/// One rank's training: the session, the callbacks, the figures.
class RankTrainer {
public:
  RankTrainer(const TrainFlags &flags, const Planned &planned,
              const TextData &data, SessionOptions options)
      : flags(flags), planned(planned), data(data),
        options(std::move(options)) {}

  Result<void> open(const std::string &jobSuffix);
  Result<void> run();

private:
  Result<void> onCompute(ComputeCall &call);
  Result<void> forward(ComputeCall &call);
  Result<void> backward(ComputeCall &call);
  Result<void> backwardWeight(ComputeCall &call);
  Result<void> syntheticInto(const ComputeCall &call,
                             std::map<std::string, std::vector<float>> &grads);
  Result<void> addGradients(ComputeCall &call,
                            std::map<std::string, std::vector<float>> &grads);
  Result<float> globalLoss(float local);
  Result<void> saveParams();
  Result<void> calibrate();
  void printCostModel(double computeSeconds, double stepSeconds,
                      double exposedSeconds);
  // --cost-model under a pipeline: the measured bubble against the cost
  // model's (docs/pipeline.md, "Measured bubble").
  std::vector<int64_t> pipelineRanks() const;
  Result<Communicator *> pairWith(int64_t peer);
  void recordBubble(const StepProfile &prof);
  Result<void> exchangeBubble();
  void printBubble();
  Result<void> saveCheckpoint();

  // run()'s steps (Train.cpp).
  /// One step's figures, as printed and written to --metrics.
  struct StepFigures {
    int64_t step = 0;
    double loss = 0, lr = 0, wall = 0, compute = 0, comm = 0, exposed = 0;
  };
  /// Every step's figures, for the summary.
  struct RunSeries {
    std::vector<double> losses, walls, computes, comms, exposeds, overheads,
        callbackComputes, planExposed, clips, traceRecordings;
    DeviceTimes deviceTimes;
  };
  Result<void> initParameters();
  void printBanner() const;
  /// --load-checkpoint: loads it and returns the first step to run (1
  /// without one).
  Result<int64_t> loadCheckpointIfAsked();
  /// --resume-after: the persistent shards kept in memory, into a fresh
  /// session.
  Result<void> resumeInFreshSession();
  /// Runs step `step` (which a healed fault-tolerant group may move on to
  /// its source's step) and measures it.
  Result<StepFigures> runStep(int64_t &step);
  void reportFaultTolerance();
  /// Gradient clipping's instructions' time in the step, if it has any.
  std::optional<double> clippingSeconds(const StepProfile &prof) const;
  void record(RunSeries &series, const StepFigures &f, const StepProfile &prof,
              int64_t firstStep);
  Result<void> writeMetrics(MetricsFile &metrics, const StepFigures &f,
                            const StepProfile &prof);
  void printStep(const StepFigures &f, const StepProfile &prof) const;
  void printSummary(const RunSeries &series, bool bubble);

  const TrainFlags &flags;
  const Planned &planned;
  const TextData &data;
  SessionOptions options;
  std::unique_ptr<Session> session;
  int64_t dpIndex = 0;
  /// The share of the batch the callbacks run now: this rank's own (0), or,
  /// in a fault-tolerant job with a replica group missing, one of the
  /// missing ranks' assigned to this rank (Session::faultTolerance()), whose
  /// data index is shareDp. Each share is a microbatch run of its own.
  int64_t share = 0, shareDp = 0;
  /// The fault-tolerance state last printed.
  int64_t ftEpoch = 0, ftDiscarded = 0, ftHeals = 0;
  static constexpr int64_t kMaxShares = 1 << 16;
  int64_t runKey(const ComputeCall &call) const {
    return call.microbatch * kMaxShares + share;
  }
  TpShard shard;
  MicrobatchShape shape;
  std::unique_ptr<TpGroup> tp;
  /// --device cuda: the model's ops on the session's GPU; else the host's.
  std::unique_ptr<ModelOps> gpuOps;
  ModelOps &modelOps() { return gpuOps ? *gpuOps : hostOps(); }
  /// --device cuda: this call's fp32 parameters and this microbatch's
  /// gradients on the GPU, by tensor (the host copies are `weights` and the
  /// backward's map).
  std::map<std::string, OpsBuffer<float>> opsWeights, opsGrads;
  HostCollectives hostComms;
  std::vector<Communicator *> extraComms, lossComms;
  bool lossIsGlobal = true;
  /// One microbatch's run through one of this rank's stages (the whole
  /// model without a pipeline): the model's activations, and the forward
  /// segments [first, end) it has run (segmentRange).
  struct StageRun {
    std::unique_ptr<Microbatch> mb;
    int64_t first = 0, end = 0;
  };
  /// By microbatch; a rank holding several stages (interleaved) has several
  /// runs of one microbatch alive at once.
  std::map<int64_t, std::vector<StageRun>> microbatches;
  /// backward_input's weight gradients until backward_weight, by (unit,
  /// microbatch).
  std::map<std::pair<std::string, int64_t>,
           std::map<std::string, std::vector<float>>>
      stashed;
  int64_t printerRank = 0;
  /// Tokens of the whole job per step.
  int64_t tokensPerStep = 0;
  std::vector<int32_t> tokens, targets;
  std::map<std::string, std::vector<float>> weights; ///< fp32 of a call

  /// The step of the last checkpoint saved (-1: none).
  int64_t lastSaved = -1;

  // --cost-model: this machine's parameters, measured at start.
  std::optional<plan::CostModel> machine;
  /// --cost-model under a pipeline, from every step but the first: this
  /// rank's compute-stream idle fraction, step wall and compute-stream busy
  /// time per step, the total dispatch latency of its instructions but the
  /// recvs per step (start - ready, StepProfile::instructionReady), and
  /// each instruction's duration per step.
  std::vector<double> idleOfStep, wallOfStep, busyOfStep, dispatchOfStep;
  std::vector<std::vector<double>> secondsOfInstruction;
  /// After exchangeBubble: per pp coordinate, the medians [idle, wall, busy],
  /// each step's total dispatch latency, the median duration of each
  /// instruction of its plan, then each step's duration of each
  /// instruction, step by step (BubbleFigures).
  std::vector<std::vector<double>> pipelineFigures;

  // This step's figures.
  double lossSum = 0;
  int64_t lossCount = 0;
  /// Time in the trainer's own collectives inside callbacks (TP, extra
  /// axes) this step.
  double tpSeconds = 0, matmulFlops = 0, matmulSeconds = 0;
};

} // namespace meshplan::trainer

#endif // MESHPLAN_TRAINER_RANKTRAINER_H
