//===- Checkpoint.h - Sharded checkpoints across parallel layouts ---------===//
//
// A checkpoint is a directory: one JSON metadata file (checkpoint.json) and
// one raw data file per writing rank (rank<R>.data), format version 2
// (docs/checkpoint-format.md; version 1, without the metadata checksum, is
// still read). Every persistent tensor of a plan (parameter
// shards and optimizer state) is stored as chunks: boxes of the global tensor
// in row-major little-endian bytes, each written once by a deterministic owner
// and checksummed with CRC32C per fixed-size block, so that a reader under any
// other layout reads (and verifies) only the blocks that intersect its boxes.
//
// Saving is three calls so that a runtime can put its collectives between
// them: beginCheckpoint (one rank: a fresh staging directory), writeRankData
// (every rank, in parallel: its owned boxes, fsynced), commitCheckpoint (one
// rank, after gathering every rank's records: metadata, fsync, rename). The
// checkpoint appears under its name only by the final rename, so a crash at
// any point leaves either the previous checkpoint or the new complete one.
//
// Everything read from disk is untrusted: the reader checks every field,
// every size with overflow-safe arithmetic and that the chunks tile each
// tensor exactly once before anything is loaded. Like MeshplanPlan this
// library may be linked into -fno-exceptions code: failures are Error values.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CHECKPOINT_CHECKPOINT_H
#define MESHPLAN_CHECKPOINT_CHECKPOINT_H

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::ckpt {

/// The "format" string of checkpoint.json, the version this build writes,
/// and the oldest it reads. Version 2 added the metadata checksum and
/// requires both fingerprints; version 1 is read as it was written
/// (unprotected metadata, empty fingerprints allowed).
inline constexpr std::string_view kCheckpointFormat = "meshplan.checkpoint";
inline constexpr int kCheckpointVersion = 2;
inline constexpr int kOldestCheckpointVersion = 1;
/// The metadata file inside a checkpoint directory.
inline constexpr std::string_view kMetadataFileName = "checkpoint.json";
/// Checksum block size the writer uses unless told otherwise: small enough
/// that a partial read wastes little, large enough that the metadata stays
/// small (8 bytes of hex per MiB).
inline constexpr int64_t kDefaultBlockBytes = int64_t(1) << 20;
/// Largest checksum block a checkpoint may declare (a reader buffers whole
/// blocks).
inline constexpr int64_t kMaxBlockBytes = int64_t(1) << 30;

//===----------------------------------------------------------------------===//
// Checksums and fingerprints
//===----------------------------------------------------------------------===//

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and
/// final xor 0xFFFFFFFF; iSCSI, ext4, RFC 3720). `crc` is the value returned
/// for the preceding bytes, so crc32c(b, crc32c(a)) == crc32c(a + b);
/// crc32c("123456789") == 0xE3069283. Uses the SSE4.2 instruction where the
/// CPU has it, else slicing-by-8 tables.
uint32_t crc32c(const void *data, size_t size, uint32_t crc = 0);
/// The portable slicing-by-8 implementation alone (tests compare the two).
uint32_t crc32cPortable(const void *data, size_t size, uint32_t crc = 0);

/// "fnv1a64:<16 hex digits>" of a document's bytes: identifies the spec or
/// model a checkpoint came from (not a security hash).
std::string fingerprintOf(std::string_view bytes);
/// True for "fnv1a64:" and 16 lowercase hex digits.
bool isFingerprint(std::string_view text);

//===----------------------------------------------------------------------===//
// Boxes
//===----------------------------------------------------------------------===//

/// A box of a tensor: global offset and shape per dim (a rank-0 tensor has
/// one element and an empty box).
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;

  int rank() const { return static_cast<int>(shape.size()); }
  /// Elements (the caller has checked the shape against the limits).
  int64_t numElements() const;
  bool empty() const { return numElements() == 0; }
  bool operator==(const Box &) const = default;
};

/// "[4,0] + [4,4]" as the plan reader writes boxes.
std::string formatBox(const Box &box);

/// The intersection of two boxes of the same rank, or nullopt when it has no
/// element. Pure per-dim interval arithmetic, O(rank). (Core has shardOf but
/// no box intersection; it lives here until something else needs it.)
std::optional<Box> intersectBoxes(const Box &a, const Box &b);

