//===- Import.cpp - A model and a spec as a dist training-step module -----===//

#include "meshplan/Pipeline/Import.h"

#include "meshplan/Dialect/Dist/IR/CoreBridge.h"
#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::frontend;
using namespace meshplan::pipeline;

//===----------------------------------------------------------------------===//
// Units
//===----------------------------------------------------------------------===//

/// Forward FLOPs per rank of one microbatch for a leaf module: 2 per weight
/// element per token for matmuls (divided by the TP degree when the weight
/// is TP-split), attention scores and values 2 * 2 * tokens * seq * dim / 2
/// (causal), nothing for lookups and norms (negligible).
static double leafFlops(const ResolvedSpec &spec, const ParamAssignment &param,
                        const Module &module, const ImportOptions &options) {
  if (module.kind != ModuleKind::Linear && module.kind != ModuleKind::Output)
    return 0;
  double elements = 1;
  for (int64_t d : param.shape)
    elements *= static_cast<double>(d);
  double tp = 1;
  if (param.tpDim >= 0)
    tp = static_cast<double>(
        spec.mesh->axis(*spec.mesh->findAxis(spec.spec.tensorParallel->axis))
            .size);
  return 2.0 * elements * static_cast<double>(options.tokensPerMicrobatch) / tp;
}

std::vector<Unit> meshplan::pipeline::fsdpUnits(const ResolvedSpec &spec,
                                                const ImportOptions &options) {
  const std::vector<ModuleEntry> &modules = spec.modules;
  std::vector<Unit> units;
  for (const UnitAssignment &assigned : spec.units)
    units.push_back(
        {assigned.name, assigned.params, 0, assigned.reshardAfterForward});
  double tokens = static_cast<double>(options.tokensPerMicrobatch);
  double seq = static_cast<double>(options.sequenceLength);
  // The unit of every module that holds parameters, and of each attention
  // module (the unit of its projections).
  std::vector<int> unitOf(modules.size(), -1);
  for (size_t u = 0; u < units.size(); ++u)
    for (int p : units[u].params) {
      const ParamAssignment &param = spec.params[p];
      unitOf[param.module] = static_cast<int>(u);
      units[u].forwardFlops +=
          leafFlops(spec, param, *modules[param.module].module, options);
    }
  for (size_t i = 0; i < modules.size(); ++i) {
    const Module &m = *modules[i].module;
    if (m.kind != ModuleKind::Attention)
      continue;
    for (size_t c = i + 1; c < modules.size() && unitOf[i] < 0; ++c)
      if (modules[c].parent == static_cast<int>(i) &&
          modules[c].module->name == "wq")
        unitOf[i] = unitOf[c];
    if (unitOf[i] < 0)
      continue;
    // Scores and weighted values: 2 matmuls of tokens x seq x (heads *
    // head_dim), halved by the causal mask; TP splits the heads when it
    // splits wq.
    double qDim = 0, tp = 1;
    for (size_t c = i + 1; c < modules.size(); ++c) {
      if (modules[c].parent != static_cast<int>(i) ||
          modules[c].module->name != "wq" || modules[c].module->params.empty())
        continue;
      qDim = static_cast<double>(modules[c].module->params.front().shape[0]);
      if (spec.assignments[c].tpStyle == TPStyle::Colwise)
        tp = static_cast<double>(
            spec.mesh
                ->axis(*spec.mesh->findAxis(spec.spec.tensorParallel->axis))
                .size);
    }
    units[unitOf[i]].forwardFlops += 2.0 * tokens * seq * qDim / tp;
  }
  return units;
}

//===----------------------------------------------------------------------===//
// Layouts
//===----------------------------------------------------------------------===//

/// One level over `names` (whole axes), chunked once by their product.
static AxisRefList wholeAxes(const Mesh &mesh,
                             const std::vector<std::string> &names) {
  AxisRefList level;
  for (const std::string &name : names) {
    int axis = *mesh.findAxis(name);
    level.push_back(AxisRef{axis, 1, mesh.axis(axis).size});
  }
  return level;
}

