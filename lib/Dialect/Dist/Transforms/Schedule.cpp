//===- Schedule.cpp - streams, prefetch, reshard, frees, buckets ----------===//
//
// Orders a lowered training step for overlap and bounded memory, and records
// the schedule on every op (dist.id, dist.stream, dist.after, dist.bucket).
// The computes (dist.compute, in block order C0..Cm-1) are the skeleton:
//
// - A compute operand is *gathered* when it is the end of a gather chain: a
//   path of layout ops (collectives, local_slice, mark_partial), casts
//   (arith.truncf/extf) and dist.fp8_cast, through their data input, back
//   to a block argument, whose ops feed nothing but chains and computes.
//   Anything else (the reduced float8 amax, earlier microbatches' gradients)
//   is shared and never moved or cloned.
// - Each compute owns a group: the chain ops first read by it, or the copies
//   made for it. A compute re-gathers a value read before (a copy of its
//   whole chain, sharing the amax) when the step reshards after forward, or
//   when it is a forward (a new microbatch), unless the compute right before
//   it read the same copy: parameters still resident are not gathered again
//   (the last forward unit's backward, the first unit between microbatches).
//   A forward compute may state its unit's own policy
//   (dist.reshard_after_forward = true/false, what import writes from the
//   spec's policy): then its backward re-gathers exactly when that is true,
//   even right after the forward (FSDP2 reshards such a unit anyway); that
//   re-gather is not prefetched: it goes after the forward and its free, and
//   waits (dist.after) for the forward, so no unit is ever gathered twice.
// - Prefetch: the group of Ci goes right before Ci-1 and waits (dist.after)
//   for Ci-2, so at most two units' gathers are in flight or in use at once.
// - The gradient reductions that follow a backward compute go right after
//   it, on their own stream (a cast of the reduced gradient stays with the
//   optimizer updates).
// - Within a group: casts first, then the collectives bucket by bucket
//   (same comm, op, element type, reduce op), so bucket members are adjacent
//   on their stream.
// - dist.free after every value's last use. An accumulation
//   (arith.addf {dist.accumulate}, one per later microbatch with "reduce":
//   "every_microbatch") adds into its first operand in place: it joins the
//   reductions of its backward, on their stream, and its first operand is
//   not freed (its buffer is the sum's).
//
//===----------------------------------------------------------------------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Debug.h"

#include <algorithm>

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTSCHEDULE
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

// -debug-only=dist-schedule (in builds with LLVM debug output) logs what it
// does.
#define DEBUG_TYPE "dist-schedule"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

/// Ops a gather chain (or a gradient reduction) is made of. Their data
/// input is operand 0; fp8_cast's amax is a shared side input.
static bool isChainOp(Operation *op) {
  return exchangesData(op) || isa<LocalSliceOp, MarkPartialOp, arith::TruncFOp,
                                  arith::ExtFOp, Fp8CastOp>(op);
}

/// An in-place accumulation of a microbatch's reduced gradient (operand 1)
/// into the gradient accumulated so far (operand 0), as import writes it
/// for "reduce": "every_microbatch".
static bool isAccumulate(Operation *op) {
  return isa<arith::AddFOp>(op) &&
         DistDialect::AccumulateAttrHelper(op->getContext()).isAttrPresent(op);
}

static StringRef streamOf(Operation *op) {
  // The accumulation follows the reduce-scatter on its stream (as FSDP2
  // accumulates after its reduce-scatter), so the next backward on the
  // compute stream never waits for a reduction.
  if (isAccumulate(op))
    return "comm.rs";
  if (isa<AllGatherOp, AllToAllOp, PermuteOp, BroadcastOp>(op))
    return "comm.ag";
  // A MAX all-reduce is the float8 amax reduction the gathers wait for;
  // gradients are reduced with sum or avg.
  if (auto allReduce = dyn_cast<AllReduceOp>(op))
    return allReduce.getReduce() == ReduceKind::Max ? "comm.ag" : "comm.rs";
  if (isa<ReduceScatterOp>(op))
    return "comm.rs";
  // Pipeline transfers, in the schedule's order, on a stream of their own:
  // a recv is posted where the schedule lists it (torch posts an irecv
  // there) and only the compute reading it waits for it. On the compute
  // stream, a recv listed before an unrelated compute (1F1B lists RECV_F of
  // the next forward before the backward) would hold that compute back and
  // couple neighbouring stages: the 1F1B bubble of p = 4, m = 8 grew from
  // the textbook 27% to 47% (PipelinePlan tests, plan::simulateTogether).
  if (isa<SendOp, RecvOp>(op))
    return "p2p";
  return "compute";
}

