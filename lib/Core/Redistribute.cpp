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

bool isPrefix(const AxisRefList &prefix, const AxisRefList &of) {
  return prefix.size() <= of.size() &&
         std::equal(prefix.begin(), prefix.end(), of.begin());
}

size_t commonPrefix(const AxisRefList &a, const AxisRefList &b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n])
    ++n;
  return n;
}

int64_t product(const std::vector<int64_t> &v) {
  int64_t p = 1;
  for (int64_t x : v)
    p *= x;
  return p;
}

class Planner {
public:
  Planner(const View &view, const Layout &from, const Layout &to,
          const std::vector<int64_t> &shape, int64_t elementBytes)
      : view(view), mesh(view.mesh()), shape(shape),
        elementBytes(elementBytes) {
    universe = view.refs();
    for (const Layout *l : {&from, &to}) {
      AxisRefList used = l->usedRefs();
      universe.insert(universe.end(), used.begin(), used.end());
    }
    cur = toFactors(from);
    target = toFactors(to);
  }

  RedistributePlan run() {
    // A pending reduction with a different op than the target's must finish
    // first; the target's partial is re-declared at the end.
    AxisRefList keep;
    if (cur.reduceOp == target.reduceOp || cur.partial.empty())
      for (const AxisRef &f : cur.partial)
        if (contains(target.partial, f))
          keep.push_back(f);
    if (!cur.partial.empty() && !target.partial.empty() &&
        cur.reduceOp != target.reduceOp)
      allReduce(cur.partial);

    for (int guard = 0; guard < 1000 && !done(keep); ++guard) {
      if (reduceScatter(keep) || allToAll() || localSlice() ||
          allReduceUnneeded(keep) || permute())
        continue;
      gatherOne();
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
    for (const AxisRefList &dim : l.dims)
      out.dims.push_back(splitIntoFactors(mesh, dim, universe));
    out.partial = splitIntoFactors(mesh, l.partial, universe);
    return out;
  }

  bool done(const AxisRefList &keep) const {
    if (cur.dims != target.dims)
      return false;
    for (const AxisRef &f : cur.partial)
      if (!contains(keep, f))
        return false;
    return true;
  }

  bool isReplicated(const AxisRef &f) const {
    if (contains(cur.partial, f))
      return false;
    for (const AxisRefList &dim : cur.dims)
      if (contains(dim, f))
        return false;
    return true;
  }

  /// Factors the target appends to dim d next, if d is on the way there.
  std::optional<AxisRefList> nextFor(size_t d) const {
    if (!isPrefix(cur.dims[d], target.dims[d]))
      return std::nullopt;
    return AxisRefList(target.dims[d].begin() + cur.dims[d].size(),
                       target.dims[d].end());
  }

  bool reduceScatter(const AxisRefList &keep) {
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      auto next = nextFor(d);
      if (!next)
        continue;
      AxisRefList run;
      for (const AxisRef &f : *next) {
        if (!contains(cur.partial, f) || contains(keep, f))
          break;
        run.push_back(f);
      }
      if (run.empty())
        continue;
      Layout before = cur;
      for (const AxisRef &f : run)
        cur.partial.erase(std::find(cur.partial.begin(), cur.partial.end(), f));
      cur.dims[d].insert(cur.dims[d].end(), run.begin(), run.end());
      emit(StepKind::ReduceScatter, run, static_cast<int>(d), -1, before);
      return true;
    }
    return false;
  }

  bool allToAll() {
    for (size_t i = 0; i < cur.dims.size(); ++i) {
      size_t keepLen = commonPrefix(cur.dims[i], target.dims[i]);
      if (keepLen == cur.dims[i].size())
        continue;
      for (size_t j = 0; j < cur.dims.size(); ++j) {
        if (j == i)
          continue;
        auto next = nextFor(j);
        if (!next)
          continue;
        // Longest suffix of dim i (beyond what it keeps) that dim j wants
        // next, in the same order.
        size_t removable = cur.dims[i].size() - keepLen;
        for (size_t k = std::min(removable, next->size()); k >= 1; --k) {
          AxisRefList suffix(cur.dims[i].end() - k, cur.dims[i].end());
          if (!std::equal(suffix.begin(), suffix.end(), next->begin()))
            continue;
          Layout before = cur;
          cur.dims[i].resize(cur.dims[i].size() - k);
          cur.dims[j].insert(cur.dims[j].end(), suffix.begin(), suffix.end());
          emit(StepKind::AllToAll, suffix, static_cast<int>(i),
               static_cast<int>(j), before);
          return true;
        }
      }
    }
    return false;
  }

