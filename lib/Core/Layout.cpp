//===- Layout.cpp - Layouts and per-rank shard boxes ----------------------===//

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Text.h"

#include <algorithm>

namespace meshplan {

std::string_view reduceOpName(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return "sum";
  case ReduceOp::Avg:
    return "avg";
  case ReduceOp::Max:
    return "max";
  case ReduceOp::Min:
    return "min";
  case ReduceOp::Product:
    return "product";
  }
  return "sum";
}

Result<ReduceOp> parseReduceOp(std::string_view text) {
  std::string t(unquote(trim(text)));
  if (t == "sum" || t == "SUM")
    return ReduceOp::Sum;
  if (t == "avg" || t == "AVG" || t == "mean")
    return ReduceOp::Avg;
  if (t == "max" || t == "MAX")
    return ReduceOp::Max;
  if (t == "min" || t == "MIN")
    return ReduceOp::Min;
  if (t == "product" || t == "PRODUCT" || t == "prod")
    return ReduceOp::Product;
  return makeError("unknown reduce op \"" + t +
                   "\"; expected one of sum, avg, max, min, product");
}

AxisRefList Layout::dimRefs(int d) const {
  AxisRefList refs;
  for (const AxisRefList &level : dims[d])
    refs.insert(refs.end(), level.begin(), level.end());
  return refs;
}

AxisRefList Layout::usedRefs() const {
  AxisRefList all;
  for (int d = 0; d < rank(); ++d) {
    AxisRefList refs = dimRefs(d);
    all.insert(all.end(), refs.begin(), refs.end());
  }
  all.insert(all.end(), partial.begin(), partial.end());
  return all;
}

Layout normalizeLayout(const Mesh &mesh, const Layout &layout) {
  Layout out;
  out.reduceOp = layout.reduceOp;
  for (const SplitLevels &levels : layout.dims) {
    SplitLevels normalized;
    for (const AxisRefList &level : levels) {
      AxisRefList refs = canonicalizeRefs(mesh, level);
      if (!refs.empty())
        normalized.push_back(std::move(refs));
    }
    out.dims.push_back(std::move(normalized));
  }
  out.partial = canonicalizeRefs(mesh, layout.partial);
  return out;
}

Layout replicatedLayout(int tensorRank) {
  Layout layout;
  layout.dims.resize(tensorRank);
  return layout;
}

Result<void> verifyLayout(const View &view, const Layout &layout) {
  const Mesh &mesh = view.mesh();
  AxisRefList viewRefs = view.refs();
  AxisRefList used = layout.usedRefs();
  for (const AxisRef &ref : used)
    if (!refsCover(mesh, viewRefs, {ref}))
      return makeError("axis \"" + formatAxisRef(mesh, ref) +
                       "\" is not in the view (axes: " + view.axisNameList() +
                       ")");
  auto disjoint = checkRefsCompatible(mesh, used, "layout");
  if (!disjoint)
    return disjoint;
  AxisRefList all = viewRefs;
  all.insert(all.end(), used.begin(), used.end());
  auto nest = checkRefsNest(mesh, all, "layout and view");
  if (!nest)
    return nest;
  for (int d = 0; d < layout.rank(); ++d)
    for (const AxisRef &ref : layout.dimRefs(d))
      if (ref.size > 1 && mesh.axis(ref.axis).managed)
        return makeError("managed axis \"" + mesh.axis(ref.axis).name +
                         "\" cannot split tensor dim " + std::to_string(d) +
                         ": its live size is known only at run time (use it "
                         "as a replicate or partial axis)");
  return {};
}

AxisRefList replicatedRefs(const View &view, const Layout &layout) {
  const Mesh &mesh = view.mesh();
  AxisRefList universe = view.refs();
  AxisRefList used = layout.usedRefs();
  universe.insert(universe.end(), used.begin(), used.end());
  AxisRefList viewFactors = splitIntoFactors(mesh, view.refs(), universe);
  AxisRefList usedFactors = splitIntoFactors(mesh, used, universe);
  AxisRefList out;
  for (const AxisRef &f : viewFactors)
    if (std::find(usedFactors.begin(), usedFactors.end(), f) ==
        usedFactors.end())
      out.push_back(f);
  return canonicalizeRefs(mesh, out);
}

