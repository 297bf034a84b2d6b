//===- DistAttrs.h - dist attributes --------------------------------------===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISTATTRS_H
#define MESHPLAN_DIALECT_DIST_IR_DISTATTRS_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpImplementation.h"

#include "meshplan/Dialect/Dist/IR/DistEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "meshplan/Dialect/Dist/IR/DistAttrs.h.inc"

namespace meshplan::dist {

/// `{"tp", "dp":(2)2}`: the axis-list syntax shared by layouts and ops.
mlir::ParseResult parseAxisList(mlir::AsmParser &parser, mlir::ArrayAttr &axes);
void printAxisList(mlir::AsmPrinter &printer, mlir::ArrayAttr axes);

/// The layout encoding of a ranked tensor type, or null.
LayoutAttr getLayout(mlir::Type type);

} // namespace meshplan::dist

#endif // MESHPLAN_DIALECT_DIST_IR_DISTATTRS_H
