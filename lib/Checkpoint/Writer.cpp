//===- Writer.cpp - Saving a checkpoint atomically ------------------------===//
//
// The protocol (docs/checkpoint-format.md, "Writing and crashes"):
//   1. beginCheckpoint: a fresh staging directory `.<name>.partial`;
//   2. writeRankData on every rank: its data file, fsynced;
//   3. commit: checkpoint.json written into the staging directory and
//      fsynced, the staging directory fsynced, then one rename makes it
//      `<name>` (an old checkpoint is swapped out by RENAME_EXCHANGE), and
//      the parent directory is fsynced.
// Readers accept only a directory under its final name holding a valid
// checkpoint.json, and the final name appears only in step 3's rename, after
// everything it names is durable: a crash anywhere leaves either the old
// checkpoint or the new, complete one.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Checkpoint.h"

#include "FileIO.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <unordered_map>

namespace meshplan::ckpt {

namespace {

struct SplitPath {
  std::string parent; ///< "" for the current directory
  std::string name;
};

SplitPath splitPath(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  size_t slash = dir.rfind('/');
  if (slash == std::string::npos)
    return {"", dir};
  return {slash == 0 ? "/" : dir.substr(0, slash), dir.substr(slash + 1)};
}

std::string parentOrDot(const std::string &parent) {
  return parent.empty() ? "." : parent;
}

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Result<void> removeTree(const std::string &path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec)
    return makeError(path + ": cannot remove: " + ec.message());
  return {};
}

std::string formatInts(const std::vector<int64_t> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

} // namespace

std::string stagingDirOf(const std::string &dir) {
  SplitPath p = splitPath(dir);
  if (p.name.empty() || p.name == "." || p.name == ".." || p.name == "/")
    return "";
  std::string staged = "." + p.name + ".partial";
  return p.parent.empty() ? staged : io::joinPath(p.parent, staged);
}

Result<void> beginCheckpoint(const std::string &dir) {
  std::string staging = stagingDirOf(dir);
  if (staging.empty())
    return makeError(dir + ": a checkpoint needs a directory name (not \".\", "
                           "\"..\" or \"/\")");
  SplitPath p = splitPath(dir);
  if (!isDirectory(parentOrDot(p.parent)))
    return makeError(dir + ": the parent directory " + parentOrDot(p.parent) +
                     " does not exist");
  // Leftovers of an interrupted save (or the old checkpoint a publish
  // swapped out and did not get to delete) are never a checkpoint.
  MESHPLAN_TRY(removeTree(staging));
  if (::mkdir(staging.c_str(), 0755) != 0)
    return makeError(staging + ": cannot create the staging directory: " +
                     io::errnoText(errno));
  return io::fsyncPath(parentOrDot(p.parent), /*directory=*/true);
}

Result<RankRecords> writeRankData(const std::string &dir, int64_t rank,
                                  std::span<const SaveBox> boxes,
                                  const WriteOptions &options) {
  if (options.blockBytes < 1 || options.blockBytes > kMaxBlockBytes)
    return makeError("checksum block size must be in [1, 2^30], got " +
                     std::to_string(options.blockBytes));
  if (rank < 0)
    return makeError("rank " + std::to_string(rank) + " is negative");
  std::string staging = stagingDirOf(dir);
  if (staging.empty() || !isDirectory(staging))
    return makeError(dir + ": no staging directory " + staging +
                     " (beginCheckpoint must run first)");
  RankRecords records;
  records.rank = rank;
  records.blockBytes = options.blockBytes;

  // Boxes to store, in the order given (which becomes the metadata's tensor
  // order), with null data for the declaration of a tensor with no
  // elements.
  struct Item {
    const PersistentBox *box;
    const SaveBox *data;
  };
  std::vector<Item> items;
  bool anyData = false;
  for (const SaveBox &b : boxes) {
    if (!b.box)
      return makeError("a SaveBox without a box description");
    const PersistentBox &pb = *b.box;
    Box whole{std::vector<int64_t>(pb.globalShape.size(), 0), pb.globalShape};
    if (whole.empty()) {
      items.push_back({&pb, nullptr});
      continue;
    }
    if (!pb.owned || pb.box.empty())
      continue;
    if (!boxWithin(pb.box, pb.globalShape))
      return makeError("tensor \"" + pb.tensor + "\": box " +
                       formatBox(pb.box) + " lies outside its shape " +
                       formatInts(pb.globalShape));
    int64_t bytes = 0;
    if (mulOverflows(pb.box.numElements(), plan::dtypeBytes(pb.dtype),
                     &bytes) ||
        int64_t(b.bytes.size()) != bytes)
      return makeError("tensor \"" + pb.tensor +
                       "\": " + std::to_string(b.bytes.size()) +
                       " bytes given for box " + formatBox(pb.box) +
                       ", which holds " + std::to_string(bytes));
    items.push_back({&pb, &b});
    anyData = true;
  }

  std::string path;
  io::Fd fd;
  if (anyData) {
    records.file = "rank" + std::to_string(rank) + ".data";
    path = io::joinPath(staging, records.file);
    fd = io::Fd(
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.ok())
      return makeError(path + ": cannot create: " + io::errnoText(errno));
  }
  int64_t offset = 0;
  for (const Item &item : items) {
    const PersistentBox &pb = *item.box;
    ChunkRecord r;
    r.tensor = pb.tensor;
    r.kind = pb.kind;
    r.tensorId = pb.tensorId;
    r.dtype = pb.dtype;
    r.globalShape = pb.globalShape;
    r.layout = pb.layout;
    if (!item.data) {
      r.declarationOnly = true;
      records.chunks.push_back(std::move(r));
      continue;
    }
    std::span<const std::byte> bytes = item.data->bytes;
    r.chunk.box = pb.box;
    r.chunk.file = records.file;
    r.chunk.byteOffset = offset;
    r.chunk.length = int64_t(bytes.size());
    for (size_t at = 0; at < bytes.size(); at += size_t(options.blockBytes)) {
      size_t n = std::min(bytes.size() - at, size_t(options.blockBytes));
      r.chunk.crc32c.push_back(crc32c(bytes.data() + at, n));
    }
    MESHPLAN_TRY(io::writeAll(fd.get(), bytes.data(), bytes.size(), path));
    offset += r.chunk.length;
    records.chunks.push_back(std::move(r));
  }
  if (!anyData)
    return records; // nothing owned: no file
  if (::fsync(fd.get()) != 0)
    return makeError(path + ": fsync failed: " + io::errnoText(errno));
  if (fd.release() != 0)
    return makeError(path + ": close failed: " + io::errnoText(errno));
  records.fileBytes = offset;
  return records;
}

Result<CheckpointMetadata>
assembleMetadata(const CheckpointInfo &info,
                 std::span<const RankRecords> records) {
  CheckpointMetadata meta;
  meta.model = info.model;
  meta.spec = info.spec;
  meta.training = info.training;
  meta.mesh = info.mesh;
  meta.generator = info.generator;
  meta.from = info.from;
  meta.conversion = info.conversion;
  std::vector<const RankRecords *> sorted;
  for (const RankRecords &r : records)
    sorted.push_back(&r);
  // Rank order makes the metadata independent of the order records arrive.
  std::sort(sorted.begin(), sorted.end(),
            [](auto *a, auto *b) { return a->rank < b->rank; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const RankRecords &r = *sorted[i];
    if (i > 0 && sorted[i - 1]->rank == r.rank)
      return makeError("records of rank " + std::to_string(r.rank) +
                       " given twice");
    if (i == 0)
      meta.blockBytes = r.blockBytes;
    else if (r.blockBytes != meta.blockBytes)
      return makeError("rank " + std::to_string(r.rank) +
                       " used checksum blocks of " +
                       std::to_string(r.blockBytes) + " bytes, rank " +
                       std::to_string(sorted[0]->rank) + " of " +
                       std::to_string(meta.blockBytes));
    if (!r.file.empty())
      meta.files.push_back({r.file, r.fileBytes});
  }
  std::unordered_map<std::string, size_t> index;
  std::vector<int64_t> firstRank;
  for (const RankRecords *r : sorted) {
    for (const ChunkRecord &c : r->chunks) {
      auto [it, fresh] = index.emplace(c.tensor, meta.tensors.size());
      if (fresh) {
        TensorEntry t;
        t.name = c.tensor;
        t.kind = c.kind;
        t.tensorId = c.tensorId;
        t.dtype = c.dtype;
        t.shape = c.globalShape;
        t.layout = c.layout;
        meta.tensors.push_back(std::move(t));
        firstRank.push_back(r->rank);
      }
      TensorEntry &t = meta.tensors[it->second];
      // Every rank must describe a tensor alike: different plans (or
      // models) mixed in one save would otherwise produce a checkpoint
      // that tiles nothing meaningful.
      if (t.kind != c.kind || t.tensorId != c.tensorId || t.dtype != c.dtype ||
          t.shape != c.globalShape)
        return makeError(
            "tensor \"" + c.tensor + "\": rank " + std::to_string(r->rank) +
            " saves it as " + std::string(plan::dtypeName(c.dtype)) + " " +
            formatInts(c.globalShape) + ", rank " +
            std::to_string(firstRank[it->second]) + " as " +
            std::string(plan::dtypeName(t.dtype)) + " " + formatInts(t.shape) +
            " (kind and tensor_id must agree too)");
      if (!c.declarationOnly)
        t.chunks.push_back(c.chunk);
    }
  }
  for (TensorEntry &t : meta.tensors)
    std::sort(t.chunks.begin(), t.chunks.end(),
              [](const Chunk &a, const Chunk &b) {
                return a.box.offset < b.box.offset;
              });
  // Every checkpoint names what it came from: a writer that knows no
  // document (a session opened from plans, a trainer's preset model) gets
  // the fingerprints of what it saved (docs/checkpoint-format.md).
  if (meta.model.fingerprint.empty())
    meta.model.fingerprint = parameterListFingerprint(meta);
  if (meta.spec.fingerprint.empty())
    meta.spec.fingerprint = layoutFingerprint(meta);
  if (Result<void> ok = validateMetadata(meta); !ok)
    return ok.error().within("the saved chunks do not form a checkpoint");
  return meta;
}

Result<void> writeStagedMetadata(const std::string &dir,
                                 const CheckpointMetadata &meta) {
  std::string staging = stagingDirOf(dir);
  if (staging.empty() || !isDirectory(staging))
    return makeError(dir + ": no staging directory " + staging +
                     " (beginCheckpoint must run first)");
  // The data files must be durable and whole before the metadata that
  // describes them exists; their writers fsynced them, the sizes are
  // checked here so that a lost write is an error, not a checkpoint.
  for (const DataFile &f : meta.files) {
    std::string path = io::joinPath(staging, f.name);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      return makeError(path + ": " + io::errnoText(errno));
    if (!S_ISREG(st.st_mode) || int64_t(st.st_size) != f.bytes)
      return makeError(path + ": " + std::to_string(st.st_size) +
                       " bytes, but its writer reported " +
                       std::to_string(f.bytes));
  }
  MESHPLAN_TRY(writeFileDurably(io::joinPath(staging, kMetadataFileName),
                                writeMetadata(meta)));
  return io::fsyncPath(staging, /*directory=*/true);
}

Result<void> writeFileDurably(const std::string &path, std::string_view bytes) {
  io::Fd fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.ok())
    return makeError(path + ": cannot create: " + io::errnoText(errno));
  MESHPLAN_TRY(io::writeAll(fd.get(),
                            reinterpret_cast<const std::byte *>(bytes.data()),
                            bytes.size(), path));
  if (::fsync(fd.get()) != 0)
    return makeError(path + ": fsync failed: " + io::errnoText(errno));
  if (fd.release() != 0)
    return makeError(path + ": close failed: " + io::errnoText(errno));
  return {};
}

Result<void> abortCheckpoint(const std::string &dir) {
  std::string staging = stagingDirOf(dir);
  if (staging.empty())
    return {};
  return removeTree(staging);
}

Result<void> publishCheckpoint(const std::string &dir) {
  std::string staging = stagingDirOf(dir);
  if (staging.empty() || !isDirectory(staging))
    return makeError(dir + ": no staging directory " + staging +
                     " (beginCheckpoint must run first)");
  struct stat st;
  if (::stat(io::joinPath(staging, kMetadataFileName).c_str(), &st) != 0)
    return makeError(staging + ": has no " + std::string(kMetadataFileName) +
                     " (writeStagedMetadata must run first)");
  SplitPath p = splitPath(dir);
  std::string parent = parentOrDot(p.parent);

  // Where the previous checkpoint waits between the two renames of a file
  // system without RENAME_EXCHANGE (below).
  std::string previous = io::joinPath(parent, "." + p.name + ".previous");
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT)
      return makeError(dir + ": " + io::errnoText(errno));
    if (::rename(staging.c_str(), dir.c_str()) != 0)
      return makeError(dir + ": cannot rename " + staging +
                       " to it: " + io::errnoText(errno));
    MESHPLAN_TRY(io::fsyncPath(parent, /*directory=*/true));
    // A save that crashed between those two renames left the checkpoint
    // before it there, the only complete one until now; this save, durable
    // now, replaces it.
    return removeTree(previous);
  }
  // Only a checkpoint is ever replaced: a typo in --output must not delete
  // somebody's directory.
  struct stat meta;
  if (!S_ISDIR(st.st_mode) ||
      ::stat(io::joinPath(dir, kMetadataFileName).c_str(), &meta) != 0)
    return makeError(dir + ": exists and is not a checkpoint (no " +
                     std::string(kMetadataFileName) + "); not replacing it");
  // One atomic swap: at every instant `dir` is the old or the new
  // checkpoint. The old one ends up under the staging name, which readers
  // refuse and the next beginCheckpoint clears.
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(),
                  RENAME_EXCHANGE) == 0) {
    MESHPLAN_TRY(io::fsyncPath(parent, /*directory=*/true));
    return removeTree(staging);
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
    return makeError(dir + ": cannot exchange it with " + staging + ": " +
                     io::errnoText(errno));
  // A file system without RENAME_EXCHANGE: two renames. A crash between
  // them leaves no `dir` but the old checkpoint complete under
  // `.<name>.previous`, which readCheckpointMetadata points out.
  MESHPLAN_TRY(removeTree(previous));
  if (::rename(dir.c_str(), previous.c_str()) != 0)
    return makeError(dir + ": cannot move the old checkpoint aside: " +
                     io::errnoText(errno));
  if (::rename(staging.c_str(), dir.c_str()) != 0)
    return makeError(dir + ": cannot rename " + staging +
                     " to it: " + io::errnoText(errno) +
                     " (the previous checkpoint is " + previous + ")");
  MESHPLAN_TRY(io::fsyncPath(parent, /*directory=*/true));
  return removeTree(previous);
}

Result<CheckpointMetadata>
commitCheckpoint(const std::string &dir, const CheckpointInfo &info,
                 std::span<const RankRecords> records) {
  Result<CheckpointMetadata> meta = assembleMetadata(info, records);
  if (!meta)
    return meta.error();
  MESHPLAN_TRY(writeStagedMetadata(dir, *meta));
  MESHPLAN_TRY(publishCheckpoint(dir));
  meta->directory = dir;
  return meta;
}

} // namespace meshplan::ckpt