bool equivalentLayouts(const View &view, const Layout &a, const Layout &b) {
  if (a.dims.size() != b.dims.size())
    return false;
  const Mesh &mesh = view.mesh();
  AxisRefList universe = view.refs();
  for (const Layout *l : {&a, &b}) {
    AxisRefList used = l->usedRefs();
    universe.insert(universe.end(), used.begin(), used.end());
  }
  // Levels compare on factors: splitting a ref inside a level keeps the
  // level's mixed radix, but splitting a level into two changes the chunks.
  auto factorLevels = [&](const SplitLevels &levels) {
    std::vector<AxisRefList> out;
    for (const AxisRefList &level : levels) {
      AxisRefList factors = splitIntoFactors(mesh, level, universe);
      if (!factors.empty())
        out.push_back(std::move(factors));
    }
    return out;
  };
  for (size_t d = 0; d < a.dims.size(); ++d)
    if (factorLevels(a.dims[d]) != factorLevels(b.dims[d]))
      return false;
  AxisRefList pa = splitIntoFactors(mesh, a.partial, universe);
  AxisRefList pb = splitIntoFactors(mesh, b.partial, universe);
  std::sort(pa.begin(), pa.end());
  std::sort(pb.begin(), pb.end());
  if (pa != pb)
    return false;
  return pa.empty() || a.reduceOp == b.reduceOp;
}

bool sameShards(const View &view, const Layout &a, const Layout &b,
                const std::vector<int64_t> &shape) {
  if (a.dims.size() != shape.size() || b.dims.size() != shape.size())
    return false;
  Layout fa = a, fb = b;
  for (size_t d = 0; d < shape.size(); ++d) {
    int dim = static_cast<int>(d);
    int64_t n = shape[d];
    AxisRefList ra = a.dimRefs(dim), rb = b.dimRefs(dim);
    if (n % refsSize(ra) == 0 && n % refsSize(rb) == 0) {
      // Even: only the ordered factors matter.
      fa.dims[d] = {ra};
      fb.dims[d] = {rb};
    }
  }
  return equivalentLayouts(view, fa, fb);
}

namespace {
/// Nested torch.chunk, one level at a time: the one implementation behind
/// chunkNested and shardOf.
struct NestedChunk {
  int64_t n, length, offset = 0, padded;
  explicit NestedChunk(int64_t n) : n(n), length(n), padded(n) {}
  void level(int64_t k, int64_t coord) {
    int64_t chunk = (length + k - 1) / k;
    int64_t start = std::min(coord * chunk, length);
    offset += start;
    length = std::min(chunk, length - start);
    padded = (padded + k - 1) / k;
  }
  // torch reports an empty shard at the end of the dim.
  DimShard result() const { return {length == 0 ? n : offset, length, padded}; }
};
} // namespace

DimShard chunkNested(int64_t n, const std::vector<int64_t> &sizes,
                     const std::vector<int64_t> &coords) {
  NestedChunk chunk(n);
  for (size_t i = 0; i < sizes.size(); ++i)
    chunk.level(sizes[i], coords[i]);
  return chunk.result();
}

bool ShardBox::empty() const {
  return std::any_of(localShape.begin(), localShape.end(),
                     [](int64_t s) { return s == 0; });
}

int64_t ShardBox::numElements() const {
  int64_t n = 1;
  for (int64_t s : localShape)
    n *= s;
  return n;
}

Result<ShardBox> shardOf(const View &view, const Layout &layout,
                         const std::vector<int64_t> &globalShape,
                         int64_t rank) {
  if (globalShape.size() != layout.dims.size())
    return makeError("layout has " + std::to_string(layout.dims.size()) +
                     " dims but the tensor shape has " +
                     std::to_string(globalShape.size()));
  auto shapeOk = checkShape(globalShape);
  if (!shapeOk)
    return shapeOk.error();
  const Mesh &mesh = view.mesh();
  auto position = mesh.positionOf(rank);
  if (!position)
    return position.error();
  size_t numDims = globalShape.size();
  ShardBox box;
  box.offset.resize(numDims);
  box.localShape.resize(numDims);
  box.paddedShape.resize(numDims);
  for (size_t d = 0; d < numDims; ++d) {
    NestedChunk chunk(globalShape[d]);
    for (const AxisRefList &level : layout.dims[d]) {
      int64_t coord = 0, size = 1;
      for (const AxisRef &ref : level) {
        coord = coord * ref.size + ref.coordinateAt(mesh, *position);
        size *= ref.size;
      }
      chunk.level(size, coord);
    }
    DimShard s = chunk.result();
    box.offset[d] = s.offset;
    box.localShape[d] = s.size;
    box.paddedShape[d] = s.padded;
  }
  return box;
}

