//===- DiscardableAttrs.cpp - verifiers of dist's discardable attributes --===//
//
// Every `dist.*` attribute on an operation, a function argument or a function
// result comes through the dialect's hooks below, so a misspelt name or a
// value of the wrong type is an error where the IR is verified (after parsing,
// after import and after each compile stage), not a silently ignored
// attribute in some pass. Cross-attribute rules that need the whole function
// or module (a float8 parameter needs its function's scale settings, a
// dist.pipeline symbol must exist) stay with the passes that use them.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Dialect/Dist/IR/DiscardableAttrs.h"
#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Interfaces/FunctionInterfaces.h"

#include <cstdio>
#include <optional>
#include <string>

using namespace mlir;
using namespace meshplan::dist;

namespace {

/// Checks one attribute; errors name it, and the argument or result it is on.
class AttrChecker {
public:
  AttrChecker(Operation *op, NamedAttribute attr, std::string where = "")
      : op(op), attr(attr), where(std::move(where)) {}

  Attribute value() const { return attr.getValue(); }

  /// `'op' op [argument N: ]dist.x must be <what>, not <value>`.
  InFlightDiagnostic fail(StringRef what) {
    return op->emitOpError()
           << where << attr.getName().getValue() << " must be " << what
           << ", not " << attr.getValue();
  }

  /// Success when `ok`, else fail(what).
  LogicalResult expect(bool ok, StringRef what) {
    if (ok)
      return success();
    return fail(what);
  }

  LogicalResult unit() {
    return expect(isa<UnitAttr>(value()), "a unit attribute");
  }

  LogicalResult i64AtLeast(int64_t min) {
    auto i = dyn_cast<IntegerAttr>(value());
    if (i && i.getType().isSignlessInteger(64) && i.getInt() >= min)
      return success();
    return fail("an i64 >= " + std::to_string(min));
  }

  LogicalResult nonEmptyString() {
    auto s = dyn_cast<StringAttr>(value());
    return expect(s && !s.getValue().empty(), "a non-empty string");
  }

private:
  Operation *op;
  NamedAttribute attr;
  std::string where;
};

/// "0.999", "1e-08": a double as a person writes it, for messages.
std::string shortFloat(double d) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", d);
  return buffer;
}

} // namespace

FailureOr<OptimizerHyper> meshplan::dist::readOptimizerAttr(Operation *op,
                                                            Attribute raw) {
  StringRef name = DistDialect::OptimizerAttrHelper::getNameStr();
  auto dict = dyn_cast<DictionaryAttr>(raw);
  if (!dict)
    return op->emitOpError() << name << " must be a dictionary, not " << raw;

  auto kind = dict.get("kind");
  if (!kind)
    return op->emitOpError() << name << " has no \"kind\"";
  auto kindStr = dyn_cast<StringAttr>(kind);
  if (!kindStr)
    return op->emitOpError()
           << name << " \"kind\" must be a string, not " << kind;
  if (kindStr.getValue() != "adamw")
    return op->emitOpError() << name << " kind \"" << kindStr.getValue()
                             << "\" is not supported (only \"adamw\")";

  OptimizerHyper h;
  // Each float key with the range the update needs (as dist.adamw checks).
  struct FloatKey {
    StringRef key;
    double *out;
    double lo;
    bool loOpen;
    std::optional<double> hiOpen;
  };
  FloatKey floats[] = {
      {"lr", &h.lr, 0, false, std::nullopt},
      {"beta1", &h.beta1, 0, false, 1.0},
      {"beta2", &h.beta2, 0, false, 1.0},
      {"eps", &h.eps, 0, true, std::nullopt},
      {"weight_decay", &h.weightDecay, 0, false, std::nullopt},
  };
  for (const FloatKey &k : floats) {
    Attribute value = dict.get(k.key);
    if (!value)
      return op->emitOpError() << name << " has no \"" << k.key << "\" (f64)";
    auto f = dyn_cast<FloatAttr>(value);
    if (!f || !f.getType().isF64())
      return op->emitOpError()
             << name << " \"" << k.key << "\" must be an f64, not " << value;
    double d = f.getValueAsDouble();
    bool ok = (k.loOpen ? d > k.lo : d >= k.lo) && (!k.hiOpen || d < *k.hiOpen);
    if (!ok)
      return op->emitOpError()
             << name << " \"" << k.key << "\" = " << shortFloat(d)
             << " is out of range " << (k.loOpen ? "(" : "[")
             << shortFloat(k.lo) << ", "
             << (k.hiOpen ? shortFloat(*k.hiOpen) + ")" : std::string("inf)"));
    *k.out = d;
  }

  Attribute sr = dict.get("stochastic_rounding");
  if (!sr)
    return op->emitOpError()
           << name << " has no \"stochastic_rounding\" (bool)";
  auto srBool = dyn_cast<BoolAttr>(sr);
  if (!srBool)
    return op->emitOpError()
           << name << " \"stochastic_rounding\" must be a bool, not " << sr;
  h.stochasticRounding = srBool.getValue();

  Attribute seed = dict.get("seed");
  if (!seed)
    return op->emitOpError() << name << " has no \"seed\" (i64)";
  auto seedInt = dyn_cast<IntegerAttr>(seed);
  if (!seedInt || !seedInt.getType().isSignlessInteger(64))
    return op->emitOpError()
           << name << " \"seed\" must be an i64, not " << seed;
  h.seed = seedInt.getInt();
  return h;
}

