//===- LowerPipeline.cpp - one pp rank's stages, microbatch by microbatch -===//
//
// The order of the (stage, microbatch) computes and of the transfers between
// ranks is core's (buildPipelineSchedule, checked deadlock-free before it is
// returned); this pass only turns each action into IR. It never decides an
// order itself.
//
//===----------------------------------------------------------------------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Debug.h"

#include <map>

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTLOWERPIPELINE
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

// -debug-only=dist-lower-pipeline (in builds with LLVM debug output) logs what
// it does.
#define DEBUG_TYPE "dist-lower-pipeline"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

namespace {
using Key = std::pair<int64_t, int64_t>; // (stage, microbatch)

/// The computes of one stage in the one-microbatch template, block order.
struct StageTemplate {
  SmallVector<ComputeOp> forward;
  SmallVector<ComputeOp> backward;
};

struct LowerPipelinePass
    : meshplan::dist::impl::DistLowerPipelineBase<LowerPipelinePass> {
  using DistLowerPipelineBase::DistLowerPipelineBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshCache meshes(module);
    SmallVector<func::FuncOp> steps;
    MLIRContext *ctx = &getContext();
    for (auto func : module.getOps<func::FuncOp>())
      if (DistDialect::TrainStepAttrHelper(ctx).isAttrPresent(func) &&
          DistDialect::PipelineAttrHelper(ctx).isAttrPresent(func) &&
          !DistDialect::PpRankAttrHelper(ctx).isAttrPresent(func))
        steps.push_back(func);
    for (func::FuncOp func : steps)
      if (failed(lowerStep(module, func, meshes)))
        return signalPassFailure();
  }

  LogicalResult lowerStep(ModuleOp module, func::FuncOp func,
                          MeshCache &meshes);
};

/// Builds one function's program; state for one lowerStep call.
class StepLowering {
public:
  StepLowering(ModuleOp module, func::FuncOp func, PipelineScheduleOp pipeline,
               const PipelineSchedule &schedule, int64_t ppRank)
      : module(module), func(func), pipeline(pipeline), schedule(schedule),
        ppRank(ppRank), b(func.getContext()),
        activation(cast<RankedTensorType>(pipeline.getActivation())) {}

  LogicalResult run();

private:
  ModuleOp module;
  func::FuncOp func;
  PipelineScheduleOp pipeline;
  const PipelineSchedule &schedule;
  int64_t ppRank;
  OpBuilder b;
  RankedTensorType activation;

  std::map<int64_t, StageTemplate> stages;
  /// Activations: a stage's output (forward), the input it read, the
  /// gradient of its input (backward) and the gradient of its output.
  std::map<Key, Value> actOut, actIn, actGrad, gradIn;
  /// Per template backward op: the gradients accumulated so far.
  DenseMap<Operation *, SmallVector<Value>> accumulated;
  /// Per template backward op: the gradients of the last microbatch.
  DenseMap<Operation *, ComputeOp> lastBackward;
  std::map<int64_t, FlatSymbolRefAttr> pairs; // peer pp rank -> pair

  bool isMine(int64_t stage) const {
    return schedule.rankOfStage(stage) == ppRank;
  }
  LogicalResult dropOtherStages();
  LogicalResult collectTemplate(SmallVectorImpl<Operation *> &after);
  FlatSymbolRefAttr pairWith(int64_t peer);
  int64_t keyOf(int64_t peer) const { return peer < ppRank ? 0 : 1; }
  void mark(Operation *op, const PipelineAction &action);
  ComputeOp emitCompute(ComputeOp tmpl, Phase phase, ValueRange inputs,
                        TypeRange results, const PipelineAction &action);
  LogicalResult emit(const PipelineAction &action);
  Value inputActivation(int64_t stage, int64_t mb);
  Value outputGradient(int64_t stage, int64_t mb);
};
} // namespace

