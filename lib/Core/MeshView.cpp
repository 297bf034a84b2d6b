//===- MeshView.cpp - Views, groups and split keys ------------------------===//

#include "meshplan/Core/MeshView.h"
#include "meshplan/Core/Text.h"

#include <algorithm>
#include <limits>
#include <set>

namespace meshplan {

//===----------------------------------------------------------------------===//
// LiveMembers
//===----------------------------------------------------------------------===//

Result<void> LiveMembers::set(const Mesh &mesh, int axis,
                              std::vector<int64_t> coords) {
  const MeshAxis &a = mesh.axis(axis);
  if (!a.managed)
    return makeError("axis \"" + a.name +
                     "\" is not managed; only managed axes take live members");
  std::sort(coords.begin(), coords.end());
  for (size_t i = 0; i < coords.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= a.size)
      return makeError("live member " + std::to_string(coords[i]) +
                       " of managed axis \"" + a.name + "\" is outside 0.." +
                       std::to_string(a.size - 1));
    if (i && coords[i] == coords[i - 1])
      return makeError("live member " + std::to_string(coords[i]) +
                       " of managed axis \"" + a.name + "\" is listed twice");
  }
  if (coords.empty())
    return makeError("managed axis \"" + a.name + "\" has no live members");
  live[axis] = std::move(coords);
  return {};
}

const std::vector<int64_t> *LiveMembers::find(int axis) const {
  auto it = live.find(axis);
  return it == live.end() ? nullptr : &it->second;
}

Result<void> LiveMembers::checkLive(const Mesh &mesh, int64_t position) const {
  for (const auto &[axis, coords] : live) {
    int64_t c = mesh.coordinateAt(position, axis);
    if (!std::binary_search(coords.begin(), coords.end(), c))
      return makeError("rank " + std::to_string(mesh.rankAt(position)) +
                       " is not live: coordinate " + std::to_string(c) +
                       " of managed axis \"" + mesh.axis(axis).name +
                       "\" is not among its live members");
  }
  return {};
}

//===----------------------------------------------------------------------===//
// Group arithmetic
//===----------------------------------------------------------------------===//

/// Live digits of a ref, or null when every digit is live. Managed axes are
/// never split (makeAxisRef), so a managed ref is always the whole axis.
static const std::vector<int64_t> *liveDigits(const AxisRef &ref,
                                              const LiveMembers *live) {
  return live ? live->find(ref.axis) : nullptr;
}

/// Zeroes the digits of `refs` in a position: the group's first position.
static int64_t groupBase(const Mesh &mesh, const AxisRefList &refs,
                         int64_t position) {
  int64_t base = position;
  for (const AxisRef &ref : refs)
    base -= ref.coordinateAt(mesh, position) * ref.positionStep(mesh);
  return base;
}

static Result<int64_t> groupIndexAt(const Mesh &mesh, const AxisRefList &refs,
                                    int64_t position, const LiveMembers *live) {
  if (live) {
    auto alive = live->checkLive(mesh, position);
    if (!alive)
      return alive.error();
  }
  int64_t index = 0;
  for (const AxisRef &ref : refs) {
    int64_t digit = ref.coordinateAt(mesh, position);
    if (const auto *digits = liveDigits(ref, live)) {
      auto it = std::lower_bound(digits->begin(), digits->end(), digit);
      index =
          index * static_cast<int64_t>(digits->size()) + (it - digits->begin());
    } else {
      index = index * ref.size + digit;
    }
  }
  return index;
}

Result<int64_t> groupIndexOf(const Mesh &mesh, const AxisRefList &refs,
                             int64_t rank, const LiveMembers *live) {
  auto position = mesh.positionOf(rank);
  if (!position)
    return position.error();
  return groupIndexAt(mesh, refs, *position, live);
}

static std::vector<int64_t> groupAtBase(const Mesh &mesh,
                                        const AxisRefList &refs, int64_t base,
                                        const LiveMembers *live) {
  std::vector<int64_t> offsets{0};
  for (const AxisRef &ref : refs) {
    int64_t step = ref.positionStep(mesh);
    std::vector<int64_t> next;
    const auto *digits = liveDigits(ref, live);
    int64_t count = digits ? static_cast<int64_t>(digits->size()) : ref.size;
    next.reserve(offsets.size() * count);
    for (int64_t offset : offsets)
      for (int64_t i = 0; i < count; ++i)
        next.push_back(offset + (digits ? (*digits)[i] : i) * step);
    offsets = std::move(next);
  }
  for (int64_t &offset : offsets)
    offset = mesh.rankAt(base + offset);
  return offsets;
}

