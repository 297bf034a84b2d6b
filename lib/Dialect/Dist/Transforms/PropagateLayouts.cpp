//===- PropagateLayouts.cpp - fill in missing layouts ---------------------===//
//
// A layout lives in a value's type (its encoding), so propagation rewrites
// types. Per function: the mesh comes from the stated layouts (one mesh per
// function); rules come from core through LayoutRuleOpInterface, or core's
// elementwise rule for `Elementwise` ops.
//
//===----------------------------------------------------------------------===//

#include "MeshCache.h"

#include "meshplan/Core/LayoutRules.h"
#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/Support/Debug.h"

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTPROPAGATELAYOUTS
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

// -debug-only=dist-propagate-layouts (in builds with LLVM debug output) logs
// what it does.
#define DEBUG_TYPE "dist-propagate-layouts"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

namespace {

/// Per function: the mesh, and the core layout of every value that has one.
class Propagation {
public:
  Propagation(func::FuncOp func, MeshCache &meshes)
      : func(func), meshes(meshes) {}

  LogicalResult run() {
    if (failed(seedArguments()) || failed(findMesh()))
      return failure();
    if (!view)
      return success(); // nothing distributed in this function
    for (int round = 0; round < 64; ++round) {
      bool changed = false;
      // Forward first: a producer's layout outranks a consumer's wish.
      SmallVector<Operation *> ops;
      func.walk([&](Operation *op) { ops.push_back(op); });
      for (Operation *op : ops)
        changed |= assign(op, /*forward=*/true);
      for (Operation *op : llvm::reverse(ops))
        changed |= assign(op, /*forward=*/false);
      if (!changed)
        break;
    }
    if (failed(insertRedistributes()) || failed(checkComplete()))
      return failure();
    updateSignature();
    return success();
  }

private:
  /// `{dist.layout = #dist.layout<...>}` on an argument states its layout
  /// without changing the type the body was written against (as Shardy's
  /// argument shardings do); it becomes the argument's type here.
  LogicalResult seedArguments() {
    StringRef layoutName = DistDialect::LayoutAttrHelper::getNameStr();
    for (BlockArgument arg : func.getArguments()) {
      unsigned i = arg.getArgNumber();
      // The verifier checked it is a #dist.layout.
      auto attr = func.getArgAttrOfType<LayoutAttr>(i, layoutName);
      if (!attr)
        continue;
      auto tensor = dyn_cast<RankedTensorType>(arg.getType());
      if (!tensor || tensor.getEncoding())
        return func.emitError() << "argument " << i
                                << ": dist.layout needs a ranked tensor "
                                   "without an encoding";
      if (attr.getRank() != tensor.getRank())
        return func.emitError()
               << "argument " << i << ": layout has " << attr.getRank()
               << " dims but the tensor has " << tensor.getRank();
      arg.setType(RankedTensorType::get(tensor.getShape(),
                                        tensor.getElementType(), attr));
      func.removeArgAttr(i, layoutName);
    }
    return success();
  }

