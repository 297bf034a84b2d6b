//===- Placement.cpp - DTensor placements <-> layouts ---------------------===//

#include "meshplan/Core/Placement.h"
#include "meshplan/Core/Text.h"

#include <algorithm>

namespace meshplan {

//===----------------------------------------------------------------------===//
// Text
//===----------------------------------------------------------------------===//

/// Parses "0", "dim=0", "sf=2", "split_factor=2" as the integer.
static std::optional<int64_t> parseArgInt(std::string_view arg) {
  arg = trim(arg);
  size_t eq = arg.find('=');
  if (eq != std::string_view::npos)
    arg = trim(arg.substr(eq + 1));
  return parseInt(arg);
}

static Result<Placement> parseOnePlacement(std::string_view text) {
  text = trim(text);
  std::string_view name = text, args;
  bool hasArgs = false;
  size_t open = text.find('(');
  if (open != std::string_view::npos) {
    if (text.back() != ')')
      return makeError("placement \"" + std::string(text) +
                       "\" has no closing ')'");
    name = trim(text.substr(0, open));
    args = trim(text.substr(open + 1, text.size() - open - 2));
    hasArgs = true;
  }
  std::vector<std::string_view> argList;
  if (!args.empty())
    argList = splitTopLevel(args, ',');
  auto bad = [&](const std::string &why) {
    return makeError("placement \"" + std::string(text) + "\": " + why);
  };
  if (name == "R" || name == "Replicate") {
    if (!argList.empty())
      return bad("Replicate takes no arguments");
    return Placement::replicate();
  }
  if (name == "S" || name == "Shard") {
    if (argList.size() != 1)
      return bad("expected Shard(dim)");
    auto dim = parseArgInt(argList[0]);
    if (!dim)
      return bad("dim is not an integer");
    return Placement::shard(static_cast<int>(*dim));
  }
  if (name == "SS" || name == "_S" || name == "_StridedShard" ||
      name == "StridedShard") {
    if (argList.size() != 2)
      return bad("expected _StridedShard(dim, split_factor)");
    auto dim = parseArgInt(argList[0]);
    auto sf = parseArgInt(argList[1]);
    if (!dim || !sf)
      return bad("dim and split_factor must be integers");
    if (*sf < 1)
      return bad("split_factor must be >= 1");
    return Placement::strided(static_cast<int>(*dim), *sf);
  }
  if (name == "P" || name == "Partial") {
    if (argList.size() > 1)
      return bad("expected Partial(op)");
    ReduceOp op = ReduceOp::Sum;
    if (argList.size() == 1) {
      std::string_view opText = trim(argList[0]);
      size_t eq = opText.find('=');
      if (eq != std::string_view::npos)
        opText = opText.substr(eq + 1);
      auto parsed = parseReduceOp(opText);
      if (!parsed)
        return bad(parsed.error().message);
      op = *parsed;
    }
    return Placement::partial(op);
  }
  (void)hasArgs;
  return makeError("unknown placement \"" + std::string(text) +
                   "\"; expected Shard(d), _StridedShard(d, sf), Replicate() "
                   "or Partial(op) (or S(d), SS(d,sf), R, P(op))");
}

Result<std::vector<Placement>> parsePlacements(std::string_view text) {
  text = trim(text);
  if (text.size() >= 2 && ((text.front() == '[' && text.back() == ']') ||
                           (text.front() == '(' && text.back() == ')')))
    text = trim(text.substr(1, text.size() - 2));
  if (text.empty())
    return makeError("empty placement list");
  std::vector<Placement> out;
  auto items = splitTopLevel(text, ',');
  // One trailing comma is tolerated, as in a Python tuple "(Shard(0),)";
  // any other empty item is an error, and so is a list of commas alone
  // (which would print back as the empty text, never a placement list).
  if (items.size() > 1 && trim(items.back()).empty())
    items.pop_back();
  for (size_t index = 0; index < items.size(); ++index) {
    if (trim(items[index]).empty())
      return makeError("placement " + std::to_string(index) + " is empty (\"" +
                       std::string(text) + "\")");
    auto p = parseOnePlacement(items[index]);
    if (!p)
      return p.error().within("placement " + std::to_string(index));
    out.push_back(*p);
  }
  return out;
}

std::string formatPlacements(const std::vector<Placement> &placements,
                             bool torchStyle) {
  std::string out;
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement &p = placements[i];
    if (i)
      out += torchStyle ? ", " : ",";
    switch (p.kind) {
    case Placement::Kind::Shard:
      out += torchStyle ? "Shard(dim=" + std::to_string(p.dim) + ")"
                        : "S(" + std::to_string(p.dim) + ")";
      break;
    case Placement::Kind::StridedShard:
      out += torchStyle ? "_StridedShard(dim=" + std::to_string(p.dim) +
                              ", sf=" + std::to_string(p.splitFactor) + ")"
                        : "SS(" + std::to_string(p.dim) + "," +
                              std::to_string(p.splitFactor) + ")";
      break;
    case Placement::Kind::Replicate:
      out += torchStyle ? "Replicate()" : "R";
      break;
    case Placement::Kind::Partial:
      out += std::string(torchStyle ? "Partial(" : "P(") +
             std::string(reduceOpName(p.op)) + ")";
      break;
    }
  }
  return torchStyle ? "(" + out + ")" : out;
}

