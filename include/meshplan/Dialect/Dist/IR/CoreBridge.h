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

Result<AxisRef> coreAxisRef(const Mesh &mesh, AxisRefAttr attr);
Result<AxisRefList> coreAxisRefs(const Mesh &mesh, mlir::ArrayAttr refs);
Result<Layout> coreLayout(const View &view, LayoutAttr attr);

ReduceOp coreReduceOp(ReduceKind kind);
ReduceKind distReduceKind(ReduceOp op);

AxisRefAttr axisRefAttr(mlir::MLIRContext *ctx, const Mesh &mesh,
                        const AxisRef &ref);
mlir::ArrayAttr axisRefsAttr(mlir::MLIRContext *ctx, const Mesh &mesh,
                             const AxisRefList &refs);
LayoutAttr layoutAttr(mlir::MLIRContext *ctx, mlir::FlatSymbolRefAttr meshName,
                      const Mesh &mesh, const Layout &layout);

} // namespace meshplan::dist

#endif // MESHPLAN_DIALECT_DIST_IR_COREBRIDGE_H