LogicalResult LowerPipelinePass::lowerStep(ModuleOp module, func::FuncOp func,
                                           MeshCache &meshes) {
  // A FlatSymbolRefAttr: the verifier checked it.
  FlatSymbolRefAttr name =
      DistDialect::PipelineAttrHelper(func->getContext()).getAttr(func);
  auto pipeline =
      meshes.symbolTable().lookup<PipelineScheduleOp>(name.getValue());
  if (!pipeline)
    return func.emitOpError() << DistDialect::PipelineAttrHelper::getNameStr()
                              << " refers to " << name << ", which is not a "
                              << PipelineScheduleOp::getOperationName();
  const View *view = meshes.get(pipeline, pipeline.getMeshAttr());
  if (!view)
    return failure();
  auto axis = view->mesh().findAxis(pipeline.getAxis().str());
  if (!axis)
    return pipeline.emitOpError()
           << "axis \"" << pipeline.getAxis() << "\" is not in mesh "
           << pipeline.getMeshAttr();
  int64_t ranks = view->mesh().axis(*axis).size;
  // The option's value (streaming the Option object prints a character).
  int64_t rank = ppRank;
  if (rank < 0 || rank >= ranks)
    return func.emitOpError()
           << "dist-lower-pipeline needs pp-rank=N with 0 <= N < " << ranks
           << " (the size of axis \"" << pipeline.getAxis() << "\"), got "
           << rank;
  auto config = pipeline.getConfig(ranks);
  if (failed(config))
    return failure();
  auto schedule = buildPipelineSchedule(*config);
  if (!schedule)
    return pipeline.emitOpError() << schedule.error().message;
  return StepLowering(module, func, pipeline, *schedule, rank).run();
}

/// Erases other stages' computes, what reads their results, and then what
/// nothing reads any more (gathers, casts) and the parameter arguments left
/// unused: the rank holds only its stages' parameters, so their gradients
/// and optimizer state never appear.
LogicalResult StepLowering::dropOtherStages() {
  Block &body = func.getBody().front();
  // A parameter's index in the whole model (the optimizer's tensor_id, from
  // which stochastic rounding draws) must survive the erasure.
  int64_t paramIndex = 0;
  StringRef paramName = DistDialect::ParamAttrHelper::getNameStr();
  StringRef tensorIdName = DistDialect::TensorIdAttrHelper::getNameStr();
  for (BlockArgument arg : func.getArguments())
    if (func.getArgAttr(arg.getArgNumber(), paramName) &&
        !func.getArgAttr(arg.getArgNumber(), tensorIdName))
      func.setArgAttr(arg.getArgNumber(), tensorIdName,
                      b.getI64IntegerAttr(paramIndex++));
    else if (func.getArgAttr(arg.getArgNumber(), paramName))
      ++paramIndex;
  llvm::DenseSet<Operation *> doomed;
  for (Operation &op : body.without_terminator()) {
    auto compute = dyn_cast<ComputeOp>(op);
    // Checked before anything is dropped: every rank must see the error.
    if (compute && compute.getStageAttr() &&
        compute.getStageAttr().getInt() >= schedule.numStages())
      return compute.emitOpError()
             << "stage " << compute.getStageAttr().getInt()
             << " is outside the pipeline's " << schedule.numStages()
             << " stages";
    bool drop = compute && compute.getStageAttr() &&
                !isMine(compute.getStageAttr().getInt());
    for (Value operand : op.getOperands())
      if (Operation *def = operand.getDefiningOp(); def && doomed.count(def)) {
        if (compute && !drop)
          return compute.emitOpError()
                 << "reads a value of stage "
                 << cast<ComputeOp>(def).getStageAttr().getInt()
                 << "'s compute; stages exchange activations only through "
                    "dist-lower-pipeline";
        drop = true;
      }
    if (drop)
      doomed.insert(&op);
  }
  SmallVector<Operation *> order;
  for (Operation &op : body.without_terminator())
    if (doomed.count(&op))
      order.push_back(&op);
  for (Operation *op : llvm::reverse(order))
    op->erase();
  // Trivially dead producers, last first so their operands die too. (A
  // snapshot: erasing under a reverse iterator would invalidate it.)
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  for (Operation *op : llvm::reverse(ops))
    if (isOpTriviallyDead(op))
      op->erase();
  llvm::BitVector unused(func.getNumArguments());
  for (BlockArgument arg : func.getArguments())
    if (arg.use_empty() &&
        func.getArgAttr(arg.getArgNumber(),
                        DistDialect::ParamAttrHelper::getNameStr()))
      unused.set(arg.getArgNumber());
  return func.eraseArguments(unused);
}