//===----------------------------------------------------------------------===//
// DTensor's rule, evaluated exactly as intervals
//===----------------------------------------------------------------------===//

namespace {
struct Interval {
  int64_t begin, end; // [begin, end)
};
using Intervals = std::vector<Interval>;

int64_t totalLength(const Intervals &in) {
  int64_t n = 0;
  for (const Interval &i : in)
    n += i.end - i.begin;
  return n;
}

/// Elements [from, to) of the concatenation of `in`.
Intervals subRange(const Intervals &in, int64_t from, int64_t to) {
  Intervals out;
  int64_t pos = 0;
  for (const Interval &i : in) {
    int64_t len = i.end - i.begin;
    int64_t lo = std::max(from, pos), hi = std::min(to, pos + len);
    if (lo < hi)
      out.push_back({i.begin + (lo - pos), i.begin + (hi - pos)});
    pos += len;
  }
  return out;
}

/// torch.chunk: chunk c of k over a length, as [start, end).
std::pair<int64_t, int64_t> chunkRange(int64_t length, int64_t k, int64_t c) {
  int64_t chunk = (length + k - 1) / k;
  int64_t start = std::min(c * chunk, length);
  return {start, std::min(start + chunk, length)};
}

Intervals merged(const Intervals &in) {
  Intervals out;
  for (const Interval &i : in) {
    if (i.begin == i.end)
      continue;
    if (!out.empty() && out.back().end == i.begin)
      out.back().end = i.end;
    else
      out.push_back(i);
  }
  return out;
}

std::string formatIntervals(const Intervals &in) {
  if (in.empty())
    return "nothing";
  std::string out;
  for (const Interval &i : in)
    out += (out.empty() ? "" : " + ") + std::string("[") +
           std::to_string(i.begin) + ", " + std::to_string(i.end) + ")";
  return out;
}

/// One sharding placement on a tensor dim: which view axis, its size and the
/// split factor (1 for Shard).
struct DimSplit {
  int viewAxis;
  int64_t size;
  int64_t splitFactor;
};
} // namespace

/// DTensor's indices of dim (size n) for one combination of coordinates.
static Intervals dtensorIndices(int64_t n, const std::vector<DimSplit> &splits,
                                const std::vector<int64_t> &coords) {
  Intervals cur{{0, n}};
  for (size_t s = 0; s < splits.size(); ++s) {
    int64_t k = splits[s].size, c = coords[s], sf = splits[s].splitFactor;
    int64_t length = totalLength(cur);
    if (sf == 1) {
      auto [b, e] = chunkRange(length, k, c);
      cur = subRange(cur, b, e);
      continue;
    }
    Intervals next;
    for (int64_t piece = 0; piece < sf; ++piece) {
      auto [pb, pe] = chunkRange(length, sf, piece);
      auto [b, e] = chunkRange(pe - pb, k, c);
      Intervals part = subRange(cur, pb + b, pb + e);
      next.insert(next.end(), part.begin(), part.end());
    }
    cur = next;
  }
  return merged(cur);
}

