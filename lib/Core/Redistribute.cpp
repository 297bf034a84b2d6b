//===- Redistribute.cpp - Plans between two layouts -----------------------===//
//
// The planner works on the finest common factors of the view and both
// layouts. Its state is a layout in factor form; each step rewrites one dim's
// factor list at its minor end (the only place nested chunking lets a
// collective add or remove a split), so every intermediate state is a valid
// layout and every step is executable from shard arithmetic alone.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/Redistribute.h"

#include <algorithm>

namespace meshplan {

std::string_view stepKindName(StepKind kind) {
  switch (kind) {
  case StepKind::AllGather:
    return "all_gather";
  case StepKind::ReduceScatter:
    return "reduce_scatter";
  case StepKind::AllReduce:
    return "all_reduce";
  case StepKind::AllToAll:
    return "all_to_all";
  case StepKind::LocalSlice:
    return "local_slice";
  case StepKind::Permute:
    return "permute";
  case StepKind::MarkPartial:
    return "mark_partial";
  case StepKind::Broadcast:
    return "broadcast";
  }
  return "?";
}

int RedistributePlan::numCollectives() const {
  return static_cast<int>(
      std::count_if(steps.begin(), steps.end(), [](const RedistributeStep &s) {
        return s.isCollective();
      }));
}

int64_t RedistributePlan::totalBytesPerRank() const {
  int64_t total = 0;
  for (const RedistributeStep &s : steps)
    total += s.bytesPerRank;
  return total;
}

namespace {

bool contains(const AxisRefList &list, const AxisRef &ref) {
  return std::find(list.begin(), list.end(), ref) != list.end();
}

bool levelsContain(const SplitLevels &levels, const AxisRef &ref) {
  for (const AxisRefList &level : levels)
    if (contains(level, ref))
      return true;
  return false;
}

bool isPrefix(const SplitLevels &prefix, const SplitLevels &of) {
  return prefix.size() <= of.size() &&
         std::equal(prefix.begin(), prefix.end(), of.begin());
}

size_t commonPrefix(const SplitLevels &a, const SplitLevels &b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n])
    ++n;
  return n;
}

AxisRefList concat(SplitLevels::const_iterator begin,
                   SplitLevels::const_iterator end) {
  AxisRefList out;
  for (auto it = begin; it != end; ++it)
    out.insert(out.end(), it->begin(), it->end());
  return out;
}

int64_t product(const std::vector<int64_t> &v) {
  int64_t p = 1;
  for (int64_t x : v)
    p *= x;
  return p;
}

/// Plans on a layout whose levels are made of the finest common factors.
///
/// A dim is *even* when its size is divisible by the product of its refs in
/// both layouts: then every intermediate chunking is exact, nested and flat
/// chunking agree, and the dim is handled as one level per factor, so any
/// factor can move on its own. On an uneven dim the levels are kept as the
/// layouts give them, and every step moves whole levels (appending one level
/// per step), because regrouping levels would change which rank holds what.
class Planner {
public:
  Planner(const View &view, const Layout &from, const Layout &to,
          const std::vector<int64_t> &shape, int64_t elementBytes)
      : mesh(view.mesh()), shape(shape), elementBytes(elementBytes) {
    universe = view.refs();
    for (const Layout *l : {&from, &to}) {
      AxisRefList used = l->usedRefs();
      universe.insert(universe.end(), used.begin(), used.end());
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t n = shape[d];
      even.push_back(n % refsSize(from.dimRefs(static_cast<int>(d))) == 0 &&
                     n % refsSize(to.dimRefs(static_cast<int>(d))) == 0);
    }
    cur = toFactors(from);
    target = toFactors(to);
  }

