//===- CoreBridge.cpp - dist IR <-> meshplan core -------------------------===//

#include "meshplan/Dialect/Dist/IR/CoreBridge.h"

#include "llvm/ADT/DenseMap.h"

#include <map>
#include <mutex>
#include <set>
#include <tuple>

using namespace mlir;

namespace meshplan::dist {

class CoreCache {
public:
  std::mutex mutex;
  /// Root views by the dist.mesh attributes that define them.
  llvm::DenseMap<std::tuple<Attribute, Attribute, Attribute, Attribute>,
                 std::shared_ptr<const View>>
      views;
  /// Layouts by (mesh, layout attribute). Each entry keeps its mesh alive,
  /// so a mesh address is never reused while a key names it.
  struct Entry {
    std::shared_ptr<const Mesh> mesh;
    Result<Layout> layout;
  };
  std::map<std::pair<const Mesh *, const void *>, Entry> layouts;
  /// Collective steps that verified (see StepKey).
  std::set<StepKey> steps;
};

std::shared_ptr<CoreCache> makeCoreCache() {
  return std::make_shared<CoreCache>();
}

static CoreCache &cacheOf(MLIRContext *ctx) {
  return ctx->getLoadedDialect<DistDialect>()->getCoreCache();
}

bool isStepVerified(MLIRContext *ctx, const StepKey &key) {
  CoreCache &cache = cacheOf(ctx);
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.steps.count(key) != 0;
}

void setStepVerified(MLIRContext *ctx, const StepKey &key) {
  CoreCache &cache = cacheOf(ctx);
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.steps.insert(key);
}

Result<View> cachedRootView(MeshOp op) {
  CoreCache &cache = cacheOf(op.getContext());
  auto key = std::make_tuple(
      Attribute(op.getAxisNamesAttr()), Attribute(op.getShapeAttr()),
      Attribute(op.getManagedAttr()), Attribute(op.getDeviceOrderAttr()));
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (auto it = cache.views.find(key); it != cache.views.end())
      return *it->second;
  }
  auto mesh = coreMesh(op);
  if (!mesh)
    return mesh.error();
  auto view = std::make_shared<const View>(
      View::root(std::make_shared<const Mesh>(std::move(*mesh))));
  std::lock_guard<std::mutex> lock(cache.mutex);
  return *cache.views.try_emplace(key, view).first->second;
}

Result<Mesh> coreMesh(MeshOp op) {
  std::vector<MeshAxis> axes;
  ArrayRef<int64_t> shape = op.getShape();
  if (op.getAxisNames().size() != shape.size())
    return makeError("mesh lists " + std::to_string(op.getAxisNames().size()) +
                     " axis names but " + std::to_string(shape.size()) +
                     " sizes");
  for (auto [name, size] : llvm::zip(op.getAxisNames(), shape))
    axes.push_back({cast<StringAttr>(name).str(), size, false});
  if (auto managed = op.getManaged()) {
    for (Attribute a : *managed) {
      StringRef name = cast<StringAttr>(a).getValue();
      auto it = llvm::find_if(
          axes, [&](const MeshAxis &m) { return m.name == name; });
      if (it == axes.end()) {
        std::string list;
        for (const MeshAxis &m : axes)
          list += (list.empty() ? "" : ", ") + m.name;
        return makeError("managed axis \"" + name.str() +
                         "\" is not an axis of the mesh (axes: " + list + ")");
      }
      it->managed = true;
    }
  }
  std::optional<std::vector<int64_t>> order;
  if (auto o = op.getDeviceOrder())
    order = std::vector<int64_t>(o->begin(), o->end());
  return Mesh::create(std::move(axes), std::move(order));
}

Result<AxisRef> coreAxisRef(const Mesh &mesh, AxisRefAttr attr) {
  StringRef name = attr.getName().getValue();
  auto axis = mesh.findAxis(name);
  if (!axis)
    return makeError("axis \"" + name.str() + "\" is not in the mesh (axes: " +
                     mesh.axisNameList() + ")");
  if (attr.isWhole())
    return AxisRef{*axis, 1, mesh.axis(*axis).size};
  return makeAxisRef(mesh, *axis, attr.getPre(), attr.getSize());
}

