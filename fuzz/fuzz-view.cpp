//===- fuzz-view.cpp - View expressions through `meshplan mesh` -----------===//
//
// Input (FuzzSupport.h): the flags of `meshplan mesh`, one per line:
//
//   mesh dp_replicate=3,dp_shard=2,tp=2
//   managed dp_replicate
//   live dp_replicate=0,2
//   view flatten(dp_replicate,dp_shard as dp).slice(dp)
//   rank 5
//   json
//   groups
//
// (order, managed, live, rank, json and groups are optional). The command
// builds the mesh, evaluates the view expression (slice / flatten /
// unflatten to any depth, over managed axes and live members) and answers
// every per-rank query: coordinates, groups, split keys, partitions.
//
//===----------------------------------------------------------------------===//

#include "FuzzCli.h"

using namespace meshplan;
using namespace meshplan::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Fields fields(asText(data, size));
  cli::MeshOptions options;
  options.mesh = meshFlags(fields);
  options.json = fields.has("json");
  options.listGroups = fields.has("groups");
  if (fields.has("rank")) {
    options.rank = fields.integer("rank");
    if (!options.rank)
      return 0; // CLI11 refuses a --rank that is not an integer
  } else if (!smallMesh(options.mesh.mesh, 256)) {
    options.rank = 0;
  }
  auto out =
      runCommand("meshplan mesh", [&] { return cli::runMeshCommand(options); });
  if (out)
    check(!out->empty(), "meshplan mesh succeeded with no output");
  return 0;
}