/// True when `box` lies within a tensor of `shape` (offset + shape <= dim,
/// overflow-safe, offsets and sizes >= 0).
bool boxWithin(const Box &box, const std::vector<int64_t> &shape);

//===----------------------------------------------------------------------===//
// Which boxes of a plan go into a checkpoint, and who writes them
//===----------------------------------------------------------------------===//

enum class TensorKind { Parameter, OptimizerState };
std::string_view tensorKindName(TensorKind kind);

/// One persistent buffer of one rank's plan as a checkpoint sees it.
struct PersistentBox {
  /// The checkpoint tensor: the parameter's name for a param_shard, the
  /// parameter's name plus ".exp_avg" / ".exp_avg_sq" for AdamW's state.
  std::string tensor;
  TensorKind kind = TensorKind::Parameter;
  std::optional<int64_t> tensorId; ///< parameters only
  plan::DType dtype = plan::DType::Float32;
  std::vector<int64_t> globalShape;
  Box box;            ///< this rank's box (core's shardOf)
  std::string layout; ///< the plan's layout text, recorded for `inspect`
  std::string bufferId;
  /// This rank writes the box (see ownsShard); false for empty boxes.
  bool owned = false;
};

/// True when `rank` is the writer of its box of a tensor laid out as
/// `layout`: its coordinate is 0 along every view ref the layout replicates
/// over (core's replicatedRefs). Ranks holding the same non-empty box differ
/// exactly in those coordinates, so each distinct box has one owner, found
/// in O(refs) without listing the others. A partial layout is an error (its
/// values are not yet the tensor's). Under pipeline parallelism a tensor
/// lives on one coordinate of `pipelineAxis` (the stage's): that axis, which
/// no layout names, is not replicated over, and the holder's coordinate
/// along it is whatever it is.
Result<bool> ownsShard(const View &view, const Layout &layout, int64_t rank,
                       std::optional<int> pipelineAxis = std::nullopt);

/// The param_shard and optimizer_state buffers of `plan`, with their
/// checkpoint names, boxes (checked against core's shardOf of their layout)
/// and ownership. Optimizer state is named by its position in an
/// optimizer_update (param, grad, exp_avg, exp_avg_sq). O(axes) per buffer
/// plus one pass over the program.
Result<std::vector<PersistentBox>> persistentBoxesOf(const plan::Plan &plan);

//===----------------------------------------------------------------------===//
// Metadata
//===----------------------------------------------------------------------===//

/// Where a document (spec or model) came from: its name and fingerprint.
struct SourceRef {
  std::string name;
  /// fingerprintOf(file bytes); "" in a CheckpointInfo lets the writer
  /// fill the default (parameterListFingerprint, layoutFingerprint).
  std::string fingerprint;
  bool operator==(const SourceRef &) const = default;
};

/// What the training loop needs to continue exactly: the next step is
/// `step + 1`; stochastic rounding keys its bits with (seed, step, tensor_id,
/// element index).
struct TrainingState {
  int64_t step = 0;
  int64_t seed = 0;
  bool stochasticRounding = false;
  bool operator==(const TrainingState &) const = default;
};

/// Caller-supplied facts recorded in checkpoint.json.
struct CheckpointInfo {
  SourceRef model;
  SourceRef spec;
  TrainingState training;
  std::string mesh;      ///< the writers' mesh, e.g. Mesh::str(); informational
  std::string generator; ///< e.g. "meshplan 0.1"; informational, may be ""
  /// What an imported or converted checkpoint was made from (a path and its
  /// format), and the dtype conversions applied; "" for neither.
  std::string from;
  std::string conversion;
};

struct Chunk {
  Box box;
  std::string file; ///< a data file of the checkpoint (a plain file name)
  int64_t byteOffset = 0;
  int64_t length = 0; ///< box elements x dtype bytes
  /// CRC32C of each block of `blockBytes` bytes of the chunk (the last one
  /// shorter): ceil(length / blockBytes) values.
  std::vector<uint32_t> crc32c;
  bool operator==(const Chunk &) const = default;
};

struct TensorEntry {
  std::string name;
  TensorKind kind = TensorKind::Parameter;
  std::optional<int64_t> tensorId;
  plan::DType dtype = plan::DType::Float32;
  std::vector<int64_t> shape;
  std::string layout;        ///< the writers' layout; informational
  std::vector<Chunk> chunks; ///< tile the tensor exactly once
  bool operator==(const TensorEntry &) const = default;
};