Result<std::vector<int64_t>> groupOf(const Mesh &mesh, const AxisRefList &refs,
                                     int64_t rank, const LiveMembers *live) {
  auto position = mesh.positionOf(rank);
  if (!position)
    return position.error();
  // A dead rank belongs to no group.
  auto index = groupIndexAt(mesh, refs, *position, live);
  if (!index)
    return index.error();
  // Listing costs memory and time linear in the group size; refuse before
  // allocating (a mesh axis of 2^31 would otherwise take 16 GiB per group).
  int64_t members = groupSizeOf(mesh, refs, live);
  if (members > kMaxGroupMembers)
    return makeError("the group over [" + formatAxisRefs(mesh, refs) +
                     "] has " + std::to_string(members) +
                     " members; groups that are listed member by member have "
                     "at most " +
                     kMaxGroupMembersText + " (docs/limits.md)");
  return groupAtBase(mesh, refs, groupBase(mesh, refs, *position), live);
}

int64_t groupSizeOf(const Mesh &mesh, const AxisRefList &refs,
                    const LiveMembers *live) {
  // Saturates rather than wraps for ref lists that are not validated yet.
  int64_t size = 1;
  for (const AxisRef &ref : refs) {
    const auto *digits = liveDigits(ref, live);
    if (mulOverflows(size,
                     digits ? static_cast<int64_t>(digits->size()) : ref.size,
                     &size))
      return std::numeric_limits<int64_t>::max();
  }
  (void)mesh;
  return size;
}

Result<SplitKey> splitKeyOf(const Mesh &mesh, const AxisRefList &refs,
                            int64_t rank, const LiveMembers *live) {
  auto position = mesh.positionOf(rank);
  if (!position)
    return position.error();
  auto index = groupIndexAt(mesh, refs, *position, live);
  if (!index)
    return index.error();
  // The first position of the group is unique per group and the same for all
  // members: a color every backend's split accepts (non-negative, < world).
  return SplitKey{groupBase(mesh, refs, *position), *index};
}

std::string partitionKeyOf(const Mesh &mesh, const AxisRefList &refs) {
  return "[" + formatAxisRefs(mesh, canonicalizeRefs(mesh, refs)) + "]";
}

std::vector<std::vector<int64_t>> listGroupsOf(const Mesh &mesh,
                                               const AxisRefList &refs,
                                               const LiveMembers *live) {
  std::vector<std::vector<int64_t>> groups;
  for (int64_t position = 0; position < mesh.size(); ++position) {
    if (groupBase(mesh, refs, position) != position)
      continue;
    std::vector<int64_t> group = groupAtBase(mesh, refs, position, live);
    // The base may be dead on an axis inside the group; its first member
    // tells whether the coordinates outside the group are live.
    auto first = mesh.positionOf(group.front());
    if (live && !live->checkLive(mesh, *first))
      continue;
    groups.push_back(std::move(group));
  }
  return groups;
}

bool touchesManaged(const Mesh &mesh, const AxisRefList &refs) {
  return std::any_of(refs.begin(), refs.end(), [&](const AxisRef &ref) {
    return ref.size > 1 && mesh.axis(ref.axis).managed;
  });
}

//===----------------------------------------------------------------------===//
// View
//===----------------------------------------------------------------------===//

View View::root(std::shared_ptr<const Mesh> mesh) {
  std::vector<ViewAxis> axes;
  for (int i = 0; i < mesh->numAxes(); ++i)
    axes.push_back({mesh->axis(i).name, {AxisRef{i, 1, mesh->axis(i).size}}});
  return View(std::move(mesh), std::move(axes));
}

Result<View> View::create(std::shared_ptr<const Mesh> mesh,
                          std::vector<ViewAxis> axes) {
  std::set<std::string> names;
  AxisRefList all;
  for (const ViewAxis &axis : axes) {
    if (axis.name.empty())
      return makeError("view axis with an empty name");
    if (!names.insert(axis.name).second)
      return makeError("view has two axes named \"" + axis.name + "\"");
    all.insert(all.end(), axis.refs.begin(), axis.refs.end());
  }
  auto ok = checkRefsCompatible(*mesh, all, "view");
  if (!ok)
    return ok.error();
  return View(std::move(mesh), std::move(axes));
}