ParamLayouts meshplan::pipeline::paramLayouts(const ResolvedSpec &spec,
                                              const ParamAssignment &param) {
  const Mesh &mesh = *spec.mesh;
  const Spec &s = spec.spec;
  size_t rank = param.shape.size();
  ParamLayouts out;
  out.compute.dims.assign(rank, {});
  if (param.tpDim >= 0)
    out.compute.dims[param.tpDim].push_back(
        wholeAxes(mesh, {s.tensorParallel->axis}));
  // FSDP2 shards dim 0 of whatever TP left (torch.chunk of the local TP
  // shard): one more level, over all shard axes at once.
  out.stored = out.compute;
  if (!s.dataParallel.shardAxes.empty() && rank > 0)
    out.stored.dims[0].push_back(wholeAxes(mesh, s.dataParallel.shardAxes));
  // Each data-parallel rank computes its own microbatch: the gradient is
  // the average over replicas and shards (FSDP2 / DDP reduce with AVG).
  out.grad = out.compute;
  std::vector<std::string> dpAxes = s.dataParallel.replicateAxes;
  dpAxes.insert(dpAxes.end(), s.dataParallel.shardAxes.begin(),
                s.dataParallel.shardAxes.end());
  // Partial axes in mesh order (the order does not matter to a reduction).
  AxisRefList partial = wholeAxes(mesh, dpAxes);
  std::sort(partial.begin(), partial.end());
  out.grad.partial = partial;
  out.grad.reduceOp = ReduceOp::Avg;
  // Sequence-parallel weights: see Import.h.
  if (s.tensorParallel && param.tpDim < 0 &&
      spec.assignments[param.module].tpStyle == TPStyle::SequenceParallel &&
      mesh.axis(*mesh.findAxis(s.tensorParallel->axis)).size > 1) {
    AxisRefList tp = wholeAxes(mesh, {s.tensorParallel->axis});
    out.stacked = true;
    out.grad.dims.insert(out.grad.dims.begin(), SplitLevels{tp});
    out.stackedStored = out.stored;
    out.stackedStored.dims.insert(out.stackedStored.dims.begin(),
                                  SplitLevels{tp});
  }
  // One spelling per layout (size-1 axes split nothing and reduce nothing),
  // so that a redistribute between equal layouts is no op at all.
  for (Layout *layout :
       {&out.stored, &out.compute, &out.grad, &out.stackedStored}) {
    *layout = normalizeLayout(mesh, *layout);
    if (layout->partial.empty())
      layout->reduceOp = ReduceOp::Sum;
  }
  return out;
}

//===----------------------------------------------------------------------===//
// The module
//===----------------------------------------------------------------------===//

static Type elementType(MLIRContext *ctx, DType dtype) {
  switch (dtype) {
  case DType::Float32:
    return Float32Type::get(ctx);
  case DType::BFloat16:
    return BFloat16Type::get(ctx);
  case DType::Float16:
    return Float16Type::get(ctx);
  }
  return Float32Type::get(ctx);
}

namespace {
class Importer {
public:
  Importer(MLIRContext &ctx, const ResolvedSpec &spec,
           const ImportOptions &options)
      : ctx(ctx), spec(spec), options(options), b(&ctx),
        loc(FileLineColLoc::get(&ctx, "spec", 0, 0)),
        meshName(FlatSymbolRefAttr::get(&ctx, "mesh")) {}

  OwningOpRef<ModuleOp> run() {
    OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
    b.setInsertionPointToEnd(module->getBody());
    buildMesh();
    buildStep();
    return module;
  }

private:
  MLIRContext &ctx;
  const ResolvedSpec &spec;
  const ImportOptions &options;
  OpBuilder b;
  Location loc;
  FlatSymbolRefAttr meshName;

  /// The parameter's tensor type; with `stackedDim`, under one more leading
  /// dim of that size (a stacked gradient, see Import.h).
  RankedTensorType tensorType(const ParamAssignment &param, DType dtype,
                              const Layout &layout, int64_t stackedDim = 0) {
    SmallVector<int64_t> shape;
    if (stackedDim)
      shape.push_back(stackedDim);
    shape.append(param.shape.begin(), param.shape.end());
    return RankedTensorType::get(
        shape, elementType(&ctx, dtype),
        dist::layoutAttr(&ctx, meshName, *spec.mesh, layout));
  }

  void buildMesh() {
    const Mesh &mesh = *spec.mesh;
    SmallVector<Attribute> names, managed;
    SmallVector<int64_t> sizes;
    for (const MeshAxis &axis : mesh.getAxes()) {
      names.push_back(b.getStringAttr(axis.name));
      sizes.push_back(axis.size);
      if (axis.managed)
        managed.push_back(b.getStringAttr(axis.name));
    }
    DenseI64ArrayAttr order;
    if (spec.spec.mesh.deviceOrder)
      order = b.getDenseI64ArrayAttr(*spec.spec.mesh.deviceOrder);
    dist::MeshOp::create(
        b, loc, b.getStringAttr("mesh"), b.getArrayAttr(names),
        b.getDenseI64ArrayAttr(sizes),
        managed.empty() ? ArrayAttr() : b.getArrayAttr(managed), order);
  }