  Result<RedistributePlan> run() {
    // A pending reduction with a different op than the target's must finish
    // first; the target's partial is declared again at the end.
    if (!cur.partial.empty() && !target.partial.empty() &&
        cur.reduceOp != target.reduceOp) {
      AxisRefList all = cur.partial; // allReduce erases from cur.partial
      allReduce(all);
    }
    for (const AxisRef &f : cur.partial)
      if (contains(target.partial, f))
        keep.push_back(f);

    for (int guard = 0; !done(); ++guard) {
      if (guard > 4 * static_cast<int>(universe.size() + shape.size()) + 8)
        return makeError("internal error: redistribution planner made no "
                         "progress; please report this layout pair");
      if (reduceScatter() || allToAll() || localSlice() ||
          allReduceUnneeded() || permute() || gatherOne())
        continue;
      // Every dim is on its way to the target, but a level it needs next
      // mixes pending-partial factors with others: reduce them first.
      AxisRefList pending = pendingPartial();
      if (pending.empty())
        return makeError("internal error: redistribution planner is stuck; "
                         "please report this layout pair");
      allReduce(pending);
    }
    AxisRefList mark;
    for (const AxisRef &f : target.partial)
      if (!contains(cur.partial, f))
        mark.push_back(f);
    if (!mark.empty()) {
      Layout before = cur;
      cur.partial.insert(cur.partial.end(), mark.begin(), mark.end());
      cur.reduceOp = target.reduceOp;
      emit(StepKind::MarkPartial, mark, -1, -1, before);
    }
    return std::move(plan);
  }

private:
  Layout toFactors(const Layout &l) const {
    Layout out;
    out.reduceOp = l.reduceOp;
    for (size_t d = 0; d < l.dims.size(); ++d) {
      SplitLevels levels;
      for (const AxisRefList &level : l.dims[d]) {
        AxisRefList factors = splitIntoFactors(mesh, level, universe);
        if (factors.empty())
          continue;
        if (even[d])
          for (const AxisRef &f : factors)
            levels.push_back({f});
        else
          levels.push_back(std::move(factors));
      }
      out.dims.push_back(std::move(levels));
    }
    out.partial = splitIntoFactors(mesh, l.partial, universe);
    return out;
  }

  bool done() const {
    return cur.dims == target.dims && pendingPartial().empty();
  }

  /// Partial factors that must be reduced (the target does not keep them).
  AxisRefList pendingPartial() const {
    AxisRefList out;
    for (const AxisRef &f : cur.partial)
      if (!contains(keep, f))
        out.push_back(f);
    return out;
  }

  bool isReplicated(const AxisRef &f) const {
    if (contains(cur.partial, f))
      return false;
    for (const SplitLevels &levels : cur.dims)
      if (levelsContain(levels, f))
        return false;
    return true;
  }

  /// Levels the target appends to dim d next, if d is on the way there.
  std::optional<SplitLevels> nextFor(size_t d) const {
    if (!isPrefix(cur.dims[d], target.dims[d]))
      return std::nullopt;
    return SplitLevels(target.dims[d].begin() + cur.dims[d].size(),
                       target.dims[d].end());
  }

  /// Appends to dim d the longest run of the target's next levels whose
  /// factors all satisfy `ok` (one level only on an uneven dim).
  std::optional<SplitLevels> appendableRun(size_t d, auto ok) const {
    auto next = nextFor(d);
    if (!next)
      return std::nullopt;
    SplitLevels run;
    for (const AxisRefList &level : *next) {
      if (!std::all_of(level.begin(), level.end(), ok))
        break;
      run.push_back(level);
      if (!even[d])
        break;
    }
    if (run.empty())
      return std::nullopt;
    return run;
  }

