//===- FuseFp8Gather.cpp - all-gather float8 weights in float8 ------------===//
//
// torchao's float8 all-gather for FSDP2: each rank casts its shard of a
// float8 weight to float8 with a tensorwise scale before the all-gather, so
// the gather moves one byte per element and the matmul receives float8
// weights with their scale. The scale needs the global amax of the weight;
// the local amaxes of all float8 weights are taken at the start of the step
// (one dist.fp8_amax) and reduced with one MAX all-reduce over exactly the
// axes that split them (docs/semantics.md, "Float8 all-gather: which
// communicator reduces the amax").
//
// Per parameter the chain the import and the earlier passes leave is
//   %arg -> [arith.truncf / arith.extf] -> layout ops (all_gather, ...) ->
//   dist.compute (forward and backward);
// the cast becomes dist.fp8_cast of the stored shard, the layout ops carry
// f8E4M3FN, and every dist.compute reading the result gets the reduced amax
// as an extra operand.
//
//===----------------------------------------------------------------------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/IR/DiscardableAttrs.h"
#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/Support/Debug.h"

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTFUSEFP8GATHER
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

// -debug-only=dist-fuse-fp8-gather (in builds with LLVM debug output) logs what
// it does.
#define DEBUG_TYPE "dist-fuse-fp8-gather"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

namespace {

/// One float8 parameter and the ops of its gather chain.
struct Float8Param {
  BlockArgument arg;
  std::string name;
  /// Mixed-precision casts of the stored shard (usually one truncf).
  SmallVector<Operation *> casts;
  /// Layout ops reading the stored shard directly (no mixed-precision cast).
  SmallVector<OpOperand *> directUses;
  /// Layout ops between the cast and the computes, producers first.
  SmallVector<Operation *> layoutOps;
  /// The computes reading a value of the chain.
  llvm::SetVector<Operation *> computes;
  bool gathered = false;
  /// Refs splitting the stored layout, canonical (core).
  AxisRefList split;
};

/// Ops that only move or relabel a value: the planner's steps for the
/// stored -> compute redistribution. They carry float8 as well as any type.
bool movesData(Operation *op) {
  return isa<AllGatherOp, AllToAllOp, PermuteOp, LocalSliceOp, BroadcastOp,
             RedistributeOp>(op);
}

class Fusion {
public:
  Fusion(func::FuncOp func, MeshCache &meshes) : func(func), meshes(meshes) {}

  LogicalResult run() {
    if (failed(readAttributes()))
      return failure();
    if (!float8 || func.isExternal())
      return success();
    std::vector<Float8Param> params;
    for (BlockArgument arg : func.getArguments()) {
      if (!func.getArgAttr(arg.getArgNumber(), float8Name()))
        continue;
      Float8Param p;
      p.arg = arg;
      p.name = paramName(arg.getArgNumber());
      if (failed(collect(p)))
        return failure();
      if (p.gathered)
        params.push_back(std::move(p));
    }
    // Parameters split over the same ordered refs (core's partition key, the
    // one dist.fp8_amax's verifier compares) share one amax and all-reduce.
    // In order of first appearance; there are only a few sets.
    std::vector<std::pair<std::string, SmallVector<Float8Param *>>> sets;
    for (Float8Param &p : params) {
      auto key = splitKey(p);
      if (failed(key))
        return failure();
      auto it = llvm::find_if(sets, [&](auto &s) { return s.first == *key; });
      if (it == sets.end())
        it = sets.emplace(sets.end(), *key, SmallVector<Float8Param *>());
      it->second.push_back(&p);
    }
    // All reductions first, at the start of the body, then the rewrites
    // (which erase casts the builder could otherwise point at).
    OpBuilder b(func.getContext());
    b.setInsertionPointToStart(&func.getBody().front());
    SmallVector<Value> reduced;
    for (auto &[key, set] : sets) {
      auto amax = reduceAmax(b, set);
      if (failed(amax))
        return failure();
      reduced.push_back(*amax);
    }
    for (auto [set, amax] : llvm::zip_equal(sets, reduced)) {
      LLVM_DEBUG({
        llvm::dbgs() << "[" DEBUG_TYPE "] @" << func.getSymName()
                     << ": one amax + MAX all-reduce for split " << set.first
                     << " over " << set.second.size() << " parameter(s):";
        for (Float8Param *p : set.second)
          llvm::dbgs() << " " << p->name;
        llvm::dbgs() << "\n";
      });
      rewrite(set.second, amax);
    }
    return success();
  }

private:
  func::FuncOp func;
  MeshCache &meshes;
  /// The function's `dist.float8` dictionary, when float8 gather is on.
  DictionaryAttr float8;
  bool powerOf2 = false;