/// The first rank (lowest position) whose coordinates on the given view axes
/// are `coords` and zero elsewhere, with a "dp=0, tp=1" description.
static std::pair<int64_t, std::string>
witnessRank(const View &view, const std::vector<DimSplit> &splits,
            const std::vector<int64_t> &coords) {
  const Mesh &mesh = view.mesh();
  int64_t position = 0;
  std::vector<int64_t> viewCoord(view.numAxes(), 0);
  for (size_t s = 0; s < splits.size(); ++s) {
    viewCoord[splits[s].viewAxis] = coords[s];
    int64_t digit = coords[s];
    const AxisRefList &refs = view.axes()[splits[s].viewAxis].refs;
    for (auto it = refs.rbegin(); it != refs.rend(); ++it) {
      position += (digit % it->size) * it->positionStep(mesh);
      digit /= it->size;
    }
  }
  std::string desc;
  for (int a = 0; a < view.numAxes(); ++a)
    desc += (desc.empty() ? "" : ", ") + view.axes()[a].name + "=" +
            std::to_string(viewCoord[a]);
  return {mesh.rankAt(position), desc};
}

/// Orders a dim's splits major to minor so nested chunking matches DTensor's
/// left-to-right rule: a _StridedShard(sf) goes right after the later splits
/// whose sizes multiply to sf. Empty when no such order exists.
static std::optional<std::vector<int>>
nestedOrder(const std::vector<DimSplit> &splits) {
  std::vector<int> order; // indices into splits
  for (int s = static_cast<int>(splits.size()) - 1; s >= 0; --s) {
    int64_t product = 1;
    size_t at = 0;
    while (product < splits[s].splitFactor && at < order.size())
      product *= splits[order[at++]].size;
    if (product != splits[s].splitFactor)
      return std::nullopt;
    order.insert(order.begin() + at, s);
  }
  return order;
}

/// Decodes combination `combo` into one coordinate per split.
static void decodeCombo(int64_t combo, const std::vector<DimSplit> &splits,
                        std::vector<int64_t> &coords) {
  for (int s = static_cast<int>(splits.size()) - 1; s >= 0; --s) {
    coords[s] = combo % splits[s].size;
    combo /= splits[s].size;
  }
}

/// First combination of coordinates where nested chunking in `order` gives a
/// different box than DTensor's rule, with both index sets; none if equal.
struct Mismatch {
  std::vector<int64_t> coords;
  Intervals actual, expected;
};
static std::optional<Mismatch>
firstMismatch(int64_t n, const std::vector<DimSplit> &splits,
              const std::vector<int> &order, int64_t combos) {
  std::vector<int64_t> coords(splits.size()), sizes, nestedCoords;
  for (int64_t combo = 0; combo < combos; ++combo) {
    decodeCombo(combo, splits, coords);
    sizes.clear();
    nestedCoords.clear();
    for (int s : order) {
      sizes.push_back(splits[s].size);
      nestedCoords.push_back(coords[s]);
    }
    DimShard box = chunkNested(n, sizes, nestedCoords);
    Intervals expected;
    if (box.size > 0)
      expected.push_back({box.offset, box.offset + box.size});
    Intervals actual = dtensorIndices(n, splits, coords);
    bool same = expected.size() == actual.size() &&
                (expected.empty() || (expected[0].begin == actual[0].begin &&
                                      expected[0].end == actual[0].end));
    if (!same)
      return Mismatch{coords, actual, expected};
  }
  return std::nullopt;
}

