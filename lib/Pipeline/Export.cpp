//===- Export.cpp - A scheduled dist module as a plan template ------------===//

#include "meshplan/Pipeline/Export.h"

#include "meshplan/Dialect/Dist/IR/CoreBridge.h"
#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"

#include <map>
#include <set>

using namespace mlir;
using namespace meshplan;
using namespace meshplan::pipeline;
namespace pl = meshplan::plan;

static std::string describe(Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "'" << op->getName() << "' at " << op->getLoc();
  return text;
}

static Error opError(Operation *op, const std::string &message) {
  return Error(describe(op) + ": " + message);
}

/// The spelling of one of dist's discardable attributes (DistBase.td), for
/// messages: `nameOf<dist::DistDialect::IdAttrHelper>()` spells dist.id.
template <typename AttrHelper> static std::string nameOf() {
  return AttrHelper::getNameStr().str();
}

static std::optional<pl::DType> planDType(Type type) {
  if (type.isF32())
    return pl::DType::Float32;
  if (type.isBF16())
    return pl::DType::BFloat16;
  if (type.isF16())
    return pl::DType::Float16;
  if (type.isF64())
    return pl::DType::Float64;
  if (isa<Float8E4M3FNType>(type))
    return pl::DType::Float8E4M3;
  if (isa<Float8E5M2Type>(type))
    return pl::DType::Float8E5M2;
  if (type.isInteger(8))
    return pl::DType::Int8;
  if (type.isInteger(32))
    return pl::DType::Int32;
  if (type.isInteger(64))
    return pl::DType::Int64;
  return std::nullopt;
}

