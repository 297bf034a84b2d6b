//===- BruteForce.h - Independent reference models for core tests ---------===//
//
// Everything here is written from the definitions in docs/semantics.md,
// without calling the library: explicit N-D arrays of rank ids (numpy style),
// explicit index lists chunked like torch.chunk (once per level of a layout,
// at the rank's mixed-radix index over the level's refs), DTensor's
// left-to-right placement rule, and enumerations of layouts with levels.
// Tests compare the library's stride arithmetic against these.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_UNITTESTS_CORE_BRUTEFORCE_H
#define MESHPLAN_UNITTESTS_CORE_BRUTEFORCE_H

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace bf {

using Ints = std::vector<int64_t>;

inline int64_t prod(const Ints &v) {
  int64_t p = 1;
  for (int64_t x : v)
    p *= x;
  return p;
}

inline std::string str(const Ints &v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i)
    os << (i ? "," : "") << v[i];
  os << "]";
  return os.str();
}

/// A dense row-major N-D array of int64 (rank ids or element indices).
struct NDArray {
  Ints shape;
  Ints data;

  NDArray() = default;
  NDArray(Ints shape, Ints data)
      : shape(std::move(shape)), data(std::move(data)) {
    assert(prod(this->shape) == static_cast<int64_t>(this->data.size()));
  }
  static NDArray arange(const Ints &shape) {
    Ints d(prod(shape));
    std::iota(d.begin(), d.end(), 0);
    return NDArray(shape, d);
  }
  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t numel() const { return static_cast<int64_t>(data.size()); }

  /// Multi-index of flat position (row-major).
  Ints unravel(int64_t flat) const {
    Ints idx(shape.size());
    for (int i = ndim() - 1; i >= 0; --i) {
      idx[i] = flat % shape[i];
      flat /= shape[i];
    }
    return idx;
  }
  int64_t ravel(const Ints &idx) const {
    int64_t flat = 0;
    for (int i = 0; i < ndim(); ++i)
      flat = flat * shape[i] + idx[i];
    return flat;
  }
  int64_t at(const Ints &idx) const { return data[ravel(idx)]; }

  /// numpy.transpose(perm): result axis i is source axis perm[i].
  NDArray transpose(const std::vector<int> &perm) const {
    Ints newShape;
    for (int p : perm)
      newShape.push_back(shape[p]);
    NDArray out(newShape, Ints(data.size()));
    for (int64_t flat = 0; flat < out.numel(); ++flat) {
      Ints idx = out.unravel(flat);
      Ints src(shape.size());
      for (size_t i = 0; i < perm.size(); ++i)
        src[perm[i]] = idx[i];
      out.data[flat] = at(src);
    }
    return out;
  }
  NDArray reshape(const Ints &newShape) const {
    assert(prod(newShape) == numel());
    return NDArray(newShape, data);
  }
  /// Flat position of a value (first occurrence), -1 if absent.
  int64_t find(int64_t value) const {
    auto it = std::find(data.begin(), data.end(), value);
    return it == data.end() ? -1 : it - data.begin();
  }
};

/// Moves the listed axes last (in the given order), keeps the others first in
/// their original order, and reshapes to (-1, prod(listed)): the rows are the
/// groups over the listed axes.
inline std::vector<Ints> groupsOver(const NDArray &a,
                                    const std::vector<int> &axes) {
  std::vector<int> perm;
  for (int i = 0; i < a.ndim(); ++i)
    if (std::find(axes.begin(), axes.end(), i) == axes.end())
      perm.push_back(i);
  int64_t g = 1;
  for (int ax : axes) {
    perm.push_back(ax);
    g *= a.shape[ax];
  }
  NDArray t = a.transpose(perm);
  std::vector<Ints> rows;
  for (int64_t r = 0; r < t.numel() / g; ++r)
    rows.emplace_back(t.data.begin() + r * g, t.data.begin() + (r + 1) * g);
  return rows;
}

/// The row that contains `value`.
inline Ints rowContaining(const std::vector<Ints> &rows, int64_t value) {
  for (const Ints &row : rows)
    if (std::find(row.begin(), row.end(), value) != row.end())
      return row;
  return {};
}

/// The partition as a canonical (sorted) list of ordered rows.
inline std::vector<Ints> canonicalPartition(std::vector<Ints> rows) {
  std::sort(rows.begin(), rows.end());
  return rows;
}

