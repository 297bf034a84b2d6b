//===- LowerOptimizer.cpp - optimizer_step -> reduction + per-shard adamw -===//
//
// For each `dist.optimizer_step %param, %grad` of a `dist.train_step`
// function: the gradient is redistributed into the parameter's stored layout
// right after it is produced (core's planner: reduce_scatter over the shard
// axes, all_reduce over the replicate axes), all-reduces over a managed axis
// become `fault_tolerant`, the optimizer state becomes two function arguments
// per parameter, and one `dist.adamw` per parameter runs at the end of the
// step on the stored shard. A reduction that would need a gather (or any
// other data movement than reducing) is an error: the point of a per-shard
// optimizer is that it never gathers.
//
//===----------------------------------------------------------------------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/IR/DiscardableAttrs.h"
#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Debug.h"

#include <optional>

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTLOWEROPTIMIZER
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

// -debug-only=dist-lower-optimizer (in builds with LLVM debug output) logs what
// it does.
#define DEBUG_TYPE "dist-lower-optimizer"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

namespace {

/// One parameter's update.
struct Update {
  OptimizerStepOp op;
  BlockArgument param;
  StringAttr name;   ///< the dist.param name
  int64_t tensorId;  ///< index among the dist.param arguments
  Value reducedGrad; ///< the gradient in the parameter's layout
};

} // namespace

/// Reads `dist.optimizer` (checked by the dialect's verifier and again by
/// readOptimizerAttr, whose errors name the key).
static FailureOr<OptimizerHyper> readHyper(func::FuncOp func) {
  Attribute raw = func->getAttr(DistDialect::OptimizerAttrHelper::getNameStr());
  if (!raw)
    return func.emitOpError()
           << "has dist.optimizer_step ops but no "
           << DistDialect::OptimizerAttrHelper::getNameStr()
           << " dictionary (kind, lr, beta1, beta2, eps, weight_decay, "
              "stochastic_rounding, seed)";
  return readOptimizerAttr(func, raw);
}

/// `{"dp", "tp":(1)2}`: the IR's spelling of a ref list, for messages.
static std::string spellAxes(const Mesh &mesh, const AxisRefList &refs) {
  std::string out = "{";
  for (size_t i = 0; i < refs.size(); ++i) {
    const AxisRef &r = refs[i];
    if (i)
      out += ", ";
    out += "\"" + mesh.axis(r.axis).name + "\"";
    if (!r.isWhole(mesh))
      out += ":(" + std::to_string(r.pre) + ")" + std::to_string(r.size);
  }
  return out + "}";
}