/// Sorts the template: each stage's computes; the ops that depend on a
/// compute's result (gradient reductions, optimizer steps) go to `after`.
/// Everything else (gathers) stays where it is, before the program. A
/// compute may not read anything computed from a compute: it is replayed
/// before the ops in `after`.
LogicalResult
StepLowering::collectTemplate(SmallVectorImpl<Operation *> &after) {
  Block &body = func.getBody().front();
  llvm::DenseSet<Operation *> late;
  for (Operation &op : body.without_terminator()) {
    auto compute = dyn_cast<ComputeOp>(op);
    bool dependsOnCompute = false;
    for (Value operand : op.getOperands())
      if (Operation *def = operand.getDefiningOp())
        dependsOnCompute |= isa<ComputeOp>(def) || late.count(def);
    if (compute) {
      if (!compute.getStageAttr())
        return compute.emitOpError()
               << "has no stage, but its function names pipeline @"
               << pipeline.getSymName();
      int64_t stage = compute.getStageAttr().getInt();
      if (dependsOnCompute)
        return compute.emitOpError()
               << "reads a value computed from a compute's result; the "
                  "template is one microbatch whose computes read only "
                  "parameters and their gathers";
      if (DistDialect::MicrobatchAttrHelper(compute->getContext())
              .isAttrPresent(compute))
        return compute.emitOpError()
               << "already has a microbatch; the template is one microbatch";
      switch (compute.getPhase()) {
      case Phase::Forward:
        if (!compute.getGrads().empty())
          return compute.emitOpError()
                 << "already produces an activation; dist-lower-pipeline "
                    "adds the stage's activations";
        stages[stage].forward.push_back(compute);
        break;
      case Phase::Backward:
        stages[stage].backward.push_back(compute);
        break;
      default:
        return compute.emitOpError()
               << "is already split (" << stringifyPhase(compute.getPhase())
               << "); the template has forward and backward only";
      }
      continue;
    }
    if (dependsOnCompute) {
      late.insert(&op);
      after.push_back(&op);
    }
  }
  for (int64_t stage = 0; stage < schedule.numStages(); ++stage) {
    if (!isMine(stage))
      continue;
    StageTemplate &t = stages[stage];
    if (t.forward.empty() || t.backward.empty())
      return func.emitOpError()
             << "stage " << stage << " (on pp rank " << ppRank << ") has no "
             << (t.forward.empty() ? "forward" : "backward") << " compute";
  }
  return success();
}

FlatSymbolRefAttr StepLowering::pairWith(int64_t peer) {
  auto it = pairs.find(peer);
  if (it != pairs.end())
    return it->second;
  int64_t lo = std::min(peer, ppRank), hi = std::max(peer, ppRank);
  // An existing pair of the same coordinates serves every function.
  for (PairOp pair : module.getOps<PairOp>())
    if (pair.getMeshAttr() == pipeline.getMeshAttr() &&
        pair.getAxis() == pipeline.getAxis() && pair.getCoords().size() == 2 &&
        pair.getCoords()[0] == lo && pair.getCoords()[1] == hi)
      return pairs[peer] = FlatSymbolRefAttr::get(pair.getSymNameAttr());
  std::string name = pipeline.getAxis().str() + "_" + std::to_string(lo) + "_" +
                     std::to_string(hi);
  // Created detached, then inserted by the symbol table, which renames it
  // if another symbol has the name.
  SymbolTable table(module);
  OpBuilder detached(module.getContext());
  auto pair =
      PairOp::create(detached, pipeline.getLoc(), detached.getStringAttr(name),
                     pipeline.getMeshAttr(), pipeline.getAxisAttr(),
                     detached.getDenseI64ArrayAttr({lo, hi}));
  // After the pipeline and the pairs before it, in the order of first use.
  Operation *anchor = pipeline;
  for (PairOp other : module.getOps<PairOp>())
    anchor = other;
  table.insert(pair, std::next(Block::iterator(anchor)));
  return pairs[peer] = FlatSymbolRefAttr::get(pair.getSymNameAttr());
}

void StepLowering::mark(Operation *op, const PipelineAction &action) {
  MLIRContext *ctx = op->getContext();
  DistDialect::MicrobatchAttrHelper(ctx).setAttr(
      op, b.getI64IntegerAttr(action.microbatch));
  DistDialect::ActionAttrHelper(ctx).setAttr(
      op, b.getStringAttr(formatPipelineAction(action)));
}