//===----------------------------------------------------------------------===//
// torch.chunk and DTensor's placement rule on explicit index lists
//===----------------------------------------------------------------------===//

/// torch.chunk(list, k): pieces of ceil(n/k); trailing pieces may be empty
/// (torch returns fewer chunks; we pad the list with empties up to k).
inline std::vector<Ints> torchChunk(const Ints &list, int64_t k) {
  int64_t n = static_cast<int64_t>(list.size());
  int64_t c = (n + k - 1) / k;
  std::vector<Ints> out;
  for (int64_t i = 0; i < k; ++i) {
    int64_t b = std::min(i * c, n), e = std::min((i + 1) * c, n);
    out.emplace_back(list.begin() + b, list.begin() + e);
  }
  return out;
}

/// _StridedShard(sf) over k members: chunk into sf pieces, chunk each piece k
/// ways, member i gets the concatenation of every piece's i-th chunk.
inline Ints stridedChunk(const Ints &list, int64_t sf, int64_t k, int64_t i) {
  Ints out;
  for (const Ints &piece : torchChunk(list, sf)) {
    Ints part = torchChunk(piece, k)[i];
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

inline Ints iota(int64_t n) {
  Ints v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

/// Nested torch.chunk: level i splits by sizes[i], keeps chunk coords[i].
inline Ints nestedChunk(int64_t n, const Ints &sizes, const Ints &coords) {
  Ints list = iota(n);
  for (size_t i = 0; i < sizes.size(); ++i)
    list = torchChunk(list, sizes[i])[coords[i]];
  return list;
}

/// True when `list` is exactly [offset, offset + size).
inline bool isRange(const Ints &list, int64_t offset, int64_t size) {
  if (static_cast<int64_t>(list.size()) != size)
    return false;
  for (int64_t i = 0; i < size; ++i)
    if (list[i] != offset + i)
      return false;
  return true;
}

inline bool isContiguous(const Ints &list) {
  for (size_t i = 1; i < list.size(); ++i)
    if (list[i] != list[i - 1] + 1)
      return false;
  return true;
}

/// All permutations of 0..n-1.
inline std::vector<std::vector<int>> permutations(int n) {
  std::vector<int> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::vector<std::vector<int>> out;
  do
    out.push_back(p);
  while (std::next_permutation(p.begin(), p.end()));
  return out;
}

/// Every non-empty ordered subset of 0..n-1.
inline std::vector<std::vector<int>> orderedSubsets(int n) {
  std::vector<std::vector<int>> out;
  for (int mask = 1; mask < (1 << n); ++mask) {
    std::vector<int> items;
    for (int i = 0; i < n; ++i)
      if (mask & (1 << i))
        items.push_back(i);
    for (const auto &p : permutations(static_cast<int>(items.size()))) {
      std::vector<int> s;
      for (int i : p)
        s.push_back(items[i]);
      out.push_back(s);
    }
  }
  return out;
}

/// One sharding placement applied to one tensor dim, in DTensor's left to
/// right order: splitFactor 1 is Shard(d), > 1 is _StridedShard(d, sf); the
/// mesh dim has `k` members and the rank sits at coordinate `c`.
struct DimPlacement {
  int64_t splitFactor;
  int64_t k;
  int64_t c;
};

/// DTensor's index list of one dim of size n for one rank.
inline Ints dtensorRule(int64_t n, const std::vector<DimPlacement> &splits) {
  Ints list = iota(n);
  for (const DimPlacement &p : splits)
    list = p.splitFactor == 1 ? torchChunk(list, p.k)[p.c]
                              : stridedChunk(list, p.splitFactor, p.k, p.c);
  return list;
}

//===----------------------------------------------------------------------===//
// Levels: nested torch.chunk, one chunk per level
//===----------------------------------------------------------------------===//

/// Mixed radix of `digits` over `sizes`, the first digit most significant.
inline int64_t mixedRadix(const Ints &sizes, const Ints &digits) {
  assert(sizes.size() == digits.size());
  int64_t index = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    assert(0 <= digits[i] && digits[i] < sizes[i]);
    index = index * sizes[i] + digits[i];
  }
  return index;
}

/// One level of a dim as one rank sees it: the sizes of the level's refs and
/// the rank's digits on them (first ref most significant).
struct LevelDigits {
  Ints sizes;
  Ints digits;
};

/// Index list of a dim of size n: each level, major to minor, chunks the
/// current list once like torch.chunk into prod(sizes) pieces and keeps the
/// piece at the mixed radix of the rank's digits.
inline Ints levelChunk(int64_t n, const std::vector<LevelDigits> &levels) {
  Ints list = iota(n);
  for (const LevelDigits &level : levels)
    list = torchChunk(list,
                      prod(level.sizes))[mixedRadix(level.sizes, level.digits)];
  return list;
}

/// Padded extent of a dim: ceil(padded / level size) per level.
inline int64_t levelPadded(int64_t n, const Ints &levelSizes) {
  for (int64_t k : levelSizes)
    n = (n + k - 1) / k;
  return n;
}

//===----------------------------------------------------------------------===//
// Layout enumeration
//===----------------------------------------------------------------------===//

/// A layout over numbered units (root axes, sub-axes or view axes): per dim,
/// the levels major to minor, each an ordered list of units (first most
/// significant); the partial units.
struct LayoutSpec {
  std::vector<std::vector<std::vector<int>>> dims;
  std::vector<int> partial;

  /// All units of dim d, levels concatenated.
  std::vector<int> dimUnits(size_t d) const {
    std::vector<int> out;
    for (const auto &level : dims[d])
      out.insert(out.end(), level.begin(), level.end());
    return out;
  }
  bool hasMultiUnitLevel() const {
    for (const auto &levels : dims)
      for (const auto &level : levels)
        if (level.size() > 1)
          return true;
    return false;
  }
};

/// Every way to split `items` into ordered levels: every order of the items,
/// cut into consecutive non-empty groups (k! * 2^(k-1) ways for k items), or
/// only one item per level (k! ways) when `multiUnitLevels` is false.
inline std::vector<std::vector<std::vector<int>>>
levelSplits(const std::vector<int> &items, bool multiUnitLevels) {
  std::vector<std::vector<std::vector<int>>> out;
  int k = static_cast<int>(items.size());
  if (k == 0)
    return {{}};
  int cutMasks = multiUnitLevels ? 1 << (k - 1) : 1;
  for (const auto &perm : permutations(k))
    for (int cuts = 0; cuts < cutMasks; ++cuts) {
      // Bit i of `cuts` set: items i and i+1 share a level.
      std::vector<std::vector<int>> levels;
      for (int i = 0; i < k; ++i) {
        bool joins = multiUnitLevels && i > 0 && (cuts & (1 << (i - 1)));
        if (!joins)
          levels.emplace_back();
        levels.back().push_back(items[perm[i]]);
      }
      out.push_back(levels);
    }
  return out;
}

/// Every assignment of units to replicated / partial / dim d, with every
/// split of each dim's units into ordered levels (see levelSplits).
inline std::vector<LayoutSpec> enumerateLayouts(int numUnits, int rank,
                                                bool multiUnitLevels = false) {
  std::vector<LayoutSpec> out;
  int choices = 2 + rank; // 0 = R, 1 = P, 2+d = dim d
  int total = 1;
  for (int i = 0; i < numUnits; ++i)
    total *= choices;
  for (int code = 0; code < total; ++code) {
    std::vector<int> assign(numUnits);
    int rest = code;
    for (int i = 0; i < numUnits; ++i) {
      assign[i] = rest % choices;
      rest /= choices;
    }
    std::vector<std::vector<int>> members(rank);
    LayoutSpec base;
    base.dims.resize(rank);
    for (int i = 0; i < numUnits; ++i) {
      if (assign[i] == 1)
        base.partial.push_back(i);
      else if (assign[i] >= 2)
        members[assign[i] - 2].push_back(i);
    }
    // Cartesian product of the level splits per dim.
    std::vector<LayoutSpec> specs = {base};
    for (int d = 0; d < rank; ++d) {
      std::vector<LayoutSpec> next;
      for (const LayoutSpec &spec : specs)
        for (const auto &levels : levelSplits(members[d], multiUnitLevels)) {
          LayoutSpec s = spec;
          s.dims[d] = levels;
          next.push_back(s);
        }
      specs = std::move(next);
    }
    out.insert(out.end(), specs.begin(), specs.end());
  }
  return out;
}

} // namespace bf

#endif // MESHPLAN_UNITTESTS_CORE_BRUTEFORCE_H