std::optional<int> View::findAxis(std::string_view name) const {
  for (size_t i = 0; i < viewAxes.size(); ++i)
    if (viewAxes[i].name == name)
      return static_cast<int>(i);
  return std::nullopt;
}

std::string View::axisNameList() const {
  std::string out;
  for (const ViewAxis &axis : viewAxes)
    out += (out.empty() ? "" : ", ") + axis.name;
  return out;
}

AxisRefList View::refs() const {
  AxisRefList all;
  for (const ViewAxis &axis : viewAxes)
    all.insert(all.end(), axis.refs.begin(), axis.refs.end());
  return all;
}

Result<std::vector<int>>
View::axisIndices(const std::vector<std::string> &names) const {
  std::vector<int> indices;
  for (const std::string &name : names) {
    auto index = findAxis(name);
    if (!index)
      return makeError("axis \"" + name +
                       "\" is not in the view (axes: " + axisNameList() + ")");
    if (std::find(indices.begin(), indices.end(), *index) != indices.end())
      return makeError("axis \"" + name + "\" is named twice");
    indices.push_back(*index);
  }
  return indices;
}

AxisRefList View::refsOf(const std::vector<int> &axisIndices) const {
  AxisRefList out;
  for (int index : axisIndices)
    out.insert(out.end(), viewAxes[index].refs.begin(),
               viewAxes[index].refs.end());
  return out;
}

Result<std::vector<int64_t>> View::coordinate(int64_t rank) const {
  auto position = mesh().positionOf(rank);
  if (!position)
    return position.error();
  std::vector<int64_t> coord;
  for (const ViewAxis &axis : viewAxes) {
    int64_t index = 0;
    for (const AxisRef &ref : axis.refs)
      index = index * ref.size + ref.coordinateAt(mesh(), *position);
    coord.push_back(index);
  }
  return coord;
}

Result<int64_t> View::localRank(int64_t rank,
                                const std::vector<int> &axes) const {
  return groupIndexOf(mesh(), refsOf(axes), rank);
}

Result<std::vector<int64_t>> View::group(int64_t rank,
                                         const std::vector<int> &axes,
                                         const LiveMembers *live) const {
  return groupOf(mesh(), refsOf(axes), rank, live);
}

Result<SplitKey> View::split(int64_t rank, const std::vector<int> &axes,
                             const LiveMembers *live) const {
  return splitKeyOf(mesh(), refsOf(axes), rank, live);
}

std::string View::partitionKey(const std::vector<int> &axes) const {
  return partitionKeyOf(mesh(), refsOf(axes));
}

std::string View::str() const {
  std::string out = "(";
  for (size_t i = 0; i < viewAxes.size(); ++i) {
    const ViewAxis &axis = viewAxes[i];
    if (i)
      out += ", ";
    out += axis.name;
    bool plain = axis.refs.size() == 1 && axis.refs[0].isWhole(mesh()) &&
                 mesh().axis(axis.refs[0].axis).name == axis.name;
    if (!plain)
      out += "=[" + formatAxisRefs(mesh(), axis.refs) + "]";
    out += "=" + std::to_string(axis.size());
  }
  return out + ")";
}

//===----------------------------------------------------------------------===//
// AxisNamespace
//===----------------------------------------------------------------------===//

AxisNamespace::AxisNamespace(std::shared_ptr<const Mesh> mesh)
    : meshPtr(std::move(mesh)) {
  for (int i = 0; i < meshPtr->numAxes(); ++i)
    names[meshPtr->axis(i).name] = {AxisRef{i, 1, meshPtr->axis(i).size}};
}