ComputeOp StepLowering::emitCompute(ComputeOp tmpl, Phase phase,
                                    ValueRange inputs, TypeRange results,
                                    const PipelineAction &action) {
  FloatAttr flops = tmpl.getFlopsAttr();
  // I and W each do about half of a full backward's matmuls (ZB-V's
  // F = I = W); the split is the cost model's estimate, not a rule.
  if (flops && phase != tmpl.getPhase())
    flops = b.getF64FloatAttr(flops.getValueAsDouble() / 2);
  auto op =
      ComputeOp::create(b, tmpl.getLoc(), results, phase, tmpl.getModuleAttr(),
                        inputs, flops, tmpl.getStageAttr());
  for (NamedAttribute attr : tmpl->getDiscardableAttrs())
    op->setAttr(attr.getName(), attr.getValue());
  mark(op, action);
  return op;
}

/// The activation F(stage, mb) reads: the predecessor's output when it is
/// on this rank (the turn of a V), else what RECV_F brought.
Value StepLowering::inputActivation(int64_t stage, int64_t mb) {
  if (stage == 0)
    return {};
  if (isMine(stage - 1))
    return actOut[{stage - 1, mb}];
  return actIn[{stage, mb}];
}

/// The gradient B/I(stage, mb) reads: the successor's input gradient when
/// it is on this rank, else what RECV_B brought.
Value StepLowering::outputGradient(int64_t stage, int64_t mb) {
  if (stage + 1 == schedule.numStages())
    return {};
  if (isMine(stage + 1))
    return actGrad[{stage + 1, mb}];
  return gradIn[{stage, mb}];
}

