//===- SessionCheckpoint.cpp - Saving and loading checkpoints -------------===//
//
// Session::saveCheckpoint and loadCheckpoint (docs/checkpoint-format.md):
// every rank writes the boxes it owns, rank 0 commits through the store;
// loading reads only the checksum blocks a rank's boxes intersect.
//
//===----------------------------------------------------------------------===//

#include "BoxCopy.h"
#include "SessionImpl.h"

#include "meshplan/Checkpoint/Checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include <sys/mman.h>

namespace meshplan::runtime {

using plan::BufferKind;
using plan::DType;
using plan::Instruction;
using plan::OpKind;
namespace k = kernels;

//===----------------------------------------------------------------------===//
// Checkpoints
//===----------------------------------------------------------------------===//

namespace {
using nlohmann::json;

std::vector<char> recordsToBytes(const ckpt::RankRecords &r) {
  json chunks = json::array();
  for (const ckpt::ChunkRecord &c : r.chunks) {
    json j{{"tensor", c.tensor},
           {"kind", std::string(ckpt::tensorKindName(c.kind))},
           {"dtype", std::string(plan::dtypeName(c.dtype))},
           {"global_shape", c.globalShape},
           {"layout", c.layout},
           {"declaration_only", c.declarationOnly},
           {"offset", c.chunk.box.offset},
           {"shape", c.chunk.box.shape},
           {"file", c.chunk.file},
           {"byte_offset", c.chunk.byteOffset},
           {"length", c.chunk.length},
           {"crc32c", c.chunk.crc32c}};
    if (c.tensorId)
      j["tensor_id"] = *c.tensorId;
    chunks.push_back(std::move(j));
  }
  json j{{"rank", r.rank},
         {"file", r.file},
         {"file_bytes", r.fileBytes},
         {"block_bytes", r.blockBytes},
         {"chunks", std::move(chunks)}};
  std::string text = "ok" + j.dump();
  return {text.begin(), text.end()};
}

/// The records a rank put in the store, or the error it put there instead.
/// The values come from this job's own ranks; a malformed one is still an
/// error, not a crash.
Result<ckpt::RankRecords> recordsFromBytes(const std::vector<char> &bytes,
                                           int64_t rank) {
  std::string text(bytes.begin(), bytes.end());
  std::string who = "rank " + std::to_string(rank) + ": ";
  // A rank's error already names the rank.
  if (text.starts_with("error: "))
    return makeError(text.substr(7));
  if (!text.starts_with("ok"))
    return makeError(who + text);
  json j = json::parse(text.begin() + 2, text.end(), nullptr, false);
  auto bad = [&] {
    return makeError(who + "malformed checkpoint records in the store");
  };
  if (j.is_discarded() || !j.is_object())
    return bad();
  ckpt::RankRecords r;
  try {
    r.rank = j.at("rank").get<int64_t>();
    r.file = j.at("file").get<std::string>();
    r.fileBytes = j.at("file_bytes").get<int64_t>();
    r.blockBytes = j.at("block_bytes").get<int64_t>();
    for (const json &c : j.at("chunks")) {
      ckpt::ChunkRecord rec;
      rec.tensor = c.at("tensor").get<std::string>();
      std::string kind = c.at("kind").get<std::string>();
      rec.kind = kind == ckpt::tensorKindName(ckpt::TensorKind::Parameter)
                     ? ckpt::TensorKind::Parameter
                     : ckpt::TensorKind::OptimizerState;
      auto dtype = plan::parseDType(c.at("dtype").get<std::string>());
      if (!dtype)
        return bad();
      rec.dtype = *dtype;
      rec.globalShape = c.at("global_shape").get<std::vector<int64_t>>();
      rec.layout = c.at("layout").get<std::string>();
      rec.declarationOnly = c.at("declaration_only").get<bool>();
      if (c.contains("tensor_id"))
        rec.tensorId = c.at("tensor_id").get<int64_t>();
      rec.chunk.box.offset = c.at("offset").get<std::vector<int64_t>>();
      rec.chunk.box.shape = c.at("shape").get<std::vector<int64_t>>();
      rec.chunk.file = c.at("file").get<std::string>();
      rec.chunk.byteOffset = c.at("byte_offset").get<int64_t>();
      rec.chunk.length = c.at("length").get<int64_t>();
      rec.chunk.crc32c = c.at("crc32c").get<std::vector<uint32_t>>();
      r.chunks.push_back(std::move(rec));
    }
  } catch (const std::exception &) {
    return bad();
  }
  return r;
}

std::vector<char> statusBytes(const Result<void> &ok) {
  std::string text = ok ? "ok" : "error: " + ok.error().message;
  return {text.begin(), text.end()};
}

/// Test hook (test/trainer/checkpoint-kill.sh):
/// MESHPLAN_TEST_SLOW_CHECKPOINT_MS = N makes saveCheckpoint sleep N ms at each
/// of its phase boundaries (after the staging directory is made, after a rank's
/// data file is written, after the staged metadata and after the rename), so
/// that a test can kill -9 a rank at a chosen point. Not for production use.
void slowCheckpointForTests() {
  static const int64_t ms = [] {
    const char *v = std::getenv("MESHPLAN_TEST_SLOW_CHECKPOINT_MS");
    return v ? std::max<int64_t>(0, std::atoll(v)) : int64_t(0);
  }();
  if (ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

/// loadCheckpoint stages every box before copying any into the session's
/// buffers (all or nothing), in one region that the session keeps for its
/// next load. Fresh anonymous memory costs a page fault and the kernel's
/// zeroing per 4 KiB page on first touch, which cost more than loading the
/// bytes into it (docs/performance.md, section G): the region is populated in
/// one call (MADV_POPULATE_WRITE, no fault per page) and, between loads,
/// handed to the kernel as lazily freeable (MADV_FREE): the kernel takes the
/// pages back under memory pressure without writing them anywhere, and a load
/// that finds them still there reuses them with no fault and no zeroing (it
/// overwrites every byte, so pages that were taken back and come back zeroed
/// are as good). Not transparent huge pages: on a VM whose free 2 MiB blocks
/// are reported to the host, their first touch was slower and erratic.
Result<std::byte *> stagingFor(std::shared_ptr<std::byte> &region,
                               size_t &regionBytes, size_t bytes) {
  if (bytes == 0)
    return static_cast<std::byte *>(nullptr);
  if (region && regionBytes == bytes)
    return region.get();
  region.reset();
  regionBytes = 0;
  void *p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return makeError("checkpoint: cannot allocate " + std::to_string(bytes) +
                     " bytes to stage the load: " + std::strerror(errno));
#ifdef MADV_POPULATE_WRITE
  // Advice only (EINVAL before Linux 5.14): without it the pages fault in
  // one by one.
  (void)::madvise(p, bytes, MADV_POPULATE_WRITE);
#endif
  region =
      std::shared_ptr<std::byte>(static_cast<std::byte *>(p),
                                 [bytes](std::byte *q) { ::munmap(q, bytes); });
  regionBytes = bytes;
  return region.get();
}

/// Marks the staging region lazily freeable when a load returns, whether it
/// succeeded or not.
struct LazyFree {
  std::byte *data;
  size_t bytes;
  ~LazyFree() {
#ifdef MADV_FREE
    if (data)
      (void)::madvise(data, bytes, MADV_FREE);
#endif
  }
};

/// A save that failed (a full disk, a rank's error): its staging directory
/// is removed, so that nothing half-written stays next to `dir`, and the
/// message says what became of the checkpoint there.
Error failedSave(const std::string &dir, const Error &error) {
  Result<void> removed = ckpt::abortCheckpoint(dir);
  return Error{"checkpoint " + dir + " not saved: " + error.message +
               (removed ? " (its partial files were removed"
                        : " (" + removed.error().message) +
               "; a checkpoint already at " + dir + " is unchanged)"};
}

Result<void> statusFrom(const std::vector<char> &bytes) {
  std::string text(bytes.begin(), bytes.end());
  if (text == "ok")
    return {};
  return makeError(text.starts_with("error: ") ? text.substr(7) : text);
}
} // namespace

Result<void> Session::saveCheckpoint(const std::string &dir,
                                     ckpt::CheckpointInfo info) {
  Impl &m = *impl;
  if (m.broken)
    return makeError("an earlier step failed; this session cannot save");
  auto boxes = ckpt::persistentBoxesOf(m.plan);
  if (!boxes)
    return boxes.error();
  if (info.training.step == 0)
    info.training.step = m.steps;
  if (info.mesh.empty() && m.mesh)
    info.mesh = m.mesh->str();
  int64_t rank = m.plan.rank, world = m.options.worldSize;
  std::string base = "ckpt/" + std::to_string(m.checkpointsSaved++) + "/";
  // The ranks that save, in rank order; the first of them coordinates.
  std::vector<int64_t> savers;
  if (m.ft) {
    // Fault-tolerant: the live groups' ranks. A box the layout replicates
    // over the managed axis is written by the lowest live group (below),
    // and the keys name the epoch and step, which every live rank shares
    // (a healed rank's save count does not).
    const FaultTolerance &f = *m.ft;
    if (m.plan.mesh.pipelineAxis)
      return makeError("checkpoint: a fault-tolerant pipelined layout cannot "
                       "be saved yet");
    for (int64_t r = 0; r < world; ++r) {
      auto position = m.mesh->positionOf(r);
      if (position && containsGroup(f.quorum.members, int(m.mesh->coordinateAt(
                                                          *position, f.axis))))
        savers.push_back(r);
    }
    base = "ckpt/e" + std::to_string(f.quorum.epoch) + "/s" +
           std::to_string(m.steps) + "/";
  } else {
    for (int64_t r = 0; r < world; ++r)
      savers.push_back(r);
  }
  int64_t coordinator = savers.front();
  Backend &store = *m.backend;
  // 1. The coordinator makes a fresh staging directory; the others wait.
  if (rank == coordinator) {
    Result<void> begun = ckpt::beginCheckpoint(dir);
    if (!begun)
      begun = failedSave(dir, begun.error());
    slowCheckpointForTests();
    MESHPLAN_TRY(store.storeSet(base + "begin", statusBytes(begun)));
    MESHPLAN_TRY(begun);
  } else {
    auto begun = store.storeGet(base + "begin");
    if (!begun)
      return begun.error();
    MESHPLAN_TRY(statusFrom(*begun));
  }
  // 2. Every rank writes what it owns, in parallel, and posts its records.
  std::vector<ckpt::SaveBox> save;
  // On a device the shards are written from host copies.
  std::vector<std::vector<std::byte>> fromDevice;
  fromDevice.reserve(boxes->size());
  for (ckpt::PersistentBox &b : *boxes) {
    auto it = m.bufferIds.find(b.bufferId);
    if (it == m.bufferIds.end())
      return makeError("checkpoint: no buffer \"" + b.bufferId + "\"");
    const BufferState &s = m.buffers[size_t(it->second)];
    if (m.ft) {
      // Coordinate 0 of the managed axis may be dead: the lowest live
      // group's rank writes instead (core's owner rule, the managed axis
      // skipped).
      auto owns = ckpt::ownsShard(*m.root, s.layout, rank, m.ft->axis);
      if (!owns)
        return owns.error();
      b.owned = *owns && !b.box.empty() &&
                m.ft->group == m.ft->quorum.members.front();
    }
    if (m.onDevice()) {
      fromDevice.emplace_back(
          size_t(s.numel * plan::dtypeBytes(s.meta->dtype)));
      MESHPLAN_TRY(m.fromDevice(m.address(it->second), fromDevice.back()));
      save.push_back({&b, std::span<const std::byte>(fromDevice.back())});
      continue;
    }
    save.push_back({&b, std::span<const std::byte>(s.data)});
  }
  auto records = ckpt::writeRankData(dir, rank, save);
  slowCheckpointForTests();
  MESHPLAN_TRY(store.storeSet(base + "rank" + std::to_string(rank),
                              records ? recordsToBytes(*records)
                                      : statusBytes(records.error().within(
                                            "rank " + std::to_string(rank)))));
  // A rank whose write failed does not return yet: the coordinator (which
  // may be this rank) still gathers every report and removes the staging
  // directory, and every rank returns its verdict.
  // 3. The coordinator gathers every saver's records (the metadata lists
  // them all) and commits; everyone returns what the commit did.
  if (rank == coordinator) {
    std::vector<ckpt::RankRecords> all;
    Result<void> committed;
    bool publishing = false;
    // Every saver's word is awaited, even after one reported an error, so
    // that no rank is still writing into the staging directory when a
    // failed save removes it. Only a store error (a rank gone) stops the
    // wait early.
    for (int64_t r : savers) {
      auto bytes = store.storeGet(base + "rank" + std::to_string(r));
      if (!bytes) {
        if (committed)
          committed = bytes.error();
        break;
      }
      auto rec = recordsFromBytes(*bytes, r);
      if (!rec) {
        if (committed)
          committed = rec.error();
      } else {
        all.push_back(std::move(*rec));
      }
    }
    if (committed) {
      // ckpt::commitCheckpoint, in its steps (the test hook goes between).
      auto meta = ckpt::assembleMetadata(info, all);
      if (!meta)
        committed = meta.error();
      else
        committed = ckpt::writeStagedMetadata(dir, *meta);
      if (committed) {
        slowCheckpointForTests();
        publishing = true;
        committed = ckpt::publishCheckpoint(dir);
      }
      if (committed)
        slowCheckpointForTests();
    }
    // A failed publish is left as it is: after an exchange the staging
    // directory may hold the previous checkpoint (publishCheckpoint's
    // message says where it is).
    if (!committed && !publishing)
      committed = failedSave(dir, committed.error());
    MESHPLAN_TRY(store.storeSet(base + "done", statusBytes(committed)));
    return committed;
  }
  auto done = store.storeGet(base + "done");
  if (!done)
    return done.error();
  return statusFrom(*done);
}

Result<ckpt::TrainingState>
Session::loadCheckpoint(const std::string &dir,
                        const ckpt::LoadOptions &options) {
  Impl &m = *impl;
  auto meta = ckpt::readCheckpointMetadata(dir);
  if (!meta)
    return meta.error();
  auto boxes = ckpt::persistentBoxesOf(m.plan);
  if (!boxes)
    return boxes.error();
  MESHPLAN_TRY(ckpt::checkLoadable(*meta, *boxes, options));
  // Everything into one staging region first (every byte of it is
  // overwritten): a failure changes nothing.
  struct Loaded {
    int index;
    size_t offset, size;
  };
  std::vector<Loaded> loaded;
  size_t total = 0;
  for (const ckpt::PersistentBox &b : *boxes) {
    auto it = m.bufferIds.find(b.bufferId);
    if (it == m.bufferIds.end())
      return makeError("checkpoint: no buffer \"" + b.bufferId + "\"");
    const BufferState &s = m.buffers[size_t(it->second)];
    size_t size = size_t(s.numel * plan::dtypeBytes(s.meta->dtype));
    int64_t want = b.box.numElements() * plan::dtypeBytes(b.dtype);
    if (want < 0 || size_t(want) != size)
      return makeError("checkpoint: " + b.tensor + " loads " +
                       std::to_string(want) + " bytes into buffer \"" +
                       b.bufferId + "\" of " + std::to_string(size));
    loaded.push_back({it->second, total, size});
    // Each box cache-line aligned (any dtype's alignment).
    total += (size + 63) & ~size_t(63);
  }
  auto staging = stagingFor(m.loadStaging, m.loadStagingBytes, total);
  if (!staging)
    return staging.error();
  LazyFree lazyFree{*staging, total};
  for (size_t i = 0; i < loaded.size(); ++i) {
    const ckpt::PersistentBox &b = (*boxes)[i];
    MESHPLAN_TRY(ckpt::loadPersistentBoxInto(
        *meta, b, options, {*staging + loaded[i].offset, loaded[i].size}));
  }
  // Copied into the existing buffers (same sizes, checked above), so that
  // the data pointers handed out earlier (TensorView, the C API's
  // mp_tensor) stay valid.
  for (const Loaded &l : loaded)
    if (l.size && m.onDevice())
      MESHPLAN_TRY(m.toDevice(l.index, {*staging + l.offset, l.size}));
    else if (l.size)
      std::memcpy(m.buffers[size_t(l.index)].data.data(), *staging + l.offset,
                  l.size);
  ckpt::TrainingState state = meta->training;
  if (options.resetOptimizerState)
    state.step = 0; // a fresh AdamW: bias correction starts again
  return state;
}

} // namespace meshplan::runtime
