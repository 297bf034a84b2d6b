//===- DistOps.cpp - dist operations: syntax and verifiers ----------------===//
//
// Verifiers that need the mesh run in verifySymbolUses, where the dist.mesh
// symbol can be looked up; every semantic check is a call into core.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Dialect/Dist/IR/CoreBridge.h"
#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

//===----------------------------------------------------------------------===//
// Custom directives
//===----------------------------------------------------------------------===//

/// `["ddp" = 2, "fsdp" = 2]`
static ParseResult parseDistMeshAxes(OpAsmParser &parser, ArrayAttr &names,
                                     DenseI64ArrayAttr &shape) {
  SmallVector<Attribute> nameAttrs;
  SmallVector<int64_t> sizes;
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Square, [&] {
        std::string name;
        int64_t size = 0;
        if (parser.parseString(&name) || parser.parseEqual() ||
            parser.parseInteger(size))
          return failure();
        nameAttrs.push_back(parser.getBuilder().getStringAttr(name));
        sizes.push_back(size);
        return success();
      }))
    return failure();
  names = parser.getBuilder().getArrayAttr(nameAttrs);
  shape = parser.getBuilder().getDenseI64ArrayAttr(sizes);
  return success();
}

static void printDistMeshAxes(OpAsmPrinter &p, Operation *, ArrayAttr names,
                              DenseI64ArrayAttr shape) {
  p << '[';
  llvm::interleaveComma(
      llvm::zip(names, shape.asArrayRef()), p, [&](auto pair) {
        auto [name, size] = pair;
        p << '"' << cast<StringAttr>(name).getValue() << "\" = " << size;
      });
  p << ']';
}

// Named apart from meshplan::dist::parseAxisList, which the generated code
// (inside namespace meshplan::dist) would find first.
static ParseResult parseDistAxisList(OpAsmParser &parser, ArrayAttr &axes) {
  return meshplan::dist::parseAxisList(parser, axes);
}

static void printDistAxisList(OpAsmPrinter &p, Operation *, ArrayAttr axes) {
  meshplan::dist::printAxisList(p, axes);
}

/// `sum`, `max`, ...: the reduce op as a bare keyword.
static ParseResult parseDistReduce(OpAsmParser &parser, ReduceKindAttr &kind) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef word;
  if (parser.parseKeyword(&word))
    return failure();
  auto value = symbolizeReduceKind(word);
  if (!value)
    return parser.emitError(loc, "unknown reduce op \"")
           << word << "\"; expected one of sum, avg, max, min, product";
  kind = ReduceKindAttr::get(parser.getContext(), *value);
  return success();
}

static void printDistReduce(OpAsmPrinter &p, Operation *, ReduceKindAttr kind) {
  p << stringifyReduceKind(kind.getValue());
}

#define GET_OP_CLASSES
#include "meshplan/Dialect/Dist/IR/DistOps.cpp.inc"

