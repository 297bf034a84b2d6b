//===- Figures.cpp - What meshplan-train measures besides the loss --------===//
//
// --cost-model: this machine's collective latency and bandwidth, measured
// at start, and the plan's cost model beside the measured step; under a
// pipeline, the measured bubble against the cost model's (docs/pipeline.md,
// "Measured bubble"). --device-timing: the executor's host time against the
// device's (docs/cuda.md, "The trainer on a GPU").
//
//===----------------------------------------------------------------------===//

#include "RankTrainer.h"

#include "meshplan/Core/PipelineSchedule.h"
#include "meshplan/Plan/Trace.h"
#include "meshplan/Runtime/Kernels.h"
#include "meshplan/Support/Timing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::trainer;
using namespace meshplan::runtime;
namespace k = meshplan::runtime::kernels;
using Clock = SteadyClock;

double meshplan::trainer::median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Measures the collective latency and bandwidth the cost model assumes
/// (alpha, beta) on this machine: all-gathers of 4 bytes and of 1 MiB per
/// member on the trainer's copy of a data-parallel communicator, and a
/// memory copy for the element-wise ops. The fastest of ten runs each. Every
/// rank runs it at the same point.
Result<void> RankTrainer::calibrate() {
  const plan::Plan &p = session->plan();
  const plan::Communicator *pc = nullptr;
  for (const auto *axes : {&planned.roles.shard, &planned.roles.replicate})
    for (const std::string &axis : *axes)
      if (!pc)
        pc = commOverAxis(p, axis);
  plan::CostModel m;
  m.ranksPerNode = options.worldSize;
  m.mfu = 1;
  auto measure = [&](Communicator *comm) -> Result<void> {
    int64_t n = comm->size(), big = int64_t(1) << 18;
    std::vector<float> in(size_t(big), 1.0f), out(size_t(big * n));
    auto timeOf = [&](int64_t count) -> Result<double> {
      std::vector<double> t;
      for (int rep = 0; rep < 12; ++rep) {
        auto start = Clock::now();
        MESHPLAN_TRY(hostComms.allGather(comm, in.data(), out.data(), count));
        if (rep >= 2)
          t.push_back(secondsSince(start));
      }
      // The fastest run: what the link can do when every member is ready
      // (the others include waiting for descheduled peers).
      return *std::min_element(t.begin(), t.end());
    };
    auto small = timeOf(1);
    if (!small)
      return small.error();
    auto large = timeOf(big);
    if (!large)
      return large.error();
    double alpha = *small / double(n - 1);
    double bytes = double((n - 1) * big * 4);
    m.intraNodeLatencySeconds = m.interNodeLatencySeconds = alpha;
    m.intraNodeBytesPerSecond = m.interNodeBytesPerSecond =
        bytes / std::max(*large - *small, *large / 2);
    return {};
  };
  if (pc && pc->ranks.size() > 1) {
    auto comm = session->trainerCommunicator(pc->id);
    if (!comm)
      return comm.error();
    MESHPLAN_TRY(measure(*comm));
  } else if (planned.spec.pipeline && planned.spec.pipeline->config.ranks > 1) {
    // No data-parallel group: the pipeline's pairs of neighbouring pp
    // coordinates, (0, 1), (1, 2), ... in turn (a two-member all-gather is
    // one transfer each way: the cost model's send).
    std::vector<int64_t> ranks = pipelineRanks();
    int64_t mine = planned.pipelineRankOf(p.rank);
    for (int64_t c = 0; c + 1 < int64_t(ranks.size()); ++c)
      if (mine == c || mine == c + 1) {
        auto comm = pairWith(ranks[size_t(mine == c ? c + 1 : c)]);
        if (!comm)
          return comm.error();
        MESHPLAN_TRY(measure(*comm));
      }
  }
  std::vector<std::byte> a(size_t(64) << 20), b(a.size());
  std::vector<double> t;
  for (int rep = 0; rep < 5; ++rep) {
    auto start = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    t.push_back(secondsSince(start));
  }
  m.hbmBytesPerSecond = 2.0 * double(a.size()) / median(t);
  machine = m;
  return {};
}