  /// The one mesh the function's stated layouts use.
  LogicalResult findMesh() {
    auto check = [&](Operation *where, Type type) -> LogicalResult {
      LayoutAttr layout = getLayout(type);
      if (!layout)
        return success();
      if (meshName && meshName != layout.getMesh())
        return where->emitError()
               << "uses meshes " << meshName << " and " << layout.getMesh()
               << " in one function; propagation needs one mesh per function";
      meshName = layout.getMesh();
      return success();
    };
    for (BlockArgument arg : func.getArguments())
      if (failed(check(func, arg.getType())))
        return failure();
    for (Type t : func.getResultTypes())
      if (failed(check(func, t)))
        return failure();
    auto walk = func.walk([&](Operation *op) {
      for (Value v : op->getResults())
        if (failed(check(op, v.getType())))
          return WalkResult::interrupt();
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return failure();
    if (meshName) {
      view = meshes.get(func, meshName);
      if (!view)
        return failure();
    }
    return success();
  }

  /// The core layout of a value's type, cached by attribute.
  const Layout *layoutOf(Value v) {
    LayoutAttr attr = getLayout(v.getType());
    if (!attr)
      return nullptr;
    auto it = cache.find(attr);
    if (it != cache.end())
      return &it->second;
    auto core = coreLayout(*view, attr);
    if (!core)
      return nullptr; // the verifier reports bad layouts
    return &cache.try_emplace(attr, std::move(*core)).first->second;
  }

  void setLayout(Value v, const Layout &layout) {
    auto tensor = cast<RankedTensorType>(v.getType());
    auto typed = RankedTensorType::get(
        tensor.getShape(), tensor.getElementType(),
        layoutAttr(v.getContext(), meshName, view->mesh(), layout));
    LLVM_DEBUG(llvm::dbgs()
               << "[" DEBUG_TYPE "] " << v.getLoc() << ": " << typed << "\n");
    v.setType(typed);
    // A constant's value carries its type too; the global value is the same
    // under any layout.
    if (auto constant = v.getDefiningOp<arith::ConstantOp>())
      if (auto dense = dyn_cast<DenseElementsAttr>(constant.getValue()))
        constant.setValueAttr(dense.reshape(typed));
  }

  /// The rule's answer for `op`, or nullopt when it has none or knows
  /// nothing yet.
  std::optional<RuleLayouts> rule(Operation *op) {
    if (!llvm::all_of(op->getOperandTypes(), llvm::IsaPred<RankedTensorType>) ||
        !llvm::all_of(op->getResultTypes(), llvm::IsaPred<RankedTensorType>) ||
        op->getNumResults() == 0)
      return std::nullopt;
    SmallVector<const Layout *> ins, outs;
    for (Value v : op->getOperands())
      ins.push_back(layoutOf(v));
    for (Value v : op->getResults())
      outs.push_back(layoutOf(v));
    if (auto ruled = dyn_cast<LayoutRuleOpInterface>(op))
      return ruled.inferLayouts(*view, ins, outs);
    if (isa<arith::AddFOp, arith::SubFOp>(op))
      return linearElementwiseRule(
          static_cast<int>(ins.size()),
          std::vector<const Layout *>(ins.begin(), ins.end()), outs[0]);
    if (op->hasTrait<OpTrait::Elementwise>() && op->getNumResults() == 1)
      return elementwiseRule(
          static_cast<int>(ins.size()),
          std::vector<const Layout *>(ins.begin(), ins.end()), outs[0]);
    return std::nullopt;
  }

  /// Gives layouts to the op's results (forward) or operands (backward)
  /// that have none.
  bool assign(Operation *op, bool forward) {
    auto r = rule(op);
    if (!r)
      return false;
    bool changed = false;
    if (forward) {
      for (auto [v, l] : llvm::zip(op->getResults(), r->results))
        if (!getLayout(v.getType())) {
          setLayout(v, l);
          changed = true;
        }
    } else {
      for (auto [v, l] : llvm::zip(op->getOperands(), r->operands))
        if (!getLayout(v.getType())) {
          setLayout(v, l);
          changed = true;
        }
    }
    return changed;
  }

  /// Where an op needs another layout than an operand has, redistribute;
  /// where a stated result layout differs from what the op gives,
  /// redistribute after it.
  LogicalResult insertRedistributes() {
    SmallVector<Operation *> ops;
    func.walk([&](Operation *op) { ops.push_back(op); });
    for (Operation *op : ops) {
      auto r = rule(op);
      if (!r)
        continue;
      OpBuilder b(op);
      for (auto [operand, need] : llvm::zip(op->getOpOperands(), r->operands)) {
        const Layout *have = layoutOf(operand.get());
        auto type = cast<RankedTensorType>(operand.get().getType());
        std::vector<int64_t> shape(type.getShape().begin(),
                                   type.getShape().end());
        if (!have || sameShards(*view, *have, need, shape))
          continue;
        auto target = RankedTensorType::get(
            type.getShape(), type.getElementType(),
            layoutAttr(op->getContext(), meshName, view->mesh(), need));
        operand.set(redistributed(operand.get(), target, op->getLoc()));
      }
      b.setInsertionPointAfter(op);
      for (auto [result, give] : llvm::zip(op->getResults(), r->results)) {
        const Layout *stated = layoutOf(result);
        auto type = cast<RankedTensorType>(result.getType());
        std::vector<int64_t> shape(type.getShape().begin(),
                                   type.getShape().end());
        if (!stated || sameShards(*view, *stated, give, shape))
          continue;
        setLayout(result, give);
        auto redistributed =
            RedistributeOp::create(b, op->getLoc(), type, result);
        LLVM_DEBUG(llvm::dbgs()
                   << "[" DEBUG_TYPE "] " << op->getName() << " at "
                   << op->getLoc() << " gives " << result.getType()
                   << "; redistributed to its stated " << type << "\n");
        result.replaceAllUsesExcept(redistributed, redistributed);
      }
    }
    return success();
  }

  /// One redistribute per (value, layout), right after the value is
  /// defined, so it dominates every use that needs it.
  Value redistributed(Value v, RankedTensorType target, Location loc) {
    auto key = std::make_pair(v, Type(target));
    auto it = redistributes.find(key);
    if (it != redistributes.end())
      return it->second;
    OpBuilder b(v.getContext());
    if (Operation *def = v.getDefiningOp())
      b.setInsertionPointAfter(def);
    else
      b.setInsertionPointToStart(cast<BlockArgument>(v).getOwner());
    Value r = RedistributeOp::create(b, loc, target, v);
    LLVM_DEBUG(llvm::dbgs() << "[" DEBUG_TYPE "] redistribute at " << loc
                            << ": " << v.getType() << " -> " << target << "\n");
    redistributes[key] = r;
    return r;
  }

  LogicalResult checkComplete() {
    for (BlockArgument arg : func.getArguments())
      if (isa<RankedTensorType>(arg.getType()) && !getLayout(arg.getType()) &&
          !llvm::all_of(arg.getUsers(), llvm::IsaPred<AnnotateOp>))
        return func.emitError()
               << "no layout fits argument " << arg.getArgNumber()
               << " (nothing constrains it); annotate it";
    auto walk = func.walk([&](Operation *op) {
      if (isa<AnnotateOp>(op))
        return WalkResult::advance(); // its operand is unlaid-out by design
      // A pipeline stage's activations (received, or handed on by a
      // staged compute) are rank-local by design: one microbatch of one
      // data-parallel rank, with no layout to infer.
      if (isa<RecvOp>(op))
        return WalkResult::advance();
      if (auto compute = dyn_cast<ComputeOp>(op);
          compute && compute.getStageAttr())
        return WalkResult::advance();
      for (Value v : op->getResults())
        if (isa<RankedTensorType>(v.getType()) && !getLayout(v.getType())) {
          op->emitOpError()
              << "result has no layout and none could be inferred (no layout "
                 "rule relates it to a laid-out value); annotate it";
          return WalkResult::interrupt();
        }
      return WalkResult::advance();
    });
    return failure(walk.wasInterrupted());
  }

  void updateSignature() {
    Operation *ret = func.getBody().back().getTerminator();
    func.setType(FunctionType::get(func.getContext(),
                                   func.getBody().getArgumentTypes(),
                                   ret->getOperandTypes()));
  }

  func::FuncOp func;
  MeshCache &meshes;
  FlatSymbolRefAttr meshName;
  const View *view = nullptr;
  llvm::DenseMap<Attribute, Layout> cache;
  llvm::DenseMap<std::pair<Value, Type>, Value> redistributes;
};

struct PropagateLayoutsPass
    : meshplan::dist::impl::DistPropagateLayoutsBase<PropagateLayoutsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshCache meshes(module);
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      Propagation propagation(func, meshes);
      if (failed(propagation.run()))
        return signalPassFailure();
    }
  }
};

} // namespace
