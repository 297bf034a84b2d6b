//===- Schedule.cpp - (being written) -------------------------------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/Transforms/Passes.h"

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTSCHEDULE
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

namespace {
struct SchedulePass : meshplan::dist::impl::DistScheduleBase<SchedulePass> {
  void runOnOperation() override {
    getOperation().emitError() << "Schedule: not implemented yet";
    signalPassFailure();
  }
};
} // namespace