  DictionaryAttr optimizerAttr() {
    const OptimizerSpec &o = spec.spec.optimizer;
    NamedAttrList attrs;
    attrs.append("kind", b.getStringAttr("adamw"));
    attrs.append("lr", b.getF64FloatAttr(o.lr));
    attrs.append("beta1", b.getF64FloatAttr(o.beta1));
    attrs.append("beta2", b.getF64FloatAttr(o.beta2));
    attrs.append("eps", b.getF64FloatAttr(o.eps));
    attrs.append("weight_decay", b.getF64FloatAttr(o.weightDecay));
    attrs.append("stochastic_rounding", b.getBoolAttr(o.stochasticRounding));
    attrs.append("seed", b.getI64IntegerAttr(static_cast<int64_t>(o.seed)));
    return attrs.getDictionary(&ctx);
  }

  std::vector<ParamLayouts> layouts;

  /// Rows of a stacked gradient (the TP size), or 0.
  int64_t stackedRows(int p) const {
    if (!layouts[p].stacked)
      return 0;
    const Mesh &mesh = *spec.mesh;
    return mesh.axis(*mesh.findAxis(spec.spec.tensorParallel->axis)).size;
  }

  /// A stacked gradient reduced over the data-parallel axes into the stored
  /// layout under its TP rows, then summed over the rows: partial(sum) over
  /// TP, which dist-lower-optimizer all-reduces (see Import.h).
  Value summedGradient(int p, Value grad) {
    if (!layouts[p].stacked)
      return grad;
    const ParamAssignment &param = spec.params[p];
    DType dtype = spec.spec.mixedPrecision.reduceDtype;
    Value reduced = dist::RedistributeOp::create(
        b, loc,
        tensorType(param, dtype, layouts[p].stackedStored, stackedRows(p)),
        grad);
    Layout summed = layouts[p].stored;
    for (const AxisRef &ref : layouts[p].stackedStored.dims[0].front())
      summed.partial.push_back(ref);
    summed.reduceOp = ReduceOp::Sum;
    return dist::ReduceSumOp::create(b, loc, tensorType(param, dtype, summed),
                                     reduced, b.getDenseI64ArrayAttr({0}));
  }

  /// One microbatch's gradient reduced over the shard axes into the stored
  /// layout (under its TP rows when stacked), still partial (avg) over the
  /// replicate axes.
  Value shardReduced(int p, Value grad) {
    const ParamAssignment &param = spec.params[p];
    const ParamLayouts &l = layouts[p];
    Layout target = l.stacked ? l.stackedStored : l.stored;
    target.partial.clear();
    for (const std::string &name : spec.spec.dataParallel.replicateAxes) {
      int axis = *spec.mesh->findAxis(name);
      target.partial.push_back(AxisRef{axis, 1, spec.mesh->axis(axis).size});
    }
    std::sort(target.partial.begin(), target.partial.end());
    target.reduceOp = ReduceOp::Avg;
    target = normalizeLayout(*spec.mesh, target);
    if (target.partial.empty())
      target.reduceOp = ReduceOp::Sum;
    return dist::RedistributeOp::create(
        b, loc,
        tensorType(param, spec.spec.mixedPrecision.reduceDtype, target,
                   stackedRows(p)),
        grad);
  }