struct DataFile {
  std::string name;
  int64_t bytes = 0;
  bool operator==(const DataFile &) const = default;
};

struct CheckpointMetadata {
  /// The format version read (a version 1 file stays 1 in memory; writing
  /// always writes kCheckpointVersion).
  int version = kCheckpointVersion;
  SourceRef model;
  SourceRef spec;
  TrainingState training;
  std::string mesh;
  std::string generator;
  std::string from;       ///< written_by.from; "" when absent
  std::string conversion; ///< written_by.conversion; "" when absent
  int64_t blockBytes = kDefaultBlockBytes;
  std::vector<DataFile> files;
  std::vector<TensorEntry> tensors;
  /// The directory it was read from ("" when parsed from text); not stored.
  std::string directory;

  const TensorEntry *findTensor(std::string_view name) const;
  bool operator==(const CheckpointMetadata &) const = default;
};

/// Checks everything the metadata alone can: names, dtypes, shapes within
/// the limits, chunks inside their tensor and their file, lengths and
/// checksum counts consistent, chunks tiling each tensor exactly once.
/// Errors are "<JSON pointer>: <message>" naming the tensor.
Result<void> validateMetadata(const CheckpointMetadata &meta);

/// Parses and validates checkpoint.json's text ("line L, column C: ..." for
/// malformed JSON, "<JSON pointer>: ..." otherwise), and, from version 2,
/// checks its metadata_checksum against metadataChecksumOf what it parsed.
Result<CheckpointMetadata> parseMetadata(std::string_view text);
/// The text of checkpoint.json, version kCheckpointVersion (one tensor per
/// line; parseMetadata inverts), with its metadata_checksum.
std::string writeMetadata(const CheckpointMetadata &meta);
/// "fnv1a64:<hex>" of the metadata's canonical text: writeMetadata's output
/// without its metadata_checksum line (docs/checkpoint-format.md, "Metadata
/// checksum"). Computed in pieces; the text is never built whole.
std::string metadataChecksumOf(const CheckpointMetadata &meta);
/// The default model fingerprint: fingerprintOf one line "<tensor_id>
/// <name> <shape>" per parameter, by tensor_id then name: what the model is,
/// whatever its layout or stored dtype.
std::string parameterListFingerprint(const CheckpointMetadata &meta);
/// The default spec fingerprint, for writers that have no spec document (a
/// session opened from plans): fingerprintOf the mesh and one line "<name>
/// <layout>" per tensor.
std::string layoutFingerprint(const CheckpointMetadata &meta);

/// Reads `dir`/checkpoint.json and checks that every data file it names
/// exists with exactly the recorded size. Errors start with the file path.
/// A staging directory (stagingDirOf) is refused: it is never a checkpoint.
Result<CheckpointMetadata> readCheckpointMetadata(const std::string &dir);

//===----------------------------------------------------------------------===//
// Saving
//===----------------------------------------------------------------------===//

/// The staging directory a save of `dir` writes into: `.<name>.partial` next
/// to it (same file system, so the final rename is atomic).
std::string stagingDirOf(const std::string &dir);

/// One rank, before any writeRankData: removes a staging directory left by
/// an interrupted save and creates a fresh one (the parent directory must
/// exist). The runtime puts a barrier after it.
Result<void> beginCheckpoint(const std::string &dir);

/// One box a rank hands to writeRankData: its description and its bytes
/// (row-major within the box, little-endian, box elements x dtype bytes).
struct SaveBox {
  const PersistentBox *box = nullptr;
  std::span<const std::byte> bytes;
};

struct WriteOptions {
  int64_t blockBytes = kDefaultBlockBytes;
};

/// One chunk a rank wrote, with what commit needs to describe its tensor.
struct ChunkRecord {
  std::string tensor;
  TensorKind kind = TensorKind::Parameter;
  std::optional<int64_t> tensorId;
  plan::DType dtype = plan::DType::Float32;
  std::vector<int64_t> globalShape;
  std::string layout;
  Chunk chunk;
  /// True for a tensor with no elements: it has no chunk, but must still
  /// appear in the checkpoint, so every rank declares it.
  bool declarationOnly = false;
};