/// The ops lowerRedistribute created between `grad` and `reduced`, first
/// to last.
static SmallVector<Operation *> chainOf(Value grad, Value reduced) {
  SmallVector<Operation *> chain;
  for (Value v = reduced; v != grad;) {
    Operation *op = v.getDefiningOp();
    chain.push_back(op);
    v = op->getOperand(0);
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

/// Redistributes one gradient into its parameter's layout, checks that this
/// only reduces (no gather or other movement) and marks all-reduces over a
/// managed axis fault-tolerant. `anchors` holds the last op inserted after
/// each producer, so that the gradients of one op are reduced in the order
/// of their optimizer_steps.
static FailureOr<Value>
reduceGradient(OptimizerStepOp step, StringAttr name, MeshCache &meshes,
               llvm::DenseMap<void *, Operation *> &anchors) {
  Value grad = step.getGrad();
  auto paramType = cast<RankedTensorType>(step.getParam().getType());
  auto gradType = cast<RankedTensorType>(grad.getType());
  LayoutAttr stored = getLayout(paramType);
  auto target = RankedTensorType::get(gradType.getShape(),
                                      gradType.getElementType(), stored);

  void *producer = grad.getDefiningOp()
                       ? static_cast<void *>(grad.getDefiningOp())
                       : static_cast<void *>(grad.getParentBlock());
  OpBuilder b(step.getContext());
  if (Operation *anchor = anchors.lookup(producer))
    b.setInsertionPointAfter(anchor);
  else
    b.setInsertionPointAfterValue(grad);
  auto redistribute = RedistributeOp::create(b, step.getLoc(), target, grad);
  FailureOr<Value> reduced = lowerRedistribute(redistribute, meshes);
  if (failed(reduced))
    return failure();
  SmallVector<Operation *> chain = chainOf(grad, *reduced);
  if (!chain.empty())
    anchors[producer] = chain.back();

  const View *view = meshes.get(step, stored.getMesh());
  if (!view)
    return failure();
  const Mesh &mesh = view->mesh();
  for (Operation *op : chain) {
    if (isa<ReduceScatterOp, AllReduceOp, LocalSliceOp, MarkPartialOp,
            RedistributeOp>(op))
      continue;
    auto refs = coreAxisRefs(mesh, op->getAttrOfType<ArrayAttr>("axes"));
    if (!refs)
      return step.emitOpError() << refs.error().message;
    StringRef kind = op->getName().stripDialect();
    return step.emitOpError()
           << "the update of " << name << " would need "
           << (kind.starts_with("a") ? "an " : "a ") << kind << " over "
           << spellAxes(mesh, *refs)
           << "; a per-shard optimizer needs the gradient reducible into the "
              "parameter's layout ("
           << gradType << " -> " << paramType << ")";
  }
  for (Operation *op : chain) {
    auto allReduce = dyn_cast<AllReduceOp>(op);
    if (!allReduce)
      continue;
    auto refs = coreAxisRefs(mesh, allReduce.getAxes());
    if (!refs)
      return step.emitOpError() << refs.error().message;
    if (touchesManaged(mesh, *refs))
      allReduce.setFaultTolerant(true);
  }
  return *reduced;
}

/// Checks one optimizer_step's operands; returns the parameter argument and
/// its dist.param name.
static FailureOr<std::pair<BlockArgument, StringAttr>>
checkStep(func::FuncOp func, OptimizerStepOp step,
          const OptimizerHyper &hyper) {
  Block &entry = func.getBody().front();
  auto param = dyn_cast<BlockArgument>(step.getParam());
  StringAttr name;
  if (param && param.getOwner() == &entry)
    name = func.getArgAttrOfType<StringAttr>(
        param.getArgNumber(), DistDialect::ParamAttrHelper::getNameStr());
  if (!name)
    return step.emitOpError()
           << "parameter operand must be an argument of the function with a "
           << DistDialect::ParamAttrHelper::getNameStr()
           << " name (the stored parameter, not a value computed from it)";
  if (step->getBlock() != &entry)
    return step.emitOpError()
           << "updating " << name
           << " must be at the top level of the dist.train_step function";
  // The op's verifier has checked shapes, element types, one mesh, a
  // non-partial stored layout and that both or neither are laid out; what is
  // left is the rank-local form, which cannot be lowered.
  auto paramType = cast<RankedTensorType>(param.getType());
  if (!getLayout(paramType))
    return step.emitOpError()
           << "parameter " << name
           << " has no layout; run dist-propagate-layouts first";
  if (hyper.stochasticRounding && !paramType.getElementType().isBF16())
    return step.emitOpError()
           << "stochastic rounding rounds the update to bfloat16, but " << name
           << " is " << paramType.getElementType();
  return std::pair{param, name};
}

static LogicalResult lowerFunction(func::FuncOp func, MeshCache &meshes) {
  SmallVector<OptimizerStepOp> steps;
  func.walk([&](OptimizerStepOp op) { steps.push_back(op); });
  if (steps.empty())
    return success();
  FailureOr<OptimizerHyper> hyper = readHyper(func);
  if (failed(hyper))
    return failure();
  if (!func.getBody().hasOneBlock())
    return func.emitOpError()
           << "a dist.train_step function must be one block to lower its "
              "optimizer";

  // tensor_id: the parameter's index among the dist.param arguments, the
  // same on every rank and under every layout.
  // A pp rank's program keeps only its stages' parameters; each carries
  // its index in the whole model (`dist.tensor_id`, dist-lower-pipeline).
  llvm::DenseMap<unsigned, int64_t> tensorIds;
  for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
    if (func.getArgAttrOfType<StringAttr>(
            i, DistDialect::ParamAttrHelper::getNameStr())) {
      auto id = func.getArgAttrOfType<IntegerAttr>(
          i, DistDialect::TensorIdAttrHelper::getNameStr());
      tensorIds.try_emplace(i, id ? id.getInt()
                                  : static_cast<int64_t>(tensorIds.size()));
    }

  SmallVector<Update> updates;
  llvm::DenseMap<unsigned, OptimizerStepOp> seen;
  llvm::DenseMap<void *, Operation *> anchors;
  for (OptimizerStepOp step : steps) {
    auto checked = checkStep(func, step, *hyper);
    if (failed(checked))
      return failure();
    auto [param, name] = *checked;
    auto [it, inserted] = seen.try_emplace(param.getArgNumber(), step);
    if (!inserted) {
      InFlightDiagnostic diag = step.emitOpError()
                                << "updates " << name << " a second time";
      diag.attachNote(it->second.getLoc()) << "first update here";
      return diag;
    }
    FailureOr<Value> reduced = reduceGradient(step, name, meshes, anchors);
    if (failed(reduced))
      return failure();
    updates.push_back(
        {step, param, name, tensorIds.lookup(param.getArgNumber()), *reduced});
    LLVM_DEBUG(llvm::dbgs()
               << "[" DEBUG_TYPE "] " << name << " (tensor_id "
               << updates.back().tensorId << "): gradient reduced to "
               << reduced->getType() << "\n");
  }

  // Optimizer state: two fp32 arguments per parameter in the stored layout,
  // appended in parameter order.
  SmallVector<Update *> byParam;
  for (Update &u : updates)
    byParam.push_back(&u);
  llvm::sort(byParam, [](Update *a, Update *b) {
    return a->param.getArgNumber() < b->param.getArgNumber();
  });
  MLIRContext *ctx = func.getContext();
  Builder builder(ctx);
  // One insertArguments call: appending one by one rebuilds the function
  // type each time (quadratic in the parameters of a 405B model).
  SmallVector<unsigned> indices;
  SmallVector<Type> types;
  SmallVector<DictionaryAttr> attrs;
  SmallVector<Location> locs;
  unsigned first = func.getNumArguments();
  for (Update *u : byParam) {
    auto paramType = cast<RankedTensorType>(u->param.getType());
    auto stateType = RankedTensorType::get(
        paramType.getShape(), builder.getF32Type(), paramType.getEncoding());
    for (const char *suffix : {".exp_avg", ".exp_avg_sq"}) {
      indices.push_back(first);
      types.push_back(stateType);
      attrs.push_back(builder.getDictionaryAttr(builder.getNamedAttr(
          DistDialect::StateAttrHelper::getNameStr(),
          builder.getStringAttr(u->name.getValue() + suffix))));
      locs.push_back(u->param.getLoc());
    }
  }
  if (failed(func.insertArguments(indices, types, attrs, locs)))
    return func.emitOpError() << "cannot append the optimizer state";
  llvm::DenseMap<Update *, std::pair<Value, Value>> state;
  for (auto [i, u] : llvm::enumerate(byParam))
    state[u] = {func.getArgument(first + 2 * i),
                func.getArgument(first + 2 * i + 1)};

  // The updates, after every reduction, in the order of the steps. AdamW
  // reads a float32 gradient (docs/plan-format.md, optimizer_update): one
  // reduced in another dtype is widened first, as FSDP2 casts the reduced
  // gradient to the fp32 parameter's dtype. The casts all come before the
  // first update, so that a unit's fused update follows all of them.
  OpBuilder b(func.getBody().back().getTerminator());
  for (Update &u : updates) {
    auto gradType = cast<RankedTensorType>(u.reducedGrad.getType());
    if (gradType.getElementType().isF32())
      continue;
    auto f32Type = RankedTensorType::get(gradType.getShape(), b.getF32Type(),
                                         gradType.getEncoding());
    if (gradType.getElementType().getIntOrFloatBitWidth() < 32)
      u.reducedGrad =
          arith::ExtFOp::create(b, u.op.getLoc(), f32Type, u.reducedGrad);
    else
      u.reducedGrad =
          arith::TruncFOp::create(b, u.op.getLoc(), f32Type, u.reducedGrad);
  }
  for (Update &u : updates) {
    auto [m, v] = state.lookup(&u);
    Type paramType = u.param.getType();
    AdamWOp::create(
        b, u.op.getLoc(), paramType, m.getType(), v.getType(), u.param,
        u.reducedGrad, m, v, b.getF64FloatAttr(hyper->lr),
        b.getF64FloatAttr(hyper->beta1), b.getF64FloatAttr(hyper->beta2),
        b.getF64FloatAttr(hyper->eps), b.getF64FloatAttr(hyper->weightDecay),
        hyper->stochasticRounding ? b.getUnitAttr() : nullptr,
        b.getI64IntegerAttr(hyper->seed), b.getI64IntegerAttr(u.tensorId));
    u.op.erase();
  }
  return success();
}

namespace {
struct LowerOptimizerPass
    : meshplan::dist::impl::DistLowerOptimizerBase<LowerOptimizerPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshCache meshes(module);
    bool failedAny = false;
    module.walk([&](OptimizerStepOp op) {
      auto func = op->getParentOfType<func::FuncOp>();
      if (!func || !DistDialect::TrainStepAttrHelper(&getContext())
                        .isAttrPresent(func)) {
        op.emitOpError() << "is outside a dist.train_step function; the "
                            "hyper-parameters come from its dist.optimizer";
        failedAny = true;
      }
    });
    if (failedAny)
      return signalPassFailure();
    for (auto func : module.getOps<func::FuncOp>())
      if (DistDialect::TrainStepAttrHelper(&getContext()).isAttrPresent(func) &&
          failed(lowerFunction(func, meshes)))
        return signalPassFailure();
  }
};
} // namespace
