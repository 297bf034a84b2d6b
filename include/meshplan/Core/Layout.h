//===- Layout.h - How a tensor is laid out on a mesh view -----------------===//
//
// A layout gives, per tensor dim, the ordered *levels* that split it (major
// to minor), the partial ("unreduced") refs with their reduce op, and
// implicitly replicates the tensor over every other ref of its view.
//
// A level is a list of axis refs. It chunks the current chunk once, like
// torch.chunk, by the product of its refs' sizes, and ranks take chunks in
// mixed-radix order over the level's refs. The next level chunks that chunk
// again (nested chunking). So:
//   [{tp, dp}]      two levels: tp chunks the dim, then dp chunks each tp
//                   chunk; how FSDP2 shards a tensor-parallel shard, which
//                   DTensor can only label with _StridedShard;
//   [{(r, s)}]      one level over r*s ranks: torch.chunk over a flattened
//                   group, as DTensor's Shard on a flattened mesh dim and
//                   FSDP2 on a flattened dp mesh do.
// For sizes divisible by every level the two agree; for uneven sizes they do
// not, and the distinction is what keeps offsets right. Trailing ranks may get
// short or empty shards; collectives pad every shard to the padded size, the
// chunk size at the innermost level assuming every outer chunk was full.
//
// Every rank holds exactly one box (offset, sizes).
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

/// The levels splitting one tensor dim, major to minor (see file comment).
using SplitLevels = std::vector<AxisRefList>;

struct Layout {
  std::vector<SplitLevels> dims; ///< one entry per tensor dim
  AxisRefList partial;           ///< pending reduction over these refs
  ReduceOp reduceOp = ReduceOp::Sum;

  int rank() const { return static_cast<int>(dims.size()); }
  /// The refs splitting dim d, all levels concatenated, major to minor.
  AxisRefList dimRefs(int d) const;
  /// All refs used by dims and partial.
  AxisRefList usedRefs() const;
};

/// Product of a level's ref sizes.
inline int64_t levelSize(const AxisRefList &level) { return refsSize(level); }

/// Canonical form: refs within a level canonicalized (adjacent sub-axes
/// merged, size-1 refs dropped) and size-1 levels dropped.
Layout normalizeLayout(const Mesh &mesh, const Layout &layout);

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

/// True when both layouts give every rank the same box of a tensor of this
/// shape, with the same pending reduction. Stronger than equivalentLayouts
/// on *even* dims (size divisible by the product of the dim's refs in both
/// layouts), where nested and flat chunking of the same ordered refs agree.
bool sameShards(const View &view, const Layout &a, const Layout &b,
                const std::vector<int64_t> &shape);

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
/// `partial(sum)={x}`. Each name in braces is one level; `(a, b)` groups
/// refs into one level. Names resolve through the namespace, so a flattened
/// name is one level of its refs; `"dp":(2)2` writes a sub-axis of a root
/// axis. Quotes around names are optional.
Result<Layout> parseLayout(const View &view, const AxisNamespace &ns,
                           std::string_view text);
/// Inverse of parseLayout (with root-axis names; a level of several refs is
/// printed as `(a,b)`).
std::string formatLayout(const Mesh &mesh, const Layout &layout);

/// Checks every dim is >= 0, the rank is <= kMaxTensorRank and the element
/// count is <= kMaxTensorElements (Limits.h).
Result<void> checkShape(const std::vector<int64_t> &shape);

/// Parses "15,5" into a shape (see checkShape).
Result<std::vector<int64_t>> parseShape(std::string_view text);

} // namespace meshplan

#endif // MESHPLAN_CORE_LAYOUT_H