bool meshplan::dist::exchangesData(Operation *op) {
  return isa<AllGatherOp, ReduceScatterOp, AllReduceOp, AllToAllOp, PermuteOp,
             BroadcastOp>(op);
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

/// The dist.mesh a symbol names, or an error on `op`.
static FailureOr<MeshOp> lookupMesh(Operation *op, FlatSymbolRefAttr name,
                                    SymbolTableCollection &symbols) {
  auto mesh = symbols.lookupNearestSymbolFrom<MeshOp>(op, name);
  if (!mesh)
    return op->emitOpError()
           << "refers to " << name << ", which is not a dist.mesh";
  return mesh;
}

/// The core view (whole mesh) of a dist.mesh symbol.
static FailureOr<View> lookupView(Operation *op, FlatSymbolRefAttr name,
                                  SymbolTableCollection &symbols) {
  auto mesh = lookupMesh(op, name, symbols);
  if (failed(mesh))
    return failure();
  auto view = cachedRootView(*mesh);
  if (!view)
    return op->emitOpError()
           << "mesh " << name << " is invalid: " << view.error().message;
  return std::move(*view);
}

//===----------------------------------------------------------------------===//
// dist.mesh, dist.comm
//===----------------------------------------------------------------------===//

LogicalResult MeshOp::verify() {
  auto core = coreMesh(*this);
  if (!core)
    return emitOpError() << core.error().message;
  return success();
}

LogicalResult CommOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto view = lookupView(*this, getMeshAttr(), symbols);
  if (failed(view))
    return failure();
  auto refs = coreAxisRefs(view->mesh(), getAxes());
  if (!refs)
    return emitOpError() << refs.error().message;
  auto ok = checkRefsCompatible(view->mesh(), *refs, "comm");
  if (!ok)
    return emitOpError() << ok.error().message;
  if (auto from = getViewAttr()) {
    AxisNamespace names(view->meshHandle());
    auto viewed = evaluateViewExpr(*view, from.getExpr().getValue(), names);
    if (!viewed)
      return emitOpError() << "view \"" << from.getExpr().getValue()
                           << "\": " << viewed.error().message;
    std::string viewKey = partitionKeyOf(view->mesh(), viewed->refs());
    std::string axesKey = partitionKeyOf(view->mesh(), *refs);
    if (viewKey != axesKey)
      return emitOpError() << "view \"" << from.getExpr().getValue()
                           << "\" groups ranks by " << viewKey
                           << " but the comm's axes are " << axesKey;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Layout ops
//===----------------------------------------------------------------------===//

namespace {
/// Both ends of a layout-changing op, resolved against their mesh.
struct LayoutPair {
  std::optional<View> view;
  Layout in, out;
  std::vector<int64_t> shape;
};
} // namespace

/// Checks operand and result are the same tensor with layouts on one mesh,
/// and converts both layouts to core.
static FailureOr<LayoutPair> resolveLayouts(Operation *op, Value input,
                                            Value result,
                                            SymbolTableCollection &symbols) {
  auto inType = cast<RankedTensorType>(input.getType());
  auto outType = cast<RankedTensorType>(result.getType());
  if (inType.getShape() != outType.getShape() ||
      inType.getElementType() != outType.getElementType())
    return op->emitOpError()
           << "changes the tensor itself (" << inType << " -> " << outType
           << "); only the layout may change";
  LayoutAttr inLayout = getLayout(inType), outLayout = getLayout(outType);
  if (!inLayout)
    return op->emitOpError() << "operand has no #dist.layout encoding";
  if (!outLayout)
    return op->emitOpError() << "result has no #dist.layout encoding";
  if (inLayout.getMesh() != outLayout.getMesh())
    return op->emitOpError()
           << "operand is on mesh " << inLayout.getMesh()
           << " but the result is on mesh " << outLayout.getMesh();
  auto view = lookupView(op, inLayout.getMesh(), symbols);
  if (failed(view))
    return failure();
  LayoutPair pair;
  pair.shape.assign(inType.getShape().begin(), inType.getShape().end());
  for (auto [layout, which, out] :
       {std::tuple{inLayout, "operand", &pair.in},
        std::tuple{outLayout, "result", &pair.out}}) {
    if (layout.getRank() != static_cast<int64_t>(pair.shape.size()))
      return op->emitOpError()
             << which << " layout has " << layout.getRank()
             << " dims but the tensor has " << pair.shape.size();
    auto core = coreLayout(*view, layout);
    if (!core)
      return op->emitOpError() << which << " layout: " << core.error().message;
    *out = std::move(*core);
  }
  pair.view = *view;
  return pair;
}

/// Verifies that the result layout is what core says `spec` makes of the
/// operand's, and that an attached comm groups the same ranks.
static LogicalResult verifyStep(Operation *op, Value input, Value result,
                                ArrayAttr axes, std::optional<StringRef> comm,
                                StepSpec spec, ArrayAttr dstAxes,
                                SymbolTableCollection &symbols) {
  // Rank-local form: shapes are this rank's, the group is explicit.
  if (!getLayout(input.getType()) && !getLayout(result.getType())) {
    auto group = op->getAttrOfType<DenseI64ArrayAttr>("group");
    if (!group)
      return op->emitOpError()
             << "has neither layouts (global form) nor a group "
                "(rank-local form)";
    if (group.empty())
      return op->emitOpError() << "has an empty group";
    return success();
  }
  if (op->hasAttr("group"))
    return op->emitOpError()
           << "has layouts and a group; a group belongs to the rank-local "
              "form only";
  auto pair = resolveLayouts(op, input, result, symbols);
  if (failed(pair))
    return failure();
  const View &view = *pair->view;
  const Mesh &mesh = view.mesh();
  auto refs = coreAxisRefs(mesh, axes);
  if (!refs)
    return op->emitOpError() << refs.error().message;
  spec.axes = *refs;
  if (dstAxes) {
    auto dst = coreAxisRefs(mesh, dstAxes);
    if (!dst)
      return op->emitOpError() << dst.error().message;
    spec.dstAxes = *dst;
  }
  StepKey key{&mesh,
              static_cast<int>(spec.kind),
              spec.dim,
              spec.dstDim,
              static_cast<int>(spec.op),
              axes.getAsOpaquePointer(),
              dstAxes ? dstAxes.getAsOpaquePointer() : nullptr,
              input.getType().getAsOpaquePointer(),
              result.getType().getAsOpaquePointer()};
  MLIRContext *ctx = op->getContext();
  if (!isStepVerified(ctx, key)) {
    auto expected = applyStep(view, pair->in, spec, pair->shape);
    if (!expected)
      return op->emitOpError() << expected.error().message;
    if (!sameShards(view, *expected, pair->out, pair->shape))
      return op->emitOpError()
             << "result layout " << formatLayout(mesh, pair->out)
             << " is not what " << stepKindName(spec.kind) << " makes of "
             << formatLayout(mesh, pair->in) << " (expected "
             << formatLayout(mesh, *expected) << ")";
    setStepVerified(ctx, key);
  }
  if (comm) {
    auto commOp = symbols.lookupNearestSymbolFrom<CommOp>(
        op, FlatSymbolRefAttr::get(op->getContext(), *comm));
    if (!commOp)
      return op->emitOpError()
             << "refers to @" << *comm << ", which is not a dist.comm";
    auto commRefs = coreAxisRefs(mesh, commOp.getAxes());
    if (!commRefs ||
        commOp.getMeshAttr() != getLayout(input.getType()).getMesh())
      return op->emitOpError()
             << "comm @" << *comm << " is not on the operand's mesh";
    if (partitionKeyOf(mesh, *commRefs) != partitionKeyOf(mesh, spec.axes))
      return op->emitOpError()
             << "comm @" << *comm << " groups ranks by "
             << partitionKeyOf(mesh, *commRefs) << " but the op's axes are "
             << partitionKeyOf(mesh, spec.axes);
  }
  return success();
}

LogicalResult AnnotateOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto inType = cast<RankedTensorType>(getInput().getType());
  auto outType = cast<RankedTensorType>(getResult().getType());
  if (getLayout(inType))
    return emitOpError() << "operand already has a layout; use "
                         << RedistributeOp::getOperationName()
                         << " to change it";
  LayoutAttr layout = getLayout(outType);
  if (!layout)
    return emitOpError() << "result has no #dist.layout encoding";
  if (inType.getShape() != outType.getShape() ||
      inType.getElementType() != outType.getElementType())
    return emitOpError() << "changes the tensor itself (" << inType << " -> "
                         << outType << "); only the layout may be added";
  auto view = lookupView(*this, layout.getMesh(), symbols);
  if (failed(view))
    return failure();
  if (layout.getRank() != inType.getRank())
    return emitOpError() << "layout has " << layout.getRank()
                         << " dims but the tensor has " << inType.getRank();
  auto core = coreLayout(*view, layout);
  if (!core)
    return emitOpError() << "layout: " << core.error().message;
  return success();
}

LogicalResult RedistributeOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return resolveLayouts(*this, getInput(), getResult(), symbols);
}

