//===- Import.cpp - A model and a spec as a dist training-step module -----===//

#include "meshplan/Pipeline/Import.h"

#include "meshplan/Dialect/Dist/IR/CoreBridge.h"
#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include <algorithm>

using namespace mlir;
using namespace meshplan;
using namespace meshplan::frontend;
using namespace meshplan::pipeline;

//===----------------------------------------------------------------------===//
// Units
//===----------------------------------------------------------------------===//

/// The TP axis's size, 1 without tensor parallelism.
static int64_t tpSize(const ResolvedSpec &spec) {
  if (!spec.spec.tensorParallel)
    return 1;
  return spec.mesh->axis(*spec.mesh->findAxis(spec.spec.tensorParallel->axis))
      .size;
}

Result<std::string>
meshplan::pipeline::contextParallelAxis(const ResolvedSpec &spec,
                                        const ImportOptions &options) {
  const std::vector<std::string> &extra = spec.spec.extraAxes;
  auto isExtra = [&](const std::string &name) {
    return std::find(extra.begin(), extra.end(), name) != extra.end();
  };
  if (!options.contextParallelAxis)
    return isExtra("cp") ? std::string("cp") : std::string();
  const std::string &name = *options.contextParallelAxis;
  if (name.empty() || isExtra(name))
    return name;
  std::string list;
  for (const std::string &e : extra)
    list += (list.empty() ? "" : ", ") + e;
  return makeError("\"" + name +
                   "\" is not an extra axis of the spec (extra axes: " +
                   (list.empty() ? std::string("none") : list) +
                   "); context parallelism splits sequences over an extra "
                   "axis");
}

/// The context-parallel size, 1 when there is none (or the option names no
/// extra axis: compile reports that through estimateActivations).
static int64_t contextSize(const ResolvedSpec &spec,
                           const ImportOptions &options) {
  Result<std::string> axis = contextParallelAxis(spec, options);
  if (!axis || axis->empty())
    return 1;
  return spec.mesh->axis(*spec.mesh->findAxis(*axis)).size;
}

/// Tokens each rank holds per microbatch: the data-parallel rank's tokens,
/// split by context parallelism (the largest part).
static int64_t tokensPerRank(const ResolvedSpec &spec,
                             const ImportOptions &options) {
  int64_t cp = contextSize(spec, options);
  return (options.tokensPerMicrobatch + cp - 1) / cp;
}

/// For each module (index into spec.modules), the transformer block it is
/// in (a block module with an attention child and a feed_forward child), or
/// -1.
static std::vector<int> transformerBlocks(const ResolvedSpec &spec) {
  const std::vector<ModuleEntry> &modules = spec.modules;
  std::vector<char> isBlock(modules.size(), 0);
  for (size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].module->kind != ModuleKind::Block)
      continue;
    bool attention = false, ffn = false;
    for (const Module &child : modules[i].module->children) {
      attention |= child.kind == ModuleKind::Attention;
      ffn |= child.kind == ModuleKind::FeedForward;
    }
    isBlock[i] = attention && ffn;
  }
  std::vector<int> blockOf(modules.size(), -1);
  for (size_t i = 0; i < modules.size(); ++i) {
    if (isBlock[i]) {
      blockOf[i] = static_cast<int>(i);
      continue;
    }
    int parent = modules[i].parent;
    if (parent >= 0)
      blockOf[i] = blockOf[parent];
  }
  return blockOf;
}

/// Forward FLOPs per rank of one microbatch for a leaf module: 2 per weight
/// element per token for matmuls (divided by the TP degree when the weight
/// is TP-split), attention scores and values 2 * 2 * tokens * seq * dim / 2
/// (causal), nothing for lookups and norms (negligible). Tokens are this
/// rank's: context parallelism splits them.
static double leafFlops(const ResolvedSpec &spec, const ParamAssignment &param,
                        const Module &module, const ImportOptions &options) {
  if (module.kind != ModuleKind::Linear && module.kind != ModuleKind::Output)
    return 0;
  double elements = 1;
  for (int64_t d : param.shape)
    elements *= static_cast<double>(d);
  double tp = param.tpDim >= 0 ? static_cast<double>(tpSize(spec)) : 1;
  return 2.0 * elements * static_cast<double>(tokensPerRank(spec, options)) /
         tp;
}