static int64_t microbatchOf(ComputeOp op) {
  if (auto mb = DistDialect::MicrobatchAttrHelper(op->getContext()).getAttr(op))
    return mb.getInt();
  return 0;
}

namespace {

/// Orders one group (chain ops of one compute, or the reductions of one
/// backward compute) given in a topological order: ops are ranked by the
/// number of collectives before them on their path in the group, casts
/// before collectives of a rank, and the collectives of a rank bucket by
/// bucket. Buckets of two or more get a fresh temporary number in
/// `bucketOf`.
class GroupOrderer {
public:
  SmallVector<Operation *> order(ArrayRef<Operation *> ops,
                                 DenseMap<Operation *, int64_t> &bucketOf) {
    DenseMap<Operation *, unsigned> rank;
    SmallVector<std::pair<unsigned, unsigned>> keyed; // (key, index)
    for (auto [index, op] : llvm::enumerate(ops)) {
      unsigned r = 0;
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp()) {
          auto it = rank.find(def);
          if (it != rank.end())
            r = std::max(r, it->second + (exchangesData(def) ? 1u : 0u));
        }
      rank[op] = r;
      keyed.push_back({2 * r + (exchangesData(op) ? 1 : 0), index});
    }
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](auto a, auto b) { return a.first < b.first; });
    SmallVector<Operation *> result;
    for (size_t begin = 0; begin < keyed.size();) {
      size_t end = begin;
      while (end < keyed.size() && keyed[end].first == keyed[begin].first)
        ++end;
      if (keyed[begin].first % 2 == 0) {
        for (size_t k = begin; k < end; ++k)
          result.push_back(ops[keyed[k].second]);
      } else {
        // Collectives of one rank: buckets in order of first appearance.
        SmallVector<std::pair<BucketKey, SmallVector<Operation *>>> buckets;
        for (size_t k = begin; k < end; ++k) {
          Operation *op = ops[keyed[k].second];
          BucketKey key = keyOf(op);
          auto it =
              llvm::find_if(buckets, [&](auto &b) { return b.first == key; });
          if (it == buckets.end())
            buckets.push_back({key, {op}});
          else
            it->second.push_back(op);
        }
        for (auto &[key, members] : buckets) {
          if (members.size() >= 2) {
            for (Operation *op : members)
              bucketOf[op] = nextBucket;
            ++nextBucket;
          }
          result.append(members.begin(), members.end());
        }
      }
      begin = end;
    }
    return result;
  }

private:
  /// Collectives merge into one bucket when they share the communicator,
  /// the op, the element type and the reduce op.
  struct BucketKey {
    OperationName name;
    Attribute comm, reduce;
    Type element;
    bool operator==(const BucketKey &o) const {
      return name == o.name && comm == o.comm && reduce == o.reduce &&
             element == o.element;
    }
  };
  static BucketKey keyOf(Operation *op) {
    return {op->getName(), op->getAttr("comm"), op->getAttr("reduce"),
            cast<ShapedType>(op->getOperand(0).getType()).getElementType()};
  }

  int64_t nextBucket = 0;
};

class StepScheduler {
public:
  explicit StepScheduler(func::FuncOp func)
      : func(func), body(func.getBody().front()) {}

  LogicalResult run();

private:
  LogicalResult check();
  bool feedsOnlyComputes(Operation *op);
  bool gatherChain(Value value, SmallVector<Operation *> &chain);
  void buildGatherGroups();
  void buildReductionGroups();
  void reorder();
  void insertFrees();
  void annotate();

  func::FuncOp func;
  Block &body;
  bool reshard = true;
  /// The function is one pp rank's program (dist.pp_rank).
  bool pipelined = false;

  SmallVector<ComputeOp> computes;
  DenseMap<Operation *, unsigned> computeIndex;
  /// Original block positions (before any change).
  DenseMap<Operation *, unsigned> position;
  /// Memo of feedsOnlyComputes.
  DenseMap<Operation *, bool> movable;