  std::string paramName(unsigned i) {
    std::string out;
    llvm::raw_string_ostream os(out);
    if (auto name = func.getArgAttrOfType<StringAttr>(
            i, DistDialect::ParamAttrHelper::getNameStr()))
      os << '"' << name.getValue() << '"';
    else
      os << "#" << i;
    return out;
  }

  static StringRef float8Name() {
    return DistDialect::Float8AttrHelper::getNameStr();
  }

  LogicalResult readAttributes() {
    Attribute attr = func->getAttr(float8Name());
    if (!attr) {
      for (unsigned i = 0; i < func.getNumArguments(); ++i)
        if (func.getArgAttr(i, float8Name()))
          return func.emitOpError()
                 << "parameter " << paramName(i) << " is marked "
                 << float8Name() << " but the function has no " << float8Name()
                 << " attribute (its scale settings)";
      return success();
    }
    // The verifier checks the same (and that parameter marks are units);
    // this reads the settings.
    FailureOr<bool> pow2 = readFloat8Attr(func, attr);
    if (failed(pow2))
      return failure();
    float8 = cast<DictionaryAttr>(attr);
    powerOf2 = *pow2;
    return success();
  }

  /// Error on `user` of the chain of `p`.
  InFlightDiagnostic unexpected(Operation *user, const Float8Param &p,
                                StringRef where) {
    return user->emitOpError()
           << "reads float8 parameter " << p.name << " " << where
           << "; only its mixed-precision cast, the layout ops of its "
              "all-gather and dist.compute may (the gathered weight becomes "
              "float8)";
  }

  LogicalResult collect(Float8Param &p) {
    auto type = dyn_cast<RankedTensorType>(p.arg.getType());
    if (!type || !isa<FloatType>(type.getElementType()))
      return func.emitOpError() << "float8 parameter " << p.name
                                << " is not a floating-point tensor";
    // Fused already (the pass ran before): nothing left to do.
    if (llvm::any_of(p.arg.getUsers(),
                     [](Operation *user) { return isa<Fp8AmaxOp>(user); }))
      return success();
    // Never all-gathered (stored as computed): no float8 gather, whatever
    // else reads it.
    if (!reachesGather(p.arg))
      return success();
    for (OpOperand &use : p.arg.getUses()) {
      Operation *user = use.getOwner();
      // The update and the computes reading the stored shard itself are
      // not part of a gather.
      if ((isa<OptimizerStepOp, AdamWOp>(user) &&
           use.getOperandNumber() == 0) ||
          isa<ComputeOp>(user))
        continue;
      if (isa<arith::TruncFOp, arith::ExtFOp>(user)) {
        p.casts.push_back(user);
        if (failed(walk(p, user->getResult(0), "after its cast")))
          return failure();
        continue;
      }
      if (movesData(user)) {
        p.directUses.push_back(&use);
        if (failed(walkLayoutOp(p, user)))
          return failure();
        continue;
      }
      return unexpected(user, p, "as its stored shard");
    }
    return success();
  }

  /// Whether a dist.all_gather is reachable from `root` through any ops
  /// before the computes and the update that consume the parameter.
  static bool reachesGather(Value root) {
    SmallVector<Value> work{root};
    llvm::SmallPtrSet<Operation *, 16> seen;
    while (!work.empty()) {
      Value value = work.pop_back_val();
      for (Operation *user : value.getUsers()) {
        if (isa<AllGatherOp>(user))
          return true;
        if (isa<ComputeOp, OptimizerStepOp, AdamWOp>(user) ||
            !seen.insert(user).second)
          continue;
        llvm::append_range(work, user->getResults());
      }
    }
    return false;
  }

  LogicalResult walkLayoutOp(Float8Param &p, Operation *op) {
    p.layoutOps.push_back(op);
    p.gathered |= isa<AllGatherOp>(op);
    return walk(p, op->getResult(0), "on its way to the computes");
  }

  LogicalResult walk(Float8Param &p, Value value, StringRef where) {
    for (Operation *user : value.getUsers()) {
      if (isa<ComputeOp>(user)) {
        p.computes.insert(user);
        continue;
      }
      if (movesData(user)) {
        if (failed(walkLayoutOp(p, user)))
          return failure();
        continue;
      }
      return unexpected(user, p, where);
    }
    return success();
  }