  void buildStep() {
    const Spec &s = spec.spec;
    SmallVector<Type> argTypes;
    for (const ParamAssignment &param : spec.params) {
      layouts.push_back(paramLayouts(spec, param));
      argTypes.push_back(
          tensorType(param, s.optimizer.paramDtype, layouts.back().stored));
    }
    auto func = func::FuncOp::create(b, loc, "train_step",
                                     b.getFunctionType(argTypes, {}));
    bool float8Gather = s.float8 && s.float8->enabled && s.float8->allGather;
    for (size_t p = 0; p < spec.params.size(); ++p) {
      func.setArgAttr(p, "dist.param", b.getStringAttr(spec.params[p].name));
      if (float8Gather && spec.params[p].float8)
        func.setArgAttr(p, "dist.float8", b.getUnitAttr());
    }
    func->setAttr("dist.train_step", b.getUnitAttr());
    func->setAttr("dist.reshard_after_forward",
                  b.getBoolAttr(s.dataParallel.reshardAfterForward !=
                                ReshardPolicy::Never));
    func->setAttr("dist.gradient_accumulation_steps",
                  b.getI64IntegerAttr(s.gradientAccumulationSteps));
    func->setAttr("dist.optimizer", optimizerAttr());
    // The trainer's own collectives inside compute callbacks (tensor
    // parallel matmuls, context parallel attention) run over these axes;
    // export declares one communicator per axis so the runtime creates them.
    SmallVector<Attribute> trainerAxes;
    if (s.tensorParallel)
      trainerAxes.push_back(b.getStringAttr(s.tensorParallel->axis));
    for (const std::string &axis : s.extraAxes)
      trainerAxes.push_back(b.getStringAttr(axis));
    if (!trainerAxes.empty())
      func->setAttr("dist.trainer_axes", b.getArrayAttr(trainerAxes));
    if (float8Gather)
      func->setAttr(
          "dist.float8",
          b.getDictionaryAttr(b.getNamedAttr(
              "power_of_2", b.getBoolAttr(s.float8->powerOf2Scales))));

    Block *body = func.addEntryBlock();
    b.setInsertionPointToStart(body);
    std::vector<Unit> units = fsdpUnits(spec, options);

    // Forward casts and gathers, once per parameter: dist-schedule decides
    // whether backward re-gathers (reshard after forward).
    std::vector<Value> gathered(spec.params.size());
    auto gather = [&](int p) {
      const ParamAssignment &param = spec.params[p];
      Value value = body->getArgument(p);
      const Layout &stored = layouts[p].stored;
      if (s.mixedPrecision.paramDtype != s.optimizer.paramDtype) {
        Type type = tensorType(param, s.mixedPrecision.paramDtype, stored);
        if (dtypeBytes(s.mixedPrecision.paramDtype) <
            dtypeBytes(s.optimizer.paramDtype))
          value = arith::TruncFOp::create(b, loc, type, value);
        else
          value = arith::ExtFOp::create(b, loc, type, value);
      }
      gathered[p] = dist::RedistributeOp::create(
          b, loc,
          tensorType(param, s.mixedPrecision.paramDtype, layouts[p].compute),
          value);
    };

    int64_t microbatches = s.gradientAccumulationSteps;
    // FSDP2's default: each microbatch's gradient is reduce-scattered right
    // after its backward and added into the sharded gradient (in the reduce
    // dtype); the unsharded gradient dies at once. The all-reduce over
    // replicas is left pending (partial over the replicate axes) and runs
    // once, after the last microbatch: it is linear, so reducing the sum
    // equals summing the reductions, for 1/k of the replicate traffic.
    bool reduceEveryMicrobatch =
        microbatches > 1 &&
        s.accumulationReduce == AccumulationReduce::EveryMicrobatch;
    std::vector<Value> grads(spec.params.size());
    for (int64_t mb = 0; mb < microbatches; ++mb) {
      for (const Unit &unit : units) {
        SmallVector<Value> inputs;
        for (int p : unit.params) {
          if (!gathered[p])
            gather(p);
          inputs.push_back(gathered[p]);
        }
        auto compute =
            dist::ComputeOp::create(b, loc, TypeRange{}, dist::Phase::Forward,
                                    b.getStringAttr(unit.name), inputs,
                                    b.getF64FloatAttr(unit.forwardFlops));
        if (microbatches > 1)
          compute->setAttr("dist.microbatch", b.getI64IntegerAttr(mb));
        // The unit's own policy, which dist-schedule follows over the
        // step's flag.
        compute->setAttr("dist.reshard_after_forward",
                         b.getBoolAttr(unit.reshardAfterForward));
      }
      for (auto it = units.rbegin(); it != units.rend(); ++it) {
        const Unit &unit = *it;
        SmallVector<Value> inputs;
        SmallVector<Type> gradTypes;
        for (int p : unit.params) {
          inputs.push_back(gathered[p]);
          gradTypes.push_back(tensorType(spec.params[p],
                                         s.mixedPrecision.reduceDtype,
                                         layouts[p].grad, stackedRows(p)));
        }
        // Later microbatches accumulate into the unsharded gradients when
        // they are reduced once, after the last microbatch.
        if (mb > 0 && !reduceEveryMicrobatch)
          for (int p : unit.params)
            inputs.push_back(grads[p]);
        auto compute =
            dist::ComputeOp::create(b, loc, gradTypes, dist::Phase::Backward,
                                    b.getStringAttr(unit.name), inputs,
                                    b.getF64FloatAttr(2 * unit.forwardFlops));
        if (microbatches > 1)
          compute->setAttr("dist.microbatch", b.getI64IntegerAttr(mb));
        for (auto [i, p] : llvm::enumerate(unit.params)) {
          if (!reduceEveryMicrobatch) {
            grads[p] = compute.getResult(i);
            continue;
          }
          Value reduced = shardReduced(p, compute.getResult(i));
          if (mb == 0) {
            grads[p] = reduced;
            continue;
          }
          auto add = arith::AddFOp::create(b, loc, grads[p], reduced);
          // In place into the accumulated gradient (dist-schedule, export).
          add->setAttr("dist.accumulate", b.getUnitAttr());
          grads[p] = add;
        }
        if (mb + 1 == microbatches)
          for (int p : unit.params)
            dist::OptimizerStepOp::create(b, loc, body->getArgument(p),
                                          summedGradient(p, grads[p]));
      }
    }
    func::ReturnOp::create(b, loc);
  }
};
} // namespace

OwningOpRef<ModuleOp>
meshplan::pipeline::importTrainStep(MLIRContext &context,
                                    const ResolvedSpec &spec,
                                    const ImportOptions &options) {
  return Importer(context, spec, options).run();
}