  bool reduceScatter() {
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      auto run = appendableRun(d, [&](const AxisRef &f) {
        return contains(cur.partial, f) && !contains(keep, f);
      });
      if (!run)
        continue;
      Layout before = cur;
      AxisRefList refs = concat(run->begin(), run->end());
      for (const AxisRef &f : refs)
        cur.partial.erase(std::find(cur.partial.begin(), cur.partial.end(), f));
      cur.dims[d].insert(cur.dims[d].end(), run->begin(), run->end());
      emit(StepKind::ReduceScatter, refs, static_cast<int>(d), -1, before);
      return true;
    }
    return false;
  }

  bool localSlice() {
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      auto run =
          appendableRun(d, [&](const AxisRef &f) { return isReplicated(f); });
      if (!run)
        continue;
      Layout before = cur;
      cur.dims[d].insert(cur.dims[d].end(), run->begin(), run->end());
      emit(StepKind::LocalSlice, concat(run->begin(), run->end()),
           static_cast<int>(d), -1, before);
      return true;
    }
    return false;
  }

  bool allToAll() {
    for (size_t i = 0; i < cur.dims.size(); ++i) {
      size_t keepLen = commonPrefix(cur.dims[i], target.dims[i]);
      size_t removable = cur.dims[i].size() - keepLen;
      if (removable == 0)
        continue;
      for (size_t j = 0; j < cur.dims.size(); ++j) {
        if (j == i)
          continue;
        auto next = nextFor(j);
        if (!next)
          continue;
        // Longest suffix of dim i (beyond what it keeps) that dim j wants
        // next, in the same order; one level when dim j is uneven, because
        // the receiving side chunks once by the group's size.
        size_t most = std::min(removable, next->size());
        if (!even[j])
          most = std::min<size_t>(most, 1);
        for (size_t k = most; k >= 1; --k) {
          SplitLevels suffix(cur.dims[i].end() - k, cur.dims[i].end());
          if (!std::equal(suffix.begin(), suffix.end(), next->begin()))
            continue;
          Layout before = cur;
          cur.dims[i].resize(cur.dims[i].size() - k);
          cur.dims[j].insert(cur.dims[j].end(), suffix.begin(), suffix.end());
          emit(StepKind::AllToAll, concat(suffix.begin(), suffix.end()),
               static_cast<int>(i), static_cast<int>(j), before);
          return true;
        }
      }
    }
    return false;
  }

  /// An even dim whose off-target suffix holds the same factors as the
  /// target's: every box keeps its size and only moves between ranks.
  bool permute() {
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      if (!even[d] || cur.dims[d].size() != target.dims[d].size())
        continue;
      size_t keepLen = commonPrefix(cur.dims[d], target.dims[d]);
      if (keepLen == cur.dims[d].size())
        continue;
      SplitLevels from(cur.dims[d].begin() + keepLen, cur.dims[d].end());
      SplitLevels to(target.dims[d].begin() + keepLen, target.dims[d].end());
      if (!std::is_permutation(from.begin(), from.end(), to.begin()))
        continue;
      Layout before = cur;
      cur.dims[d] = target.dims[d];
      emit(StepKind::Permute, concat(from.begin(), from.end()),
           static_cast<int>(d), -1, before);
      plan.steps.back().dstAxes =
          canonicalizeRefs(mesh, concat(to.begin(), to.end()));
      return true;
    }
    return false;
  }

  /// Reduces, in one all_reduce, every pending factor that the target
  /// neither keeps partial nor scatters into a dim.
  bool allReduceUnneeded() {
    AxisRefList run;
    for (const AxisRef &f : pendingPartial()) {
      bool scattered = false;
      for (const SplitLevels &levels : target.dims)
        scattered |= levelsContain(levels, f);
      if (!scattered)
        run.push_back(f);
    }
    if (run.empty())
      return false;
    allReduce(run);
    return true;
  }

  void allReduce(const AxisRefList &run) {
    Layout before = cur;
    for (const AxisRef &f : run)
      cur.partial.erase(std::find(cur.partial.begin(), cur.partial.end(), f));
    emit(StepKind::AllReduce, run, -1, -1, before);
  }

  /// Gathers the minor end of one dim that is off its target: only the
  /// levels behind the last level another dim wants (so that one can move by
  /// all_to_all next); the whole off-target suffix when nothing else can
  /// make progress. False when every dim is on its way to the target.
  bool gatherOne() {
    std::optional<size_t> fallback;
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      size_t keepLen = commonPrefix(cur.dims[d], target.dims[d]);
      if (keepLen == cur.dims[d].size())
        continue;
      if (!fallback)
        fallback = d;
      size_t cut = cur.dims[d].size();
      while (cut > keepLen && !wantedElsewhere(cur.dims[d][cut - 1], d))
        --cut;
      if (cut == cur.dims[d].size())
        continue; // its last level waits to move by all_to_all
      gather(d, cut);
      return true;
    }
    if (!fallback)
      return false;
    gather(*fallback,
           commonPrefix(cur.dims[*fallback], target.dims[*fallback]));
    return true;
  }

  bool wantedElsewhere(const AxisRefList &level, size_t d) const {
    for (size_t j = 0; j < target.dims.size(); ++j)
      if (j != d)
        for (const AxisRef &f : level)
          if (levelsContain(target.dims[j], f))
            return true;
    return false;
  }

  void gather(size_t d, size_t keepLen) {
    Layout before = cur;
    AxisRefList removed =
        concat(cur.dims[d].begin() + keepLen, cur.dims[d].end());
    cur.dims[d].resize(keepLen);
    emit(StepKind::AllGather, removed, static_cast<int>(d), -1, before);
  }

  void emit(StepKind kind, const AxisRefList &factors, int dim, int dstDim,
            const Layout &before) {
    RedistributeStep step;
    step.kind = kind;
    step.axes = canonicalizeRefs(mesh, factors);
    step.dim = dim;
    step.dstDim = dstDim;
    // A reduction performs the pending op; mark_partial declares the new
    // one (the planner reduced any pending partial with another op first).
    step.op = kind == StepKind::MarkPartial ? cur.reduceOp : before.reduceOp;
    step.before = normalizeLayout(mesh, before);
    step.after = normalizeLayout(mesh, cur);
    step.groupSize = refsSize(factors);
    // A local shard has at most kMaxTensorElements (2^50) elements and a
    // group at most 2^31 members, so (g - 1) * elements * bytes needs up to
    // 2^87: computed in 128 bits, saturated (found by fuzz-spec).
    using Wide = __int128;
    auto saturate = [](Wide bytes) {
      return bytes > Wide(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(bytes);
    };
    Wide g = step.groupSize;
    std::vector<int64_t> in = paddedShapeOf(before, shape);
    std::vector<int64_t> out = paddedShapeOf(cur, shape);
    switch (kind) {
    case StepKind::AllGather:
      step.bytesPerRank = saturate((g - 1) * product(in) * elementBytes);
      break;
    case StepKind::ReduceScatter:
      step.bytesPerRank = saturate((g - 1) * product(out) * elementBytes);
      break;
    case StepKind::AllReduce:
      step.bytesPerRank =
          saturate(2 * (g - 1) * product(in) * elementBytes / g);
      break;
    case StepKind::AllToAll: {
      std::vector<int64_t> piece = in;
      piece[dstDim] = out[dstDim];
      step.bytesPerRank = saturate((g - 1) * product(piece) * elementBytes);
      break;
    }
    case StepKind::Permute:
      step.bytesPerRank = saturate(Wide(product(in)) * elementBytes);
      break;
    case StepKind::LocalSlice:
    case StepKind::MarkPartial:
    case StepKind::Broadcast:
      step.bytesPerRank = 0;
      break;
    }
    plan.steps.push_back(std::move(step));
  }

  const Mesh &mesh;
  std::vector<int64_t> shape;
  int64_t elementBytes;
  AxisRefList universe;
  std::vector<bool> even;
  Layout cur, target;
  AxisRefList keep; ///< partial factors the target keeps partial
  RedistributePlan plan;
};

} // namespace

