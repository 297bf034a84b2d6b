//===- LowerOptimizer.cpp - (being written) -------------------------------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/Transforms/Passes.h"

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTLOWEROPTIMIZER
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

namespace {
struct LowerOptimizerPass
    : meshplan::dist::impl::DistLowerOptimizerBase<LowerOptimizerPass> {
  void runOnOperation() override {
    getOperation().emitError() << "LowerOptimizer: not implemented yet";
    signalPassFailure();
  }
};
} // namespace