Result<void> AxisNamespace::define(const std::string &name,
                                   const AxisRefList &refs) {
  if (name.empty())
    return makeError("empty axis name");
  // Names end up in every output (JSON included) and in plans: the rule of
  // mesh axes (found by fuzz-layout: a flatten name of arbitrary bytes made
  // --json fail on invalid UTF-8, exit 3).
  if (!isIdentifier(name))
    return makeError("axis name \"" + printable(name) +
                     "\" is not an identifier (letters, digits, _)");
  const Mesh &mesh = *meshPtr;
  auto it = names.find(name);
  if (it == names.end()) {
    names[name] = refs;
    return {};
  }
  if (canonicalizeRefs(mesh, it->second) == canonicalizeRefs(mesh, refs))
    return {};
  if (mesh.findAxis(name))
    return makeError("name \"" + name +
                     "\" is a mesh axis; it cannot also name [" +
                     formatAxisRefs(mesh, refs) + "]");
  return makeError("name \"" + name + "\" already names [" +
                   formatAxisRefs(mesh, it->second) +
                   "]; it cannot also name [" + formatAxisRefs(mesh, refs) +
                   "]");
}

const AxisRefList *AxisNamespace::lookup(std::string_view name) const {
  auto it = names.find(name);
  return it == names.end() ? nullptr : &it->second;
}

//===----------------------------------------------------------------------===//
// Slice, flatten, unflatten
//===----------------------------------------------------------------------===//

Result<View> sliceView(const View &view, const std::vector<std::string> &names,
                       const AxisNamespace &ns) {
  if (names.empty())
    return makeError("slice needs at least one axis");
  std::vector<ViewAxis> axes;
  std::set<std::string> seen;
  AxisRefList viewRefs = view.refs();
  for (const std::string &name : names) {
    if (!seen.insert(name).second)
      return makeError("axis \"" + name + "\" is named twice");
    if (auto index = view.findAxis(name)) {
      axes.push_back(view.axes()[*index]);
      continue;
    }
    const AxisRefList *refs = ns.lookup(name);
    if (!refs || !refsCover(view.mesh(), viewRefs, *refs))
      return makeError("axis \"" + name + "\" is not in the view (axes: " +
                       view.axisNameList() + ")");
    axes.push_back({name, *refs});
  }
  return View::create(view.meshHandle(), std::move(axes));
}

Result<View> flattenView(const View &view,
                         const std::vector<std::string> &names,
                         std::optional<std::string> name, AxisNamespace &ns) {
  if (names.empty())
    return makeError("flatten needs at least one axis");
  auto indices = view.axisIndices(names);
  if (!indices)
    return indices.error();
  std::string newName;
  if (name) {
    newName = *name;
  } else {
    for (const std::string &n : names)
      newName += (newName.empty() ? "" : "_") + n;
  }
  AxisRefList refs = view.refsOf(*indices);
  auto defined = ns.define(newName, refs);
  if (!defined)
    return defined.error();
  int firstIndex = *std::min_element(indices->begin(), indices->end());
  std::vector<ViewAxis> axes;
  for (int i = 0; i < view.numAxes(); ++i) {
    if (i == firstIndex)
      axes.push_back({newName, refs});
    else if (std::find(indices->begin(), indices->end(), i) == indices->end())
      axes.push_back(view.axes()[i]);
  }
  for (const ViewAxis &axis : axes)
    if (axis.name == newName && axis.refs != refs)
      return makeError("name \"" + newName +
                       "\" clashes with another axis of the view");
  return View::create(view.meshHandle(), std::move(axes));
}

Result<View>
unflattenView(const View &view, const std::string &name,
              const std::vector<std::pair<std::string, int64_t>> &parts,
              AxisNamespace &ns) {
  auto index = view.findAxis(name);
  if (!index)
    return makeError("axis \"" + name + "\" is not in the view (axes: " +
                     view.axisNameList() + ")");
  if (parts.empty())
    return makeError("unflatten of \"" + name + "\" needs at least one part");
  std::vector<int64_t> sizes;
  std::set<std::string> seen;
  for (const auto &[partName, size] : parts) {
    if (!seen.insert(partName).second)
      return makeError("part \"" + partName + "\" is named twice");
    if (partName != name && view.findAxis(partName))
      return makeError("part \"" + partName +
                       "\" clashes with an axis of the view");
    sizes.push_back(size);
  }
  const ViewAxis &axis = view.axes()[*index];
  auto split = splitRefs(view.mesh(), axis.refs, sizes);
  if (!split)
    return split.error().within("unflatten of \"" + name + "\"");
  std::vector<ViewAxis> axes;
  for (int i = 0; i < view.numAxes(); ++i) {
    if (i != *index) {
      axes.push_back(view.axes()[i]);
      continue;
    }
    for (size_t p = 0; p < parts.size(); ++p) {
      auto defined = ns.define(parts[p].first, (*split)[p]);
      if (!defined)
        return defined.error();
      axes.push_back({parts[p].first, (*split)[p]});
    }
  }
  return View::create(view.meshHandle(), std::move(axes));
}