  bool localSlice() {
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      auto next = nextFor(d);
      if (!next)
        continue;
      AxisRefList run;
      for (const AxisRef &f : *next) {
        if (!isReplicated(f))
          break;
        run.push_back(f);
      }
      if (run.empty())
        continue;
      Layout before = cur;
      cur.dims[d].insert(cur.dims[d].end(), run.begin(), run.end());
      emit(StepKind::LocalSlice, run, static_cast<int>(d), -1, before);
      return true;
    }
    return false;
  }

  /// A dim whose off-target suffix holds the same factors as the target's,
  /// on a dim that splits evenly at every level: every box keeps its size
  /// and only moves between ranks.
  bool permute() {
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      size_t keepLen = commonPrefix(cur.dims[d], target.dims[d]);
      if (keepLen == cur.dims[d].size() ||
          cur.dims[d].size() != target.dims[d].size())
        continue;
      AxisRefList from(cur.dims[d].begin() + keepLen, cur.dims[d].end());
      AxisRefList to(target.dims[d].begin() + keepLen, target.dims[d].end());
      if (!std::is_permutation(from.begin(), from.end(), to.begin()))
        continue;
      if (shape[d] % refsSize(cur.dims[d]) != 0)
        continue; // uneven boxes differ in size: gather and slice instead
      Layout before = cur;
      cur.dims[d] = target.dims[d];
      emit(StepKind::Permute, from, static_cast<int>(d), -1, before);
      plan.steps.back().dstAxes = canonicalizeRefs(mesh, to);
      return true;
    }
    return false;
  }

  /// Reduces, in one all_reduce, every pending factor that the target
  /// neither keeps partial nor scatters into a dim.
  bool allReduceUnneeded(const AxisRefList &keep) {
    AxisRefList run;
    for (const AxisRef &f : cur.partial) {
      if (contains(keep, f))
        continue;
      bool scattered = false;
      for (const AxisRefList &dim : target.dims)
        scattered |= contains(dim, f);
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

  /// Gathers the minor end of one dim that is off its target: only the tail
  /// behind the last factor another dim wants (so that factor can move by
  /// all_to_all next); the whole off-target suffix when nothing else can
  /// make progress.
  void gatherOne() {
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
        continue; // its last factor waits to move by all_to_all
      gather(d, cut == keepLen ? keepLen : cut);
      return;
    }
    if (fallback)
      gather(*fallback,
             commonPrefix(cur.dims[*fallback], target.dims[*fallback]));
  }

  bool wantedElsewhere(const AxisRef &f, size_t d) const {
    for (size_t j = 0; j < target.dims.size(); ++j)
      if (j != d && contains(target.dims[j], f))
        return true;
    return false;
  }

  void gather(size_t d, size_t keepLen) {
    Layout before = cur;
    AxisRefList removed(cur.dims[d].begin() + keepLen, cur.dims[d].end());
    cur.dims[d].resize(keepLen);
    emit(StepKind::AllGather, removed, static_cast<int>(d), -1, before);
  }

  Layout canonical(const Layout &l) const {
    Layout out = l;
    for (AxisRefList &dim : out.dims)
      dim = canonicalizeRefs(mesh, dim);
    out.partial = canonicalizeRefs(mesh, out.partial);
    return out;
  }

  void emit(StepKind kind, const AxisRefList &factors, int dim, int dstDim,
            const Layout &before) {
    RedistributeStep step;
    step.kind = kind;
    step.axes = canonicalizeRefs(mesh, factors);
    step.dim = dim;
    step.dstDim = dstDim;
    step.op = before.reduceOp;
    step.before = canonical(before);
    step.after = canonical(cur);
    step.groupSize = refsSize(factors);
    int64_t g = step.groupSize;
    std::vector<int64_t> in = paddedShapeOf(before, shape);
    std::vector<int64_t> out = paddedShapeOf(cur, shape);
    switch (kind) {
    case StepKind::AllGather:
      step.bytesPerRank = (g - 1) * product(in) * elementBytes;
      break;
    case StepKind::ReduceScatter:
      step.bytesPerRank = (g - 1) * product(out) * elementBytes;
      break;
    case StepKind::AllReduce:
      step.bytesPerRank = 2 * (g - 1) * product(in) * elementBytes / g;
      break;
    case StepKind::AllToAll: {
      std::vector<int64_t> piece = in;
      piece[dstDim] = out[dstDim];
      step.bytesPerRank = (g - 1) * product(piece) * elementBytes;
      break;
    }
    case StepKind::Permute:
      step.bytesPerRank = product(in) * elementBytes;
      break;
    case StepKind::LocalSlice:
    case StepKind::MarkPartial:
      step.bytesPerRank = 0;
      break;
    }
    plan.steps.push_back(std::move(step));
  }

  const View &view;
  const Mesh &mesh;
  std::vector<int64_t> shape;
  int64_t elementBytes;
  AxisRefList universe;
  Layout cur, target;
  RedistributePlan plan;
};

} // namespace

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
  if (elementBytes < 1)
    return makeError("element size must be >= 1 byte");
  return Planner(view, from, to, shape, elementBytes).run();
}

} // namespace meshplan