  /// Per compute: the chain ops it owns (topological order), the
  /// reductions of its gradients (backward only).
  std::vector<SmallVector<Operation *>> gathers, reductions;
  DenseMap<Operation *, unsigned> gatherGroupOf, reductionGroupOf;
  /// Per compute: whether its group was placed before the previous compute.
  std::vector<bool> prefetched;
  /// Per compute: whether its group re-gathers a copy the compute right
  /// before it read (a resharded unit's backward right after its forward).
  std::vector<bool> regathersPrevious;

  DenseMap<Operation *, int64_t> bucketOf;
};

} // namespace

LogicalResult StepScheduler::check() {
  MLIRContext *ctx = func->getContext();
  // The verifier checked the attributes' types (and that a compute's
  // reshard_after_forward is on a forward).
  if (BoolAttr flag =
          DistDialect::ReshardAfterForwardAttrHelper(ctx).getAttr(func))
    reshard = flag.getValue();
  pipelined = DistDialect::PpRankAttrHelper(ctx).isAttrPresent(func);
  DenseSet<std::pair<Attribute, int64_t>> forwards;
  SmallVector<Operation *> oldFrees;
  for (Operation &op : body.without_terminator()) {
    if (isa<RedistributeOp>(op))
      return op.emitOpError()
             << "cannot be scheduled; run dist-lower-redistribute first";
    if (isa<OptimizerStepOp>(op))
      return op.emitOpError()
             << "cannot be scheduled; run dist-lower-optimizer first";
    if (exchangesData(&op) && !op.hasAttr("comm"))
      return op.emitOpError()
             << "has no communicator; run dist-materialize-comms first";
    if (auto compute = dyn_cast<ComputeOp>(op)) {
      std::pair<Attribute, int64_t> unit{compute.getModuleAttr(),
                                         microbatchOf(compute)};
      if (compute.getPhase() == Phase::Forward)
        forwards.insert(unit);
      else if (!forwards.contains(unit))
        return op.emitOpError()
               << "is the backward of \"" << compute.getModule()
               << "\" (microbatch " << unit.second
               << ") but no forward of it comes before";
      computeIndex[&op] = computes.size();
      computes.push_back(compute);
    }
    // A step scheduled before is scheduled again from scratch.
    if (isa<FreeOp>(op))
      oldFrees.push_back(&op);
    for (StringRef name : {DistDialect::IdAttrHelper::getNameStr(),
                           DistDialect::StreamAttrHelper::getNameStr(),
                           DistDialect::AfterAttrHelper::getNameStr(),
                           DistDialect::BucketAttrHelper::getNameStr()})
      if (op.getDiscardableAttr(name))
        op.removeDiscardableAttr(name);
  }
  for (Operation *op : oldFrees)
    op->erase();
  for (Operation &op : body)
    position[&op] = position.size();
  return success();
}

/// Whether `op` can move with its chain: a chain op of the step whose result
/// is read only by computes and, as their data input, by chain ops that can
/// move too.
bool StepScheduler::feedsOnlyComputes(Operation *op) {
  auto it = movable.find(op);
  if (it != movable.end())
    return it->second;
  bool result =
      isChainOp(op) && op->getBlock() == &body && op->getNumResults() == 1;
  if (result)
    for (OpOperand &use : op->getResult(0).getUses()) {
      Operation *user = use.getOwner();
      if (isa<ComputeOp>(user) && user->getBlock() == &body)
        continue;
      if (use.getOperandNumber() == 0 && feedsOnlyComputes(user))
        continue;
      result = false;
      break;
    }
  movable[op] = result;
  return result;
}

/// The ops from a block argument to `value` (root first), when `value` is
/// gathered.
bool StepScheduler::gatherChain(Value value, SmallVector<Operation *> &chain) {
  chain.clear();
  while (Operation *def = value.getDefiningOp()) {
    if (!feedsOnlyComputes(def))
      return false;
    chain.push_back(def);
    value = def->getOperand(0);
  }
  std::reverse(chain.begin(), chain.end());
  return !chain.empty();
}