/// The plan's cost model (Trace.h) with the measured parameters and the
/// measured compute rate, beside what the step measured.
void RankTrainer::printCostModel(double computeSeconds, double stepSeconds,
                                 double exposedSeconds) {
  const plan::Plan &p = session->plan();
  const std::vector<double> &flops = planned.templateFor(p.rank).flops();
  double total = 0;
  for (size_t i = 0; i < p.program.size() && i < flops.size(); ++i)
    if (p.program[i].op == plan::OpKind::Compute)
      total += flops[i];
  plan::CostModel m = *machine;
  m.peakFlopsPerSecond = total / std::max(computeSeconds, 1e-9);
  auto schedule = plan::simulate(p, flops, m);
  if (!schedule) {
    std::printf("cost model: %s\n", schedule.error().message.c_str());
    return;
  }
  std::printf("cost model with this machine's parameters (alpha %.0f us, "
              "%.2f GB/s per link, compute %.2f GFLOP/s as measured, memory "
              "%.1f GB/s): step %.1f ms, exposed plan communication %.1f ms; "
              "measured: step %.1f ms, exposed plan communication %.1f ms\n",
              m.intraNodeLatencySeconds * 1e6, m.intraNodeBytesPerSecond * 1e-9,
              m.peakFlopsPerSecond * 1e-9, m.hbmBytesPerSecond * 1e-9,
              schedule->stepSeconds * 1e3, schedule->exposedCommSeconds * 1e3,
              stepSeconds * 1e3, exposedSeconds * 1e3);
}

/// The ranks of this rank's pipeline (its coordinates with each pp
/// coordinate in turn), by pp coordinate.
std::vector<int64_t> RankTrainer::pipelineRanks() const {
  const Mesh &mesh = *planned.spec.mesh;
  int axis = planned.spec.pipeline->axisIndex;
  int64_t position = *mesh.positionOf(session->plan().rank);
  int64_t base =
      position - mesh.coordinateAt(position, axis) * mesh.stride(axis);
  std::vector<int64_t> ranks;
  for (int64_t c = 0; c < mesh.axis(axis).size; ++c)
    ranks.push_back(mesh.rankAt(base + c * mesh.stride(axis)));
  return ranks;
}

/// The trainer's copy of the plan's pair communicator with `peer` (the one
/// its sends and receives use).
Result<Communicator *> RankTrainer::pairWith(int64_t peer) {
  const plan::Plan &p = session->plan();
  for (const plan::Instruction &in : p.program) {
    if (in.op != plan::OpKind::Send && in.op != plan::OpKind::Recv)
      continue;
    const plan::Communicator *c = p.findCommunicator(in.comm);
    if (c && c->ranks.size() == 2 &&
        (c->ranks[0] == peer || c->ranks[1] == peer))
      return session->trainerCommunicator(c->id);
  }
  return makeError("the plan has no pair communicator with rank " +
                   std::to_string(peer));
}

/// One step's compute-stream figures (every step but the first).
void RankTrainer::recordBubble(const StepProfile &prof) {
  const plan::Plan &p = session->plan();
  size_t n = p.program.size();
  if (prof.instructionStart.size() != n || prof.instructionEnd.size() != n ||
      prof.instructionReady.size() != n)
    return;
  // The union of the compute stream's spans (as the cost model's busy time
  // sums that stream's instructions, which never overlap there).
  std::vector<std::pair<double, double>> spans;
  for (size_t i = 0; i < n; ++i) {
    const plan::Instruction &in = p.program[i];
    if (in.stream == "compute" && in.op != plan::OpKind::Free &&
        in.op != plan::OpKind::Wait)
      spans.emplace_back(prof.instructionStart[i], prof.instructionEnd[i]);
  }
  std::sort(spans.begin(), spans.end());
  double busy = 0, end = -1;
  for (auto [a, b] : spans) {
    a = std::max(a, end);
    if (b > a)
      busy += b - a;
    end = std::max(end, b);
  }
  idleOfStep.push_back(prof.wall > 0 ? std::max(0.0, 1 - busy / prof.wall)
                                     : 0.0);
  wallOfStep.push_back(prof.wall);
  busyOfStep.push_back(busy);
  // The executor's hand-offs, which the cost model lays out as its dispatch
  // latency (a recv's is left out, as the model leaves it out: a recv ends
  // where its send's transfer does).
  double dispatch = 0;
  for (size_t i = 0; i < n; ++i)
    if (p.program[i].op != plan::OpKind::Recv)
      dispatch +=
          std::max(0.0, prof.instructionStart[i] - prof.instructionReady[i]);
  dispatchOfStep.push_back(dispatch);
  secondsOfInstruction.resize(n);
  for (size_t i = 0; i < n; ++i)
    secondsOfInstruction[i].push_back(prof.instructionEnd[i] -
                                      prof.instructionStart[i]);
}