static int64_t product(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

namespace {
class Exporter {
public:
  explicit Exporter(ModuleOp module) : module(module) {}

  Result<pl::ProgramTemplate> run() {
    if (auto ok = exportMesh(); !ok)
      return ok.error();
    func::FuncOp step;
    for (auto func : module.getOps<func::FuncOp>())
      if (dist::DistDialect::TrainStepAttrHelper(func->getContext())
              .isAttrPresent(func)) {
        if (step)
          return opError(func, "a second dist.train_step function");
        step = func;
      }
    if (!step)
      return Error("the module has no dist.train_step function");
    // One pp rank's program (dist-lower-pipeline) names its pipeline axis.
    if (auto axis = dist::DistDialect::PpAxisAttrHelper(step->getContext())
                        .getAttr(step)) {
      if (!mesh->findAxis(axis.getValue()))
        return opError(step, nameOf<dist::DistDialect::PpAxisAttrHelper>() +
                                 " names no mesh axis");
      out.mesh.pipelineAxis = axis.getValue().str();
    }
    if (auto ok = exportComms(); !ok)
      return ok.error();
    if (auto ok = exportTrainerComms(step); !ok)
      return ok.error();
    if (auto ok = exportArguments(step); !ok)
      return ok.error();
    for (Operation &op : step.getBody().front()) {
      if (isa<func::ReturnOp>(op))
        continue;
      if (auto ok = exportOp(&op); !ok)
        return ok.error();
    }
    orderFp8CastInputs();
    return std::move(out);
  }

private:
  ModuleOp module;
  pl::ProgramTemplate out;
  std::shared_ptr<const Mesh> mesh;
  std::optional<View> view;
  FlatSymbolRefAttr meshName;

  llvm::DenseMap<Attribute, Layout> layouts;    ///< core layout of a LayoutAttr
  llvm::DenseMap<Value, int> bufferOf;          ///< value -> out.buffers index
  llvm::DenseMap<Value, std::string> rootOf;    ///< value -> parameter name
  llvm::StringMap<int> bufferIds;               ///< buffer id -> index
  std::vector<Type> bufferTypes;                ///< parallel to out.buffers
  llvm::DenseMap<int64_t, int> instructionOfId; ///< dist.id -> instruction
  llvm::DenseMap<Operation *, int> instructionOfOp;
  llvm::DenseMap<int64_t, int> bucketInstruction; ///< dist.bucket -> instr
  std::string lastUpdateUnit; ///< unit of the last optimizer instruction
  int lastUpdateInstruction = -1;

  Result<void> exportMesh() {
    auto meshes = module.getOps<dist::MeshOp>();
    if (std::distance(meshes.begin(), meshes.end()) != 1)
      return Error("the module must hold exactly one dist.mesh");
    dist::MeshOp meshOp = *meshes.begin();
    auto core = dist::coreMesh(meshOp);
    if (!core)
      return opError(meshOp, core.error().message);
    mesh = std::make_shared<const Mesh>(std::move(*core));
    view = View::root(mesh);
    meshName = FlatSymbolRefAttr::get(meshOp.getSymNameAttr());
    out.mesh.axes = mesh->getAxes();
    if (auto order = meshOp.getDeviceOrder())
      out.mesh.deviceOrder = std::vector<int64_t>(order->begin(), order->end());
    return {};
  }

  Result<void> exportComms() {
    for (auto comm : module.getOps<dist::CommOp>()) {
      auto refs = dist::coreAxisRefs(*mesh, comm.getAxes());
      if (!refs)
        return opError(comm, refs.error().message);
      pl::CommTemplate t;
      t.id = comm.getSymName().str();
      bool whole = true;
      for (const AxisRef &ref : *refs) {
        t.axes.push_back(formatAxisRef(*mesh, ref));
        // A group along a managed axis changes membership at run time.
        t.faultTolerant |= mesh->axis(ref.axis).managed;
        whole &= ref.isWhole(*mesh);
      }
      if (auto v = comm.getViewAttr())
        t.view = v.getExpr().str();
      else if (whole)
        t.view = "slice(" + formatAxisRefs(*mesh, *refs) + ")";
      out.comms.push_back(std::move(t));
    }
    // Pipeline stages' point-to-point pairs (dist-lower-pipeline): only
    // the pairs this pp coordinate's program uses exist.
    for (auto pair : module.getOps<dist::PairOp>()) {
      if (pair.getMeshAttr() != meshName || pair.getCoords().size() != 2)
        return opError(pair, "is not a pair of the module's mesh");
      pl::CommTemplate t;
      t.id = pair.getSymName().str();
      t.pair = pl::PairTemplate{pair.getAxis().str(),
                                {pair.getCoords()[0], pair.getCoords()[1]}};
      out.comms.push_back(std::move(t));
    }
    return {};
  }

  /// One communicator per `dist.trainer_axes` axis (tensor parallel, extra
  /// axes): no instruction of the plan uses it, the trainer's compute
  /// callbacks do, and the runtime creates exactly the plan's communicators.
  Result<void> exportTrainerComms(func::FuncOp step) {
    ArrayAttr axes =
        dist::DistDialect::TrainerAxesAttrHelper(step->getContext())
            .getAttr(step);
    if (!axes)
      return {};
    for (Attribute attr : axes) {
      auto name = dyn_cast<StringAttr>(attr);
      if (!name || !mesh->findAxis(name.getValue()))
        return opError(step,
                       nameOf<dist::DistDialect::TrainerAxesAttrHelper>() +
                           " names no mesh axis");
      bool exists = false;
      for (const pl::CommTemplate &c : out.comms)
        exists |= c.axes == std::vector<std::string>{name.str()};
      if (exists)
        continue;
      pl::CommTemplate t;
      t.id = "trainer_" + name.str();
      t.axes = {name.str()};
      t.view = "slice(" + name.str() + ")";
      t.faultTolerant = mesh->axis(*mesh->findAxis(name.getValue())).managed;
      out.comms.push_back(std::move(t));
    }
    return {};
  }

  /// The core layout of a value's type (replicated when it has none).
  Result<Layout> layoutOf(Operation *op, Value value) {
    auto type = cast<RankedTensorType>(value.getType());
    dist::LayoutAttr attr = dist::getLayout(type);
    if (!attr) {
      Layout layout;
      layout.dims.assign(type.getRank(), {});
      return layout;
    }
    if (attr.getMesh() != meshName)
      return opError(op, "value on mesh " + attr.getMesh().getValue().str() +
                             ", not the module's mesh");
    // Attributes are uniqued: a step has a few dozen distinct layouts.
    if (auto it = layouts.find(attr); it != layouts.end())
      return it->second;
    auto layout = dist::coreLayout(*view, attr);
    if (!layout)
      return opError(op, layout.error().message);
    layouts.try_emplace(attr, *layout);
    return std::move(*layout);
  }

  Result<int> addBuffer(Operation *op, Value value, std::string id,
                        pl::BufferKind kind, bool persistent) {
    auto type = cast<RankedTensorType>(value.getType());
    auto dtype = planDType(type.getElementType());
    if (!dtype)
      return opError(op, "no plan dtype for element type of value " + id);
    auto layout = layoutOf(op, value);
    if (!layout)
      return layout.error();
    // Ids name buffers. A value gathered again after its buffer was freed
    // (FSDP's backward re-gather) goes back into that buffer; otherwise the
    // value takes the first unused id of `id`, `id.2`, `id.3`, ...
    std::vector<int64_t> shape(type.getShape().begin(), type.getShape().end());
    std::string unique = id;
    int index = -1;
    for (int n = 2;; ++n) {
      auto it = bufferIds.find(unique);
      if (it == bufferIds.end())
        break;
      // Types are uniqued: equal types have the same dtype, shape and layout.
      if (freed.count(it->second) && bufferTypes[it->second] == type) {
        index = it->second;
        break;
      }
      unique = id + "." + std::to_string(n);
    }
    if (index < 0) {
      pl::BufferTemplate buffer;
      buffer.id = unique;
      buffer.kind = kind;
      buffer.dtype = *dtype;
      buffer.globalShape = shape;
      buffer.layout = std::move(*layout);
      buffer.persistent = persistent;
      auto root = rootOf.find(value);
      if (root != rootOf.end() && root->second != "fp8.amax")
        buffer.tensor = root->second;
      index = static_cast<int>(out.buffers.size());
      out.buffers.push_back(std::move(buffer));
      bufferTypes.push_back(type);
      bufferIds[unique] = index;
    }
    freed.erase(index);
    bufferOf[value] = index;
    return index;
  }

  /// Buffers released by a `free` (and persistent ones, which no value may
  /// take over).
  std::set<int> freed;

  /// The buffer a transfer tagged "F s0 mb3" (or "B s2 mb3") carries:
  /// act.s0.mb3 (actgrad.s2.mb3), as its producer names it.
  static std::string activationId(StringRef tag) {
    SmallVector<StringRef> parts;
    tag.split(parts, ' ');
    std::string id = tag.starts_with("B") ? "actgrad" : "act";
    for (StringRef part : llvm::drop_begin(parts))
      id += "." + part.str();
    return id;
  }

  /// The fields a send or recv shares: pair, peer, tag, dtype, count.
  Result<void> exportTransfer(Operation *op, FlatSymbolRefAttr comm,
                              int64_t peer, StringRef tag, Value value,
                              pl::Instruction &in) {
    auto type = cast<RankedTensorType>(value.getType());
    auto dtype = planDType(type.getElementType());
    if (!dtype)
      return opError(op, "no plan dtype for its element type");
    in.comm = comm.getValue().str();
    in.peer = peer;
    in.tag = tag.str();
    in.dtype = *dtype;
    in.count = type.getNumElements();
    in.label =
        std::string(isa<dist::SendOp>(op) ? "send " : "recv ") + tag.str();
    return {};
  }

  Result<void> exportArguments(func::FuncOp step) {
    int64_t nextTensorId = 0;
    for (BlockArgument arg : step.getArguments()) {
      unsigned i = arg.getArgNumber();
      pl::BufferKind kind;
      std::string name;
      if (auto param = step.getArgAttrOfType<StringAttr>(
              i, dist::DistDialect::ParamAttrHelper::getNameStr())) {
        kind = pl::BufferKind::ParamShard;
        name = param.str();
      } else if (auto state = step.getArgAttrOfType<StringAttr>(
                     i, dist::DistDialect::StateAttrHelper::getNameStr())) {
        kind = pl::BufferKind::OptimizerState;
        name = state.str();
      } else {
        return opError(step, "argument #" + std::to_string(i) +
                                 " has neither dist.param nor dist.state");
      }
      rootOf[arg] = name;
      auto index = addBuffer(step, arg, name, kind, /*persistent=*/true);
      if (!index)
        return index.error();
      // The parameter's index among the dist.param arguments: the model's
      // order, the same under every layout (dist.adamw's tensor_id).
      // (A pp rank's program states it: dist.tensor_id.)
      if (kind == pl::BufferKind::ParamShard) {
        auto id = step.getArgAttrOfType<IntegerAttr>(
            i, dist::DistDialect::TensorIdAttrHelper::getNameStr());
        out.buffers[*index].tensorId = id ? id.getInt() : nextTensorId;
        ++nextTensorId;
      }
      // Optimizer state "<param>.exp_avg" belongs to its parameter.
      if (kind == pl::BufferKind::OptimizerState)
        for (std::string_view suffix : {".exp_avg_sq", ".exp_avg"})
          if (name.size() > suffix.size() && name.ends_with(suffix)) {
            out.buffers[*index].tensor =
                name.substr(0, name.size() - suffix.size());
            break;
          }
    }
    return {};
  }

  std::string bufferId(Value v) { return out.buffers[bufferOf.lookup(v)].id; }

  Result<std::string> inputId(Operation *op, Value v) {
    if (!bufferOf.count(v))
      return opError(op, "operand is not a buffer of the step");
    return bufferId(v);
  }

  /// Buffer kind and id suffix of an op's results.
  static std::pair<pl::BufferKind, std::string> roleOf(Operation *op) {
    if (isa<dist::AllGatherOp>(op))
      return {pl::BufferKind::Gathered, "gathered"};
    if (isa<dist::ReduceScatterOp>(op))
      return {pl::BufferKind::Gradient, "reduced"};
    if (isa<dist::AllReduceOp>(op))
      return {pl::BufferKind::Gradient, "allreduced"};
    if (isa<dist::Fp8CastOp>(op))
      return {pl::BufferKind::Scratch, "fp8"};
    if (isa<arith::TruncFOp, arith::ExtFOp>(op))
      return {pl::BufferKind::Scratch, "cast"};
    return {pl::BufferKind::Scratch, "tmp"};
  }

  /// An op being translated into an instruction: its id, the instruction
  /// so far, the buffer ids of its operands, and its FLOPs.
  struct Translation {
    Operation *op;
    int64_t distId;
    pl::Instruction in;
    std::vector<std::string> inputs;
    double flops = 0;
  };

  /// Where a translation went: a new instruction still to be added, or
  /// into an earlier one (a bucket, a fused update).
  enum class Placed { New, Merged };

  Result<void> exportOp(Operation *op) {
    IntegerAttr idAttr =
        dist::DistDialect::IdAttrHelper(op->getContext()).getAttr(op);
    StringAttr streamAttr =
        dist::DistDialect::StreamAttrHelper(op->getContext()).getAttr(op);
    if (!idAttr || !streamAttr)
      return opError(op, "has no dist.id / dist.stream (run dist-schedule)");
    Translation t{op, idAttr.getInt(), {}, {}};
    std::string stream = streamAttr.str();
    if (std::find(out.streams.begin(), out.streams.end(), stream) ==
        out.streams.end())
      out.streams.push_back(stream);
    t.in.id = "i" + std::to_string(t.distId);
    t.in.stream = stream;

    // Operands are buffers of earlier ops (or arguments).
    for (Value v : op->getOperands()) {
      auto id = inputId(op, v);
      if (!id)
        return id.error();
      t.inputs.push_back(*id);
    }
    if (foldsAway(t))
      return {};
    Result<Placed> placed = translate(t);
    if (!placed)
      return placed.error();
    if (*placed == Placed::Merged)
      return {};
    // Adjacent local instructions of one kind fuse into one (a unit's
    // casts, the frees after one compute): fewer, larger instructions.
    if (!out.program.empty() && fusable(out.program.back(), t.in))
      return mergeInto(static_cast<int>(out.program.size()) - 1, op, t.distId,
                       t.in, t.flops);
    if (auto ok = addDeps(op, t.in); !ok)
      return ok.error();
    instructionOfId[t.distId] = static_cast<int>(out.program.size());
    instructionOfOp[op] = static_cast<int>(out.program.size());
    out.program.push_back(std::move(t.in));
    out.flops.push_back(t.flops);
    return {};
  }

  /// Whether the op needs no instruction: a cast folded into the all-gather
  /// that reads it, or a free of folded casts only (whose other operands it
  /// then keeps as its inputs).
  bool foldsAway(Translation &t) {
    Operation *op = t.op;
    // FSDP2 casts a parameter shard to the mixed-precision dtype while
    // copying it into the all-gather buffer: a cast of a parameter read only
    // by all-gathers (and frees) is no instruction and no buffer of its own;
    // the all-gather reads the shard and converts to its dtype.
    if (isa<arith::TruncFOp, arith::ExtFOp>(op) && foldsIntoGather(op)) {
      Value result = op->getResult(0), source = op->getOperand(0);
      bufferOf[result] = bufferOf.lookup(source);
      rootOf[result] = rootOf.lookup(source);
      folded.insert(result);
      instructionOfId[t.distId] = -1;
      instructionOfOp[op] = -1;
      return true;
    }
    if (isa<dist::FreeOp>(op)) {
      // Frees of folded casts release nothing.
      t.inputs.clear();
      for (Value v : op->getOperands())
        if (!folded.count(v))
          t.inputs.push_back(bufferId(v));
      if (t.inputs.empty()) {
        instructionOfId[t.distId] = -1;
        instructionOfOp[op] = -1;
        return true;
      }
    }
    return false;
  }

  /// Fills the instruction for the op's kind.
  Result<Placed> translate(Translation &t) {
    Operation *op = t.op;
    if (isa<dist::SendOp, dist::RecvOp>(op))
      return translateTransfer(t);
    if (auto compute = dyn_cast<dist::ComputeOp>(op))
      return translateCompute(compute, t);
    if (auto adam = dyn_cast<dist::AdamWOp>(op))
      return translateAdamW(adam, t);
    if (isa<dist::FreeOp>(op))
      return translateFree(t);
    if (isa<arith::AddFOp>(op) &&
        dist::DistDialect::AccumulateAttrHelper(op->getContext())
            .isAttrPresent(op)) {
      // A microbatch's reduced gradient added into the accumulated one, in
      // place (dist-schedule frees neither the sum nor its first operand).
      Value result = op->getResult(0), acc = op->getOperand(0);
      bufferOf[result] = bufferOf.lookup(acc);
      rootOf[result] = rootOf.lookup(acc);
      t.in.op = pl::OpKind::Accumulate;
      t.in.inputs = t.inputs;
      t.in.outputs = {t.inputs[0]};
      t.in.label = "accumulate " + rootOf.lookup(acc);
      return Placed::New;
    }
    if (auto sum = dyn_cast<dist::ReduceSumOp>(op))
      return translateSum(sum, t);
    if (auto amax = dyn_cast<dist::Fp8AmaxOp>(op))
      return translateAmax(amax, t);
    if (op->getNumResults() == 1 &&
        (isa<dist::Fp8CastOp, arith::TruncFOp, arith::ExtFOp, dist::AllGatherOp,
             dist::ReduceScatterOp, dist::AllReduceOp, dist::AllToAllOp,
             dist::PermuteOp, dist::BroadcastOp>(op)))
      return translateOneResult(t);
    return opError(op, "has no plan instruction (export supports the "
                       "ops of a scheduled dist.train_step)");
  }

  Result<Placed> translateTransfer(Translation &t) {
    Operation *op = t.op;
    pl::Instruction &in = t.in;
    if (auto transfer = dyn_cast<dist::SendOp>(op)) {
      if (auto ok = exportTransfer(op, transfer.getCommAttr(),
                                   transfer.getPeerAttr().getInt(),
                                   transfer.getTag(), transfer.getInput(), in);
          !ok)
        return ok.error();
      in.op = pl::OpKind::Send;
      in.inputs = t.inputs;
      return Placed::New;
    }
    auto transfer = cast<dist::RecvOp>(op);
    if (auto ok = exportTransfer(op, transfer.getCommAttr(),
                                 transfer.getPeerAttr().getInt(),
                                 transfer.getTag(), transfer.getResult(), in);
        !ok)
      return ok.error();
    in.op = pl::OpKind::Recv;
    // "F s0 mb3" arrives as act.s0.mb3, "B s2 mb3" as actgrad.s2.mb3:
    // the names its producer's buffer has on the other rank.
    auto index =
        addBuffer(op, transfer.getResult(), activationId(transfer.getTag()),
                  pl::BufferKind::Activation, false);
    if (!index)
      return index.error();
    in.outputs = {bufferId(transfer.getResult())};
    return Placed::New;
  }

  Result<Placed> translateCompute(dist::ComputeOp compute, Translation &t) {
    Operation *op = t.op;
    pl::Instruction &in = t.in;
    in.op = pl::OpKind::Compute;
    // zbv's split backward keeps its phase names (the dialect's):
    // backward_input, then backward_weight (docs/plan-format.md).
    switch (compute.getPhase()) {
    case dist::Phase::Forward:
      in.phase = "forward";
      break;
    case dist::Phase::Backward:
      in.phase = "backward";
      break;
    default:
      in.phase = dist::stringifyPhase(compute.getPhase()).str();
      break;
    }
    in.label = in.phase + " " + compute.getModule().str();
    in.unit = compute.getModule().str();
    IntegerAttr mbAttr =
        dist::DistDialect::MicrobatchAttrHelper(op->getContext()).getAttr(op);
    if (auto stage = compute.getStageAttr())
      in.label +=
          " (stage " + std::to_string(stage.getInt()) + (mbAttr ? ", " : ")");
    else if (mbAttr)
      in.label += " (";
    if (mbAttr) {
      in.label += "microbatch " + std::to_string(mbAttr.getInt()) + ")";
      in.microbatch = mbAttr.getInt();
    }
    if (auto f = compute.getFlopsAttr())
      t.flops = f.getValueAsDouble();
    in.inputs = t.inputs;
    int64_t mb = 0;
    if (auto attr = dist::DistDialect::MicrobatchAttrHelper(op->getContext())
                        .getAttr(op))
      mb = attr.getInt();
    auto stageTag = [&](std::string_view what) {
      return std::string(what) + ".s" +
             std::to_string(compute.getStageAttr().getInt()) + ".mb" +
             std::to_string(mb);
    };
    for (auto [i, grad] : llvm::enumerate(compute.getGrads())) {
      // A stage's activations (rank-local, no layout): a forward's
      // output for the next stage, a backward's gradient of the stage's
      // input activation.
      if (compute.getStageAttr() && !dist::getLayout(grad.getType())) {
        bool forward = compute.getPhase() == dist::Phase::Forward;
        auto index = addBuffer(op, grad, stageTag(forward ? "act" : "actgrad"),
                               pl::BufferKind::Activation, false);
        if (!index)
          return index.error();
        in.outputs.push_back(bufferId(grad));
        continue;
      }
      Value source = compute.getInputs()[i];
      std::string root = rootOf.lookup(source);
      rootOf[grad] = root;
      auto index =
          addBuffer(op, grad, root + ".grad", pl::BufferKind::Gradient, false);
      if (!index)
        return index.error();
      in.outputs.push_back(bufferId(grad));
    }
    return Placed::New;
  }

  Result<Placed> translateAdamW(dist::AdamWOp adam, Translation &t) {
    Operation *op = t.op;
    pl::Instruction &in = t.in;
    in.op = pl::OpKind::OptimizerUpdate;
    // In place: the results are the parameter and state buffers.
    for (auto [result, operand] :
         {std::pair{adam.getNewParam(), adam.getParam()},
          std::pair{adam.getNewExpAvg(), adam.getExpAvg()},
          std::pair{adam.getNewExpAvgSq(), adam.getExpAvgSq()}}) {
      bufferOf[result] = bufferOf.lookup(operand);
      rootOf[result] = rootOf.lookup(operand);
    }
    in.inputs = t.inputs;
    in.outputs = {bufferId(adam.getParam()), bufferId(adam.getExpAvg()),
                  bufferId(adam.getExpAvgSq())};
    auto layout = layoutOf(op, adam.getParam());
    if (!layout)
      return layout.error();
    auto type = cast<RankedTensorType>(adam.getParam().getType());
    std::vector<int64_t> shape(type.getShape().begin(), type.getShape().end());
    // ~ 12 flops per element for AdamW (+ rounding); memory-bound anyway.
    t.flops =
        12.0 * static_cast<double>(product(paddedShapeOf(*layout, shape)));
    pl::OptimizerConfig config;
    config.lr = adam.getLr().convertToDouble();
    config.beta1 = adam.getBeta1().convertToDouble();
    config.beta2 = adam.getBeta2().convertToDouble();
    config.eps = adam.getEps().convertToDouble();
    config.weightDecay = adam.getWeightDecay().convertToDouble();
    config.stochasticRounding = adam.getStochasticRounding();
    config.seed = adam.getSeed();
    if (out.optimizer && *out.optimizer != config)
      return opError(op, "its hyperparameters differ from an earlier " +
                             dist::AdamWOp::getOperationName().str() +
                             "'s (a plan has one optimizer)");
    out.optimizer = config;
    std::string unit = unitOfGradient(adam.getGrad());
    in.label = "adamw " + unit;
    if (adam.getStochasticRounding())
      in.label += " (bf16 stochastic rounding)";
    // One fused multi-tensor update per FSDP unit (frees of consumed
    // gradients may sit between its members; they only wait for it).
    if (lastUpdateInstruction >= 0 && unit == lastUpdateUnit)
      return mergedInto(lastUpdateInstruction, t);
    lastUpdateUnit = unit;
    lastUpdateInstruction = static_cast<int>(out.program.size());
    return Placed::New;
  }

  Result<Placed> translateFree(Translation &t) {
    pl::Instruction &in = t.in;
    in.op = pl::OpKind::Free;
    in.inputs = t.inputs;
    in.label = "free " + t.inputs.front();
    for (Value v : t.op->getOperands()) {
      if (folded.count(v))
        continue;
      int index = bufferOf.lookup(v);
      if (out.buffers[index].persistent)
        return opError(t.op, "frees a persistent buffer");
      freed.insert(index);
    }
    return Placed::New;
  }

  /// The local half of a sum over a split dim (a stacked gradient's TP
  /// rows); the all-reduce over the dim's axes follows.
  Result<Placed> translateSum(dist::ReduceSumOp sum, Translation &t) {
    pl::Instruction &in = t.in;
    std::string root = rootOf.lookup(sum.getInput());
    rootOf[sum.getResult()] = root;
    auto index =
        addBuffer(t.op, sum.getResult(), root + ".summed",
                  out.buffers[bufferOf.lookup(sum.getInput())].kind, false);
    if (!index)
      return index.error();
    in.op = pl::OpKind::Sum;
    in.inputs = t.inputs;
    in.outputs = {bufferId(sum.getResult())};
    in.dtype = planDType(
        cast<RankedTensorType>(sum.getResult().getType()).getElementType());
    in.label = "sum the rows of " + root;
    return Placed::New;
  }

  Result<Placed> translateAmax(dist::Fp8AmaxOp amax, Translation &t) {
    pl::Instruction &in = t.in;
    in.op = pl::OpKind::Fp8Amax;
    in.inputs = t.inputs;
    in.dtype = pl::DType::Float32;
    auto index = addBuffer(t.op, amax.getAmax(), "fp8.amax.local",
                           pl::BufferKind::Scratch, false);
    if (!index)
      return index.error();
    rootOf[amax.getAmax()] = "fp8.amax";
    in.outputs.push_back(bufferId(amax.getAmax()));
    in.label = "float8 amax of " + std::to_string(amax.getInputs().size()) +
               " weights";
    return Placed::New;
  }

  /// A cast (float8 or not) or a collective: one result buffer named after
  /// its source's parameter and its role.
  Result<Placed> translateOneResult(Translation &t) {
    Operation *op = t.op;
    pl::Instruction &in = t.in;
    Value result = op->getResult(0);
    Value source = op->getOperand(0);
    std::string root = rootOf.lookup(source);
    rootOf[result] = root;
    auto [kind, role] = roleOf(op);
    if (bufferOf.count(source) &&
        out.buffers[bufferOf.lookup(source)].kind == pl::BufferKind::Gradient) {
      kind = pl::BufferKind::Gradient;
      // The reduced gradient widened for the optimizer: "<param>.float32".
      if (isa<arith::TruncFOp, arith::ExtFOp>(op))
        if (auto dtype =
                planDType(cast<RankedTensorType>(op->getResult(0).getType())
                              .getElementType()))
          role = std::string(pl::dtypeName(*dtype));
    }
    if (root == "fp8.amax")
      kind = pl::BufferKind::Scratch;
    auto index = addBuffer(op, result, root + "." + role, kind, false);
    if (!index)
      return index.error();
    in.inputs = {t.inputs[0]};
    in.outputs = {bufferId(result)};
    auto elt = cast<RankedTensorType>(result.getType()).getElementType();
    if (auto cast = dyn_cast<dist::Fp8CastOp>(op)) {
      in.op = pl::OpKind::Fp8Cast;
      in.dtype = planDType(elt);
      in.inputs = t.inputs; // the shard and the amax
      in.label = "float8 cast " + root;
      out.buffers[*index].scale = pl::Fp8Scale{
          bufferId(cast.getAmax()), static_cast<int64_t>(cast.getIndex()),
          cast.getPowerOf_2()};
      castSource[out.buffers[*index].id] = t.inputs[0];
      return Placed::New;
    }
    if (isa<arith::TruncFOp, arith::ExtFOp>(op)) {
      in.op = pl::OpKind::Cast;
      in.dtype = planDType(elt);
      in.label =
          "cast " + root + " to " + std::string(pl::dtypeName(*in.dtype));
      return Placed::New;
    }
    // A gathered float8 weight keeps the scale of the shards it gathers.
    const pl::BufferTemplate &from = out.buffers[bufferOf.lookup(source)];
    if (from.scale && from.dtype == out.buffers[*index].dtype)
      out.buffers[*index].scale = from.scale;
    if (auto ok = exportCollective(op, in); !ok)
      return ok.error();
    if (auto bucket =
            dist::DistDialect::BucketAttrHelper(op->getContext()).getAttr(op)) {
      auto it = bucketInstruction.find(bucket.getInt());
      if (it != bucketInstruction.end())
        return mergedInto(it->second, t); // t.flops is 0: a collective
      bucketInstruction[bucket.getInt()] = static_cast<int>(out.program.size());
    }
    return Placed::New;
  }

  /// mergeInto for a translation that joins an earlier instruction.
  Result<Placed> mergedInto(int index, Translation &t) {
    if (auto ok = mergeInto(index, t.op, t.distId, t.in, t.flops); !ok)
      return ok.error();
    return Placed::Merged;
  }

  /// fp8_cast result buffer -> the shard it casts.
  std::map<std::string, std::string> castSource;

  /// A fused fp8_cast lists its sources parallel to its outputs, then the
  /// amax buffers the scales read (plan-format.md).
  void orderFp8CastInputs() {
    for (pl::Instruction &in : out.program) {
      if (in.op != pl::OpKind::Fp8Cast)
        continue;
      std::vector<std::string> inputs;
      for (const std::string &o : in.outputs)
        inputs.push_back(castSource[o]);
      for (const std::string &i : in.inputs)
        if (std::find(inputs.begin(), inputs.end(), i) == inputs.end())
          inputs.push_back(i);
      in.inputs = std::move(inputs);
    }
  }

  static bool fusable(const pl::Instruction &last, const pl::Instruction &in) {
    bool local = in.op == pl::OpKind::Cast || in.op == pl::OpKind::Fp8Cast ||
                 in.op == pl::OpKind::Accumulate || in.op == pl::OpKind::Free;
    return local && last.op == in.op && last.stream == in.stream &&
           last.dtype == in.dtype;
  }

  /// A cast of a parameter argument whose users are all-gathers and frees.
  static bool foldsIntoGather(Operation *op) {
    if (!isa<BlockArgument>(op->getOperand(0)))
      return false;
    bool gathered = false;
    for (Operation *user : op->getResult(0).getUsers()) {
      if (isa<dist::AllGatherOp>(user))
        gathered = true;
      else if (!isa<dist::FreeOp>(user))
        return false;
    }
    return gathered;
  }
  llvm::DenseSet<Value> folded;

  /// The unit whose backward produced a gradient (through its reductions).
  std::string unitOfGradient(Value grad) {
    while (Operation *def = grad.getDefiningOp()) {
      if (auto compute = dyn_cast<dist::ComputeOp>(def))
        return compute.getModule().str();
      if (def->getNumOperands() == 0)
        break;
      grad = def->getOperand(0);
    }
    return "";
  }

  Result<void> exportCollective(Operation *op, pl::Instruction &in) {
    auto comm = op->getAttrOfType<FlatSymbolRefAttr>("comm");
    if (!comm)
      return opError(op, "has no comm (run dist-materialize-comms)");
    in.comm = comm.getValue().str();
    Value input = op->getOperand(0), result = op->getResult(0);
    auto inType = cast<RankedTensorType>(input.getType());
    std::vector<int64_t> shape(inType.getShape().begin(),
                               inType.getShape().end());
    in.dtype = planDType(inType.getElementType());
    if (!in.dtype)
      return opError(op, "no plan dtype for its element type");
    auto inLayout = layoutOf(op, input);
    auto outLayout = layoutOf(op, result);
    if (!inLayout || !outLayout)
      return (inLayout ? outLayout : inLayout).error();
    int64_t inElems = product(paddedShapeOf(*inLayout, shape));
    int64_t outElems = product(paddedShapeOf(*outLayout, shape));
    auto axes = dist::coreAxisRefs(*mesh, op->getAttrOfType<ArrayAttr>("axes"));
    if (!axes)
      return opError(op, axes.error().message);
    int64_t group = refsSize(*axes);
    std::string what = rootOf.lookup(input);
    std::string over = " over " + formatAxisRefs(*mesh, *axes);
    if (isa<dist::AllGatherOp>(op)) {
      in.op = pl::OpKind::AllGather;
      in.count = inElems;
      in.label = "all-gather " + what + over;
    } else if (auto rs = dyn_cast<dist::ReduceScatterOp>(op)) {
      in.op = pl::OpKind::ReduceScatter;
      in.count = outElems;
      in.reduce = dist::coreReduceOp(rs.getReduce());
      in.label = "reduce-scatter " + what + over;
    } else if (auto ar = dyn_cast<dist::AllReduceOp>(op)) {
      in.op = pl::OpKind::AllReduce;
      in.count = inElems;
      in.reduce = dist::coreReduceOp(ar.getReduce());
      in.label = "all-reduce " + what + over;
      if (ar.getFaultTolerant())
        in.label += " (fault-tolerant)";
    } else if (isa<dist::AllToAllOp>(op)) {
      in.op = pl::OpKind::AllToAll;
      in.count = group > 0 ? inElems / group : inElems;
      in.label = "all-to-all " + what + over;
    } else if (isa<dist::PermuteOp>(op)) {
      in.op = pl::OpKind::Permute;
      in.count = inElems;
      in.label = "permute " + what + over;
    } else {
      auto bc = cast<dist::BroadcastOp>(op);
      in.op = pl::OpKind::Broadcast;
      in.count = inElems;
      in.root = bc.getRootAttr().getInt();
      in.label = "broadcast " + what + over;
    }
    return {};
  }

  /// Deps: producers of the operands on other streams, and dist.after.
  Result<void> addDeps(Operation *op, pl::Instruction &in) {
    auto addDep = [&](int index) {
      const std::string &id = out.program[index].id;
      if (id != in.id &&
          std::find(in.deps.begin(), in.deps.end(), id) == in.deps.end())
        in.deps.push_back(id);
    };
    for (Value v : op->getOperands()) {
      Operation *def = v.getDefiningOp();
      if (!def)
        continue;
      auto it = instructionOfOp.find(def);
      if (it == instructionOfOp.end())
        return opError(op, "an operand's producer was not exported first");
      if (it->second < 0) {
        // Folded into this consumer, which inherits what it waited for
        // (a prefetch bound, a free).
        if (auto after = dist::DistDialect::AfterAttrHelper(def->getContext())
                             .getAttr(def))
          for (int64_t id : after.asArrayRef())
            if (auto dep = instructionOfId.find(id);
                dep != instructionOfId.end() && dep->second >= 0)
              addDep(dep->second);
        continue;
      }
      if (out.program[it->second].stream != in.stream)
        addDep(it->second);
    }
    if (auto after =
            dist::DistDialect::AfterAttrHelper(op->getContext()).getAttr(op))
      for (int64_t id : after.asArrayRef()) {
        auto it = instructionOfId.find(id);
        if (it == instructionOfId.end())
          return opError(op, nameOf<dist::DistDialect::AfterAttrHelper>() +
                                 " names id " + std::to_string(id) +
                                 ", which no earlier op has");
        if (it->second >= 0)
          addDep(it->second);
      }
    return {};
  }

  /// Adds `op` (already translated into `in`) to the instruction at
  /// `index`: one bucket or one fused update.
  Result<void> mergeInto(int index, Operation *op, int64_t distId,
                         pl::Instruction &in, double flops) {
    pl::Instruction &target = out.program[index];
    if (target.op != in.op || target.comm != in.comm ||
        target.dtype != in.dtype || target.reduce != in.reduce)
      return opError(op, nameOf<dist::DistDialect::BucketAttrHelper>() +
                             " mixes different collectives");
    bool collective = pl::isCollective(in.op);
    if (auto ok = addDeps(op, in); !ok)
      return ok.error();
    target.count += in.count;
    auto append = [](std::vector<std::string> &to,
                     const std::vector<std::string> &from) {
      for (const std::string &s : from)
        if (std::find(to.begin(), to.end(), s) == to.end())
          to.push_back(s);
    };
    append(target.inputs, in.inputs);
    append(target.outputs, in.outputs);
    for (const std::string &dep : in.deps)
      if (dep != target.id)
        append(target.deps, {dep});
    out.flops[index] += flops;
    if (!bucketed.count(index)) {
      bucketed.insert(index);
      if (collective)
        target.label += " (bucket)";
    }
    if (!collective && in.op != pl::OpKind::OptimizerUpdate) {
      // A fused local instruction lists its tensors in the label's count.
      ++fusedCount[index];
      size_t cut = target.label.find(" (+");
      if (cut != std::string::npos)
        target.label.resize(cut);
      target.label += " (+" + std::to_string(fusedCount[index]) + " more)";
    }
    instructionOfId[distId] = index;
    instructionOfOp[op] = index;
    return {};
  }
  std::set<int> bucketed;
  std::map<int, int> fusedCount;
};
} // namespace

Result<pl::ProgramTemplate>
meshplan::pipeline::exportTemplate(ModuleOp module) {
  return Exporter(module).run();
}