Result<Layout> applyStep(const View &view, const Layout &before,
                         const StepSpec &step,
                         const std::vector<int64_t> &shape) {
  const Mesh &mesh = view.mesh();
  std::string name(stepKindName(step.kind));
  if (before.rank() != static_cast<int>(shape.size()))
    return makeError("layout has " + std::to_string(before.rank()) +
                     " dims but the tensor has " +
                     std::to_string(shape.size()));
  auto axesOk = checkRefsCompatible(mesh, step.axes, name + " axes");
  if (!axesOk)
    return axesOk.error();
  AxisRefList universe = view.refs();
  for (const AxisRefList *list : {&step.axes, &step.dstAxes}) {
    for (const AxisRef &ref : *list)
      if (!refsCover(mesh, view.refs(), {ref}))
        return makeError(name + ": axis \"" + formatAxisRef(mesh, ref) +
                         "\" is not in the view (axes: " + view.axisNameList() +
                         ")");
    universe.insert(universe.end(), list->begin(), list->end());
  }
  AxisRefList used = before.usedRefs();
  universe.insert(universe.end(), used.begin(), used.end());
  auto nest = checkRefsNest(mesh, universe, name + " axes and layout");
  if (!nest)
    return nest.error();
  auto factors = [&](const AxisRefList &refs) {
    return splitIntoFactors(mesh, refs, universe);
  };
  AxisRefList axesF = factors(step.axes);
  AxisRefList usedF = factors(used);
  AxisRefList partialF = factors(before.partial);
  auto checkDim = [&](int d, const char *what) -> Result<void> {
    if (d < 0 || d >= before.rank())
      return makeError(name + ": " + what + " " + std::to_string(d) +
                       " is out of range for a " +
                       std::to_string(before.rank()) + "-d tensor");
    return {};
  };
  auto axesText = "{" + formatAxisRefs(mesh, step.axes) + "}";
  // Removes from dim d the minor-most levels whose refs are exactly the
  // step's axes.
  auto strip = [&](Layout &l, int d) -> Result<void> {
    SplitLevels &levels = l.dims[d];
    AxisRefList tail;
    for (size_t k = 1; k <= levels.size(); ++k) {
      const AxisRefList &level = levels[levels.size() - k];
      tail.insert(tail.begin(), level.begin(), level.end());
      if (factors(tail) == axesF) {
        levels.resize(levels.size() - k);
        return {};
      }
    }
    return makeError(name + ": axes " + axesText +
                     " are not the minor-most levels of dim " +
                     std::to_string(d) + " (its axes: {" +
                     formatAxisRefs(mesh, l.dimRefs(d)) + "})");
  };
  auto requireAll = [&](const AxisRefList &set, const char *what,
                        bool wantIn) -> Result<void> {
    for (const AxisRef &f : axesF)
      if ((std::find(set.begin(), set.end(), f) != set.end()) != wantIn)
        return makeError(name + ": axis \"" + formatAxisRef(mesh, f) +
                         "\" is " + (wantIn ? "not " : "") + what +
                         " in the operand's layout");
    return {};
  };
  auto removePartial = [&](Layout &l) {
    AxisRefList rest;
    for (const AxisRef &f : partialF)
      if (std::find(axesF.begin(), axesF.end(), f) == axesF.end())
        rest.push_back(f);
    l.partial = canonicalizeRefs(mesh, rest);
  };
  auto checkOp = [&]() -> Result<void> {
    if (step.op != before.reduceOp)
      return makeError(name + ": reduce op " +
                       std::string(reduceOpName(step.op)) +
                       " differs from the operand's pending " +
                       std::string(reduceOpName(before.reduceOp)));
    return {};
  };
  if (step.axes.empty() && step.kind != StepKind::Broadcast)
    return makeError(name + ": empty axis list");

  Layout after = before;
  Result<void> ok;
  switch (step.kind) {
  case StepKind::AllGather:
    if (!(ok = checkDim(step.dim, "dim")))
      return ok.error();
    if (!(ok = strip(after, step.dim)))
      return ok.error();
    break;
  case StepKind::LocalSlice:
    if (!(ok = checkDim(step.dim, "dim")))
      return ok.error();
    if (!(ok = requireAll(usedF, "split or partial", false)))
      return ok.error();
    after.dims[step.dim].push_back(step.axes);
    break;
  case StepKind::ReduceScatter:
    if (!(ok = checkDim(step.dim, "dim")) ||
        !(ok = requireAll(partialF, "partial", true)) || !(ok = checkOp()))
      return ok.error();
    removePartial(after);
    after.dims[step.dim].push_back(step.axes);
    break;
  case StepKind::AllReduce:
    if (!(ok = requireAll(partialF, "partial", true)) || !(ok = checkOp()))
      return ok.error();
    removePartial(after);
    break;
  case StepKind::AllToAll:
    if (!(ok = checkDim(step.dim, "source dim")) ||
        !(ok = checkDim(step.dstDim, "target dim")))
      return ok.error();
    if (step.dim == step.dstDim)
      return makeError(name + ": source and target dim are both " +
                       std::to_string(step.dim));
    if (!(ok = strip(after, step.dim)))
      return ok.error();
    after.dims[step.dstDim].push_back(step.axes);
    break;
  case StepKind::Permute: {
    if (!(ok = checkDim(step.dim, "dim")))
      return ok.error();
    AxisRefList dstF = factors(step.dstAxes);
    if (!std::is_permutation(axesF.begin(), axesF.end(), dstF.begin(),
                             dstF.end()))
      return makeError(name + ": {" + formatAxisRefs(mesh, step.dstAxes) +
                       "} is not a reordering of " + axesText);
    if (!(ok = strip(after, step.dim)))
      return ok.error();
    if (shape[step.dim] % refsSize(before.dimRefs(step.dim)) != 0)
      return makeError(name + ": dim " + std::to_string(step.dim) + " (size " +
                       std::to_string(shape[step.dim]) +
                       ") is not split evenly, so boxes differ in size and "
                       "cannot be permuted");
    after.dims[step.dim].push_back(step.dstAxes);
    break;
  }
  case StepKind::MarkPartial:
    if (!(ok = requireAll(usedF, "split or partial", false)))
      return ok.error();
    if (!before.partial.empty() && !(ok = checkOp()))
      return ok.error();
    after.partial.insert(after.partial.end(), step.axes.begin(),
                         step.axes.end());
    after.reduceOp = step.op;
    break;
  case StepKind::Broadcast:
    break;
  }
  auto valid = verifyLayout(view, after);
  if (!valid)
    return valid.error().within(name);
  return normalizeLayout(mesh, after);
}