/// Where each figure of one pp coordinate sits in exchangeBubble's floats:
/// [idle, wall, busy] medians, each step's total dispatch latency, each
/// instruction's median duration, then each step's duration of each
/// instruction, step by step.
struct BubbleFigures {
  size_t steps, n; // recorded steps, instructions of the coordinate's plan
  size_t dispatch(size_t k) const { return 3 + k; }
  size_t median(size_t i) const { return 3 + steps + i; }
  size_t seconds(size_t k, size_t i) const {
    return 3 + steps + n * (1 + k) + i;
  }
  size_t size() const { return 3 + steps + (1 + steps) * n; }
};

/// Every rank of the pipeline gets every coordinate's figures
/// (BubbleFigures): a sweep of max-all-reduces down the pairs of
/// neighbouring coordinates and back up (each rank's share is zero
/// elsewhere). Collective over the pipeline.
Result<void> RankTrainer::exchangeBubble() {
  std::vector<int64_t> ranks = pipelineRanks();
  int64_t P = int64_t(ranks.size()),
          mine = planned.pipelineRankOf(session->plan().rank);
  // Every rank recorded the same steps (all but the first).
  size_t steps = idleOfStep.size();
  std::vector<size_t> offset(size_t(P) + 1, 0);
  for (int64_t c = 0; c < P; ++c)
    offset[size_t(c) + 1] =
        offset[size_t(c)] +
        BubbleFigures{
            steps, planned.templateFor(ranks[size_t(c)]).get().program.size()}
            .size();
  std::vector<float> all(offset.back(), 0.0f);
  float *own = all.data() + offset[size_t(mine)];
  BubbleFigures at{steps, secondsOfInstruction.size()};
  if (at.size() != offset[size_t(mine) + 1] - offset[size_t(mine)] ||
      dispatchOfStep.size() != steps)
    return makeError("the step profiles do not match this rank's plan");
  own[0] = float(median(idleOfStep));
  own[1] = float(median(wallOfStep));
  own[2] = float(median(busyOfStep));
  for (size_t k = 0; k < steps; ++k)
    own[at.dispatch(k)] = float(dispatchOfStep[k]);
  for (size_t i = 0; i < at.n; ++i) {
    if (secondsOfInstruction[i].size() != steps)
      return makeError("a step profile is missing instructions");
    own[at.median(i)] = float(std::max(0.0, median(secondsOfInstruction[i])));
    for (size_t k = 0; k < steps; ++k)
      own[at.seconds(k, i)] = float(std::max(0.0, secondsOfInstruction[i][k]));
  }
  auto sweep = [&](int64_t c) -> Result<void> {
    if (mine != c && mine != c + 1)
      return {};
    auto comm = pairWith(ranks[size_t(mine == c ? c + 1 : c)]);
    if (!comm)
      return comm.error();
    return hostComms.allReduce(*comm, all.data(), int64_t(all.size()),
                               ReduceOp::Max);
  };
  for (int64_t c = 0; c + 1 < P; ++c)
    MESHPLAN_TRY(sweep(c));
  for (int64_t c = P - 2; c >= 0; --c)
    MESHPLAN_TRY(sweep(c));
  pipelineFigures.assign(size_t(P), {});
  for (int64_t c = 0; c < P; ++c)
    pipelineFigures[size_t(c)].assign(all.begin() + long(offset[size_t(c)]),
                                      all.begin() +
                                          long(offset[size_t(c) + 1]));
  return {};
}

