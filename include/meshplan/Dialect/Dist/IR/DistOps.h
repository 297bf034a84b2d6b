//===- DistOps.h - dist operations ----------------------------------------===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISTOPS_H
#define MESHPLAN_DIALECT_DIST_IR_DISTOPS_H

#include "meshplan/Core/LayoutRules.h"
#include "meshplan/Dialect/Dist/IR/DistAttrs.h"

#include "meshplan/Dialect/Dist/IR/DistInterfaces.h.inc"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "meshplan/Dialect/Dist/IR/DistOps.h.inc"

#endif // MESHPLAN_DIALECT_DIST_IR_DISTOPS_H
