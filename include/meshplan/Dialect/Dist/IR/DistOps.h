//===- DistOps.h - dist operations ----------------------------------------===//
#ifndef MESHPLAN_DIALECT_DIST_IR_DISTOPS_H
#define MESHPLAN_DIALECT_DIST_IR_DISTOPS_H

#include "meshplan/Core/LayoutRules.h"
#include "meshplan/Core/PipelineSchedule.h"
#include "meshplan/Dialect/Dist/IR/DistAttrs.h"

#include "meshplan/Dialect/Dist/IR/DistInterfaces.h.inc"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "meshplan/Dialect/Dist/IR/DistOps.h.inc"

namespace meshplan::dist {
/// Collectives that exchange data between ranks and so run on a
/// communicator: all_gather, reduce_scatter, all_reduce, all_to_all,
/// permute, broadcast. (local_slice and mark_partial run on each rank
/// alone.)
bool exchangesData(mlir::Operation *op);
} // namespace meshplan::dist

#endif // MESHPLAN_DIALECT_DIST_IR_DISTOPS_H