/// Sets the digits of `refs` in a position to the mixed-radix digits of
/// `index` (first ref most significant).
static int64_t withGroupIndex(const Mesh &mesh, const AxisRefList &refs,
                              int64_t position, int64_t index) {
  for (auto it = refs.rbegin(); it != refs.rend(); ++it) {
    int64_t digit = index % it->size;
    index /= it->size;
    position +=
        (digit - it->coordinateAt(mesh, position)) * it->positionStep(mesh);
  }
  return position;
}

Result<PermutePeers> permutePeers(const Mesh &mesh,
                                  const RedistributeStep &step, int64_t rank) {
  if (step.kind != StepKind::Permute)
    return makeError("permutePeers: step is " +
                     std::string(stepKindName(step.kind)) + ", not permute");
  auto position = mesh.positionOf(rank);
  if (!position)
    return position.error();
  // This rank holds box `mine` among the group's boxes (source order); the
  // rank that holds that box afterwards has it as its target-order index.
  int64_t mine = *groupIndexOf(mesh, step.axes, rank);
  int64_t wanted = *groupIndexOf(mesh, step.dstAxes, rank);
  return PermutePeers{
      mesh.rankAt(withGroupIndex(mesh, step.dstAxes, *position, mine)),
      mesh.rankAt(withGroupIndex(mesh, step.axes, *position, wanted))};
}

Result<RedistributePlan> planRedistribute(const View &view, const Layout &from,
                                          const Layout &to,
                                          const std::vector<int64_t> &shape,
                                          int64_t elementBytes) {
  for (const auto &[layout, what] :
       {std::pair{&from, "source"}, std::pair{&to, "target"}}) {
    if (layout->dims.size() != shape.size())
      return makeError(std::string(what) + " layout has " +
                       std::to_string(layout->dims.size()) +
                       " dims but the tensor shape has " +
                       std::to_string(shape.size()));
    auto ok = verifyLayout(view, *layout);
    if (!ok)
      return ok.error().within(std::string(what) + " layout");
  }
  AxisRefList all = view.refs();
  for (const Layout *l : {&from, &to}) {
    AxisRefList used = l->usedRefs();
    all.insert(all.end(), used.begin(), used.end());
  }
  auto nest = checkRefsNest(view.mesh(), all, "source and target layouts");
  if (!nest)
    return nest.error();
  if (elementBytes < 1 || elementBytes > 64)
    return makeError("element size must be 1..64 bytes");
  auto shapeOk = checkShape(shape);
  if (!shapeOk)
    return shapeOk.error();
  return Planner(view, from, to, shape, elementBytes).run();
}

} // namespace meshplan