std::vector<int64_t> paddedShapeOf(const Layout &layout,
                                   const std::vector<int64_t> &globalShape) {
  std::vector<int64_t> padded;
  for (size_t d = 0; d < globalShape.size(); ++d) {
    int64_t p = globalShape[d];
    for (const AxisRefList &level : layout.dims[d])
      p = (p + levelSize(level) - 1) / levelSize(level);
    padded.push_back(p);
  }
  return padded;
}

/// Resolves one name of a layout: `"dp":(2)2` (a sub-axis of a root axis) or
/// any namespace name (a root axis, or a flattened name, which expands).
static Result<AxisRefList> resolveLayoutName(const View &view,
                                             const AxisNamespace &ns,
                                             std::string_view text) {
  const Mesh &mesh = view.mesh();
  text = trim(text);
  size_t colon = text.find(":(");
  if (colon != std::string_view::npos) {
    std::string name(unquote(trim(text.substr(0, colon))));
    std::string_view rest = text.substr(colon + 2);
    size_t close = rest.find(')');
    auto axis = mesh.findAxis(name);
    if (!axis)
      return makeError("sub-axis \"" + std::string(text) + "\": \"" + name +
                       "\" is not a mesh axis (axes: " + mesh.axisNameList() +
                       ")");
    auto pre = close == std::string_view::npos
                   ? std::nullopt
                   : parseInt(trim(rest.substr(0, close)));
    auto size = close == std::string_view::npos
                    ? std::nullopt
                    : parseInt(trim(rest.substr(close + 1)));
    if (!pre || !size)
      return makeError("sub-axis \"" + std::string(text) +
                       "\" is not name:(pre)size");
    auto ref = makeAxisRef(mesh, *axis, *pre, *size);
    if (!ref)
      return ref.error();
    return AxisRefList{*ref};
  }
  std::string name(unquote(text));
  if (name.empty())
    return makeError("empty axis name");
  const AxisRefList *refs = ns.lookup(name);
  if (auto index = view.findAxis(name))
    return view.axes()[*index].refs;
  if (!refs)
    return makeError("axis \"" + name + "\" is not in the view (axes: " +
                     view.axisNameList() + ")");
  return *refs;
}

/// Parses `{tp, (r, s), dp}`: one level per item; `(...)` groups refs into
/// one level.
static Result<SplitLevels> parseBraceList(const View &view,
                                          const AxisNamespace &ns,
                                          std::string_view text) {
  text = trim(text);
  if (text.size() < 2 || text.front() != '{' || text.back() != '}')
    return makeError("\"" + std::string(text) +
                     "\" is not a braced axis list such as {tp, dp}");
  std::string_view inner = trim(text.substr(1, text.size() - 2));
  SplitLevels levels;
  if (inner.empty())
    return levels;
  for (std::string_view item : splitTopLevel(inner, ',')) {
    item = trim(item);
    std::vector<std::string_view> names{item};
    if (!item.empty() && item.front() == '(') {
      if (item.back() != ')')
        return makeError("level \"" + std::string(item) +
                         "\" has no closing ')'");
      names = splitTopLevel(item.substr(1, item.size() - 2), ',');
    }
    AxisRefList level;
    for (std::string_view name : names) {
      auto resolved = resolveLayoutName(view, ns, name);
      if (!resolved)
        return resolved.error();
      level.insert(level.end(), resolved->begin(), resolved->end());
    }
    levels.push_back(std::move(level));
  }
  return levels;
}