void StepScheduler::buildGatherGroups() {
  gathers.resize(computes.size());
  regathersPrevious.assign(computes.size(), false);
  // Per gathered value: the copy computes read now, and the last compute
  // that read it.
  DenseMap<Value, std::pair<Value, unsigned>> current;
  SmallVector<Operation *> chain;
  // Per (unit, microbatch): the reshard policy its forward states.
  DenseMap<std::pair<Attribute, int64_t>, bool> policies;
  for (ComputeOp compute : computes)
    if (compute.getPhase() == Phase::Forward)
      if (auto flag =
              DistDialect::ReshardAfterForwardAttrHelper(compute->getContext())
                  .getAttr(compute))
        policies[{compute.getModuleAttr(), microbatchOf(compute)}] =
            flag.getValue();
  auto unitPolicy = [&](ComputeOp compute) -> std::optional<bool> {
    auto it = policies.find({compute.getModuleAttr(), microbatchOf(compute)});
    if (it == policies.end())
      return std::nullopt;
    return it->second;
  };
  for (auto [i, compute] : llvm::enumerate(computes)) {
    IRMapping copies; // this compute's re-gathers
    OpBuilder builder(compute);
    for (OpOperand &use : compute->getOpOperands()) {
      Value value = use.get();
      if (!gatherChain(value, chain))
        continue;
      auto [it, first] = current.try_emplace(value, value, i);
      if (first) {
        for (Operation *op : chain)
          if (gatherGroupOf.try_emplace(op, i).second)
            gathers[i].push_back(op);
        continue;
      }
      auto &[copy, lastReader] = it->second;
      bool regather = (reshard || compute.getPhase() == Phase::Forward) &&
                      lastReader != i && lastReader + 1 != i;
      // A unit's own policy (on its forward) decides its backward: resharded
      // units gather again even right after their forward.
      if (std::optional<bool> unitReshard = unitPolicy(compute);
          unitReshard && compute.getPhase() == Phase::Backward)
        regather = *unitReshard && lastReader != i;
      // One pp rank's stages (after dist-lower-pipeline) gather once per
      // step, as torchtitan's FSDP under pipelining: unsharded before a
      // stage's first forward, resharded after its last backward.
      if (pipelined)
        regather = false;
      if (regather) {
        regathersPrevious[i] = regathersPrevious[i] || lastReader + 1 == i;
        for (Operation *op : chain) {
          if (copies.contains(op->getResult(0)))
            continue;
          Operation *clone = builder.clone(*op, copies);
          gatherGroupOf[clone] = i;
          gathers[i].push_back(clone);
        }
        copy = copies.lookup(value);
      }
      use.set(copy);
      lastReader = i;
    }
  }
}

void StepScheduler::buildReductionGroups() {
  reductions.resize(computes.size());
  for (auto [i, compute] : llvm::enumerate(computes)) {
    if (compute.getPhase() != Phase::Backward)
      continue;
    SmallVector<Value> worklist(compute->getResults());
    auto inGroup = [&](Value v) {
      Operation *def = v.getDefiningOp();
      if (def == compute.getOperation())
        return true;
      auto it = reductionGroupOf.find(def);
      return it != reductionGroupOf.end() && it->second == i;
    };
    while (!worklist.empty()) {
      Value value = worklist.pop_back_val();
      for (Operation *user : value.getUsers()) {
        // The accumulation of this backward's reduced gradient joins its
        // reductions (its other operand is an earlier microbatch's).
        if (isAccumulate(user) && user->getBlock() == &body &&
            user->getOperand(1) == value && inGroup(value) &&
            !reductionGroupOf.contains(user)) {
          reductionGroupOf[user] = i;
          reductions[i].push_back(user);
          worklist.push_back(user->getResult(0));
          continue;
        }
        // A cast of a reduced gradient (to the optimizer's float32) runs
        // with the updates, not right after backward, where the compute
        // stream would wait for the reduction.
        if (user->getBlock() != &body || !isChainOp(user) ||
            isa<arith::TruncFOp, arith::ExtFOp>(user) ||
            gatherGroupOf.contains(user) || reductionGroupOf.contains(user) ||
            !llvm::all_of(user->getOperands(), inGroup))
          continue;
        reductionGroupOf[user] = i;
        reductions[i].push_back(user);
        worklist.append(user->getResults().begin(), user->getResults().end());
      }
    }
    llvm::sort(reductions[i], [&](Operation *a, Operation *b) {
      return position.lookup(a) < position.lookup(b);
    });
  }
}