LogicalResult StepLowering::emit(const PipelineAction &action) {
  LLVM_DEBUG(llvm::dbgs() << "[" DEBUG_TYPE "] @" << func.getSymName()
                          << " pp rank " << ppRank << ": "
                          << formatPipelineAction(action) << "\n");
  int64_t s = action.stage, mb = action.microbatch;
  int64_t last = schedule.numStages() - 1;
  Location loc = pipeline.getLoc();
  auto tag = [&](char what, int64_t stage) {
    return b.getStringAttr(std::string(1, what) + " s" + std::to_string(stage) +
                           " mb" + std::to_string(mb));
  };
  // Core's schedule was checked (every action after what it consumes), so
  // a missing value here is a bug in this pass, not in the input.
  auto missing = [&](StringRef what) {
    return func.emitOpError()
           << "internal error: " << formatPipelineAction(action) << " has no "
           << what;
  };
  switch (action.op) {
  case PipelineOp::RecvActivation:
  case PipelineOp::RecvGrad: {
    bool fwd = action.op == PipelineOp::RecvActivation;
    auto recv = RecvOp::create(b, loc, activation, pairWith(action.peer),
                               b.getI64IntegerAttr(keyOf(action.peer)),
                               fwd ? tag('F', s - 1) : tag('B', s + 1));
    mark(recv, action);
    (fwd ? actIn : gradIn)[{s, mb}] = recv.getResult();
    return success();
  }
  case PipelineOp::SendActivation:
  case PipelineOp::SendGrad: {
    bool fwd = action.op == PipelineOp::SendActivation;
    Value value = (fwd ? actOut : actGrad)[{s, mb}];
    if (!value)
      return missing(fwd ? "activation to send" : "gradient to send");
    auto send = SendOp::create(b, loc, value, pairWith(action.peer),
                               b.getI64IntegerAttr(keyOf(action.peer)),
                               fwd ? tag('F', s) : tag('B', s));
    mark(send, action);
    return success();
  }
  case PipelineOp::Forward: {
    Value in = inputActivation(s, mb);
    if (s > 0 && !in)
      return missing("input activation");
    actIn[{s, mb}] = in;
    SmallVector<ComputeOp> &ops = stages[s].forward;
    for (size_t i = 0; i < ops.size(); ++i) {
      ComputeOp tmpl = ops[i];
      SmallVector<Value> inputs(tmpl.getInputs());
      if (i == 0 && in)
        inputs.push_back(in);
      SmallVector<Type> results;
      if (i + 1 == ops.size() && s < last)
        results.push_back(activation);
      ComputeOp op = emitCompute(tmpl, Phase::Forward, inputs, results, action);
      if (!results.empty())
        actOut[{s, mb}] = op.getGrads()[0];
    }
    return success();
  }
  case PipelineOp::Backward:
  case PipelineOp::BackwardInput: {
    bool full = action.op == PipelineOp::Backward;
    Value out = outputGradient(s, mb);
    if (s < last && !out)
      return missing("output gradient");
    Value in = actIn[{s, mb}];
    if (s > 0 && !in)
      return missing("input activation (its forward has not run)");
    SmallVector<ComputeOp> &ops = stages[s].backward;
    for (size_t i = 0; i < ops.size(); ++i) {
      ComputeOp tmpl = ops[i];
      bool first = i == 0, lastOp = i + 1 == ops.size();
      Value act = lastOp ? in : Value();
      size_t grads = tmpl.getGrads().size();
      SmallVector<Value> inputs;
      SmallVector<Type> results;
      if (full) {
        // Gradient i belongs to input i: the activation's sits after the
        // parameters' (see the pass description).
        inputs.append(tmpl.getInputs().begin(),
                      tmpl.getInputs().begin() + grads);
        results.append(tmpl.getGrads().getTypes().begin(),
                       tmpl.getGrads().getTypes().end());
        if (act) {
          inputs.push_back(act);
          results.push_back(activation);
        }
        inputs.append(tmpl.getInputs().begin() + grads, tmpl.getInputs().end());
        auto acc = accumulated.find(tmpl);
        if (acc != accumulated.end())
          inputs.append(acc->second);
      } else {
        // I: the activation's gradient only, so it comes first.
        if (act) {
          inputs.push_back(act);
          results.push_back(activation);
        }
        inputs.append(tmpl.getInputs().begin(), tmpl.getInputs().end());
      }
      if (first && out)
        inputs.push_back(out);
      ComputeOp op =
          emitCompute(tmpl, full ? Phase::Backward : Phase::BackwardInput,
                      inputs, results, action);
      if (full) {
        accumulated[tmpl] = SmallVector<Value>(op.getGrads().take_front(grads));
        lastBackward[tmpl] = op;
      }
      if (act)
        actGrad[{s, mb}] = op.getGrads().back();
    }
    return success();
  }
  case PipelineOp::BackwardWeight: {
    for (ComputeOp tmpl : stages[s].backward) {
      SmallVector<Value> inputs(tmpl.getInputs());
      auto acc = accumulated.find(tmpl);
      if (acc != accumulated.end())
        inputs.append(acc->second);
      ComputeOp op = emitCompute(tmpl, Phase::BackwardWeight, inputs,
                                 tmpl.getGrads().getTypes(), action);
      accumulated[tmpl] = SmallVector<Value>(op.getGrads());
      lastBackward[tmpl] = op;
    }
    return success();
  }
  }
  return success();
}

LogicalResult StepLowering::run() {
  if (failed(dropOtherStages()))
    return failure();
  SmallVector<Operation *> after;
  if (failed(collectTemplate(after)))
    return failure();
  Block &body = func.getBody().front();
  Operation *terminator = body.getTerminator();
  for (Operation *op : after)
    op->moveBefore(terminator);
  b.setInsertionPoint(after.empty() ? terminator : after.front());
  for (const PipelineAction &action : schedule.ranks[ppRank])
    if (failed(emit(action)))
      return failure();
  // The gradient consumers read the last microbatch's gradients, which
  // carry every earlier one's.
  for (auto &[stage, t] : stages)
    for (ComputeOp tmpl : t.backward) {
      ComputeOp final = lastBackward.lookup(tmpl);
      if (!final)
        return tmpl.emitOpError()
               << "internal error: the schedule ran no backward of it";
      for (auto [i, grad] : llvm::enumerate(tmpl.getGrads()))
        grad.replaceAllUsesWith(final.getGrads()[i]);
    }
  for (auto &[stage, t] : stages) {
    for (ComputeOp op : t.forward)
      op.erase();
    for (ComputeOp op : t.backward)
      op.erase();
  }
  DistDialect::PpRankAttrHelper(func->getContext())
      .setAttr(func, b.getI64IntegerAttr(ppRank));
  // The plan's mesh names the axis (a checkpoint's owners need it: no
  // layout replicates over it).
  DistDialect::PpAxisAttrHelper(func->getContext())
      .setAttr(func, pipeline.getAxisAttr());
  return success();
}