namespace {

/// "flops" per measured second in the replayed costs below.
constexpr double kReplayRate = 1e12;

/// What printBubble replays, gathered from every pp coordinate's plan and
/// figures (BubbleFigures).
struct BubbleInputs {
  std::vector<plan::Plan> plans;
  std::vector<std::vector<double>> planFlops, measuredCosts;
  /// Per recorded step, per pp coordinate: the durations replayed.
  std::vector<std::vector<std::vector<double>>> stepSeconds;
  /// Per recorded step: the dispatch latency of the pipeline's instructions
  /// but the recvs, summed, and how many there are.
  std::vector<double> dispatchTotal;
  size_t dispatched = 0;
  double totalFlops = 0, totalCompute = 0;
};

/// Each coordinate's plan instantiated for its rank, with its measured
/// costs (or the line saying why there are none).
Result<BubbleInputs>
gatherBubbleInputs(const Planned &planned, const std::vector<int64_t> &ranks,
                   const std::vector<std::vector<double>> &figures,
                   size_t steps) {
  BubbleInputs in;
  in.stepSeconds.resize(steps);
  in.dispatchTotal.assign(steps, 0.0);
  for (size_t c = 0; c < ranks.size(); ++c) {
    const plan::PreparedTemplate &t = planned.templateFor(ranks[c]);
    auto one = t.instantiate(ranks[c], false);
    if (!one)
      return one.error();
    const std::vector<double> &f = figures[c];
    size_t n = one->program.size();
    BubbleFigures at{steps, n};
    if (f.size() != at.size())
      return makeError("the figures of pp coordinate " + std::to_string(c) +
                       " do not match its plan");
    // Each step's durations: every instruction but the transfers (a recv's
    // time is the wait the layout predicts; a send is the model's transfer,
    // as its measured time is only the posting) and the no-ops.
    for (size_t k = 0; k < steps; ++k) {
      std::vector<double> sec(n, -1.0);
      for (size_t i = 0; i < n; ++i) {
        plan::OpKind op = one->program[i].op;
        if (op != plan::OpKind::Send && op != plan::OpKind::Recv &&
            op != plan::OpKind::Free && op != plan::OpKind::Wait)
          sec[i] = f[at.seconds(k, i)];
      }
      in.stepSeconds[k].push_back(std::move(sec));
      in.dispatchTotal[k] += f[at.dispatch(k)];
    }
    for (const plan::Instruction &instr : one->program)
      in.dispatched += instr.op != plan::OpKind::Recv;
    std::vector<double> flops = t.flops(), measured(one->program.size(), 0);
    flops.resize(one->program.size(), 0);
    for (size_t i = 0; i < one->program.size(); ++i) {
      plan::OpKind op = one->program[i].op;
      if (plan::isCollective(op) || op == plan::OpKind::Free ||
          op == plan::OpKind::Wait)
        continue;
      measured[i] = double(f[at.median(i)]) * kReplayRate;
      if (op == plan::OpKind::Compute) {
        in.totalFlops += flops[i];
        in.totalCompute += double(f[at.median(i)]);
      }
    }
    in.plans.push_back(std::move(*one));
    in.planFlops.push_back(std::move(flops));
    in.measuredCosts.push_back(std::move(measured));
  }
  return in;
}

/// The bubble of a joint layout: the compute stream idle over the slowest
/// rank's step, per rank and averaged (PlanCommands.cpp's explainPipeline).
struct BubbleLayout {
  std::vector<double> idle;
  double mean = 0, step = 0;
  std::string error;
};

BubbleLayout layOut(const std::vector<const plan::Plan *> &plans,
                    const std::vector<std::vector<double>> &costs,
                    const plan::CostModel &m,
                    const std::vector<std::vector<double>> &seconds = {}) {
  BubbleLayout out;
  auto schedules = plan::simulateTogether(plans, costs, m, seconds);
  if (!schedules) {
    out.error = schedules.error().message;
    return out;
  }
  for (const plan::Schedule &s : *schedules)
    out.step = std::max(out.step, s.stepSeconds);
  for (const plan::Schedule &s : *schedules) {
    double busy = s.computeStream >= 0
                      ? s.streamBusySeconds[size_t(s.computeStream)]
                      : 0.0;
    out.idle.push_back(out.step > 0 ? std::max(0.0, 1 - busy / out.step) : 0.0);
    out.mean += out.idle.back() / double(plans.size());
  }
  return out;
}

/// Each step laid out with its own measured durations (and, withDispatch,
/// its own dispatch latency), then the median over the steps per coordinate
/// (as the measurement takes it): the pipeline's waits come from the layout
/// alone. A median of the durations instead loses their spread, and a
/// pipeline's step depends on it: a slow instruction on the critical path
/// delays every stage behind.
BubbleLayout replaySteps(const std::vector<const plan::Plan *> &plans,
                         const BubbleInputs &in, const plan::CostModel &m,
                         const std::vector<double> &dispatchOf,
                         bool withDispatch) {
  size_t P = plans.size(), steps = in.stepSeconds.size();
  BubbleLayout out;
  std::vector<std::vector<double>> idle(P);
  std::vector<double> stepOf;
  for (size_t k = 0; k < steps && out.error.empty(); ++k) {
    plan::CostModel mk = m;
    mk.dispatchSeconds = withDispatch ? dispatchOf[k] : 0.0;
    BubbleLayout one = layOut(plans, in.measuredCosts, mk, in.stepSeconds[k]);
    out.error = one.error;
    for (size_t c = 0; c < one.idle.size(); ++c)
      idle[c].push_back(one.idle[c]);
    stepOf.push_back(one.step);
  }
  if (out.error.empty() && !stepOf.empty()) {
    for (size_t c = 0; c < P; ++c) {
      out.idle.push_back(median(idle[c]));
      out.mean += out.idle.back() / double(P);
    }
    out.step = median(stepOf);
  }
  return out;
}

std::string percents(const std::vector<double> &v) {
  std::string out;
  for (size_t c = 0; c < v.size(); ++c) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.1f%%", c ? " " : "", 100 * v[c]);
    out += buf;
  }
  return out;
}

} // namespace