static StepSpec spec(StepKind kind, int64_t dim = -1, int64_t dstDim = -1,
                     ReduceKind op = ReduceKind::Sum) {
  StepSpec s;
  s.kind = kind;
  s.dim = static_cast<int>(dim);
  s.dstDim = static_cast<int>(dstDim);
  s.op = coreReduceOp(op);
  return s;
}

LogicalResult AllGatherOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStep(*this, getInput(), getResult(), getAxes(), getComm(),
                    spec(StepKind::AllGather, getDim()), {}, symbols);
}

LogicalResult
ReduceScatterOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStep(*this, getInput(), getResult(), getAxes(), getComm(),
                    spec(StepKind::ReduceScatter, getDim(), -1, getReduce()),
                    {}, symbols);
}

LogicalResult AllReduceOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (getFaultTolerant()) {
    auto meshName = getLayout(getInput().getType())
                        ? getLayout(getInput().getType()).getMesh()
                        : FlatSymbolRefAttr();
    if (meshName) {
      auto view = lookupView(*this, meshName, symbols);
      if (failed(view))
        return failure();
      auto refs = coreAxisRefs(view->mesh(), getAxes());
      bool managed = false;
      if (refs)
        for (const AxisRef &r : *refs)
          managed |= r.size > 1 && view->mesh().axis(r.axis).managed;
      if (refs && !managed)
        return emitOpError() << "is fault_tolerant but reduces over no "
                                "managed axis";
    }
  }
  return verifyStep(*this, getInput(), getResult(), getAxes(), getComm(),
                    spec(StepKind::AllReduce, -1, -1, getReduce()), {},
                    symbols);
}

LogicalResult AllToAllOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStep(*this, getInput(), getResult(), getAxes(), getComm(),
                    spec(StepKind::AllToAll, getSrcDim(), getDstDim()), {},
                    symbols);
}

LogicalResult PermuteOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStep(*this, getInput(), getResult(), getAxes(), getComm(),
                    spec(StepKind::Permute, getDim()), getDstAxes(), symbols);
}

LogicalResult LocalSliceOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStep(*this, getInput(), getResult(), getAxes(), getComm(),
                    spec(StepKind::LocalSlice, getDim()), {}, symbols);
}

LogicalResult MarkPartialOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStep(*this, getInput(), getResult(), getAxes(), getComm(),
                    spec(StepKind::MarkPartial, -1, -1, getReduce()), {},
                    symbols);
}

