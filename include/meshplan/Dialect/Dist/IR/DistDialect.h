//===- DistDialect.h - The dist dialect -----------------------------------===//
//
// Includes everything a user of the dist dialect needs: the dialect, its
// attributes and its operations.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISTDIALECT_H
#define MESHPLAN_DIALECT_DIST_IR_DISTDIALECT_H

#include "mlir/IR/Dialect.h"

#include <memory>

namespace meshplan::dist {
class CoreCache;
} // namespace meshplan::dist

// Before the dialect: its generated discardable-attribute accessors
// (DistBase.td) return attribute classes by value.
#include "meshplan/Dialect/Dist/IR/DistAttrs.h"

#include "meshplan/Dialect/Dist/IR/DistDialect.h.inc"

#include "meshplan/Dialect/Dist/IR/DistOps.h"

#endif // MESHPLAN_DIALECT_DIST_IR_DISTDIALECT_H