//===----------------------------------------------------------------------===//
// View expressions
//===----------------------------------------------------------------------===//

namespace {
struct StepText {
  std::string_view op, args;
  size_t column; // 1-based
};
} // namespace

static Result<std::vector<StepText>> splitSteps(std::string_view expr) {
  std::vector<StepText> steps;
  size_t pos = 0;
  for (std::string_view raw : splitTopLevel(expr, '.')) {
    size_t leading = std::min(raw.find_first_not_of(" \t"), raw.size());
    size_t column = pos + 1 + leading;
    pos += raw.size() + 1;
    std::string_view step = trim(raw);
    std::string where = "column " + std::to_string(column);
    if (step.empty())
      return makeError(where + ": empty step in view expression");
    size_t open = step.find('(');
    if (open == std::string_view::npos || step.back() != ')')
      return makeError(where + ": \"" + std::string(step) +
                       "\" is not op(...); expected slice(...), "
                       "flatten(...) or unflatten(...)");
    steps.push_back({trim(step.substr(0, open)),
                     step.substr(open + 1, step.size() - open - 2), column});
  }
  return steps;
}

static Result<std::vector<std::string>> parseNameList(std::string_view text) {
  std::vector<std::string> names;
  if (trim(text).empty())
    return makeError("empty axis list");
  for (std::string_view item : splitTopLevel(text, ',')) {
    std::string name(unquote(trim(item)));
    if (name.empty())
      return makeError("empty axis name in \"" + std::string(text) + "\"");
    names.push_back(name);
  }
  return names;
}

/// Splits "a,b as name" at the keyword " as ".
static std::pair<std::string_view, std::optional<std::string_view>>
splitAs(std::string_view args) {
  size_t at = args.rfind(" as ");
  if (at == std::string_view::npos)
    return {args, std::nullopt};
  return {args.substr(0, at), trim(args.substr(at + 4))};
}

Result<View> evaluateViewExpr(const View &start, std::string_view expr,
                              AxisNamespace &ns) {
  auto steps = splitSteps(expr);
  if (!steps)
    return steps.error();
  View view = start;
  for (const StepText &step : *steps) {
    std::string where = "column " + std::to_string(step.column) + " (" +
                        std::string(step.op) + ")";
    Result<View> next = makeError("unreachable");
    if (step.op == "slice") {
      auto names = parseNameList(step.args);
      if (!names)
        return names.error().within(where);
      next = sliceView(view, *names, ns);
    } else if (step.op == "flatten") {
      auto [list, name] = splitAs(step.args);
      auto names = parseNameList(list);
      if (!names)
        return names.error().within(where);
      std::optional<std::string> newName;
      if (name) {
        if (name->empty())
          return makeError(where + ": empty name after \"as\"");
        newName = std::string(unquote(*name));
      }
      next = flattenView(view, *names, newName, ns);
    } else if (step.op == "unflatten") {
      auto [source, partsText] = splitAs(step.args);
      if (!partsText)
        return makeError(where + ": expected unflatten(name as a:2,b:4)");
      std::vector<std::pair<std::string, int64_t>> parts;
      for (std::string_view item : splitTopLevel(*partsText, ',')) {
        item = trim(item);
        size_t colon = item.rfind(':');
        auto size = colon == std::string_view::npos
                        ? std::nullopt
                        : parseInt(trim(item.substr(colon + 1)));
        if (!size)
          return makeError(where + ": part \"" + std::string(item) +
                           "\" is not name:size");
        parts.push_back(
            {std::string(unquote(trim(item.substr(0, colon)))), *size});
      }
      next = unflattenView(view, std::string(unquote(trim(source))), parts, ns);
    } else {
      return makeError(where + ": unknown view operation \"" +
                       std::string(step.op) +
                       "\"; expected slice, flatten or unflatten");
    }
    if (!next)
      return next.error().within(where);
    view = std::move(next.value());
  }
  return view;
}

} // namespace meshplan