/// What one rank wrote: gathered to the committing rank.
struct RankRecords {
  int64_t rank = 0;
  std::string file; ///< "" when the rank owned nothing (no file written)
  int64_t fileBytes = 0;
  int64_t blockBytes = kDefaultBlockBytes;
  std::vector<ChunkRecord> chunks;
};

/// Every rank, in parallel: writes the owned, non-empty boxes among `boxes`
/// (others are skipped) into `<staging>/rank<R>.data`, back to back, and
/// fsyncs it; declares tensors with no elements. No file when nothing is
/// owned. Requires beginCheckpoint(dir) first.
Result<RankRecords> writeRankData(const std::string &dir, int64_t rank,
                                  std::span<const SaveBox> boxes,
                                  const WriteOptions &options = {});

/// Assembles the metadata from every rank's records (validated: chunks must
/// tile every tensor exactly once, so a missing rank is caught here), without
/// writing anything.
Result<CheckpointMetadata>
assembleMetadata(const CheckpointInfo &info,
                 std::span<const RankRecords> records);

/// Commit, first half: writes `<staging>/checkpoint.json` and fsyncs it and
/// the staging directory. A crash after it leaves a complete-looking
/// directory under the staging name only, which no reader accepts.
Result<void> writeStagedMetadata(const std::string &dir,
                                 const CheckpointMetadata &meta);
/// Commit, second half: makes the staging directory appear as `dir` in one
/// rename (an existing checkpoint at `dir` is swapped out atomically with
/// renameat2(RENAME_EXCHANGE) and then deleted), then fsyncs the parent. An
/// existing `dir` that is not a checkpoint is refused, never replaced.
Result<void> publishCheckpoint(const std::string &dir);

/// After a failed save (any step; once no rank writes any more): removes
/// the staging directory and what it holds, so that nothing half-written
/// stays next to `dir`. A checkpoint at `dir` is never touched.
Result<void> abortCheckpoint(const std::string &dir);

/// Writes `bytes` to a new file at `path` (replacing one), fsyncs and
/// closes it, checking each step: a full disk is reported by write, fsync
/// or close, whichever sees it first, naming `path`.
Result<void> writeFileDurably(const std::string &path, std::string_view bytes);

/// One rank, after gathering every rank's records: assembleMetadata,
/// writeStagedMetadata, publishCheckpoint. On failure the staging
/// directory is left for the caller (abortCheckpoint, or a retry).
Result<CheckpointMetadata>
commitCheckpoint(const std::string &dir, const CheckpointInfo &info,
                 std::span<const RankRecords> records);

//===----------------------------------------------------------------------===//
// Loading and verifying
//===----------------------------------------------------------------------===//

/// Checks, before anything is loaded, that every box a plan would load
/// exists in the checkpoint with the same global shape and dtype: the first
/// mismatch is an error naming the tensor.
Result<void> checkLoadable(const CheckpointMetadata &meta,
                           std::span<const PersistentBox> boxes);

/// Fills `out` (target's elements x dtype bytes, row-major) with the
/// target box of `tensor`: reads, from each chunk that intersects the box,
/// only the checksum blocks covering the intersection, verifies them, and
/// copies the intersection. A checksum mismatch names the tensor, the file
/// and the byte offset of the block. On error `out` is unspecified.
Result<void> loadBoxInto(const CheckpointMetadata &meta,
                         std::string_view tensor,
                         const std::vector<int64_t> &globalShape,
                         const Box &target, plan::DType dtype,
                         std::span<std::byte> out);
/// loadBoxInto into a new buffer.
Result<std::vector<std::byte>> loadBox(const CheckpointMetadata &meta,
                                       std::string_view tensor,
                                       const std::vector<int64_t> &globalShape,
                                       const Box &target, plan::DType dtype);

struct VerifyReport {
  int64_t tensors = 0;
  int64_t chunks = 0;
  int64_t bytes = 0; ///< data bytes read and checksummed
};
/// Reads the metadata (tiling, sizes) and checksums every block of every
/// chunk. `progress`, when given, is called with (bytes checked, bytes in
/// all) after each chunk, in order, ending at (total, total).
Result<VerifyReport>
verifyCheckpoint(const std::string &dir,
                 const std::function<void(int64_t, int64_t)> &progress = {});

} // namespace meshplan::ckpt

#endif // MESHPLAN_CHECKPOINT_CHECKPOINT_H