/// The measured bubble next to the cost model's (plan::simulateTogether,
/// as `meshplan explain` lays a pipeline out) and the textbook formula.
/// Bubble = the compute stream's idle time over the step, averaged over the
/// pipeline's ranks; the model's step is the slowest rank's.
void RankTrainer::printBubble() {
  const frontend::ResolvedPipeline &pp = *planned.spec.pipeline;
  std::vector<int64_t> ranks = pipelineRanks();
  size_t P = ranks.size();
  if (pipelineFigures.size() != P)
    return;
  size_t steps = idleOfStep.size();
  Result<BubbleInputs> inputs =
      gatherBubbleInputs(planned, ranks, pipelineFigures, steps);
  if (!inputs) {
    std::printf("pipeline bubble: %s\n", inputs.error().message.c_str());
    return;
  }
  const BubbleInputs &in = *inputs;
  std::vector<const plan::Plan *> pointers;
  for (const plan::Plan &one : in.plans)
    pointers.push_back(&one);
  // The executor's mean hand-off per instruction, step by step: the cost
  // model's dispatch latency (every instruction starts that long after it
  // is ready; CostModel::dispatchSeconds).
  std::vector<double> dispatchOf(steps, 0.0);
  for (size_t k = 0; k < steps; ++k)
    dispatchOf[k] =
        in.dispatchTotal[k] / double(std::max<size_t>(in.dispatched, 1));
  double dispatchMedian = steps ? median(dispatchOf) : 0.0;
  plan::CostModel m = *machine;
  m.peakFlopsPerSecond = kReplayRate;
  m.dispatchSeconds = dispatchMedian;
  BubbleLayout measuredLayout = layOut(pointers, in.measuredCosts, m);
  BubbleLayout replayLayout = replaySteps(pointers, in, m, dispatchOf, true),
               undispatchedLayout =
                   replaySteps(pointers, in, m, dispatchOf, false);
  plan::CostModel f = *machine;
  f.peakFlopsPerSecond = in.totalFlops / std::max(in.totalCompute, 1e-9);
  BubbleLayout flopLayout = layOut(pointers, in.planFlops, f);

  std::vector<double> measuredIdle;
  double measuredMean = 0, measuredWall = 0;
  for (size_t c = 0; c < P; ++c) {
    measuredIdle.push_back(pipelineFigures[c][0]);
    measuredMean += measuredIdle.back() / double(P);
    measuredWall = std::max(measuredWall, double(pipelineFigures[c][1]));
  }
  const PipelineScheduleConfig &config = pp.config;
  const char *formula =
      config.kind == PipelineScheduleKind::Interleaved1F1B ? "(p-1)/(v m+p-1)"
      : config.kind == PipelineScheduleKind::ZeroBubbleV   ? "(p-1)/(6m+p-1)"
                                                           : "(p-1)/(m+p-1)";
  std::printf(
      "pipeline bubble (%s, p %lld, m %lld, v %lld; the compute stream idle "
      "over the step, per pp coordinate, median of %zu steps): measured %s, "
      "mean %.1f%% (step %.1f ms)\n",
      std::string(pipelineScheduleKindName(config.kind)).c_str(),
      (long long)config.ranks, (long long)config.microbatches,
      (long long)config.stagesPerRank, idleOfStep.size(),
      percents(measuredIdle).c_str(), 100 * measuredMean, measuredWall * 1e3);
  auto ratio = [&](const BubbleLayout &l) {
    return l.mean > 0 ? measuredMean / l.mean : 0.0;
  };
  if (!replayLayout.error.empty())
    std::printf("  cost model: %s\n", replayLayout.error.c_str());
  else if (!replayLayout.idle.empty())
    std::printf("  cost model replaying each step (plan::simulateTogether; "
                "every instruction but the transfers at its measured time "
                "in that step, transfers at the measured latency and "
                "bandwidth, each instruction started that step's measured "
                "dispatch latency after it is ready, median %.3f ms; median "
                "of %zu steps): %s, mean %.1f%% (step %.1f ms); measured / "
                "model %.2f; without the dispatch latency: mean %.1f%% (step "
                "%.1f ms), measured / model %.2f\n",
                dispatchMedian * 1e3, steps,
                percents(replayLayout.idle).c_str(), 100 * replayLayout.mean,
                replayLayout.step * 1e3, ratio(replayLayout),
                100 * undispatchedLayout.mean, undispatchedLayout.step * 1e3,
                ratio(undispatchedLayout));
  if (measuredLayout.error.empty())
    std::printf("  cost model with the median cost of every local "
                "instruction, collectives at the measured latency and "
                "bandwidth, the median dispatch latency: %s, mean %.1f%% "
                "(step %.1f ms); measured / model %.2f\n",
                percents(measuredLayout.idle).c_str(),
                100 * measuredLayout.mean, measuredLayout.step * 1e3,
                ratio(measuredLayout));
  if (flopLayout.error.empty())
    std::printf("  cost model with the plan's flops at the measured %.2f "
                "GFLOP/s: %s, mean %.1f%% (step %.1f ms)\n",
                f.peakFlopsPerSecond * 1e-9, percents(flopLayout.idle).c_str(),
                100 * flopLayout.mean, flopLayout.step * 1e3);
  std::printf("  textbook %s = %.1f%%\n", formula,
              100 * textbookBubbleFraction(config));
}