FailureOr<bool> meshplan::dist::readFloat8Attr(Operation *op, Attribute raw) {
  StringRef name = DistDialect::Float8AttrHelper::getNameStr();
  StringRef trainStep = DistDialect::TrainStepAttrHelper::getNameStr();
  if (!op->hasAttr(trainStep))
    return op->emitOpError()
           << "has " << name << " but is not a " << trainStep << " function";
  auto dict = dyn_cast<DictionaryAttr>(raw);
  if (!dict)
    return op->emitOpError()
           << name << " must be a dictionary {power_of_2 = true|false}";
  for (NamedAttribute entry : dict) {
    if (entry.getName() != "power_of_2")
      return op->emitOpError()
             << name << " has an unknown key \"" << entry.getName().str()
             << "\" (expected {power_of_2 = true|false})";
  }
  auto pow2 = dict.getAs<BoolAttr>("power_of_2");
  if (!pow2)
    return op->emitOpError() << name << " needs power_of_2 = true|false";
  return pow2.getValue();
}

/// Whether `name` is one of the attributes of function arguments.
static bool isArgumentAttr(DistDialect &dialect, StringAttr name) {
  return name == dialect.getLayoutAttrHelper().getName() ||
         name == dialect.getParamAttrHelper().getName() ||
         name == dialect.getTensorIdAttrHelper().getName() ||
         name == dialect.getStateAttrHelper().getName();
}

