//===- MeshSetup.h - Mesh and view from the CLI's flags -------------------===//
//
// Every subcommand that takes --mesh/--order/--managed/--view builds its view
// here, so the flags mean the same thing everywhere. Failures are reported as
// CliError, which main() turns into one message on stderr and exit code 2.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_MESHSETUP_H
#define MESHPLAN_TOOLS_PLANNER_MESHSETUP_H

#include "meshplan/Core/MeshView.h"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshplan::cli {

/// A user error: printed as "meshplan: error: <message>", exit code 2.
struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Unwraps a core Result or throws a CliError located at `flag`.
template <typename T> T orThrow(Result<T> result, const std::string &flag) {
  if (!result)
    throw CliError(flag + ": " + result.error().message);
  return std::move(result.value());
}
inline void orThrow(Result<void> result, const std::string &flag) {
  if (!result)
    throw CliError(flag + ": " + result.error().message);
}

struct MeshFlags {
  std::string mesh;
  std::string order;
  std::string managed;
  std::vector<std::string> live;
  std::string view;
};

struct MeshSetup {
  std::shared_ptr<const Mesh> mesh;
  std::unique_ptr<AxisNamespace> names;
  std::optional<View> view;
  LiveMembers live;
  bool hasLive = false;
};

MeshSetup buildMeshSetup(const MeshFlags &flags);

/// Rank given by --rank, checked against the mesh.
void checkRank(const Mesh &mesh, int64_t rank);

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_MESHSETUP_H