/// Places every gather group before the previous compute (or as early
/// after that as its operands allow), every reduction group right after its
/// backward compute, and moves the ops into that order.
void StepScheduler::reorder() {
  SmallVector<Operation *> rest;
  DenseMap<Operation *, unsigned> restIndex;
  for (Operation &op : body)
    if (!gatherGroupOf.contains(&op) && !reductionGroupOf.contains(&op)) {
      restIndex[&op] = rest.size();
      rest.push_back(&op);
    }

  // Group i goes before rest[at[i]]; positions never decrease with i.
  std::vector<unsigned> at(computes.size(), 0);
  prefetched.assign(computes.size(), false);
  unsigned floor = 0;
  for (size_t i = 0; i < computes.size(); ++i) {
    if (gathers[i].empty())
      continue;
    // A group that re-gathers what the previous compute read goes after it
    // (and after the free of that copy): never two copies of one unit.
    unsigned anchor = restIndex.lookup(computes[i ? i - 1 : 0]) +
                      (regathersPrevious[i] ? 1 : 0);
    unsigned index = std::max(anchor, floor);
    for (Operation *op : gathers[i])
      for (Value operand : op->getOperands()) {
        Operation *def = operand.getDefiningOp();
        if (!def || gatherGroupOf.contains(def))
          continue; // argument, or this or an earlier group
        auto red = reductionGroupOf.find(def);
        Operation *after = red != reductionGroupOf.end()
                               ? computes[red->second].getOperation()
                               : def;
        index = std::max(index, restIndex.lookup(after) + 1);
      }
    // Operands of a chain are defined before its first reader.
    assert(index <= restIndex.lookup(computes[i]) && "group after its reader");
    at[i] = floor = index;
    prefetched[i] = i > 0 && index <= restIndex.lookup(computes[i - 1]);
  }

  GroupOrderer orderer;
  SmallVector<Operation *> order;
  order.reserve(body.getOperations().size());
  size_t next = 0;
  for (auto [k, op] : llvm::enumerate(rest)) {
    for (; next < computes.size() && (gathers[next].empty() || at[next] == k);
         ++next)
      if (!gathers[next].empty())
        llvm::append_range(order, orderer.order(gathers[next], bucketOf));
    order.push_back(op);
    auto it = computeIndex.find(op);
    if (it != computeIndex.end() && !reductions[it->second].empty())
      llvm::append_range(order,
                         orderer.order(reductions[it->second], bucketOf));
  }
  Operation *terminator = body.getTerminator();
  for (Operation *op : order)
    if (op != terminator)
      op->moveBefore(terminator);
}

/// One dist.free after each op that is the last user of values defined in
/// the step (not adamw's results, which are the new parameters and state,
/// nor values the function returns).
void StepScheduler::insertFrees() {
  DenseMap<Operation *, unsigned> at;
  for (Operation &op : body)
    at[&op] = at.size();
  Operation *terminator = body.getTerminator();
  llvm::MapVector<Operation *, SmallVector<Value>> frees;
  for (Operation &op : body.without_terminator()) {
    if (isa<AdamWOp, FreeOp>(op))
      continue;
    for (Value result : op.getResults()) {
      // Accumulated into in place: its buffer lives on as the sum's.
      if (llvm::any_of(result.getUses(), [](OpOperand &use) {
            return use.getOperandNumber() == 0 && isAccumulate(use.getOwner());
          }))
        continue;
      Operation *last = nullptr;
      for (Operation *user : result.getUsers()) {
        Operation *inBody = body.findAncestorOpInBlock(*user);
        if (!inBody || inBody == terminator) {
          last = nullptr;
          break;
        }
        if (!last || at.lookup(inBody) > at.lookup(last))
          last = inBody;
      }
      if (last)
        frees[last].push_back(result);
    }
  }
  for (auto &[last, values] : frees) {
    OpBuilder builder(last->getContext());
    builder.setInsertionPointAfter(last);
    FreeOp::create(builder, last->getLoc(), values);
  }
}