/// A unit's name in `stage`: its own, or "<unit>@stage<k>" when it spans
/// stages (see splitUnitsByStage).
static std::string unitNameInStage(const ResolvedSpec &spec,
                                   const std::string &name,
                                   const std::vector<int> &params, int stage) {
  if (!spec.pipeline || stage < 0)
    return name;
  for (int p : params)
    if (spec.pipeline->stageOfParam[p] != stage)
      return name + "@stage" + std::to_string(stage);
  return name;
}

/// Under pipeline parallelism every unit runs in one stage. The root unit
/// (what no other unit holds) spans stages: each stage gets its share,
/// "<unit>@stage<k>", as torchtitan shards each model part on its own.
/// Units stay in forward order of their first parameter.
static std::vector<Unit> splitUnitsByStage(const ResolvedSpec &spec,
                                           std::vector<Unit> units) {
  const std::vector<int> &stageOf = spec.pipeline->stageOfParam;
  std::vector<Unit> out;
  for (Unit &unit : units) {
    std::map<int, std::vector<int>> byStage;
    for (int p : unit.params)
      byStage[stageOf[p]].push_back(p);
    if (byStage.size() == 1) {
      out.push_back(std::move(unit));
      continue;
    }
    for (auto &[stage, params] : byStage)
      out.push_back({unitNameInStage(spec, unit.name, unit.params, stage),
                     std::move(params), 0, 0, unit.reshardAfterForward});
  }
  std::stable_sort(out.begin(), out.end(), [](const Unit &a, const Unit &b) {
    return a.params.front() < b.params.front();
  });
  return out;
}

std::vector<Unit> meshplan::pipeline::fsdpUnits(const ResolvedSpec &spec,
                                                const ImportOptions &options) {
  const std::vector<ModuleEntry> &modules = spec.modules;
  std::vector<Unit> units;
  for (const UnitAssignment &assigned : spec.units)
    units.push_back(
        {assigned.name, assigned.params, 0, 0, assigned.reshardAfterForward});
  if (spec.pipeline)
    units = splitUnitsByStage(spec, std::move(units));
  double tokens = static_cast<double>(tokensPerRank(spec, options));
  double seq = static_cast<double>(options.sequenceLength);
  ActivationCheckpointing policy = spec.spec.activationCheckpointing;
  std::vector<int> blockOf = transformerBlocks(spec);
  // Which linear of its block each module is, in forward order (from 1):
  // torchtitan's selective policy recomputes every second matmul.
  std::vector<int> linearIndex(modules.size(), 0);
  std::vector<int> linearsSeen(modules.size(), 0);
  for (size_t i = 0; i < modules.size(); ++i)
    if (blockOf[i] >= 0 && modules[i].module->kind == ModuleKind::Linear)
      linearIndex[i] = ++linearsSeen[blockOf[i]];
  // The unit of every module that holds parameters, and of each attention
  // module (the unit of its projections).
  std::vector<int> unitOf(modules.size(), -1);
  for (size_t u = 0; u < units.size(); ++u)
    for (int p : units[u].params) {
      const ParamAssignment &param = spec.params[p];
      unitOf[param.module] = static_cast<int>(u);
      double flops =
          leafFlops(spec, param, *modules[param.module].module, options);
      units[u].forwardFlops += flops;
      if (blockOf[param.module] < 0)
        continue;
      if (policy == ActivationCheckpointing::Full ||
          (policy == ActivationCheckpointing::Selective &&
           linearIndex[param.module] % 2 == 0))
        units[u].recomputeFlops += flops;
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
        tp = static_cast<double>(tpSize(spec));
    }
    double flops = 2.0 * tokens * seq * qDim / tp;
    units[unitOf[i]].forwardFlops += flops;
    // Selective checkpointing keeps SDPA's output; full recomputes it.
    if (blockOf[i] >= 0 && policy == ActivationCheckpointing::Full)
      units[unitOf[i]].recomputeFlops += flops;
  }
  return units;
}

