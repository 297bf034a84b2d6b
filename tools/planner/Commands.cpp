//===- Commands.cpp - mesh, layout and redistribute subcommands -----------===//

#include "Commands.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Placement.h"
#include "meshplan/Core/Redistribute.h"
#include "meshplan/Core/Text.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <sstream>

namespace meshplan::cli {

using Json = nlohmann::ordered_json;

static std::string ints(const std::vector<int64_t> &v) {
  return "[" + joinInts(v) + "]";
}

/// Refuses a listing of `ranks` ranks of `perRank` numbers each (plus
/// `extra`) that would print more than kMaxListedIntegers: listing every
/// rank's groups grows with world x group size, so the output is bounded,
/// not the mesh. Checked before anything is allocated or computed.
static void checkListingSize(const std::string &command, const Mesh &mesh,
                             std::optional<int64_t> rank, int64_t perRank,
                             int64_t extra, const std::string &what) {
  int64_t ranks = rank ? 1 : mesh.size();
  int64_t total = 0;
  bool overflows = mulOverflows(ranks, perRank, &total) ||
                   __builtin_add_overflow(total, extra, &total);
  if (!overflows && total <= kMaxListedIntegers)
    return;
  std::string whose = rank ? "of rank " + std::to_string(*rank)
                           : "of all " + std::to_string(ranks) + " ranks";
  throw CliError(
      command + ": listing " + what + " " + whose + " would print " +
      (overflows ? std::string("more than 2^63") : std::to_string(total)) +
      " numbers; a listing prints at most " + kMaxListedIntegersText +
      " (docs/limits.md)" + (rank ? "" : "; ask for one rank with --rank"));
}

/// The ranks a listing covers: --rank alone, or the whole mesh.
static std::vector<int64_t> listedRanks(const Mesh &mesh,
                                        std::optional<int64_t> rank) {
  if (rank) {
    checkRank(mesh, *rank);
    return {*rank};
  }
  std::vector<int64_t> ranks;
  ranks.reserve(mesh.size());
  for (int64_t p = 0; p < mesh.size(); ++p)
    ranks.push_back(mesh.rankAt(p));
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

static Json meshJson(const Mesh &mesh) {
  Json axes = Json::array();
  for (const MeshAxis &axis : mesh.getAxes())
    axes.push_back(
        {{"name", axis.name}, {"size", axis.size}, {"managed", axis.managed}});
  Json out = {{"axes", axes}, {"devices", mesh.size()}};
  if (mesh.hasDeviceOrder())
    out["device_order"] = mesh.getDeviceOrder();
  return out;
}

static Json viewJson(const View &view, const MeshFlags &flags) {
  Json axes = Json::array();
  for (int a = 0; a < view.numAxes(); ++a) {
    const ViewAxis &axis = view.axes()[a];
    Json refs = Json::array();
    for (const AxisRef &ref : axis.refs)
      refs.push_back(formatAxisRef(view.mesh(), ref));
    axes.push_back({{"name", axis.name},
                    {"size", axis.size()},
                    {"refs", refs},
                    {"managed", touchesManaged(view.mesh(), axis.refs)},
                    {"partition", view.partitionKey({a})}});
  }
  return {{"expr", flags.view}, {"axes", axes}};
}

//===----------------------------------------------------------------------===//
// meshplan mesh
//===----------------------------------------------------------------------===//

std::string runMeshCommand(const MeshOptions &options) {
  MeshSetup setup = buildMeshSetup(options.mesh);
  const Mesh &mesh = *setup.mesh;
  const View &view = *setup.view;
  const LiveMembers *live = setup.hasLive ? &setup.live : nullptr;
  {
    // Per rank: the rank, both coordinates, and per view axis its group and
    // split; --groups adds every rank once per view axis.
    int64_t perRank = 1 + mesh.numAxes() + 3 * int64_t(view.numAxes());
    for (int a = 0; a < view.numAxes(); ++a)
      if (__builtin_add_overflow(
              perRank, groupSizeOf(mesh, view.refsOf({a}), live), &perRank))
        perRank = std::numeric_limits<int64_t>::max();
    int64_t extra = 0;
    if (options.listGroups && mulOverflows(mesh.size(), view.numAxes(), &extra))
      extra = std::numeric_limits<int64_t>::max();
    checkListingSize("mesh", mesh, options.rank, perRank, extra, "the groups");
  }
  std::vector<int64_t> ranks = listedRanks(mesh, options.rank);

  if (options.json) {
    Json out = {{"mesh", meshJson(mesh)},
                {"view", viewJson(view, options.mesh)}};
    Json rankList = Json::array();
    for (int64_t rank : ranks) {
      Json entry = {
          {"rank", rank},
          {"coordinate", orThrow(view.coordinate(rank), "--rank")},
          {"mesh_coordinate", orThrow(mesh.coordinate(rank), "--rank")}};
      Json groups = Json::object(), splits = Json::object();
      for (int a = 0; a < view.numAxes(); ++a) {
        const std::string &name = view.axes()[a].name;
        auto group = view.group(rank, {a}, live);
        auto split = view.split(rank, {a}, live);
        if (!group || !split) { // a dead member of a managed axis
          groups[name] = nullptr;
          splits[name] = nullptr;
          continue;
        }
        groups[name] = *group;
        splits[name] = {{"color", split->color}, {"key", split->key}};
      }
      entry["groups"] = groups;
      entry["splits"] = splits;
      rankList.push_back(entry);
    }
    out["ranks"] = rankList;
    if (options.listGroups) {
      Json all = Json::object();
      for (int a = 0; a < view.numAxes(); ++a)
        all[view.axes()[a].name] = listGroupsOf(mesh, view.refsOf({a}), live);
      out["all_groups"] = all;
    }
    return out.dump() + "\n";
  }

  std::ostringstream os;
  os << "mesh  " << mesh.str() << "  (" << mesh.size() << " devices)\n";
  os << "view  " << (options.mesh.view.empty() ? "(root)" : options.mesh.view)
     << "  ->  " << view.str() << "\n";
  for (int a = 0; a < view.numAxes(); ++a) {
    const ViewAxis &axis = view.axes()[a];
    os << "  axis " << axis.name << ": size " << axis.size() << ", refs ["
       << formatAxisRefs(mesh, axis.refs) << "], partition "
       << view.partitionKey({a});
    if (touchesManaged(mesh, axis.refs))
      os << ", managed (membership supplied at run time)";
    os << "\n";
    if (options.listGroups) {
      os << "    groups:";
      for (const auto &group : listGroupsOf(mesh, axis.refs, live))
        os << " " << ints(group);
      os << "\n";
    }
  }
  os << "rank  coordinate";
  for (const ViewAxis &axis : view.axes())
    os << "  " << axis.name << " group";
  os << "\n";
  for (int64_t rank : ranks) {
    os << rank << "  " << ints(orThrow(view.coordinate(rank), "--rank"));
    for (int a = 0; a < view.numAxes(); ++a) {
      auto group = view.group(rank, {a}, live);
      os << "  " << (group ? ints(*group) : std::string("(not live)"));
    }
    os << "\n";
  }
  return os.str();
}

//===----------------------------------------------------------------------===//
// meshplan layout
//===----------------------------------------------------------------------===//

/// A layout given as DTensor placements or in meshplan's own form.
static Layout resolveLayout(const MeshSetup &setup, const std::string &text,
                            const std::vector<int64_t> &shape,
                            const std::string &flag) {
  const View &view = *setup.view;
  Layout layout;
  if (text.find('{') != std::string::npos) {
    layout = orThrow(parseLayout(view, *setup.names, text), flag);
  } else {
    auto placements = orThrow(parsePlacements(text), flag);
    layout = orThrow(layoutFromPlacements(view, placements, shape), flag);
  }
  if (layout.rank() != static_cast<int>(shape.size()))
    throw CliError(flag + ": layout has " + std::to_string(layout.rank()) +
                   " dims but --shape has " + std::to_string(shape.size()));
  return layout;
}

std::string runLayoutCommand(const LayoutOptions &options) {
  MeshSetup setup = buildMeshSetup(options.mesh);
  const Mesh &mesh = *setup.mesh;
  const View &view = *setup.view;
  auto shape = orThrow(parseShape(options.shape), "--shape");
  bool hasPlacements = !options.placements.empty();
  if (hasPlacements == !options.layout.empty())
    throw CliError("give exactly one of --placements and --layout");
  Layout layout =
      hasPlacements
          ? resolveLayout(setup, options.placements, shape, "--placements")
          : resolveLayout(setup, options.layout, shape, "--layout");
  auto placements = placementsFromLayout(view, layout, shape);
  // Per rank: the rank, its coordinate, offset, local and padded shapes.
  checkListingSize("layout", mesh, options.rank,
                   1 + view.numAxes() + 3 * int64_t(shape.size()), 0,
                   "the shards");
  std::vector<int64_t> ranks = listedRanks(mesh, options.rank);

  if (options.json) {
    Json out = {{"view", viewJson(view, options.mesh)},
                {"shape", shape},
                {"layout", formatLayout(mesh, layout)}};
    out["placements"] =
        placements ? Json(formatPlacements(*placements, true)) : Json(nullptr);
    if (!placements)
      out["placements_note"] = placements.error().message;
    Json rankList = Json::array();
    for (int64_t rank : ranks) {
      ShardBox box = orThrow(shardOf(view, layout, shape, rank), "--rank");
      rankList.push_back(
          {{"rank", rank},
           {"coordinate", orThrow(view.coordinate(rank), "--rank")},
           {"local_shape", box.localShape},
           {"offset", box.offset},
           {"padded_shape", box.paddedShape}});
    }
    out["ranks"] = rankList;
    return out.dump() + "\n";
  }

  std::ostringstream os;
  os << "view        " << view.str() << "\n";
  os << "shape       " << ints(shape) << "\n";
  os << "layout      " << formatLayout(mesh, layout) << "\n";
  os << "placements  "
     << (placements ? formatPlacements(*placements, true)
                    : "(none: " + placements.error().message + ")")
     << "\n";
  os << "padded      " << ints(paddedShapeOf(layout, shape)) << "\n";
  os << "rank  coordinate  offset  local_shape\n";
  for (int64_t rank : ranks) {
    ShardBox box = orThrow(shardOf(view, layout, shape, rank), "--rank");
    os << rank << "  " << ints(orThrow(view.coordinate(rank), "--rank")) << "  "
       << ints(box.offset) << "  " << ints(box.localShape) << "\n";
  }
  return os.str();
}

//===----------------------------------------------------------------------===//
// meshplan redistribute
//===----------------------------------------------------------------------===//

static int64_t elementBytes(const std::string &dtype) {
  if (dtype == "fp32" || dtype == "float32" || dtype == "f32")
    return 4;
  if (dtype == "bf16" || dtype == "bfloat16" || dtype == "fp16" ||
      dtype == "float16")
    return 2;
  if (dtype == "fp8" || dtype == "e4m3" || dtype == "e5m2" || dtype == "int8")
    return 1;
  if (dtype == "fp64" || dtype == "float64" || dtype == "int64")
    return 8;
  throw CliError("--dtype: unknown dtype \"" + dtype +
                 "\"; expected fp32, bf16, fp16, fp8, int8, fp64 or int64");
}

std::string runRedistributeCommand(const RedistributeOptions &options) {
  MeshSetup setup = buildMeshSetup(options.mesh);
  const Mesh &mesh = *setup.mesh;
  const View &view = *setup.view;
  auto shape = orThrow(parseShape(options.shape), "--shape");
  int64_t bytes = elementBytes(options.dtype);
  Layout from = resolveLayout(setup, options.from, shape, "--from");
  Layout to = resolveLayout(setup, options.to, shape, "--to");
  RedistributePlan plan =
      orThrow(planRedistribute(view, from, to, shape, bytes), "redistribute");

  if (options.json) {
    Json steps = Json::array();
    for (const RedistributeStep &s : plan.steps) {
      Json axes = Json::array();
      for (const AxisRef &ref : s.axes)
        axes.push_back(formatAxisRef(mesh, ref));
      Json step = {{"kind", stepKindName(s.kind)},
                   {"axes", axes},
                   {"partition", partitionKeyOf(mesh, s.axes)},
                   {"group_size", s.groupSize}};
      if (s.kind == StepKind::Permute) {
        Json dst = Json::array();
        for (const AxisRef &ref : s.dstAxes)
          dst.push_back(formatAxisRef(mesh, ref));
        step["dst_axes"] = dst;
      }
      if (s.dim >= 0)
        step["dim"] = s.dim;
      if (s.dstDim >= 0)
        step["dst_dim"] = s.dstDim;
      if (s.kind == StepKind::ReduceScatter || s.kind == StepKind::AllReduce ||
          s.kind == StepKind::MarkPartial)
        step["op"] = reduceOpName(s.op);
      step["bytes_per_rank"] = s.bytesPerRank;
      step["before"] = formatLayout(mesh, s.before);
      step["after"] = formatLayout(mesh, s.after);
      steps.push_back(step);
    }
    Json out = {{"from", formatLayout(mesh, from)},
                {"to", formatLayout(mesh, to)},
                {"shape", shape},
                {"dtype", options.dtype},
                {"steps", steps},
                {"collectives", plan.numCollectives()},
                {"bytes_per_rank", plan.totalBytesPerRank()}};
    return out.dump() + "\n";
  }

  std::ostringstream os;
  os << "view   " << view.str() << "\n";
  os << "from   " << formatLayout(mesh, from) << "\n";
  os << "to     " << formatLayout(mesh, to) << "\n";
  if (plan.steps.empty())
    os << "nothing to do: the layouts are the same\n";
  int index = 1;
  for (const RedistributeStep &s : plan.steps) {
    os << index++ << ". " << stepKindName(s.kind);
    if (s.kind == StepKind::ReduceScatter || s.kind == StepKind::AllReduce ||
        s.kind == StepKind::MarkPartial)
      os << "(" << reduceOpName(s.op) << ")";
    os << " over " << partitionKeyOf(mesh, s.axes);
    if (s.kind == StepKind::Permute)
      os << " -> " << partitionKeyOf(mesh, s.dstAxes);
    if (s.kind == StepKind::AllToAll)
      os << " dim " << s.dim << " -> dim " << s.dstDim;
    else if (s.dim >= 0)
      os << " on dim " << s.dim;
    os << ": " << formatLayout(mesh, s.before) << " -> "
       << formatLayout(mesh, s.after) << "  (group " << s.groupSize << ", "
       << s.bytesPerRank << " B/rank)\n";
  }
  os << plan.numCollectives() << " collective(s), " << plan.totalBytesPerRank()
     << " bytes received per rank\n";
  return os.str();
}

} // namespace meshplan::cli