LogicalResult BroadcastOp::verifySymbolUses(SymbolTableCollection &symbols) {
  // The generated accessor is unsigned; read the stored i64.
  int64_t root = getRootAttr().getInt();
  if (root < 0)
    return emitOpError() << "root " << root << " is negative";
  if (failed(verifyStep(*this, getInput(), getResult(), getAxes(), getComm(),
                        spec(StepKind::Broadcast), {}, symbols)))
    return failure();
  int64_t groupSize;
  if (!getLayout(getInput().getType())) {
    groupSize = static_cast<int64_t>(getGroup()->size());
  } else {
    auto view =
        lookupView(*this, getLayout(getInput().getType()).getMesh(), symbols);
    auto refs = coreAxisRefs(view->mesh(), getAxes());
    groupSize = refs ? refsSize(*refs) : 1;
  }
  if (root >= groupSize)
    return emitOpError() << "root " << root << " is outside the group of "
                         << groupSize << " ranks";
  return success();
}

//===----------------------------------------------------------------------===//
// Model ops
//===----------------------------------------------------------------------===//

#include "meshplan/Dialect/Dist/IR/DistInterfaces.cpp.inc"

LogicalResult MatmulOp::verify() {
  auto a = cast<RankedTensorType>(getLhs().getType());
  auto b = cast<RankedTensorType>(getRhs().getType());
  auto c = cast<RankedTensorType>(getResult().getType());
  if (a.getRank() != 2 || b.getRank() != 2 || c.getRank() != 2)
    return emitOpError() << "takes 2-d operands and result";
  if (a.getDimSize(1) != b.getDimSize(0) ||
      c.getDimSize(0) != a.getDimSize(0) || c.getDimSize(1) != b.getDimSize(1))
    return emitOpError() << "shapes do not multiply: " << a << " x " << b
                         << " -> " << c;
  return success();
}

std::optional<RuleLayouts>
MatmulOp::inferLayouts(const View &view, ArrayRef<const Layout *> operands,
                       ArrayRef<const Layout *> results) {
  return matmulRule(view, operands[0], operands[1], results[0]);
}

LogicalResult BitcastOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  if (in.getRank() != out.getRank() || in.getRank() == 0 ||
      in.getShape().drop_back() != out.getShape().drop_back())
    return emitOpError() << "may change only the last dim (" << in << " -> "
                         << out << ")";
  if (!in.getElementType().isIntOrFloat() ||
      !out.getElementType().isIntOrFloat() ||
      in.getDimSize(in.getRank() - 1) *
              in.getElementType().getIntOrFloatBitWidth() !=
          out.getDimSize(out.getRank() - 1) *
              out.getElementType().getIntOrFloatBitWidth())
    return emitOpError() << "changes the number of bits in the last dim (" << in
                         << " -> " << out << ")";
  return success();
}

std::optional<RuleLayouts>
BitcastOp::inferLayouts(const View &, ArrayRef<const Layout *> operands,
                        ArrayRef<const Layout *> results) {
  auto in = cast<RankedTensorType>(getInput().getType()).getShape();
  auto out = cast<RankedTensorType>(getResult().getType()).getShape();
  return bitcastRule(operands[0], results[0],
                     std::vector<int64_t>(in.begin(), in.end()),
                     std::vector<int64_t>(out.begin(), out.end()));
}

LogicalResult ReduceSumOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  SmallVector<int64_t> kept;
  for (int64_t d = 0; d < in.getRank(); ++d) {
    if (llvm::is_contained(getDims(), d))
      continue;
    kept.push_back(in.getDimSize(d));
  }
  for (int64_t d : getDims())
    if (d < 0 || d >= in.getRank())
      return emitOpError() << "dim " << d << " is out of range for " << in;
  if (ArrayRef<int64_t>(kept) != out.getShape() ||
      in.getElementType() != out.getElementType())
    return emitOpError() << "result " << out << " is not " << in
                         << " summed over the given dims";
  return success();
}

std::optional<RuleLayouts>
ReduceSumOp::inferLayouts(const View &, ArrayRef<const Layout *> operands,
                          ArrayRef<const Layout *> results) {
  std::vector<int> dims(getDims().begin(), getDims().end());
  return reduceSumRule(operands[0], results[0], dims,
                       cast<RankedTensorType>(getInput().getType()).getRank());
}

LogicalResult ReshapeOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  if (in.getNumElements() != out.getNumElements() ||
      in.getElementType() != out.getElementType())
    return emitOpError() << "changes the elements (" << in << " -> " << out
                         << ")";
  return success();
}

std::optional<RuleLayouts>
ReshapeOp::inferLayouts(const View &, ArrayRef<const Layout *> operands,
                        ArrayRef<const Layout *> results) {
  auto in = cast<RankedTensorType>(getInput().getType()).getShape();
  auto out = cast<RankedTensorType>(getResult().getType()).getShape();
  return reshapeRule(operands[0], results[0],
                     std::vector<int64_t>(in.begin(), in.end()),
                     std::vector<int64_t>(out.begin(), out.end()));
}

