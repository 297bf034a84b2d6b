//===- fuzz-checkpoint.cpp - The checkpoint metadata reader ---------------===//
//
// Input: a checkpoint.json (docs/checkpoint-format.md), which a loader reads
// from a directory it does not trust. Checks the reader's promises: what it
// accepts validates, and writeMetadata writes it back as text it accepts
// again, equal to what it read.
//
//===----------------------------------------------------------------------===//

#include "FuzzSupport.h"

#include "meshplan/Checkpoint/Checkpoint.h"

using namespace meshplan;
using namespace meshplan::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto meta = ckpt::parseMetadata(asText(data, size));
  if (!meta) {
    checkMessage(meta.error().message, "parseMetadata");
    return 0;
  }
  auto valid = ckpt::validateMetadata(*meta);
  check(bool(valid),
        "parseMetadata accepted metadata that validateMetadata refuses: " +
            (valid ? "" : valid.error().message));
  std::string written = ckpt::writeMetadata(*meta);
  auto again = ckpt::parseMetadata(written);
  check(bool(again), "parseMetadata refuses what writeMetadata wrote: " +
                         (again ? "" : again.error().message));
  check(*again == *meta, "parseMetadata(writeMetadata(m)) != m");
  return 0;
}
