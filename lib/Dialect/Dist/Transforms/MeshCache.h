//===- MeshCache.h - core views of a module's dist.mesh symbols -----------===//
//
// Passes convert each dist.mesh to a core view once and reuse it for every
// op that refers to it. Also declares the helpers passes share.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_LIB_DIALECT_DIST_TRANSFORMS_MESHCACHE_H
#define MESHPLAN_LIB_DIALECT_DIST_TRANSFORMS_MESHCACHE_H

#include "meshplan/Dialect/Dist/IR/CoreBridge.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"

#include <memory>

namespace meshplan::dist {

class MeshCache {
public:
  explicit MeshCache(mlir::ModuleOp module) : symbols(module) {}

  /// The core view of the mesh `name`, or null after emitting an error at
  /// `user`.
  const View *get(mlir::Operation *user, mlir::FlatSymbolRefAttr name) {
    auto it = views.find(name.getAttr());
    if (it != views.end())
      return it->second.get();
    auto mesh = symbols.lookup<MeshOp>(name.getValue());
    if (!mesh) {
      user->emitOpError() << "refers to " << name
                          << ", which is not a dist.mesh";
      return nullptr;
    }
    auto root = cachedRootView(mesh);
    if (!root) {
      mesh.emitOpError() << root.error().message;
      return nullptr;
    }
    auto view = std::make_unique<View>(std::move(*root));
    return (views[name.getAttr()] = std::move(view)).get();
  }

  mlir::SymbolTable &symbolTable() { return symbols; }

private:
  mlir::SymbolTable symbols;
  llvm::DenseMap<mlir::StringAttr, std::unique_ptr<View>> views;
};

/// Replaces `op` by the collectives core's planner chooses (see
/// dist-lower-redistribute) and returns the value that replaces its result
/// (the op itself when it only relabels the same shards). Used by the passes
/// that create redistributions after dist-lower-redistribute has run.
mlir::FailureOr<mlir::Value> lowerRedistribute(RedistributeOp op,
                                               MeshCache &meshes);

} // namespace meshplan::dist

#endif // MESHPLAN_LIB_DIALECT_DIST_TRANSFORMS_MESHCACHE_H
