//===- fuzz-layout.cpp - meshplan's layout strings ------------------------===//
//
// Input (FuzzSupport.h): a mesh, an optional view, a shape and a layout in
// meshplan's own form, as `meshplan layout --layout` and `meshplan
// redistribute` take them:
//
//   mesh dp=4,tp=2
//   view flatten(dp,tp as all)
//   shape 15,5
//   layout [{tp,dp}, {}]
//   to [{"dp":(2)2}, {}] partial(sum)={tp}
//
// Runs both commands, then checks that a layout prints (formatLayout) as
// text that parses back to a layout giving every rank the same box, and that
// printing is stable.
//
//===----------------------------------------------------------------------===//

#include "FuzzCli.h"
#include "LayoutOracle.h"

using namespace meshplan;
using namespace meshplan::fuzz;

static void checkRoundTrip(const Fields &fields) {
  std::optional<cli::MeshSetup> setup;
  runCommand("mesh setup", [&] {
    setup.emplace(cli::buildMeshSetup(meshFlags(fields)));
    return std::string();
  });
  if (!setup)
    return;
  const View &view = *setup->view;
  const Mesh &mesh = view.mesh();
  std::string text = fields.get("layout");
  auto layout = parseLayout(view, *setup->names, text);
  if (!layout) {
    checkMessage(layout.error().message, "parseLayout");
    return;
  }
  check(bool(verifyLayout(view, *layout)),
        "parseLayout accepted a layout that does not verify: " + text);
  std::string printed = formatLayout(mesh, *layout);
  auto again = parseLayout(view, *setup->names, printed);
  check(bool(again), "layout \"" + text + "\" prints as \"" + printed +
                         "\", which does not parse: " +
                         (again ? "" : again.error().message));
  check(formatLayout(mesh, *again) == printed,
        "layout \"" + printed + "\" prints differently after a round trip");
  auto shape = parseShape(fields.get("shape"));
  if (shape && shape->size() == size_t(layout->rank()))
    checkSameShards(view, *layout, *again, *shape, "layout -> text -> layout");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Fields fields(asText(data, size));
  cli::LayoutOptions options;
  options.mesh = meshFlags(fields);
  options.shape = fields.get("shape");
  options.layout = fields.get("layout");
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
    redistribute.from = options.layout;
    redistribute.to = fields.get("to");
    if (fields.has("dtype"))
      redistribute.dtype = fields.get("dtype");
    redistribute.json = options.json;
    runCommand("meshplan redistribute",
               [&] { return cli::runRedistributeCommand(redistribute); });
  }
  checkRoundTrip(fields);
  return 0;
}