//===----------------------------------------------------------------------===//
// Activations
//===----------------------------------------------------------------------===//

Result<ActivationEstimate>
meshplan::pipeline::estimateActivations(const ResolvedSpec &spec,
                                        const ImportOptions &options) {
  const std::vector<ModuleEntry> &modules = spec.modules;
  ActivationEstimate out;
  auto axis = contextParallelAxis(spec, options);
  if (!axis)
    return axis.error();
  out.contextAxis = *axis;
  out.contextSize = contextSize(spec, options);
  out.tokensPerRank = tokensPerRank(spec, options);
  out.dtypeBytes = dtypeBytes(spec.spec.mixedPrecision.paramDtype);
  switch (spec.spec.activationCheckpointing) {
  case ActivationCheckpointing::None:
    out.policy = plan::Recompute::None;
    break;
  case ActivationCheckpointing::Full:
    out.policy = plan::Recompute::Full;
    break;
  case ActivationCheckpointing::Selective:
    out.policy = plan::Recompute::Selective;
    break;
  }
  const int64_t n = out.tokensPerRank, p = out.dtypeBytes;
  const int64_t tp = tpSize(spec);
  auto tpIf = [&](size_t module, TPStyle style) -> int64_t {
    return spec.assignments[module].tpStyle == style ? tp : 1;
  };

  // The unit of a module: the unit of its first parameter in forward order
  // (its own or a descendant's).
  // Under a pipeline, a unit spanning stages is charged per stage (its
  // parts are units of their own, fsdpUnits).
  std::vector<int> unitOfParamModule(modules.size(), -1);
  std::vector<int> stageOfParamModule(modules.size(), -1);
  for (size_t u = 0; u < spec.units.size(); ++u)
    for (int param : spec.units[u].params) {
      unitOfParamModule[spec.params[param].module] = static_cast<int>(u);
      if (spec.pipeline)
        stageOfParamModule[spec.params[param].module] =
            spec.pipeline->stageOfParam[param];
    }
  struct UnitRef {
    int unit = -1, stage = -1;
  };
  auto unitOf = [&](size_t module) -> UnitRef {
    for (size_t i = module; i < modules.size(); ++i) {
      // Stop at the first module outside `module`'s subtree.
      if (i != module) {
        int a = modules[i].parent;
        while (a >= 0 && a != static_cast<int>(module))
          a = modules[a].parent;
        if (a < 0)
          break;
      }
      if (unitOfParamModule[i] >= 0)
        return {unitOfParamModule[i], stageOfParamModule[i]};
    }
    return {};
  };
  auto child = [&](size_t parent, ModuleKind kind,
                   std::string_view preferred) -> int {
    int first = -1;
    for (size_t c = parent + 1; c < modules.size(); ++c) {
      if (modules[c].parent != static_cast<int>(parent) ||
          modules[c].module->kind != kind)
        continue;
      if (modules[c].module->name == preferred)
        return static_cast<int>(c);
      if (first < 0)
        first = static_cast<int>(c);
    }
    return first;
  };
  auto charge = [&](UnitRef ref, int64_t saved, int64_t forwardTransient,
                    int64_t backwardTransient) {
    if (ref.unit < 0)
      return;
    const frontend::UnitAssignment &unit = spec.units[ref.unit];
    plan::UnitActivation &a =
        out.units[unitNameInStage(spec, unit.name, unit.params, ref.stage)];
    a.saved += saved;
    // A unit runs its blocks one at a time: the largest working set.
    a.forwardTransient = std::max(a.forwardTransient, forwardTransient);
    a.backwardTransient = std::max(a.backwardTransient, backwardTransient);
  };

  std::vector<int> blockOf = transformerBlocks(spec);
  int lastNorm = -1; // the latest top-level norm: the output's final norm
  for (size_t i = 0; i < modules.size(); ++i) {
    const Module &m = *modules[i].module;
    if (m.kind == ModuleKind::Norm && blockOf[i] < 0)
      lastNorm = static_cast<int>(i);
    if (m.kind == ModuleKind::Embedding && blockOf[i] < 0) {
      charge(unitOf(i), plan::tokenIdBytes(n), 0, 0);
      continue;
    }
    if (m.kind == ModuleKind::Output && blockOf[i] < 0 && !m.params.empty()) {
      const Parameter *w = m.findParam("weight");
      if (!w || w->shape.size() != 2)
        continue;
      plan::OutputShape o;
      o.vocab = w->shape[0];
      o.dim = w->shape[1];
      o.vocabTp = tpIf(i, TPStyle::Colwise);
      if (lastNorm >= 0)
        o.sequenceTp = tpIf(lastNorm, TPStyle::SequenceParallel);
      int64_t transient = plan::outputTransientBytes(o, n, p);
      charge(unitOf(i), plan::sumTerms(plan::outputTerms(o, n, p)), transient,
             transient);
      continue;
    }
    if (blockOf[i] != static_cast<int>(i))
      continue;
    // A transformer block: its attention's projections and heads, its
    // feed-forward's linears, and the norm before the attention.
    int attention = child(i, ModuleKind::Attention, "attention");
    int ffn = child(i, ModuleKind::FeedForward, "feed_forward");
    int wq = child(attention, ModuleKind::Linear, "wq");
    int w1 = child(ffn, ModuleKind::Linear, "w1");
    int norm = child(i, ModuleKind::Norm, "attention_norm");
    if (wq < 0 || w1 < 0)
      continue;
    const Parameter *q = modules[wq].module->findParam("weight");
    const Parameter *up = modules[w1].module->findParam("weight");
    const Module &attn = *modules[attention].module;
    if (!q || !up || q->shape.size() != 2 || up->shape.size() != 2 ||
        attn.nHeads < 1)
      continue;
    int linears = 0;
    for (const Module &c : modules[ffn].module->children)
      linears += c.kind == ModuleKind::Linear;
    plan::BlockShape block;
    block.dim = q->shape[1];
    block.heads = attn.nHeads;
    block.kvHeads = attn.nKvHeads > 0 ? attn.nKvHeads : attn.nHeads;
    block.headDim = q->shape[0] / attn.nHeads;
    block.ffnDim = up->shape[0];
    block.gatedFfn = linears >= 3;
    block.attentionTp = tpIf(wq, TPStyle::Colwise);
    block.ffnTp = tpIf(w1, TPStyle::Colwise);
    block.sequenceTp = norm >= 0 ? tpIf(norm, TPStyle::SequenceParallel) : 1;
    ++out.blocks;
    charge(unitOf(i),
           plan::sumTerms(plan::savedBlockTerms(block, n, p, out.policy)), 0,
           plan::blockBackwardTransientBytes(block, n, p, out.policy));
  }
  return out;
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
    if (spec.pipeline)
      buildPipeline();
  }

  /// The schedule, and what crosses a stage boundary: one microbatch's
  /// hidden states on one rank (tokens x model dim, in the compute dtype).
  void buildPipeline() {
    const frontend::ResolvedPipeline &pp = *spec.pipeline;
    int64_t dim = 0;
    for (const ParamAssignment &param : spec.params)
      if (param.shape.size() == 2 &&
          std::string_view(param.name).ends_with("attention.wq.weight")) {
        dim = param.shape[1]; // Linear weights are [out, in]
        break;
      }
    for (const ParamAssignment &param : spec.params)
      if (!dim && !param.shape.empty())
        dim = param.shape.back();
    // Under sequence parallelism (torchtitan's plan: the norms are
    // SequenceParallel) the residual stream between pieces, and so what
    // crosses a stage boundary, is each TP rank's shard of the sequence
    // (the largest part, as for context parallelism).
    int64_t tokens = tokensPerRank(spec, options);
    for (size_t i = 0; i < spec.modules.size(); ++i)
      if (spec.modules[i].module->kind == ModuleKind::Norm &&
          spec.assignments[i].tpStyle == TPStyle::SequenceParallel) {
        int64_t tp = tpSize(spec);
        tokens = (tokens + tp - 1) / tp;
        break;
      }
    auto activation = RankedTensorType::get(
        {tokens, std::max<int64_t>(dim, 1)},
        elementType(&ctx, spec.spec.mixedPrecision.paramDtype));
    dist::PipelineScheduleOp::create(
        b, loc, b.getStringAttr("pipeline"), meshName, b.getStringAttr(pp.axis),
        b.getStringAttr(pipelineScheduleKindName(pp.config.kind)),
        b.getI64IntegerAttr(pp.config.microbatches),
        b.getI64IntegerAttr(pp.config.stagesPerRank),
        TypeAttr::get(activation));
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

  /// The stage of a unit (fsdpUnits keeps each within one), or none.
  IntegerAttr stageOf(const Unit &unit) {
    if (!spec.pipeline)
      return {};
    return b.getI64IntegerAttr(
        spec.pipeline->stageOfParam[unit.params.front()]);
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
      func.setArgAttr(p, dist::DistDialect::ParamAttrHelper::getNameStr(),
                      b.getStringAttr(spec.params[p].name));
      if (float8Gather && spec.params[p].float8)
        func.setArgAttr(p, dist::DistDialect::Float8AttrHelper::getNameStr(),
                        b.getUnitAttr());
    }
    dist::DistDialect::TrainStepAttrHelper(&ctx).setAttr(func, b.getUnitAttr());
    // One microbatch per stage: dist-lower-pipeline replays it in the
    // schedule's order for one pp coordinate.
    if (spec.pipeline)
      dist::DistDialect::PipelineAttrHelper(&ctx).setAttr(
          func, FlatSymbolRefAttr::get(&ctx, "pipeline"));
    dist::DistDialect::ReshardAfterForwardAttrHelper(&ctx).setAttr(
        func, b.getBoolAttr(s.dataParallel.reshardAfterForward !=
                            ReshardPolicy::Never));
    dist::DistDialect::GradientAccumulationStepsAttrHelper(&ctx).setAttr(
        func, b.getI64IntegerAttr(s.gradientAccumulationSteps));
    dist::DistDialect::OptimizerAttrHelper(&ctx).setAttr(func, optimizerAttr());
    // The trainer's own collectives inside compute callbacks (tensor
    // parallel matmuls, context parallel attention) run over these axes;
    // export declares one communicator per axis so the runtime creates them.
    SmallVector<Attribute> trainerAxes;
    if (s.tensorParallel)
      trainerAxes.push_back(b.getStringAttr(s.tensorParallel->axis));
    for (const std::string &axis : s.extraAxes)
      trainerAxes.push_back(b.getStringAttr(axis));
    if (!trainerAxes.empty())
      dist::DistDialect::TrainerAxesAttrHelper(&ctx).setAttr(
          func, b.getArrayAttr(trainerAxes));
    if (float8Gather)
      dist::DistDialect::Float8AttrHelper(&ctx).setAttr(
          func, b.getDictionaryAttr(b.getNamedAttr(
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
        auto compute = dist::ComputeOp::create(
            b, loc, TypeRange{}, dist::Phase::Forward,
            b.getStringAttr(unit.name), inputs,
            b.getF64FloatAttr(unit.forwardFlops), stageOf(unit));
        if (microbatches > 1)
          dist::DistDialect::MicrobatchAttrHelper(&ctx).setAttr(
              compute, b.getI64IntegerAttr(mb));
        // The unit's own policy, which dist-schedule follows over the
        // step's flag.
        dist::DistDialect::ReshardAfterForwardAttrHelper(&ctx).setAttr(
            compute, b.getBoolAttr(unit.reshardAfterForward));
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
        auto compute = dist::ComputeOp::create(
            b, loc, gradTypes, dist::Phase::Backward,
            b.getStringAttr(unit.name), inputs,
            b.getF64FloatAttr(2 * unit.forwardFlops + unit.recomputeFlops),
            stageOf(unit));
        if (microbatches > 1)
          dist::DistDialect::MicrobatchAttrHelper(&ctx).setAttr(
              compute, b.getI64IntegerAttr(mb));
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
          dist::DistDialect::AccumulateAttrHelper(&ctx).setAttr(
              add, b.getUnitAttr());
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