Result<Layout> parseLayout(const View &view, const AxisNamespace &ns,
                           std::string_view text) {
  text = trim(text);
  if (text.empty() || text.front() != '[')
    return makeError("layout \"" + std::string(text) +
                     "\" must start with '[' as in [{tp, dp}, {}]");
  size_t close = std::string_view::npos;
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[' || text[i] == '{' || text[i] == '(')
      ++depth;
    if (text[i] == ']' || text[i] == '}' || text[i] == ')')
      if (--depth == 0) {
        close = i;
        break;
      }
  }
  if (close == std::string_view::npos || text[close] != ']')
    return makeError("layout \"" + std::string(text) + "\" has no closing ']'");
  Layout layout;
  std::string_view dimsText = trim(text.substr(1, close - 1));
  if (!dimsText.empty()) {
    int d = 0;
    for (std::string_view dim : splitTopLevel(dimsText, ',')) {
      auto refs = parseBraceList(view, ns, dim);
      if (!refs)
        return refs.error().within("layout dim " + std::to_string(d));
      layout.dims.push_back(std::move(*refs));
      ++d;
    }
  }
  std::string_view rest = trim(text.substr(close + 1));
  if (!rest.empty() && rest.front() == ',')
    rest = trim(rest.substr(1));
  if (!rest.empty()) {
    if (rest.substr(0, 7) != "partial")
      return makeError("unexpected \"" + std::string(rest) +
                       "\" after the layout's dims; expected "
                       "partial(op)={axes}");
    rest = trim(rest.substr(7));
    if (!rest.empty() && rest.front() == '(') {
      size_t end = rest.find(')');
      if (end == std::string_view::npos)
        return makeError("partial(op: missing ')'");
      auto op = parseReduceOp(rest.substr(1, end - 1));
      if (!op)
        return op.error();
      layout.reduceOp = *op;
      rest = trim(rest.substr(end + 1));
    }
    if (rest.empty() || rest.front() != '=')
      return makeError("expected '=' after partial, as in partial(sum)={dp}");
    auto levels = parseBraceList(view, ns, rest.substr(1));
    if (!levels)
      return levels.error().within("layout partial axes");
    for (const AxisRefList &level : *levels)
      layout.partial.insert(layout.partial.end(), level.begin(), level.end());
  }
  auto ok = verifyLayout(view, layout);
  if (!ok)
    return ok.error();
  return normalizeLayout(view.mesh(), layout);
}

std::string formatLayout(const Mesh &mesh, const Layout &layout) {
  std::string out = "[";
  for (size_t d = 0; d < layout.dims.size(); ++d) {
    if (d)
      out += ", ";
    out += "{";
    for (size_t l = 0; l < layout.dims[d].size(); ++l) {
      const AxisRefList &level = layout.dims[d][l];
      if (l)
        out += ",";
      out += level.size() == 1 ? formatAxisRef(mesh, level[0])
                               : "(" + formatAxisRefs(mesh, level) + ")";
    }
    out += "}";
  }
  out += "]";
  if (!layout.partial.empty())
    out += " partial(" + std::string(reduceOpName(layout.reduceOp)) + ")={" +
           formatAxisRefs(mesh, layout.partial) + "}";
  return out;
}

Result<void> checkShape(const std::vector<int64_t> &shape) {
  if (static_cast<int64_t>(shape.size()) > kMaxTensorRank)
    return makeError("shape has " + std::to_string(shape.size()) +
                     " dims; tensors have at most " +
                     std::to_string(kMaxTensorRank) + " (docs/limits.md)");
  int64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      return makeError("shape dim " + std::to_string(i) + " is " +
                       std::to_string(shape[i]) + "; sizes must be >= 0");
    if (shape[i] > kMaxTensorElements ||
        (shape[i] > 0 && elements > kMaxTensorElements / shape[i]))
      return makeError("shape dim " + std::to_string(i) + " (" +
                       std::to_string(shape[i]) +
                       ") makes the tensor larger than " +
                       kMaxTensorElementsText + " elements (docs/limits.md)");
    elements *= shape[i] > 0 ? shape[i] : 1;
  }
  return {};
}

Result<std::vector<int64_t>> parseShape(std::string_view text) {
  auto dims = parseIntList(text, "shape");
  if (!dims)
    return dims.error();
  auto ok = checkShape(*dims);
  if (!ok)
    return ok.error();
  return dims;
}

} // namespace meshplan