//===----------------------------------------------------------------------===//
// Training-step ops
//===----------------------------------------------------------------------===//

/// The core layout of a value's type, or std::nullopt when it has none.
/// `view` is set from the first layout seen; every later one must be on the
/// same mesh.
static FailureOr<std::optional<Layout>>
resolveOptionalLayout(Operation *op, Value value, StringRef what,
                      std::optional<View> &view, FlatSymbolRefAttr &meshName,
                      SymbolTableCollection &symbols) {
  auto type = cast<RankedTensorType>(value.getType());
  LayoutAttr layout = getLayout(type);
  if (!layout)
    return std::optional<Layout>();
  if (!view) {
    auto resolved = lookupView(op, layout.getMesh(), symbols);
    if (failed(resolved))
      return failure();
    view = *resolved;
    meshName = layout.getMesh();
  } else if (layout.getMesh() != meshName) {
    return op->emitOpError() << what << " is on mesh " << layout.getMesh()
                             << " but an earlier value is on " << meshName;
  }
  if (layout.getRank() != type.getRank())
    return op->emitOpError() << what << " layout has " << layout.getRank()
                             << " dims but the tensor has " << type.getRank();
  auto core = coreLayout(*view, layout);
  if (!core)
    return op->emitOpError() << what << " layout: " << core.error().message;
  return std::optional<Layout>(std::move(*core));
}

/// Either every tensor operand and result has a layout (the global form) or
/// none has (the rank-local form after dist-specialize-rank).
static LogicalResult verifyOneForm(Operation *op) {
  std::optional<bool> global;
  auto check = [&](Value v, StringRef what, size_t i) -> LogicalResult {
    bool laidOut = static_cast<bool>(getLayout(v.getType()));
    if (!global) {
      global = laidOut;
      return success();
    }
    if (*global != laidOut)
      return op->emitOpError()
             << what << " #" << i
             << (laidOut ? " has a layout but an earlier value has none"
                         : " has no layout but an earlier value has one")
             << "; use layouts on every value (global form) or on none "
                "(rank-local form)";
    return success();
  };
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    if (failed(check(v, "operand", i)))
      return failure();
  for (auto [i, v] : llvm::enumerate(op->getResults()))
    if (failed(check(v, "result", i)))
      return failure();
  return success();
}

/// Checks every operand's and result's layout resolves on one mesh; with
/// `oneForm`, that all values or none have one.
static LogicalResult verifyAllLayouts(Operation *op,
                                      SymbolTableCollection &symbols,
                                      bool oneForm = true) {
  if (oneForm && failed(verifyOneForm(op)))
    return failure();
  std::optional<View> view;
  FlatSymbolRefAttr meshName;
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    if (failed(resolveOptionalLayout(op, v, "operand #" + std::to_string(i),
                                     view, meshName, symbols)))
      return failure();
  for (auto [i, v] : llvm::enumerate(op->getResults()))
    if (failed(resolveOptionalLayout(op, v, "result #" + std::to_string(i),
                                     view, meshName, symbols)))
      return failure();
  return success();
}

static bool isFloat8(Type type) {
  return isa<Float8E4M3FNType, Float8E5M2Type>(type);
}

/// A rank-local tensor: what a pipeline stage hands to its neighbour.
static bool isLocalTensor(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  return tensor && !getLayout(tensor);
}

LogicalResult ComputeOp::verify() {
  if (getModule().empty())
    return emitOpError() << "needs a module name";
  if (auto flops = getFlopsAttr(); flops && !(flops.getValueAsDouble() >= 0))
    return emitOpError() << "flops must be >= 0";
  std::optional<int64_t> stage;
  if (auto attr = getStageAttr())
    stage = attr.getInt();
  if (stage && *stage < 0)
    return emitOpError() << "stage " << *stage << " is negative";
  bool split =
      getPhase() == Phase::BackwardInput || getPhase() == Phase::BackwardWeight;
  if (split && !stage)
    return emitOpError() << stringifyPhase(getPhase())
                         << " belongs to a pipeline stage's split backward; "
                            "it needs a stage";
  if (getPhase() == Phase::Forward) {
    // Outside a pipeline the trainer keeps its activations; a stage hands
    // one to the next stage.
    if (!stage && !getGrads().empty())
      return emitOpError() << "forward produces no values; gradients come "
                              "from backward";
    if (getGrads().size() > 1)
      return emitOpError() << "a stage's forward produces at most one value "
                              "(the activation for the next stage), not "
                           << getGrads().size();
    if (getGrads().size() == 1 && !isLocalTensor(getGrads()[0].getType()))
      return emitOpError() << "a stage's output activation is rank-local; "
                              "it must have no layout, not "
                           << getGrads()[0].getType();
    return success();
  }
  if (getGrads().size() > getInputs().size())
    return emitOpError() << "has " << getGrads().size()
                         << " gradients but only " << getInputs().size()
                         << " inputs";
  // Gradient i is the gradient of input i (parameters come first; scales
  // and accumulated gradients follow): of its shape, or stacked with one
  // leading dim (per-rank contributions still to be summed, split over the
  // axis they came from: a sequence-parallel weight's rows per TP rank).
  for (auto [i, grad] : llvm::enumerate(getGrads())) {
    auto in = cast<RankedTensorType>(getInputs()[i].getType());
    auto out = cast<RankedTensorType>(grad.getType());
    bool stacked = out.getRank() == in.getRank() + 1 &&
                   out.getShape().drop_front() == in.getShape();
    if ((in.getShape() != out.getShape() && !stacked) ||
        !isa<FloatType>(out.getElementType()))
      return emitOpError() << "gradient #" << i << " (" << out
                           << ") must be a floating-point tensor of the shape "
                              "of input #"
                           << i << " (" << in
                           << "), or of that shape with one leading dim";
  }
  return success();
}