  /// Core's partition key of the refs splitting the stored layout.
  FailureOr<std::string> splitKey(Float8Param &p) {
    LayoutAttr layout = getLayout(p.arg.getType());
    if (!layout)
      return func.emitOpError()
             << "float8 parameter " << p.name
             << " has no layout; run dist-propagate-layouts first";
    const View *view = meshes.get(func, layout.getMesh());
    if (!view)
      return failure();
    auto core = coreLayout(*view, layout);
    if (!core)
      return func.emitOpError()
             << "float8 parameter " << p.name << ": " << core.error().message;
    if (!core->partial.empty())
      return func.emitOpError() << "float8 parameter " << p.name
                                << " is stored partial; its amax is undefined";
    AxisRefList split;
    for (int d = 0; d < core->rank(); ++d)
      for (const AxisRef &r : core->dimRefs(d))
        split.push_back(r);
    // A MAX reduction does not care about member order: weights split by
    // the same axes in any order (colwise {tp, dp}, rowwise {dp} x {tp})
    // share one amax all-reduce, over the axes in mesh order.
    std::sort(split.begin(), split.end());
    p.split = canonicalizeRefs(view->mesh(), split);
    return layout.getMesh().getValue().str() +
           partitionKeyOf(view->mesh(), p.split);
  }

  /// One amax over the stored shards of `set` and its all-reduce, at `b`
  /// (left after them); returns the replicated amaxes.
  FailureOr<Value> reduceAmax(OpBuilder &b, ArrayRef<Float8Param *> set) {
    MLIRContext *ctx = func.getContext();
    LayoutAttr stored = getLayout(set.front()->arg.getType());
    const View *view = meshes.get(func, stored.getMesh());
    const Mesh &mesh = view->mesh();
    SmallVector<Value> args;
    SmallVector<Location> locs;
    for (Float8Param *p : set) {
      args.push_back(p->arg);
      locs.push_back(p->arg.getLoc());
    }
    Location loc = b.getFusedLoc(locs);
    auto n = static_cast<int64_t>(set.size());
    Layout partial = replicatedLayout(1);
    partial.partial = set.front()->split;
    partial.reduceOp = ReduceOp::Max;
    auto f32 = b.getF32Type();
    auto partialType = RankedTensorType::get(
        {n}, f32, layoutAttr(ctx, stored.getMesh(), mesh, partial));
    auto replicatedType = RankedTensorType::get(
        {n}, f32, layoutAttr(ctx, stored.getMesh(), mesh, replicatedLayout(1)));
    Value amax = Fp8AmaxOp::create(b, loc, partialType, args);
    // Core plans the reduction (one MAX all-reduce over the split refs).
    auto redistribute = RedistributeOp::create(b, loc, replicatedType, amax);
    FailureOr<Value> reduced = lowerRedistribute(redistribute, meshes);
    if (failed(reduced))
      return failure();
    if (Operation *def = reduced->getDefiningOp())
      b.setInsertionPointAfter(def);
    return *reduced;
  }

  /// Casts each parameter of `set` to float8 in place of its mixed-precision
  /// cast, carries float8 through its layout ops, and passes `reduced` to
  /// every compute that reads one of them.
  void rewrite(ArrayRef<Float8Param *> set, Value reduced) {
    MLIRContext *ctx = func.getContext();
    auto f8 = Float8E4M3FNType::get(ctx);
    auto toF8 = [&](Type type) {
      auto t = cast<RankedTensorType>(type);
      return RankedTensorType::get(t.getShape(), f8, t.getEncoding());
    };
    UnitAttr pow2 = powerOf2 ? UnitAttr::get(ctx) : nullptr;
    llvm::SetVector<Operation *> computes;
    for (auto [i, p] : llvm::enumerate(set)) {
      auto castAt = [&](Operation *where) -> Value {
        OpBuilder cb(where);
        return Fp8CastOp::create(cb, where->getLoc(), toF8(p->arg.getType()),
                                 p->arg, reduced, cb.getI64IntegerAttr(i),
                                 pow2);
      };
      for (Operation *cast : p->casts) {
        cast->getResult(0).replaceAllUsesWith(castAt(cast));
        cast->erase();
      }
      for (OpOperand *use : p->directUses)
        use->set(castAt(use->getOwner()));
      for (Operation *op : p->layoutOps)
        op->getResult(0).setType(toF8(op->getResult(0).getType()));
      computes.insert(p->computes.begin(), p->computes.end());
    }
    for (Operation *compute : computes)
      cast<ComputeOp>(compute).getInputsMutable().append(reduced);
  }
};

struct FuseFp8GatherPass
    : meshplan::dist::impl::DistFuseFp8GatherBase<FuseFp8GatherPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshCache meshes(module);
    for (auto func : module.getOps<func::FuncOp>())
      if (failed(Fusion(func, meshes).run()))
        return signalPassFailure();
  }
};

} // namespace
