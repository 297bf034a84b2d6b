//===- FuzzCli.h - Running the meshplan CLI's commands in a fuzz target ---===//
//
// The view, placement and layout targets call the commands of the meshplan
// tool (tools/planner/Commands.cpp) as main() does. A CliError is the
// documented answer to a bad input (one message, exit 2); anything else that
// escapes a command would reach main()'s "internal error" (exit 3), which
// must be unreachable, so it is a defect.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_FUZZ_FUZZCLI_H
#define MESHPLAN_FUZZ_FUZZCLI_H

#include "Commands.h"
#include "FuzzSupport.h"

#include "meshplan/Core/Mesh.h"

#include <exception>
#include <new>

namespace meshplan::fuzz {

/// The command's output, or nullopt after a CliError.
template <typename F>
std::optional<std::string> runCommand(const char *name, F &&command) {
  try {
    return command();
  } catch (const cli::CliError &e) {
    checkMessage(e.what(), name);
    return std::nullopt;
  } catch (const std::bad_alloc &) {
    defect(std::string(name) + ": std::bad_alloc (exit 3)");
  } catch (const std::exception &e) {
    defect(std::string(name) + ": internal error (exit 3): " + e.what());
  }
}

/// The mesh flags of an input: mesh, order, managed, live (repeated), view.
inline cli::MeshFlags meshFlags(const Fields &fields) {
  cli::MeshFlags flags;
  flags.mesh = fields.get("mesh");
  flags.order = fields.get("order");
  flags.managed = fields.get("managed");
  flags.live = fields.all("live");
  flags.view = fields.get("view");
  return flags;
}

/// True when `--mesh` parses to at most `limit` ranks. Commands without
/// --rank list every rank, which is bounded (docs/limits.md) but takes
/// seconds at the bound under the sanitizers; the targets list small meshes
/// and ask for one rank of large ones.
inline bool smallMesh(const std::string &meshText, int64_t limit) {
  auto axes = parseMeshAxes(meshText);
  if (!axes)
    return true; // refused before anything is listed
  int64_t size = 1;
  for (const MeshAxis &axis : *axes) {
    if (axis.size < 0 || __builtin_mul_overflow(size, axis.size, &size))
      return false;
  }
  return size <= limit;
}

} // namespace meshplan::fuzz

#endif // MESHPLAN_FUZZ_FUZZCLI_H