LogicalResult ComputeOp::verifySymbolUses(SymbolTableCollection &symbols) {
  // A stage's activations are rank-local among laid-out parameters (see
  // the op's description): check the layouts that are there.
  return verifyAllLayouts(*this, symbols, /*oneForm=*/!getStageAttr());
}

LogicalResult
OptimizerStepOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto param = cast<RankedTensorType>(getParam().getType());
  auto grad = cast<RankedTensorType>(getGrad().getType());
  if (param.getShape() != grad.getShape())
    return emitOpError() << "gradient shape differs from the parameter's ("
                         << grad << " vs " << param << ")";
  if (!isa<FloatType>(param.getElementType()) ||
      !isa<FloatType>(grad.getElementType()))
    return emitOpError() << "needs floating-point parameter and gradient";
  if (getLayout(param) && getLayout(param).getPartial().size())
    return emitOpError() << "parameter layout is partial; a stored "
                            "parameter is never pending a reduction";
  return verifyAllLayouts(*this, symbols);
}

LogicalResult AdamWOp::verify() {
  auto param = cast<RankedTensorType>(getParam().getType());
  for (auto [name, value] :
       {std::pair{"gradient", getGrad()}, std::pair{"exp_avg", getExpAvg()},
        std::pair{"exp_avg_sq", getExpAvgSq()}}) {
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getShape() != param.getShape())
      return emitOpError() << name << " shape differs from the parameter's ("
                           << type << " vs " << param << ")";
    // The same layout attribute on all four operands: every rank updates
    // exactly the shard it stores, so no collective hides in the update.
    if (getLayout(type) != getLayout(param))
      return emitOpError() << name
                           << " is laid out differently from the parameter ("
                           << type << " vs " << param
                           << "); the update must be local to the stored shard";
  }
  if (LayoutAttr layout = getLayout(param);
      layout && layout.getPartial().size())
    return emitOpError() << "operands are partial; reduce the gradient first";
  for (Value state : {getExpAvg(), getExpAvgSq()})
    if (!cast<RankedTensorType>(state.getType()).getElementType().isF32())
      return emitOpError() << "optimizer state must be float32";
  Type paramElt = param.getElementType();
  if (!isa<FloatType>(paramElt) ||
      !isa<FloatType>(
          cast<RankedTensorType>(getGrad().getType()).getElementType()))
    return emitOpError() << "needs floating-point parameter and gradient";
  if (getStochasticRounding() && !paramElt.isBF16())
    return emitOpError() << "stochastic rounding needs a bfloat16 parameter, "
                            "not "
                         << paramElt;
  double lr = getLrAttr().getValueAsDouble();
  double beta1 = getBeta1Attr().getValueAsDouble();
  double beta2 = getBeta2Attr().getValueAsDouble();
  double eps = getEpsAttr().getValueAsDouble();
  double decay = getWeightDecayAttr().getValueAsDouble();
  if (!(lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) ||
      !(eps > 0) || !(decay >= 0))
    return emitOpError() << "hyper-parameters out of range (lr >= 0, "
                            "0 <= beta < 1, eps > 0, weight_decay >= 0)";
  return success();
}

LogicalResult AdamWOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyAllLayouts(*this, symbols);
}

