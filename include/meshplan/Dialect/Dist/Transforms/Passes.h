//===- Passes.h - dist passes ---------------------------------------------===//
#ifndef MESHPLAN_DIALECT_DIST_TRANSFORMS_PASSES_H
#define MESHPLAN_DIALECT_DIST_TRANSFORMS_PASSES_H

#include "meshplan/Dialect/Dist/IR/DistDialect.h"

#include "mlir/Pass/Pass.h"

namespace meshplan::dist {

#define GEN_PASS_DECL
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"

} // namespace meshplan::dist

#endif // MESHPLAN_DIALECT_DIST_TRANSFORMS_PASSES_H
