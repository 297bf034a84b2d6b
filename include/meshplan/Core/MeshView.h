//===- MeshView.h - Views of a mesh: slice, flatten, unflatten ------------===//
//
// A view is an ordered list of named view axes, each an ordered list of root
// axis refs (major to minor). Slicing picks view axes, flattening merges
// several into one, unflattening cuts one into sub-axes; all are list
// operations over the *root* mesh, so a submesh of a submesh, a flatten of a
// submesh or a slice of a flattened axis are as easy as the first level, and
// no view keeps bookkeeping about a parent (the bug behind torchtitan's
// managed-mesh flatten crash).
//
// Like a torch DeviceMesh, a view partitions the root mesh into blocks (ranks
// that agree on every root factor outside the view); each rank sees the block
// that contains it. Groups, local ranks and communicator split keys are all
// computed from strides in O(number of axes) per query (plus the group size
// when listing a group's members).
//
// Names live in an AxisNamespace shared by all views of one root mesh, as
// torch registers flattened names on the root: flattening the same axes twice
// under one name yields the same view; reusing a name for different axes, or a
// root axis name for anything but that axis, is an error.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_MESHVIEW_H
#define MESHPLAN_CORE_MESHVIEW_H

#include "meshplan/Core/AxisRef.h"

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshplan {

struct ViewAxis {
  std::string name;
  AxisRefList refs; ///< major to minor
  int64_t size() const { return refsSize(refs); }
};

/// Live coordinates of managed axes, supplied at run time (e.g. by a fault
/// tolerance manager). Axes not listed are fully live.
class LiveMembers {
public:
  /// `coords` must be distinct and within the axis; the axis must be managed.
  Result<void> set(const Mesh &mesh, int axis, std::vector<int64_t> coords);
  const std::vector<int64_t> *find(int axis) const;
  bool empty() const { return live.empty(); }
  /// Error naming the first dead coordinate of a mesh position, if any.
  Result<void> checkLive(const Mesh &mesh, int64_t position) const;

private:
  std::map<int, std::vector<int64_t>> live; // sorted coordinates
};

/// A communicator split key: members of one group share `color`; `key` is
/// the member's index in the group's rank order.
struct SplitKey {
  int64_t color = 0;
  int64_t key = 0;
};

//===----------------------------------------------------------------------===//
// Group arithmetic over an ordered ref list: the primitive every view, layout
// and collective uses.
//===----------------------------------------------------------------------===//

/// Index of `rank` in its group over `refs` (mixed radix of its digits).
Result<int64_t> groupIndexOf(const Mesh &mesh, const AxisRefList &refs,
                             int64_t rank, const LiveMembers *live = nullptr);
/// Ordered ranks of the group over `refs` that contains `rank`. With live
/// members, dead coordinates of managed axes are skipped, and a dead rank
/// (one whose coordinate on some managed axis is not live) has no group.
/// Groups of more than kMaxGroupMembers are refused before allocating.
Result<std::vector<int64_t>> groupOf(const Mesh &mesh, const AxisRefList &refs,
                                     int64_t rank,
                                     const LiveMembers *live = nullptr);
/// Number of members of each group over `refs`.
int64_t groupSizeOf(const Mesh &mesh, const AxisRefList &refs,
                    const LiveMembers *live = nullptr);
/// (color, key) for splitting a communicator into the groups over `refs`.
Result<SplitKey> splitKeyOf(const Mesh &mesh, const AxisRefList &refs,
                            int64_t rank, const LiveMembers *live = nullptr);
/// A string naming the partition of the mesh into ordered groups over `refs`;
/// equal for any two expressions of the same partition.
std::string partitionKeyOf(const Mesh &mesh, const AxisRefList &refs);
/// Every group over `refs` with live members, ordered by color. Enumerates
/// the world: only for listings, whose callers bound the output by
/// kMaxListedIntegers first.
std::vector<std::vector<int64_t>>
listGroupsOf(const Mesh &mesh, const AxisRefList &refs,
             const LiveMembers *live = nullptr);
/// True when some ref lies on a managed axis.
bool touchesManaged(const Mesh &mesh, const AxisRefList &refs);

//===----------------------------------------------------------------------===//
// Views
//===----------------------------------------------------------------------===//

class View {
public:
  /// The whole mesh, one view axis per root axis.
  static View root(std::shared_ptr<const Mesh> mesh);
  /// Builds a view from explicit axes; checks refs are compatible.
  static Result<View> create(std::shared_ptr<const Mesh> mesh,
                             std::vector<ViewAxis> axes);

  const Mesh &mesh() const { return *meshPtr; }
  const std::shared_ptr<const Mesh> &meshHandle() const { return meshPtr; }
  const std::vector<ViewAxis> &axes() const { return viewAxes; }
  int numAxes() const { return static_cast<int>(viewAxes.size()); }
  std::optional<int> findAxis(std::string_view name) const;
  /// "dp, tp"
  std::string axisNameList() const;
  /// All refs of the view in axis order.
  AxisRefList refs() const;
  /// Number of ranks in one block of the view.
  int64_t size() const { return refsSize(refs()); }

  /// Resolves view axis names; errors name the unknown one and list the view.
  Result<std::vector<int>>
  axisIndices(const std::vector<std::string> &names) const;
  /// Concatenated refs of the given view axes, in the given order.
  AxisRefList refsOf(const std::vector<int> &axisIndices) const;

  /// Per-rank queries (O(number of axes)).
  Result<std::vector<int64_t>> coordinate(int64_t rank) const;
  Result<int64_t> localRank(int64_t rank, const std::vector<int> &axes) const;
  Result<std::vector<int64_t>> group(int64_t rank, const std::vector<int> &axes,
                                     const LiveMembers *live = nullptr) const;
  Result<SplitKey> split(int64_t rank, const std::vector<int> &axes,
                         const LiveMembers *live = nullptr) const;
  std::string partitionKey(const std::vector<int> &axes) const;

  /// "(dp=2, tp=4)" with flattened axes spelled out: "(dp=[ddp,fsdp]=4)".
  std::string str() const;

private:
  View(std::shared_ptr<const Mesh> mesh, std::vector<ViewAxis> axes)
      : meshPtr(std::move(mesh)), viewAxes(std::move(axes)) {}
  std::shared_ptr<const Mesh> meshPtr;
  std::vector<ViewAxis> viewAxes;
};

/// Names of axes and axis groups for one root mesh (see file comment).
class AxisNamespace {
public:
  explicit AxisNamespace(std::shared_ptr<const Mesh> mesh);
  /// Registers `name` for `refs`; ok if it already names the same partition.
  Result<void> define(const std::string &name, const AxisRefList &refs);
  /// The refs a name stands for, or null.
  const AxisRefList *lookup(std::string_view name) const;

private:
  std::shared_ptr<const Mesh> meshPtr;
  std::map<std::string, AxisRefList, std::less<>> names;
};

/// Keeps the named axes in the given order. A name may be a view axis, or any
/// name in the namespace (root axis, earlier flatten or unflatten) whose refs
/// lie within the view: a slice of a flattened axis.
Result<View> sliceView(const View &view, const std::vector<std::string> &names,
                       const AxisNamespace &ns);
/// Merges the named view axes (major to minor, in the order given) into one
/// axis called `name` (default: names joined with "_"), placed where the first
/// of them was.
Result<View> flattenView(const View &view,
                         const std::vector<std::string> &names,
                         std::optional<std::string> name, AxisNamespace &ns);
/// Cuts view axis `name` into named parts (major to minor) whose sizes
/// multiply to its size.
Result<View>
unflattenView(const View &view, const std::string &name,
              const std::vector<std::pair<std::string, int64_t>> &parts,
              AxisNamespace &ns);

/// Evaluates a chain such as "slice(ddp,fsdp).slice(fsdp)",
/// "flatten(dp_replicate,dp_shard as dp)" or "unflatten(dp as r:2,s:4)".
/// Errors give the 1-based column of the offending step.
Result<View> evaluateViewExpr(const View &start, std::string_view expr,
                              AxisNamespace &ns);

} // namespace meshplan

#endif // MESHPLAN_CORE_MESHVIEW_H