LogicalResult Fp8AmaxOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto amax = cast<RankedTensorType>(getAmax().getType());
  if (getInputs().empty())
    return emitOpError() << "needs at least one input";
  if (amax.getRank() != 1 ||
      amax.getDimSize(0) != static_cast<int64_t>(getInputs().size()) ||
      !amax.getElementType().isF32())
    return emitOpError() << "result must be tensor<" << getInputs().size()
                         << "xf32>, one amax per input";
  std::optional<View> view;
  FlatSymbolRefAttr meshName;
  if (failed(verifyOneForm(*this)))
    return failure();
  std::optional<std::string> splitKey;
  size_t splitOperand = 0;
  for (auto [i, input] : llvm::enumerate(getInputs())) {
    std::string what = "operand #" + std::to_string(i);
    if (!isa<FloatType>(
            cast<RankedTensorType>(input.getType()).getElementType()))
      return emitOpError() << what << " is not floating-point";
    auto layout =
        resolveOptionalLayout(*this, input, what, view, meshName, symbols);
    if (failed(layout))
      return failure();
    if (!*layout)
      continue;
    if ((*layout)->partial.size())
      return emitOpError() << what << " is partial; its amax is undefined";
    AxisRefList split;
    for (int d = 0; d < (*layout)->rank(); ++d)
      for (const AxisRef &r : (*layout)->dimRefs(d))
        split.push_back(r);
    // MAX does not care about member order: compare the sets of axes.
    std::sort(split.begin(), split.end());
    std::string key =
        partitionKeyOf(view->mesh(), canonicalizeRefs(view->mesh(), split));
    if (splitKey && *splitKey != key)
      return emitOpError() << what << " is split over " << key
                           << " but operand #" << splitOperand << " over "
                           << *splitKey
                           << "; one amax all-reduce needs one set of axes";
    if (!splitKey)
      splitOperand = i;
    splitKey = key;
  }
  auto result = resolveOptionalLayout(*this, getAmax(), "result", view,
                                      meshName, symbols);
  if (failed(result))
    return failure();
  if (!*result)
    return success(); // rank-local form
  if ((*result)->dimRefs(0).size())
    return emitOpError() << "result must not be split";
  if ((*result)->reduceOp != ReduceOp::Max && (*result)->partial.size())
    return emitOpError() << "result must be partial(max)";
  AxisRefList partial = (*result)->partial;
  std::sort(partial.begin(), partial.end());
  std::string key =
      partitionKeyOf(view->mesh(), canonicalizeRefs(view->mesh(), partial));
  if (splitKey && key != *splitKey)
    return emitOpError() << "result is partial over " << key
                         << " but the inputs are split over " << *splitKey;
  return success();
}

LogicalResult Fp8CastOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  auto amax = cast<RankedTensorType>(getAmax().getType());
  if (!isFloat8(out.getElementType()))
    return emitOpError() << "result element type must be f8E4M3FN or "
                            "f8E5M2, not "
                         << out.getElementType();
  if (in.getShape() != out.getShape() || getLayout(in) != getLayout(out))
    return emitOpError() << "changes more than the element type (" << in
                         << " -> " << out << ")";
  if (amax.getRank() != 1 || !amax.getElementType().isF32())
    return emitOpError() << "amax must be a 1-D float32 tensor";
  int64_t index = getIndexAttr().getInt();
  if (index < 0 || (!amax.isDynamicDim(0) && index >= amax.getDimSize(0)))
    return emitOpError() << "amax index " << index << " is outside " << amax;
  if (!isa<FloatType>(in.getElementType()) || isFloat8(in.getElementType()))
    return emitOpError() << "input must be a wider floating-point tensor, not "
                         << in.getElementType();
  if (LayoutAttr layout = getLayout(amax); layout && layout.getPartial().size())
    return emitOpError() << "amax is still partial; all-reduce it (max) "
                            "before casting, or ranks scale differently";
  if (LayoutAttr layout = getLayout(amax))
    for (int64_t d = 0; d < layout.getRank(); ++d)
      if (layout.getLevels(d).size())
        return emitOpError() << "amax must be replicated: every rank reads "
                                "every weight's scale";
  return verifyAllLayouts(*this, symbols);
}

//===----------------------------------------------------------------------===//
// Pipeline ops
//===----------------------------------------------------------------------===//

/// The whole axis `name` of a dist.mesh, or an error on `op`.
static FailureOr<int> lookupWholeAxis(Operation *op, FlatSymbolRefAttr meshName,
                                      StringRef name,
                                      SymbolTableCollection &symbols) {
  auto view = lookupView(op, meshName, symbols);
  if (failed(view))
    return failure();
  const Mesh &mesh = view->mesh();
  auto axis = mesh.findAxis(name.str());
  if (!axis)
    return op->emitOpError()
           << "axis \"" << name << "\" is not in mesh " << meshName
           << " (axes: " << mesh.axisNameList() << ")";
  return *axis;
}

FailureOr<PipelineScheduleConfig> PipelineScheduleOp::getConfig(int64_t ranks) {
  auto kind = parsePipelineScheduleKind(getSchedule().str());
  if (!kind)
    return emitOpError() << kind.error().message;
  PipelineScheduleConfig config;
  config.kind = *kind;
  config.ranks = ranks;
  config.microbatches = getMicrobatchesAttr().getInt();
  config.stagesPerRank = getStagesPerRankAttr().getInt();
  return config;
}