/// The nesting order (major to minor) of a dim's splits whose boxes equal
/// DTensor's for this size: the order the split factors call for, else the
/// first order that happens to match (degenerate sizes, size-1 axes).
/// Errors name a rank and what DTensor would give it.
static Result<std::vector<int>>
chooseNesting(const View &view, int dim, int64_t n,
              const std::vector<DimSplit> &splits) {
  // Checking is exhaustive: every combination of coordinates, each costing
  // one more piece per unit of split factor (dtensorIndices). Bound that work,
  // with overflow-safe products, before doing any of it.
  int64_t combos = 1, pieces = 1;
  bool overflows = false;
  for (const DimSplit &s : splits) {
    overflows |= mulOverflows(combos, s.size, &combos);
    overflows |= __builtin_add_overflow(pieces, s.splitFactor - 1, &pieces);
  }
  if (overflows || combos > kMaxPlacementChecks)
    return makeError(
        "dim " + std::to_string(dim) + " is split " +
        (overflows ? std::string("more than 2^63") : std::to_string(combos)) +
        " ways by placements; too many to check exactly (at most " +
        kMaxPlacementChecksText + ", docs/limits.md)");
  int64_t work = 0;
  if (mulOverflows(combos, pieces, &work) || work > kMaxPlacementChecks) {
    int64_t largest = 1;
    for (const DimSplit &s : splits)
      largest = std::max(largest, s.splitFactor);
    return makeError("dim " + std::to_string(dim) + " is split " +
                     std::to_string(combos) + " ways with a split factor of " +
                     std::to_string(largest) +
                     " by placements; too many pieces to check exactly (at "
                     "most " +
                     kMaxPlacementChecksText + ", docs/limits.md)");
  }
  std::string dimDesc =
      "dim " + std::to_string(dim) + " (size " + std::to_string(n) + ")";
  // No nesting can reproduce a rank that holds several pieces.
  std::vector<int64_t> coords(splits.size());
  for (int64_t combo = 0; combo < combos; ++combo) {
    decodeCombo(combo, splits, coords);
    Intervals actual = dtensorIndices(n, splits, coords);
    if (actual.size() > 1) {
      auto [rank, desc] = witnessRank(view, splits, coords);
      return makeError("placements give rank " + std::to_string(rank) + " (" +
                       desc + ") the pieces " + formatIntervals(actual) +
                       " of " + dimDesc +
                       ", not one contiguous box; meshplan rejects such "
                       "lists instead of reporting a wrong offset");
    }
  }
  auto preferred = nestedOrder(splits);
  std::optional<Mismatch> preferredMismatch;
  if (preferred) {
    preferredMismatch = firstMismatch(n, splits, *preferred, combos);
    if (!preferredMismatch)
      return *preferred;
  }
  // Few splits per dim (one per mesh dim), so trying every order is cheap.
  std::vector<int> order(splits.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = static_cast<int>(i);
  std::optional<Mismatch> firstSeen;
  if (order.size() <= 8) {
    do {
      auto mismatch = firstMismatch(n, splits, order, combos);
      if (!mismatch)
        return order;
      if (!firstSeen)
        firstSeen = mismatch;
    } while (std::next_permutation(order.begin(), order.end()));
  }
  const Mismatch &m = preferredMismatch ? *preferredMismatch : *firstSeen;
  auto [rank, desc] = witnessRank(view, splits, m.coords);
  std::string what = "placements give rank " + std::to_string(rank) + " (" +
                     desc + ") " + formatIntervals(m.actual) + " of " +
                     dimDesc + " by DTensor's rule, but ";
  if (preferred)
    return makeError(what + "nested chunking gives " +
                     formatIntervals(m.expected) +
                     "; for uneven sizes DTensor's _StridedShard differs from "
                     "nested chunking (pytorch#168134), so write the layout "
                     "directly");
  return makeError(what + "no nesting of its mesh axes gives every rank its "
                          "DTensor box (the split factors match no order)");
}

//===----------------------------------------------------------------------===//
// Conversions
//===----------------------------------------------------------------------===//

Result<Layout> layoutFromPlacements(const View &view,
                                    const std::vector<Placement> &placements,
                                    const std::vector<int64_t> &shape) {
  if (static_cast<int>(placements.size()) != view.numAxes())
    return makeError(
        std::to_string(placements.size()) + " placements for a view with " +
        std::to_string(view.numAxes()) + " axes (" + view.axisNameList() + ")");
  auto shapeOk = checkShape(shape);
  if (!shapeOk)
    return shapeOk.error();
  int rank = static_cast<int>(shape.size());
  Layout layout;
  layout.dims.resize(rank);
  std::vector<std::vector<DimSplit>> splits(rank);
  std::optional<ReduceOp> partialOp;
  for (int a = 0; a < view.numAxes(); ++a) {
    const Placement &p = placements[a];
    const ViewAxis &axis = view.axes()[a];
    std::string where =
        "placement " + std::to_string(a) + " (axis \"" + axis.name + "\")";
    switch (p.kind) {
    case Placement::Kind::Replicate:
      break;
    case Placement::Kind::Partial:
      if (partialOp && *partialOp != p.op)
        return makeError(
            where + ": Partial(" + std::string(reduceOpName(p.op)) +
            ") mixed with Partial(" + std::string(reduceOpName(*partialOp)) +
            "); one tensor has one pending reduce op");
      partialOp = p.op;
      layout.partial.insert(layout.partial.end(), axis.refs.begin(),
                            axis.refs.end());
      break;
    case Placement::Kind::Shard:
    case Placement::Kind::StridedShard: {
      int d = p.dim < 0 ? p.dim + rank : p.dim;
      if (d < 0 || d >= rank)
        return makeError(where + ": dim " + std::to_string(p.dim) +
                         " is out of range for a " + std::to_string(rank) +
                         "-d tensor");
      splits[d].push_back({a, axis.size(), p.splitFactor});
      break;
    }
    }
  }
  if (partialOp)
    layout.reduceOp = *partialOp;
  for (int d = 0; d < rank; ++d) {
    auto order = chooseNesting(view, d, shape[d], splits[d]);
    if (!order)
      return order.error();
    // Each mesh dim of DTensor is one level: a flattened axis chunks once.
    for (int s : *order)
      layout.dims[d].push_back(view.axes()[splits[d][s].viewAxis].refs);
  }
  auto ok = verifyLayout(view, layout);
  if (!ok)
    return ok.error();
  return normalizeLayout(view.mesh(), layout);
}

Result<std::vector<Placement>>
placementsFromLayout(const View &view, const Layout &layout,
                     const std::vector<int64_t> &shape) {
  const Mesh &mesh = view.mesh();
  if (layout.dims.size() != shape.size())
    return makeError("layout has " + std::to_string(layout.dims.size()) +
                     " dims but the tensor shape has " +
                     std::to_string(shape.size()));
  AxisRefList universe = view.refs();
  AxisRefList used = layout.usedRefs();
  universe.insert(universe.end(), used.begin(), used.end());
  std::vector<AxisRefList> axisFactors;
  for (const ViewAxis &axis : view.axes())
    axisFactors.push_back(splitIntoFactors(mesh, axis.refs, universe));

  // The view axis whose refs are exactly `refs` (compared on factors).
  auto matchAxis = [&](const AxisRefList &refs,
                       const std::string &what) -> Result<int> {
    AxisRefList factors = splitIntoFactors(mesh, refs, universe);
    for (int a = 0; a < view.numAxes(); ++a)
      if (!factors.empty() && axisFactors[a] == factors)
        return a;
    return makeError(what + " uses \"" + formatAxisRefs(mesh, refs) +
                     "\", which is not one axis of the view (" +
                     view.axisNameList() +
                     "); DTensor places whole mesh dims only");
  };
  // Levels of one dim, as view axes.
  auto matchLevels = [&](const SplitLevels &levels,
                         const std::string &what) -> Result<std::vector<int>> {
    std::vector<int> axes;
    for (const AxisRefList &level : levels) {
      auto axis = matchAxis(level, what);
      if (!axis)
        return axis.error();
      axes.push_back(*axis);
    }
    return axes;
  };

  std::vector<Placement> placements(view.numAxes(), Placement::replicate());
  for (size_t d = 0; d < layout.dims.size(); ++d) {
    auto axes = matchLevels(layout.dims[d], "dim " + std::to_string(d));
    if (!axes)
      return axes.error();
    for (size_t q = 0; q < axes->size(); ++q) {
      int a = (*axes)[q];
      int64_t sf = 1;
      for (size_t earlier = 0; earlier < q; ++earlier)
        if ((*axes)[earlier] > a)
          sf *= view.axes()[(*axes)[earlier]].size();
      placements[a] = sf == 1 ? Placement::shard(static_cast<int>(d))
                              : Placement::strided(static_cast<int>(d), sf);
    }
  }
  // Partial refs: a set, covered by whole view axes.
  AxisRefList partialFactors = splitIntoFactors(mesh, layout.partial, universe);
  size_t covered = 0;
  for (int a = 0; a < view.numAxes(); ++a) {
    const AxisRefList &af = axisFactors[a];
    bool all = !af.empty(), any = false;
    for (const AxisRef &f : af) {
      bool in = std::find(partialFactors.begin(), partialFactors.end(), f) !=
                partialFactors.end();
      all &= in;
      any |= in;
    }
    if (any && !all)
      return makeError("partial uses part of view axis \"" +
                       view.axes()[a].name +
                       "\"; DTensor places whole mesh dims only");
    if (all) {
      placements[a] = Placement::partial(layout.reduceOp);
      covered += af.size();
    }
  }
  if (covered != partialFactors.size())
    return makeError("partial uses \"" + formatAxisRefs(mesh, layout.partial) +
                     "\", which is not made of whole axes of the view (" +
                     view.axisNameList() + ")");

  // DTensor's rule must reproduce the layout's boxes for this shape.
  auto back = layoutFromPlacements(view, placements, shape);
  if (!back)
    return makeError("DTensor cannot express layout " +
                     formatLayout(mesh, layout) + " for shape [" +
                     joinInts(shape) + "]: " + back.error().message);
  return placements;
}

} // namespace meshplan
