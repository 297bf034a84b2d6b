//===- DistAttrs.cpp - dist attributes: syntax and structure --------------===//
//
// Attributes check only their structure here; whether the axes exist on the
// mesh is checked by the ops that use them (they can see the dist.mesh).
//
//===----------------------------------------------------------------------===//

#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace meshplan::dist;

#include "meshplan/Dialect/Dist/IR/DistEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "meshplan/Dialect/Dist/IR/DistAttrs.cpp.inc"

namespace meshplan::dist {

void DistDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "meshplan/Dialect/Dist/IR/DistAttrs.cpp.inc"
      >();
}

AxisRefAttr AxisRefAttr::getWhole(MLIRContext *ctx, StringRef name) {
  return AxisRefAttr::get(ctx, StringAttr::get(ctx, name), 0, 0);
}

/// `"dp"` or `"dp":(2)2`.
static ParseResult parseAxisRefBody(AsmParser &parser, AxisRefAttr &ref) {
  std::string name;
  if (parser.parseString(&name))
    return failure();
  int64_t pre = 0, size = 0;
  if (succeeded(parser.parseOptionalColon())) {
    SMLoc loc = parser.getCurrentLocation();
    if (parser.parseLParen() || parser.parseInteger(pre) ||
        parser.parseRParen() || parser.parseInteger(size))
      return failure();
    if (pre < 1 || size < 1)
      return parser.emitError(loc, "sub-axis \"" + name +
                                       "\": pre-size and size must be >= 1");
  }
  ref = AxisRefAttr::get(parser.getContext(),
                         StringAttr::get(parser.getContext(), name), pre, size);
  return success();
}

static void printAxisRefBody(AsmPrinter &printer, AxisRefAttr ref) {
  printer << '"' << ref.getName().getValue() << '"';
  if (!ref.isWhole())
    printer << ":(" << ref.getPre() << ")" << ref.getSize();
}

Attribute AxisRefAttr::parse(AsmParser &parser, Type) {
  AxisRefAttr ref;
  if (parser.parseLess() || parseAxisRefBody(parser, ref) ||
      parser.parseGreater())
    return {};
  return ref;
}

void AxisRefAttr::print(AsmPrinter &printer) const {
  printer << '<';
  printAxisRefBody(printer, *this);
  printer << '>';
}

ParseResult parseAxisList(AsmParser &parser, ArrayAttr &axes) {
  SmallVector<Attribute> refs;
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Braces, [&] {
        AxisRefAttr ref;
        if (parseAxisRefBody(parser, ref))
          return failure();
        refs.push_back(ref);
        return success();
      }))
    return failure();
  axes = ArrayAttr::get(parser.getContext(), refs);
  return success();
}

void printAxisList(AsmPrinter &printer, ArrayAttr axes) {
  printer << '{';
  llvm::interleaveComma(axes, printer, [&](Attribute a) {
    printAxisRefBody(printer, cast<AxisRefAttr>(a));
  });
  printer << '}';
}

LayoutAttr getLayout(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  return tensor ? dyn_cast_or_null<LayoutAttr>(tensor.getEncoding())
                : LayoutAttr();
}

//===----------------------------------------------------------------------===//
// #dist.layout<@mesh, [{"tp", ("r", "s")}, {}], partial(sum) = {"x"}>
//===----------------------------------------------------------------------===//

Attribute LayoutAttr::parse(AsmParser &parser, Type) {
  MLIRContext *ctx = parser.getContext();
  FlatSymbolRefAttr mesh;
  SMLoc start = parser.getCurrentLocation();
  if (parser.parseLess() || parser.parseAttribute(mesh) || parser.parseComma())
    return {};
  SmallVector<Attribute> dims;
  auto parseLevel = [&](SmallVectorImpl<Attribute> &levels) -> ParseResult {
    SmallVector<Attribute> refs;
    if (succeeded(parser.parseOptionalLParen())) {
      if (parser.parseCommaSeparatedList([&] {
            AxisRefAttr ref;
            if (parseAxisRefBody(parser, ref))
              return failure();
            refs.push_back(ref);
            return success();
          }) ||
          parser.parseRParen())
        return failure();
    } else {
      AxisRefAttr ref;
      if (parseAxisRefBody(parser, ref))
        return failure();
      refs.push_back(ref);
    }
    levels.push_back(ArrayAttr::get(ctx, refs));
    return success();
  };
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&] {
        SmallVector<Attribute> levels;
        if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Braces,
                                           [&] { return parseLevel(levels); }))
          return failure();
        dims.push_back(ArrayAttr::get(ctx, levels));
        return success();
      }))
    return {};
  ArrayAttr partial = ArrayAttr::get(ctx, {});
  ReduceKind reduce = ReduceKind::Sum;
  if (succeeded(parser.parseOptionalComma())) {
    std::string opName;
    if (parser.parseKeyword("partial") || parser.parseLParen() ||
        parser.parseKeywordOrString(&opName) || parser.parseRParen())
      return {};
    auto kind = symbolizeReduceKind(opName);
    if (!kind) {
      parser.emitError(parser.getCurrentLocation(),
                       "unknown reduce op \"" + opName +
                           "\"; expected one of sum, avg, max, min, product");
      return {};
    }
    reduce = *kind;
    if (parser.parseEqual() || parseAxisList(parser, partial))
      return {};
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<LayoutAttr>(
      start, ctx, mesh, ArrayAttr::get(ctx, dims), partial, reduce);
}

void LayoutAttr::print(AsmPrinter &printer) const {
  printer << '<' << getMesh() << ", [";
  llvm::interleaveComma(getDims(), printer, [&](Attribute dim) {
    printer << '{';
    llvm::interleaveComma(cast<ArrayAttr>(dim), printer, [&](Attribute lvl) {
      auto level = cast<ArrayAttr>(lvl);
      if (level.size() == 1) {
        printAxisRefBody(printer, cast<AxisRefAttr>(level[0]));
        return;
      }
      printer << '(';
      llvm::interleaveComma(level, printer, [&](Attribute r) {
        printAxisRefBody(printer, cast<AxisRefAttr>(r));
      });
      printer << ')';
    });
    printer << '}';
  });
  printer << ']';
  if (!getPartial().empty()) {
    printer << ", partial(" << stringifyReduceKind(getReduce()) << ") = ";
    printAxisList(printer, getPartial());
  }
  printer << '>';
}

LogicalResult LayoutAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 FlatSymbolRefAttr mesh, ArrayAttr dims,
                                 ArrayAttr partial, ReduceKind) {
  if (!mesh)
    return emitError() << "layout needs a mesh symbol";
  for (auto [d, dim] : llvm::enumerate(dims)) {
    auto levels = dyn_cast<ArrayAttr>(dim);
    if (!levels)
      return emitError() << "layout dim " << d << " is not a list of levels";
    for (Attribute level : levels) {
      auto refs = dyn_cast<ArrayAttr>(level);
      if (!refs || refs.empty() ||
          !llvm::all_of(refs, [](Attribute a) { return isa<AxisRefAttr>(a); }))
        return emitError() << "layout dim " << d
                           << " has a level that is not a non-empty list of "
                              "axis refs";
    }
  }
  if (!llvm::all_of(partial, [](Attribute a) { return isa<AxisRefAttr>(a); }))
    return emitError() << "layout partial axes must be axis refs";
  return success();
}

} // namespace meshplan::dist