LogicalResult PipelineScheduleOp::verify() {
  auto type = dyn_cast<RankedTensorType>(getActivation());
  if (!type || !type.hasStaticShape() ||
      !isa<FloatType>(type.getElementType()) || getLayout(type))
    return emitOpError() << "activation must be a statically shaped "
                            "floating-point tensor without a layout (one "
                            "rank's microbatch), not "
                         << getActivation();
  if (auto kind = parsePipelineScheduleKind(getSchedule().str()); !kind)
    return emitOpError() << kind.error().message;
  return success();
}

/// Core's messages speak of the spec section; here the op is the context.
static std::string withoutSpecPrefix(const std::string &message) {
  constexpr std::string_view prefix = "pipeline_parallel: ";
  if (message.compare(0, prefix.size(), prefix) == 0)
    return message.substr(prefix.size());
  return message;
}

LogicalResult
PipelineScheduleOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto axis = lookupWholeAxis(*this, getMeshAttr(), getAxis(), symbols);
  if (failed(axis))
    return failure();
  const Mesh &mesh = lookupView(*this, getMeshAttr(), symbols)->mesh();
  // Fault-tolerant replicas come and go; a stage cannot.
  if (mesh.axis(*axis).managed)
    return emitOpError() << "pipeline axis \"" << getAxis()
                         << "\" is managed; stages need a fixed membership";
  auto config = getConfig(mesh.axis(*axis).size);
  if (failed(config))
    return failure();
  if (auto ok = checkPipelineScheduleConfig(*config); !ok)
    return emitOpError() << withoutSpecPrefix(ok.error().message);
  return success();
}

LogicalResult PairOp::verify() {
  ArrayRef<int64_t> coords = getCoords();
  if (coords.size() != 2)
    return emitOpError() << "needs exactly two coordinates, not "
                         << coords.size();
  if (coords[0] == coords[1])
    return emitOpError() << "pairs coordinate " << coords[0] << " with itself";
  for (int64_t c : coords)
    if (c < 0)
      return emitOpError() << "coordinate " << c << " is negative";
  return success();
}

LogicalResult PairOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto axis = lookupWholeAxis(*this, getMeshAttr(), getAxis(), symbols);
  if (failed(axis))
    return failure();
  const Mesh &mesh = lookupView(*this, getMeshAttr(), symbols)->mesh();
  int64_t size = mesh.axis(*axis).size;
  for (int64_t c : getCoords())
    if (c >= size)
      return emitOpError() << "coordinate " << c << " is outside axis \""
                           << getAxis() << "\" of size " << size;
  return success();
}

/// The rules shared by send and recv: a pair member's key, a tag, and a
/// rank-local tensor of known size.
static LogicalResult verifyTransfer(Operation *op, int64_t peer, StringRef tag,
                                    Type type) {
  if (peer != 0 && peer != 1)
    return op->emitOpError()
           << "peer " << peer << " is not a key of a pair (0 or 1)";
  if (tag.empty())
    return op->emitOpError() << "needs a tag naming what travels";
  auto tensor = cast<RankedTensorType>(type);
  if (getLayout(tensor))
    return op->emitOpError()
           << "moves one rank's buffer; " << type
           << " has a layout (point-to-point transfers are rank-local)";
  if (!tensor.hasStaticShape())
    return op->emitOpError()
           << "needs a statically shaped tensor, not " << type;
  return success();
}

static LogicalResult verifyPairUse(Operation *op, FlatSymbolRefAttr comm,
                                   SymbolTableCollection &symbols) {
  if (!symbols.lookupNearestSymbolFrom<PairOp>(op, comm))
    return op->emitOpError()
           << "refers to " << comm << ", which is not a dist.pair";
  return success();
}

LogicalResult SendOp::verify() {
  return verifyTransfer(*this, getPeerAttr().getInt(), getTag(),
                        getInput().getType());
}

LogicalResult SendOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPairUse(*this, getCommAttr(), symbols);
}

LogicalResult RecvOp::verify() {
  return verifyTransfer(*this, getPeerAttr().getInt(), getTag(),
                        getResult().getType());
}

LogicalResult RecvOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPairUse(*this, getCommAttr(), symbols);
}

LogicalResult FreeOp::verify() {
  if (getInputs().empty())
    return emitOpError() << "needs at least one value";
  Block *block = getOperation()->getBlock();
  for (Value v : getInputs())
    for (Operation *user : v.getUsers()) {
      if (user == getOperation())
        continue;
      // A use nested in a later op's region counts as that op's use; a use
      // outside this block (a later block, or no common ancestor here) is
      // not known to precede the free.
      Operation *ancestor = block->findAncestorOpInBlock(*user);
      if (!ancestor || getOperation()->isBeforeInBlock(ancestor))
        return emitOpError() << "frees a value that is used afterwards";
    }
  return success();
}
