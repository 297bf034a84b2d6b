//===- CoreBridge.h - dist IR <-> meshplan core ---------------------------===//
//
// The dialect owns no semantics: it converts its attributes to core's types
// here and asks core. Errors come back as core Errors whose messages name
// what the IR says ("axis \"fsdp\" is not in the view (axes: ddp, tp)").
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_DIALECT_DIST_IR_COREBRIDGE_H
#define MESHPLAN_DIALECT_DIST_IR_COREBRIDGE_H

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Redistribute.h"
#include "meshplan/Dialect/Dist/IR/DistDialect.h"

namespace meshplan::dist {

/// The core mesh a dist.mesh describes (validated by core).
Result<Mesh> coreMesh(MeshOp op);
/// The root view of a dist.mesh, built once per distinct mesh (its axis,
/// size, managed and order attributes) per context: verifiers and passes
/// ask for it for every op.
Result<View> cachedRootView(MeshOp op);

Result<AxisRef> coreAxisRef(const Mesh &mesh, AxisRefAttr attr);
Result<AxisRefList> coreAxisRefs(const Mesh &mesh, mlir::ArrayAttr refs);
/// A layout attribute as a core layout, verified against `view`. Converted
/// once per (mesh, attribute) for root views: attributes are uniqued, so a
/// step of 20,000 ops has a few dozen distinct layouts.
Result<Layout> coreLayout(const View &view, LayoutAttr attr);

ReduceOp coreReduceOp(ReduceKind kind);
ReduceKind distReduceKind(ReduceOp op);

AxisRefAttr axisRefAttr(mlir::MLIRContext *ctx, const Mesh &mesh,
                        const AxisRef &ref);
mlir::ArrayAttr axisRefsAttr(mlir::MLIRContext *ctx, const Mesh &mesh,
                             const AxisRefList &refs);
LayoutAttr layoutAttr(mlir::MLIRContext *ctx, mlir::FlatSymbolRefAttr meshName,
                      const Mesh &mesh, const Layout &layout);

/// The per-context memo behind cachedRootView and coreLayout, owned by the
/// dist dialect. Thread-safe (MLIR may verify ops in parallel).
class CoreCache;
std::shared_ptr<CoreCache> makeCoreCache();

/// A collective's step as the verifier checks it with core's applyStep:
/// (mesh, kind, dim, dst dim, reduce op, axes, dst axes, operand type,
/// result type); the mesh is cachedRootView's (one per distinct mesh, so two
/// meshes spelled @m in one context differ), attributes and types are their
/// uniqued pointers. Steps that checked
/// out are remembered per context: a step's collectives repeat one shape per
/// parameter kind.
using StepKey =
    std::tuple<const void *, int, int64_t, int64_t, int, const void *,
               const void *, const void *, const void *>;
bool isStepVerified(mlir::MLIRContext *ctx, const StepKey &key);
void setStepVerified(mlir::MLIRContext *ctx, const StepKey &key);

} // namespace meshplan::dist

#endif // MESHPLAN_DIALECT_DIST_IR_COREBRIDGE_H
