//===- LowerRedistribute.cpp - dist.redistribute -> collectives -----------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/Debug.h"

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTLOWERREDISTRIBUTE
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

// -debug-only=dist-lower-redistribute (in builds with LLVM debug output) logs
// what it does.
#define DEBUG_TYPE "dist-lower-redistribute"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

/// Bytes per element for the byte estimates on each step.
static int64_t elementBytes(Type type) {
  if (type.isIntOrFloat())
    return std::max<int64_t>(1, (type.getIntOrFloatBitWidth() + 7) / 8);
  return 8; // index and others: a machine word
}

/// Builds the op for one planned step.
static Value buildStep(OpBuilder &b, Location loc, const Mesh &mesh,
                       const RedistributeStep &step, Value input, Type type) {
  MLIRContext *ctx = b.getContext();
  ArrayAttr axes = axisRefsAttr(ctx, mesh, step.axes);
  IntegerAttr dim = b.getI64IntegerAttr(step.dim);
  auto reduce = ReduceKindAttr::get(ctx, distReduceKind(step.op));
  switch (step.kind) {
  case StepKind::AllGather:
    return AllGatherOp::create(b, loc, type, input, axes, dim, nullptr,
                               nullptr);
  case StepKind::ReduceScatter:
    return ReduceScatterOp::create(b, loc, type, input, axes, dim, reduce,
                                   nullptr, nullptr);
  case StepKind::AllReduce:
    return AllReduceOp::create(b, loc, type, input, axes, reduce,
                               /*fault_tolerant=*/nullptr, nullptr, nullptr);
  case StepKind::AllToAll:
    return AllToAllOp::create(b, loc, type, input, axes, dim,
                              b.getI64IntegerAttr(step.dstDim), nullptr,
                              nullptr);
  case StepKind::Permute:
    return PermuteOp::create(b, loc, type, input, axes, dim,
                             axisRefsAttr(ctx, mesh, step.dstAxes), nullptr,
                             nullptr);
  case StepKind::LocalSlice:
    return LocalSliceOp::create(b, loc, type, input, axes, dim, nullptr,
                                nullptr);
  case StepKind::MarkPartial:
    return MarkPartialOp::create(b, loc, type, input, axes, reduce, nullptr,
                                 nullptr);
  case StepKind::Broadcast:
    break;
  }
  llvm_unreachable("planRedistribute does not plan broadcasts");
}

FailureOr<Value> meshplan::dist::lowerRedistribute(RedistributeOp op,
                                                   MeshCache &meshes) {
  auto inType = cast<RankedTensorType>(op.getInput().getType());
  auto outType = cast<RankedTensorType>(op.getResult().getType());
  LayoutAttr inLayout = getLayout(inType), outLayout = getLayout(outType);
  if (!inLayout || !outLayout)
    return op.emitOpError() << "needs layouts on operand and result";
  const View *view = meshes.get(op, inLayout.getMesh());
  if (!view)
    return failure();
  auto from = coreLayout(*view, inLayout);
  auto to = coreLayout(*view, outLayout);
  if (!from || !to)
    return op.emitOpError() << (from ? to : from).error().message;
  std::vector<int64_t> shape(inType.getShape().begin(),
                             inType.getShape().end());
  auto plan = planRedistribute(*view, *from, *to, shape,
                               elementBytes(inType.getElementType()));
  if (!plan)
    return op.emitOpError() << plan.error().message;
  LLVM_DEBUG(llvm::dbgs() << "[" DEBUG_TYPE "] " << op.getLoc() << ": "
                          << inType << " -> " << outType << " in "
                          << plan->steps.size() << " step(s)\n");
  if (plan->steps.empty() && inType != outType)
    return Value(op.getResult()); // same shards, another spelling: keep it

  OpBuilder b(op);
  Value current = op.getInput();
  for (size_t i = 0; i < plan->steps.size(); ++i) {
    const RedistributeStep &step = plan->steps[i];
    // The last step produces exactly the declared result type (the
    // planner's own spelling may differ, with the same shards).
    Type type = i + 1 == plan->steps.size()
                    ? Type(outType)
                    : RankedTensorType::get(
                          inType.getShape(), inType.getElementType(),
                          layoutAttr(op.getContext(), inLayout.getMesh(),
                                     view->mesh(), step.after));
    current = buildStep(b, op.getLoc(), view->mesh(), step, current, type);
    LLVM_DEBUG(llvm::dbgs()
               << "[" DEBUG_TYPE "]   step " << i << ": "
               << current.getDefiningOp()->getName() << " -> " << type << "\n");
  }
  op.getResult().replaceAllUsesWith(current);
  op.erase();
  return current;
}

namespace {
struct LowerRedistributePass
    : meshplan::dist::impl::DistLowerRedistributeBase<LowerRedistributePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshCache meshes(module);
    SmallVector<RedistributeOp> ops;
    module.walk([&](RedistributeOp op) { ops.push_back(op); });
    for (RedistributeOp op : ops)
      if (failed(lowerRedistribute(op, meshes)))
        return signalPassFailure();
  }
};
} // namespace
