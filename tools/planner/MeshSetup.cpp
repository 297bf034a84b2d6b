//===- MeshSetup.cpp - Mesh and view from the CLI's flags -----------------===//

#include "MeshSetup.h"

#include "meshplan/Core/Text.h"

namespace meshplan::cli {

MeshSetup buildMeshSetup(const MeshFlags &flags) {
  auto axes = orThrow(parseMeshAxes(flags.mesh), "--mesh");
  if (!flags.managed.empty()) {
    for (std::string_view item : splitTopLevel(flags.managed, ',')) {
      std::string name(trim(item));
      bool found = false;
      for (MeshAxis &axis : axes)
        if (axis.name == name)
          axis.managed = found = true;
      if (!found) {
        std::string list;
        for (const MeshAxis &axis : axes)
          list += (list.empty() ? "" : ", ") + axis.name;
        throw CliError("--managed: axis \"" + name +
                       "\" is not in the mesh (axes: " + list + ")");
      }
    }
  }
  std::optional<std::vector<int64_t>> order;
  if (!flags.order.empty())
    order = orThrow(parseIntList(flags.order, "device order"), "--order");
  MeshSetup setup;
  setup.mesh = std::make_shared<const Mesh>(
      orThrow(Mesh::create(std::move(axes), std::move(order)),
              flags.order.empty() ? "--mesh" : "--mesh/--order"));
  for (const std::string &entry : flags.live) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos)
      throw CliError("--live: \"" + entry + "\" is not axis=c0,c1,...");
    std::string name(trim(std::string_view(entry).substr(0, eq)));
    auto axis = setup.mesh->findAxis(name);
    if (!axis)
      throw CliError(
          "--live: axis \"" + name +
          "\" is not in the mesh (axes: " + setup.mesh->axisNameList() + ")");
    auto coords = orThrow(
        parseIntList(std::string_view(entry).substr(eq + 1), "live members"),
        "--live " + name);
    orThrow(setup.live.set(*setup.mesh, *axis, std::move(coords)),
            "--live " + name);
    setup.hasLive = true;
  }
  setup.names = std::make_unique<AxisNamespace>(setup.mesh);
  View root = View::root(setup.mesh);
  if (flags.view.empty())
    setup.view = root;
  else
    setup.view =
        orThrow(evaluateViewExpr(root, flags.view, *setup.names), "--view");
  return setup;
}

void checkRank(const Mesh &mesh, int64_t rank) {
  if (!mesh.contains(rank))
    throw CliError("--rank: " + mesh.positionOf(rank).error().message);
}

} // namespace meshplan::cli
