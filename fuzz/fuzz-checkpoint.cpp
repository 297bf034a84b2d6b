//===- fuzz-checkpoint.cpp - The checkpoint metadata reader ---------------===//
//
// Input: a checkpoint.json (docs/checkpoint-format.md), which a loader reads
// from a directory it does not trust. Checks the reader's promises: what it
// accepts validates, and writeMetadata writes it back as text it accepts
// again, equal to what it read (a version 1 document upgraded), with the
// same metadata checksum.
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
  // writeMetadata writes the current version, whose fingerprints are
  // required: a version 1 document is written back as a writer upgrading it
  // would (ckpt reshard: the default fingerprints for empty ones).
  ckpt::CheckpointMetadata m = *meta;
  if (m.version < ckpt::kCheckpointVersion) {
    m.version = ckpt::kCheckpointVersion;
    if (m.model.fingerprint.empty())
      m.model.fingerprint = ckpt::parameterListFingerprint(m);
    if (m.spec.fingerprint.empty())
      m.spec.fingerprint = ckpt::layoutFingerprint(m);
  }
  std::string written = ckpt::writeMetadata(m);
  auto again = ckpt::parseMetadata(written);
  check(bool(again), "parseMetadata refuses what writeMetadata wrote: " +
                         (again ? "" : again.error().message));
  check(*again == m, "parseMetadata(writeMetadata(m)) != m");
  check(ckpt::writeMetadata(*again) == written, "writeMetadata is not stable");
  return 0;
}
