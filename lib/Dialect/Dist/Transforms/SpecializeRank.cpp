//===- SpecializeRank.cpp - one rank's program ----------------------------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/Support/Debug.h"

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTSPECIALIZERANK
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

// -debug-only=dist-specialize-rank (in builds with LLVM debug output) logs what
// it does.
#define DEBUG_TYPE "dist-specialize-rank"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

namespace {
struct SpecializeRankPass
    : meshplan::dist::impl::DistSpecializeRankBase<SpecializeRankPass> {
  using DistSpecializeRankBase::DistSpecializeRankBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (rank < 0) {
      module.emitError() << "dist-specialize-rank needs rank=N (N >= 0)";
      return signalPassFailure();
    }
    MeshCache meshes(module);
    if (failed(foldAnnotations(module)) || failed(checkLowered(module)) ||
        failed(setGroups(module, meshes)) || failed(setSplits(module, meshes)))
      return signalPassFailure();
    // Types last: groups and splits read the global layouts.
    if (failed(localizeTypes(module, meshes)))
      return signalPassFailure();
    DistDialect::RankAttrHelper(&getContext())
        .setAttr(module,
                 IntegerAttr::get(IntegerType::get(&getContext(), 64), rank));
  }

  /// A rank's local type for a global tensor with a layout.
  FailureOr<Type> localType(Operation *user, Type type, MeshCache &meshes) {
    auto tensor = dyn_cast<RankedTensorType>(type);
    LayoutAttr layout = getLayout(type);
    if (!layout)
      return type;
    const View *view = meshes.get(user, layout.getMesh());
    if (!view)
      return failure();
    auto core = coreLayout(*view, layout);
    if (!core)
      return user->emitOpError() << core.error().message;
    std::vector<int64_t> shape(tensor.getShape().begin(),
                               tensor.getShape().end());
    auto box = shardOf(*view, *core, shape, rank);
    if (!box)
      return user->emitOpError() << box.error().message;
    return Type(
        RankedTensorType::get(box->localShape, tensor.getElementType()));
  }

  /// Annotations of function arguments become the arguments' types.
  LogicalResult foldAnnotations(ModuleOp module) {
    SmallVector<AnnotateOp> annotations;
    module.walk([&](AnnotateOp op) { annotations.push_back(op); });
    for (AnnotateOp op : annotations) {
      auto arg = dyn_cast<BlockArgument>(op.getInput());
      if (!arg || !isa<func::FuncOp>(arg.getOwner()->getParentOp()) ||
          !arg.hasOneUse())
        return op.emitOpError()
               << "has no rank-local form unless it annotates a function "
                  "argument used only here";
      arg.setType(op.getResult().getType());
      op.getResult().replaceAllUsesWith(arg);
      op.erase();
    }
    return success();
  }

  LogicalResult checkLowered(ModuleOp module) {
    auto walk = module.walk([&](RedistributeOp op) {
      op.emitOpError() << "has no rank-local form; run "
                          "dist-lower-redistribute first";
      return WalkResult::interrupt();
    });
    return failure(walk.wasInterrupted());
  }

  LogicalResult setGroups(ModuleOp module, MeshCache &meshes) {
    auto walk = module.walk([&](Operation *op) {
      auto axes = op->getAttrOfType<ArrayAttr>("axes");
      if (!axes || isa<CommOp>(op) || op->getNumOperands() != 1)
        return WalkResult::advance();
      LayoutAttr layout = getLayout(op->getOperand(0).getType());
      if (!layout)
        return WalkResult::advance();
      const View *view = meshes.get(op, layout.getMesh());
      if (!view)
        return WalkResult::interrupt();
      auto refs = coreAxisRefs(view->mesh(), axes);
      auto group = refs ? groupOf(view->mesh(), *refs, rank)
                        : Result<std::vector<int64_t>>(refs.error());
      if (!group) {
        op->emitOpError() << group.error().message;
        return WalkResult::interrupt();
      }
      op->setAttr("group", DenseI64ArrayAttr::get(op->getContext(), *group));
      LLVM_DEBUG({
        llvm::dbgs() << "[" DEBUG_TYPE "] rank " << rank << ": "
                     << op->getName() << " at " << op->getLoc() << " group [";
        llvm::interleaveComma(*group, llvm::dbgs());
        llvm::dbgs() << "]\n";
      });
      return WalkResult::advance();
    });
    return failure(walk.wasInterrupted());
  }

  LogicalResult setSplits(ModuleOp module, MeshCache &meshes) {
    auto walk = module.walk([&](CommOp comm) {
      const View *view = meshes.get(comm, comm.getMeshAttr());
      if (!view)
        return WalkResult::interrupt();
      auto refs = coreAxisRefs(view->mesh(), comm.getAxes());
      auto split = refs ? splitKeyOf(view->mesh(), *refs, rank)
                        : Result<SplitKey>(refs.error());
      if (!split) {
        comm.emitOpError() << split.error().message;
        return WalkResult::interrupt();
      }
      Builder b(comm);
      comm->setAttr("color", b.getI64IntegerAttr(split->color));
      comm->setAttr("key", b.getI64IntegerAttr(split->key));
      return WalkResult::advance();
    });
    return failure(walk.wasInterrupted());
  }

  LogicalResult localizeTypes(ModuleOp module, MeshCache &meshes) {
    auto walk = module.walk([&](func::FuncOp func) {
      for (BlockArgument arg : func.getArguments()) {
        auto type = localType(func, arg.getType(), meshes);
        if (failed(type))
          return WalkResult::interrupt();
        arg.setType(*type);
      }
      auto inner = func.walk([&](Operation *op) {
        for (OpResult result : op->getResults()) {
          auto type = localType(op, result.getType(), meshes);
          if (failed(type))
            return WalkResult::interrupt();
          result.setType(*type);
        }
        return WalkResult::advance();
      });
      if (inner.wasInterrupted())
        return WalkResult::interrupt();
      SmallVector<Type> results;
      for (Type t : func.getResultTypes()) {
        auto type = localType(func, t, meshes);
        if (failed(type))
          return WalkResult::interrupt();
        results.push_back(*type);
      }
      func.setType(FunctionType::get(
          func.getContext(), func.getBody().getArgumentTypes(), results));
      return WalkResult::advance();
    });
    return failure(walk.wasInterrupted());
  }
};
} // namespace