void StepScheduler::annotate() {
  MLIRContext *ctx = func.getContext();
  Builder b(ctx);
  DenseMap<Operation *, int64_t> id;
  for (Operation &op : body.without_terminator())
    id[&op] = id.size();

  DenseMap<Operation *, SmallVector<int64_t, 2>> after;
  // A buffer is freed once every reader on another stream finished.
  for (FreeOp free : body.getOps<FreeOp>()) {
    SmallVector<int64_t, 2> &ids = after[free];
    for (Value value : free.getInputs())
      for (Operation *user : value.getUsers()) {
        Operation *inBody = body.findAncestorOpInBlock(*user);
        if (inBody && inBody != free.getOperation() &&
            streamOf(inBody) != "compute")
          ids.push_back(id.lookup(inBody));
      }
    llvm::sort(ids);
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  }
  // A prefetched group starts once the compute two units back finished,
  // whose gathered parameters are then free: at most two units' gathers are
  // in flight or in use at once.
  // A group placed after the previous compute because it re-gathers that
  // compute's copy starts once that copy is freed (the free right after the
  // compute).
  for (size_t i = 1; i < computes.size(); ++i) {
    if (!prefetched[i] && !regathersPrevious[i])
      continue;
    if (prefetched[i] && i < 2)
      continue;
    Operation *previous = computes[prefetched[i] ? i - 2 : i - 1];
    if (!prefetched[i] && isa_and_present<FreeOp>(previous->getNextNode()))
      previous = previous->getNextNode();
    int64_t bound = id.lookup(previous);
    for (Operation *op : gathers[i]) {
      bool root = llvm::none_of(op->getOperands(), [&](Value v) {
        Operation *def = v.getDefiningOp();
        auto it = def ? gatherGroupOf.find(def) : gatherGroupOf.end();
        return it != gatherGroupOf.end() && it->second == i;
      });
      if (root)
        after[op].push_back(bound);
    }
  }

  // One dictionary per op.
  StringAttr idName = DistDialect::IdAttrHelper(ctx).getName(),
             streamName = DistDialect::StreamAttrHelper(ctx).getName(),
             afterName = DistDialect::AfterAttrHelper(ctx).getName(),
             bucketName = DistDialect::BucketAttrHelper(ctx).getName();
  llvm::StringMap<StringAttr> streams;
  DenseMap<int64_t, int64_t> buckets; // temporary -> final, by first use
  for (Operation &op : body.without_terminator()) {
    NamedAttrList attrs(op.getDiscardableAttrDictionary());
    attrs.set(idName, b.getI64IntegerAttr(id.lookup(&op)));
    StringRef stream = streamOf(&op);
    auto [it, fresh] = streams.try_emplace(stream);
    if (fresh)
      it->second = b.getStringAttr(stream);
    attrs.set(streamName, it->second);
    auto deps = after.find(&op);
    if (deps != after.end() && !deps->second.empty())
      attrs.set(afterName, b.getDenseI64ArrayAttr(deps->second));
    auto bucket = bucketOf.find(&op);
    if (bucket != bucketOf.end()) {
      auto [it, fresh] = buckets.try_emplace(bucket->second, buckets.size());
      attrs.set(bucketName, b.getI64IntegerAttr(it->second));
    }
    op.setDiscardableAttrs(attrs.getDictionary(ctx));
    LLVM_DEBUG({
      llvm::dbgs() << "[" DEBUG_TYPE "] id " << id.lookup(&op) << " "
                   << op.getName() << " on " << stream;
      if (deps != after.end() && !deps->second.empty()) {
        llvm::dbgs() << ", after";
        for (int64_t dep : deps->second)
          llvm::dbgs() << " " << dep;
      }
      if (bucket != bucketOf.end())
        llvm::dbgs() << ", bucket " << buckets.lookup(bucket->second);
      llvm::dbgs() << "\n";
    });
  }
}

LogicalResult StepScheduler::run() {
  if (failed(check()))
    return failure();
  LLVM_DEBUG(llvm::dbgs() << "[" DEBUG_TYPE "] @" << func.getSymName() << ": "
                          << computes.size() << " computes, reshard after "
                          << "forward " << (reshard ? "on" : "off")
                          << (pipelined ? ", one pp rank's program" : "")
                          << "\n");
  buildGatherGroups();
  buildReductionGroups();
  reorder();
  insertFrees();
  annotate();
  return success();
}

namespace {
struct SchedulePass : meshplan::dist::impl::DistScheduleBase<SchedulePass> {
  void runOnOperation() override {
    bool failedAny = false;
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      if (!DistDialect::TrainStepAttrHelper(&getContext())
               .isAttrPresent(func) ||
          func.isExternal())
        continue;
      if (!func.getBody().hasOneBlock()) {
        func.emitOpError() << "a "
                           << DistDialect::TrainStepAttrHelper::getNameStr()
                           << " function must have one block";
        failedAny = true;
        continue;
      }
      if (failed(StepScheduler(func).run()))
        failedAny = true;
    }
    if (failedAny)
      signalPassFailure();
  }
};
} // namespace
