//===- fuzz-placement.cpp - DTensor placement strings ---------------------===//
//
// Input (FuzzSupport.h): a mesh, an optional view, a shape and a placement
// list, as `meshplan layout --placements` and `meshplan redistribute` take
// them:
//
//   mesh dp=4,tp=2
//   shape 15,5
//   placements SS(0,2),S(0)
//   to R,S(0)
//   rank 3
//
// Runs both commands (the exhaustive placement check is bounded by
// kMaxPlacementChecks), then checks the conversions core promises: a list
// prints and parses back to itself (short and PyTorch forms), and a layout
// made from placements, converted back to placements and to a layout again,
// gives every rank the same box.
//
//===----------------------------------------------------------------------===//

#include "FuzzCli.h"
#include "LayoutOracle.h"

#include "meshplan/Core/Placement.h"

using namespace meshplan;
using namespace meshplan::fuzz;

static void checkRoundTrips(const Fields &fields) {
  std::string text = fields.get("placements");
  auto placements = parsePlacements(text);
  if (!placements) {
    checkMessage(placements.error().message, "parsePlacements");
    return;
  }
  for (bool torch : {false, true}) {
    std::string printed = formatPlacements(*placements, torch);
    auto again = parsePlacements(printed);
    check(again && *again == *placements,
          "placements \"" + text + "\" print as \"" + printed +
              "\", which does not parse back to them");
  }

  std::optional<cli::MeshSetup> setup;
  runCommand("mesh setup", [&] {
    setup.emplace(cli::buildMeshSetup(meshFlags(fields)));
    return std::string();
  });
  if (!setup)
    return;
  const View &view = *setup->view;
  auto shape = parseShape(fields.get("shape"));
  if (!shape)
    return;
  auto layout = layoutFromPlacements(view, *placements, *shape);
  if (!layout) {
    checkMessage(layout.error().message, "layoutFromPlacements");
    return;
  }
  check(bool(verifyLayout(view, *layout)),
        "layoutFromPlacements made a layout that does not verify");
  auto back = placementsFromLayout(view, *layout, *shape);
  if (!back)
    return; // not every layout has a placement list
  auto again = layoutFromPlacements(view, *back, *shape);
  check(bool(again), "placementsFromLayout gave \"" + formatPlacements(*back) +
                         "\", which layoutFromPlacements refuses: " +
                         (again ? "" : again.error().message));
  checkSameShards(view, *layout, *again, *shape,
                  "placements -> layout -> placements -> layout");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Fields fields(asText(data, size));
  cli::LayoutOptions options;
  options.mesh = meshFlags(fields);
  options.shape = fields.get("shape");
  options.placements = fields.get("placements");
  options.json = fields.has("json");
  if (fields.has("rank")) {
    options.rank = fields.integer("rank");
    if (!options.rank)
      return 0; // CLI11 refuses a --rank that is not an integer
  } else if (!smallMesh(options.mesh.mesh, 256)) {
    options.rank = 0;
  }
  runCommand("meshplan layout", [&] { return cli::runLayoutCommand(options); });
  if (fields.has("to")) {
    cli::RedistributeOptions redistribute;
    redistribute.mesh = options.mesh;
    redistribute.shape = options.shape;
    redistribute.from = options.placements;
    redistribute.to = fields.get("to");
    if (fields.has("dtype"))
      redistribute.dtype = fields.get("dtype");
    redistribute.json = options.json;
    runCommand("meshplan redistribute",
               [&] { return cli::runRedistributeCommand(redistribute); });
  }
  checkRoundTrips(fields);
  return 0;
}
