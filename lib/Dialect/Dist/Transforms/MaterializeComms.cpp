//===- MaterializeComms.cpp - one dist.comm per distinct partition --------===//

#include "MeshCache.h"

#include "meshplan/Dialect/Dist/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Debug.h"

namespace meshplan::dist {
#define GEN_PASS_DEF_DISTMATERIALIZECOMMS
#include "meshplan/Dialect/Dist/Transforms/Passes.h.inc"
} // namespace meshplan::dist

// -debug-only=dist-materialize-comms (in builds with LLVM debug output) logs
// what it does.
#define DEBUG_TYPE "dist-materialize-comms"

using namespace mlir;
using namespace meshplan;
using namespace meshplan::dist;

/// "comm_world_dp_replicate_dp_shard", "comm_m_x_2_4" for x:(2)4.
static std::string commName(StringRef mesh, const Mesh &core,
                            const AxisRefList &refs) {
  std::string name = "comm_" + mesh.str();
  for (const AxisRef &ref : refs) {
    name += "_" + core.axis(ref.axis).name;
    if (!ref.isWhole(core))
      name += "_" + std::to_string(ref.pre) + "_" + std::to_string(ref.size);
  }
  return name;
}

namespace {
struct MaterializeCommsPass
    : meshplan::dist::impl::DistMaterializeCommsBase<MaterializeCommsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshCache meshes(module);
    // Partition key (mesh + core's canonical key) -> comm symbol.
    llvm::StringMap<FlatSymbolRefAttr> comms;
    bool failedAny = false;
    module.walk([&](CommOp comm) {
      const View *view = meshes.get(comm, comm.getMeshAttr());
      auto refs = view ? coreAxisRefs(view->mesh(), comm.getAxes())
                       : Result<AxisRefList>(makeError(""));
      if (!refs) {
        failedAny = true;
        return;
      }
      std::string key =
          comm.getMesh().str() + partitionKeyOf(view->mesh(), *refs);
      comms.try_emplace(key, FlatSymbolRefAttr::get(comm.getSymNameAttr()));
    });
    if (failedAny)
      return signalPassFailure();

    module.walk([&](Operation *op) {
      if (!exchangesData(op) || failedAny)
        return;
      LayoutAttr layout = getLayout(op->getOperand(0).getType());
      if (!layout)
        return; // rank-local form: comms were materialized before
      const View *view = meshes.get(op, layout.getMesh());
      auto axes = op->getAttrOfType<ArrayAttr>("axes");
      auto refs = view ? coreAxisRefs(view->mesh(), axes)
                       : Result<AxisRefList>(makeError(""));
      if (!refs) {
        if (view)
          op->emitOpError() << refs.error().message;
        failedAny = true;
        return;
      }
      const Mesh &mesh = view->mesh();
      std::string key =
          layout.getMesh().getValue().str() + partitionKeyOf(mesh, *refs);
      auto [it, inserted] = comms.try_emplace(key);
      if (inserted) {
        AxisRefList canonical = canonicalizeRefs(mesh, *refs);
        OpBuilder b(module.getBodyRegion());
        auto meshOp =
            meshes.symbolTable().lookup<MeshOp>(layout.getMesh().getValue());
        b.setInsertionPointAfter(meshOp);
        auto comm = CommOp::create(
            b, meshOp.getLoc(),
            b.getStringAttr(
                commName(layout.getMesh().getValue(), mesh, canonical)),
            layout.getMesh(), axisRefsAttr(op->getContext(), mesh, canonical),
            /*view=*/nullptr);
        // Renames on a clash with an existing symbol.
        meshes.symbolTable().insert(comm, b.getInsertionPoint());
        LLVM_DEBUG(llvm::dbgs()
                   << "[" DEBUG_TYPE "] new comm @" << comm.getSymName()
                   << " on @" << layout.getMesh().getValue() << " axes "
                   << comm.getAxes() << " (partition " << key << ")\n");
        it->second = FlatSymbolRefAttr::get(comm.getSymNameAttr());
      }
      op->setAttr("comm", it->second);
      LLVM_DEBUG(llvm::dbgs() << "[" DEBUG_TYPE "] " << op->getName() << " at "
                              << op->getLoc() << " -> " << it->second << "\n");
    });
    if (failedAny)
      signalPassFailure();
  }
};
} // namespace