void DeviceTimes::add(const plan::Plan &p, const StepProfile &prof) {
  if (prof.deviceStart.size() != p.program.size())
    return;
  double host = 0, device = 0, compute = 0;
  int64_t n = 0;
  std::map<std::string, std::array<double, 3>> step; // host, device, count
  std::vector<std::pair<double, double>> spans;
  for (size_t i = 0; i < p.program.size(); ++i) {
    plan::OpKind op = p.program[i].op;
    if (op == plan::OpKind::Free || op == plan::OpKind::Wait)
      continue;
    spans.push_back({prof.deviceStart[i], prof.deviceEnd[i]});
    double h = prof.instructionEnd[i] - prof.instructionStart[i];
    if (op == plan::OpKind::Compute) {
      compute += h;
      continue;
    }
    double d = prof.deviceEnd[i] - prof.deviceStart[i];
    host += h;
    device += d;
    ++n;
    auto &k = step[std::string(plan::opKindName(op))];
    k[0] += h;
    k[1] += d;
    k[2] += 1;
  }
  std::sort(spans.begin(), spans.end());
  double busy = 0, end = 0;
  for (auto [a, b] : spans) {
    a = std::max(a, end);
    if (b > a)
      busy += b - a;
    end = std::max(end, b);
  }
  instructions = n;
  hostPerStep.push_back(host);
  devicePerStep.push_back(device);
  deviceBusy.push_back(busy);
  callbacks.push_back(compute);
  for (auto &[name, k] : step) {
    Kind &kind = kinds[name];
    kind.host.push_back(k[0] / k[2]);
    kind.device.push_back(k[1] / k[2]);
    kind.count = int64_t(k[2]);
  }
}

void DeviceTimes::print(double stepSeconds) const {
  if (hostPerStep.empty()) {
    std::printf("device timing: no step after the first to report\n");
    return;
  }
  double host = median(hostPerStep), device = median(devicePerStep);
  std::printf(
      "device timing (median of %zu steps after the first): %lld plan "
      "instructions per step besides compute callbacks: host %.2f ms per "
      "step to enqueue them, device %.2f ms to run them (host/device "
      "%.2f); device busy %.2f ms of the %.2f ms step; compute callbacks "
      "%.2f ms\n",
      hostPerStep.size(), (long long)instructions, host * 1e3, device * 1e3,
      device > 0 ? host / device : 0.0, median(deviceBusy) * 1e3,
      stepSeconds * 1e3, median(callbacks) * 1e3);
  for (const auto &[name, k] : kinds)
    std::printf("  %-16s %3lld per step: host %8.1f us, device %8.1f us "
                "per instruction\n",
                name.c_str(), (long long)k.count, median(k.host) * 1e6,
                median(k.device) * 1e6);
}