LogicalResult DistDialect::verifyOperationAttribute(Operation *op,
                                                    NamedAttribute attr) {
  StringAttr name = attr.getName();
  AttrChecker check(op, attr);
  if (name == getTrainStepAttrHelper().getName() ||
      name == getAccumulateAttrHelper().getName())
    return check.unit();
  if (name == getPipelineAttrHelper().getName()) {
    if (isa<FlatSymbolRefAttr>(attr.getValue()))
      return success();
    return op->emitOpError()
           << name.getValue() << " must name a "
           << PipelineScheduleOp::getOperationName() << " symbol";
  }
  if (name == getReshardAfterForwardAttrHelper().getName()) {
    // On the step (its default) or on one forward compute (its unit's own).
    if (auto compute = dyn_cast<ComputeOp>(op)) {
      if (!isa<BoolAttr>(attr.getValue()) ||
          compute.getPhase() != Phase::Forward)
        return check.fail("a bool on a forward compute");
      return success();
    }
    return check.expect(isa<BoolAttr>(attr.getValue()), "a bool");
  }
  if (name == getGradientAccumulationStepsAttrHelper().getName())
    return check.i64AtLeast(1);
  if (name == getOptimizerAttrHelper().getName())
    return readOptimizerAttr(op, attr.getValue());
  if (name == getTrainerAxesAttrHelper().getName()) {
    auto axes = dyn_cast<ArrayAttr>(attr.getValue());
    bool ok = axes && llvm::all_of(axes, [](Attribute a) {
                auto s = dyn_cast<StringAttr>(a);
                return s && !s.getValue().empty();
              });
    return check.expect(ok, "an array of mesh axis names");
  }
  if (name == getFloat8AttrHelper().getName())
    return readFloat8Attr(op, attr.getValue());
  if (name == getPpRankAttrHelper().getName() ||
      name == getRankAttrHelper().getName() ||
      name == getMicrobatchAttrHelper().getName() ||
      name == getIdAttrHelper().getName() ||
      name == getBucketAttrHelper().getName())
    return check.i64AtLeast(0);
  if (name == getPpAxisAttrHelper().getName() ||
      name == getActionAttrHelper().getName())
    return check.nonEmptyString();
  if (name == getStreamAttrHelper().getName()) {
    // The streams dist-schedule assigns (Schedule.cpp, streamOf).
    auto stream = dyn_cast<StringAttr>(attr.getValue());
    if (stream && llvm::is_contained(ArrayRef<StringRef>{"compute", "comm.ag",
                                                         "comm.rs", "p2p"},
                                     stream.getValue()))
      return success();
    return check.fail("one of \"compute\", \"comm.ag\", \"comm.rs\", \"p2p\"");
  }
  if (name == getAfterAttrHelper().getName()) {
    auto after = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
    if (after &&
        llvm::all_of(after.asArrayRef(), [](int64_t id) { return id >= 0; }))
      return success();
    return check.fail("an array<i64> of ids >= 0");
  }
  if (isArgumentAttr(*this, name))
    return op->emitOpError()
           << name.getValue() << " is an attribute of function arguments";
  return op->emitOpError() << "has an unknown attribute " << name.getValue()
                           << " (docs/dialect.md lists the dist attributes)";
}

LogicalResult DistDialect::verifyRegionArgAttribute(Operation *op,
                                                    unsigned regionIndex,
                                                    unsigned argIndex,
                                                    NamedAttribute attr) {
  StringAttr name = attr.getName();
  AttrChecker check(op, attr, "argument " + std::to_string(argIndex) + ": ");
  if (name == getLayoutAttrHelper().getName()) {
    if (isa<LayoutAttr>(attr.getValue()))
      return success();
    return op->emitError() << "argument " << argIndex << ": " << name.getValue()
                           << " must be a #dist.layout";
  }
  if (name == getParamAttrHelper().getName() ||
      name == getStateAttrHelper().getName())
    return check.nonEmptyString();
  if (name == getTensorIdAttrHelper().getName())
    return check.i64AtLeast(0);
  if (name == getFloat8AttrHelper().getName()) {
    // A mark on a parameter; the function's own dist.float8 holds the
    // settings.
    if (isa<UnitAttr>(attr.getValue()))
      return success();
    std::string param = "#" + std::to_string(argIndex);
    if (auto func = dyn_cast<FunctionOpInterface>(op))
      if (auto paramName = func.getArgAttrOfType<StringAttr>(
              argIndex, getParamAttrHelper().getName()))
        param = ("\"" + paramName.getValue() + "\"").str();
    return op->emitOpError() << "parameter " << param << ": " << name.getValue()
                             << " is a unit attribute";
  }
  return op->emitOpError() << "argument " << argIndex << ": " << name.getValue()
                           << " is not an attribute of function arguments";
}

LogicalResult DistDialect::verifyRegionResultAttribute(Operation *op,
                                                       unsigned regionIndex,
                                                       unsigned resultIndex,
                                                       NamedAttribute attr) {
  return op->emitOpError() << "result " << resultIndex << ": "
                           << attr.getName().getValue()
                           << " is not an attribute of function results";
}
