//===- Layout.h - How a tensor is laid out on a mesh view -----------------===//
//
// A layout gives, per tensor dim, the ordered list of axis refs that split it
// (major to minor), the partial ("unreduced") refs with their reduce op, and
// implicitly replicates the tensor over every other ref of its view. Splits
// follow torch.chunk, nested: the first ref chunks the dim into ceil-sized
// chunks, the next ref chunks that chunk, and so on. Trailing ranks may get
// short or empty shards; collectives pad every shard to the padded size, the
// chunk size at the innermost level assuming every outer chunk was full.
//
// Nested chunking gives every rank exactly one box (offset, sizes). It is how
// FSDP2 shards a tensor-parallel shard (dim 0 split by [tp, dp]), which DTensor
// can only label with _StridedShard.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_LAYOUT_H
#define MESHPLAN_CORE_LAYOUT_H

#include "meshplan/Core/MeshView.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan {

enum class ReduceOp { Sum, Avg, Max, Min, Product };
std::string_view reduceOpName(ReduceOp op);
Result<ReduceOp> parseReduceOp(std::string_view text);

struct Layout {
  std::vector<AxisRefList> dims; ///< one list per tensor dim, major to minor
  AxisRefList partial;           ///< pending reduction over these refs
  ReduceOp reduceOp = ReduceOp::Sum;

  int rank() const { return static_cast<int>(dims.size()); }
  /// All refs used by dims and partial.
  AxisRefList usedRefs() const;
};

/// Fully replicated layout of a tensor of the given rank.
Layout replicatedLayout(int tensorRank);

/// Checks every ref lies in the view, no ref is used twice (or overlaps
/// another), and all refs are compatible with the view's.
Result<void> verifyLayout(const View &view, const Layout &layout);

/// View refs the layout neither splits nor leaves partial.
AxisRefList replicatedRefs(const View &view, const Layout &layout);

/// True when both layouts place the same data on every rank with the same
/// pending reduction (compared on the finest common factors).
bool equivalentLayouts(const View &view, const Layout &a, const Layout &b);

/// One dim of one rank's shard.
struct DimShard {
  int64_t offset = 0; ///< global offset; the dim size when the shard is empty
  int64_t size = 0;   ///< local (unpadded) size
  int64_t padded = 0; ///< size every rank pads to for collectives
};

/// Nested torch.chunk of a dim of size n: level i splits by sizes[i] and the
/// rank holds chunk coords[i]. Pure arithmetic, O(levels).
DimShard chunkNested(int64_t n, const std::vector<int64_t> &sizes,
                     const std::vector<int64_t> &coords);

struct ShardBox {
  std::vector<int64_t> offset;
  std::vector<int64_t> localShape;
  std::vector<int64_t> paddedShape;
  bool empty() const;
  int64_t numElements() const;
};

/// The box `rank` holds. O(number of refs).
Result<ShardBox> shardOf(const View &view, const Layout &layout,
                         const std::vector<int64_t> &globalShape, int64_t rank);
/// Padded local shape (the same on every rank).
std::vector<int64_t> paddedShapeOf(const Layout &layout,
                                   const std::vector<int64_t> &globalShape);

/// Parses Shardy-like text: `[{tp, dp}, {}]`, optionally followed by
/// `partial(sum)={x}`. Names resolve through the namespace (so a flattened
/// name expands to its refs); `"dp":(2)2` writes a sub-axis of a root axis.
/// Quotes around names are optional.
Result<Layout> parseLayout(const View &view, const AxisNamespace &ns,
                           std::string_view text);
/// Inverse of parseLayout (with root-axis names).
std::string formatLayout(const Mesh &mesh, const Layout &layout);

/// Parses "15,5" into a shape; each dim >= 0.
Result<std::vector<int64_t>> parseShape(std::string_view text);

} // namespace meshplan

#endif // MESHPLAN_CORE_LAYOUT_H