Result<AxisRefList> coreAxisRefs(const Mesh &mesh, ArrayAttr refs) {
  AxisRefList out;
  for (Attribute a : refs) {
    auto ref = coreAxisRef(mesh, cast<AxisRefAttr>(a));
    if (!ref)
      return ref.error();
    out.push_back(*ref);
  }
  return out;
}

ReduceOp coreReduceOp(ReduceKind kind) {
  switch (kind) {
  case ReduceKind::Sum:
    return ReduceOp::Sum;
  case ReduceKind::Avg:
    return ReduceOp::Avg;
  case ReduceKind::Max:
    return ReduceOp::Max;
  case ReduceKind::Min:
    return ReduceOp::Min;
  case ReduceKind::Product:
    return ReduceOp::Product;
  }
  return ReduceOp::Sum;
}

ReduceKind distReduceKind(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return ReduceKind::Sum;
  case ReduceOp::Avg:
    return ReduceKind::Avg;
  case ReduceOp::Max:
    return ReduceKind::Max;
  case ReduceOp::Min:
    return ReduceKind::Min;
  case ReduceOp::Product:
    return ReduceKind::Product;
  }
  return ReduceKind::Sum;
}

static Result<Layout> convertLayout(const View &view, LayoutAttr attr);

Result<Layout> coreLayout(const View &view, LayoutAttr attr) {
  // Only root views are memoized: a layout verified against a sub-view may
  // be rejected there and accepted on the root.
  const Mesh &mesh = view.mesh();
  bool root = static_cast<int>(view.refs().size()) == mesh.numAxes();
  for (const AxisRef &ref : view.refs())
    root &= ref.isWhole(mesh);
  if (!root)
    return convertLayout(view, attr);
  CoreCache &cache = cacheOf(attr.getContext());
  auto key = std::make_pair(&mesh, attr.getAsOpaquePointer());
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (auto it = cache.layouts.find(key); it != cache.layouts.end())
      return it->second.layout;
  }
  Result<Layout> layout = convertLayout(view, attr);
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.layouts.try_emplace(key, CoreCache::Entry{view.meshHandle(), layout});
  return layout;
}

static Result<Layout> convertLayout(const View &view, LayoutAttr attr) {
  const Mesh &mesh = view.mesh();
  Layout layout;
  layout.reduceOp = coreReduceOp(attr.getReduce());
  for (int64_t d = 0; d < attr.getRank(); ++d) {
    SplitLevels levels;
    for (Attribute level : attr.getLevels(d)) {
      auto refs = coreAxisRefs(mesh, cast<ArrayAttr>(level));
      if (!refs)
        return refs.error().within("dim " + std::to_string(d));
      levels.push_back(std::move(*refs));
    }
    layout.dims.push_back(std::move(levels));
  }
  auto partial = coreAxisRefs(mesh, attr.getPartial());
  if (!partial)
    return partial.error().within("partial");
  layout.partial = std::move(*partial);
  auto ok = verifyLayout(view, layout);
  if (!ok)
    return ok.error();
  return layout;
}

AxisRefAttr axisRefAttr(MLIRContext *ctx, const Mesh &mesh,
                        const AxisRef &ref) {
  StringAttr name = StringAttr::get(ctx, mesh.axis(ref.axis).name);
  if (ref.isWhole(mesh))
    return AxisRefAttr::get(ctx, name, 0, 0);
  return AxisRefAttr::get(ctx, name, ref.pre, ref.size);
}

ArrayAttr axisRefsAttr(MLIRContext *ctx, const Mesh &mesh,
                       const AxisRefList &refs) {
  SmallVector<Attribute> out;
  for (const AxisRef &ref : refs)
    out.push_back(axisRefAttr(ctx, mesh, ref));
  return ArrayAttr::get(ctx, out);
}

LayoutAttr layoutAttr(MLIRContext *ctx, FlatSymbolRefAttr meshName,
                      const Mesh &mesh, const Layout &layout) {
  SmallVector<Attribute> dims;
  for (const SplitLevels &levels : layout.dims) {
    SmallVector<Attribute> lv;
    for (const AxisRefList &level : levels)
      lv.push_back(axisRefsAttr(ctx, mesh, level));
    dims.push_back(ArrayAttr::get(ctx, lv));
  }
  return LayoutAttr::get(ctx, meshName, ArrayAttr::get(ctx, dims),
                         axisRefsAttr(ctx, mesh, layout.partial),
                         distReduceKind(layout.reduceOp));
}

} // namespace meshplan::dist
