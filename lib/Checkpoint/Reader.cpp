//===- Reader.cpp - Loading boxes from a checkpoint, verifying it ---------===//
//
// A loader under another layout needs, from each chunk that intersects its
// box, only part of the chunk. Checksums are per block (the metadata's
// block_bytes), so it reads the blocks covering the intersection's byte
// range, verifies each before using a byte of it, and copies the
// intersection's rows; whole chunks are read only when the intersection
// spans them (docs/checkpoint-format.md, "Reading").
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Checkpoint.h"

#include "meshplan/Support/Json.h"

#include "FileIO.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

namespace meshplan::ckpt {

namespace {

std::string formatInts(const std::vector<int64_t> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::string hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::string baseName(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

/// Bytes one pread brings in (and the most a reader holds from a chunk):
/// a few MiB, so that each block is checksummed and copied out while it is
/// still in cache (the window holds at least one block).
constexpr int64_t kWindowBytes = int64_t(4) << 20;

/// How far ahead of its reads a reader asks the kernel to read
/// (POSIX_FADV_WILLNEED), within the blocks it is going to read anyway.
constexpr int64_t kReadAheadBytes = int64_t(16) << 20;

/// The read buffer of one load, shared by its chunks: allocated on first
/// use, grown only for a larger window, never zero-filled (every byte used
/// is read into it first).
class WindowBuffer {
public:
  std::byte *get(size_t n) {
    if (n > capacity) {
      data.reset();
      data.reset(new std::byte[n]);
      capacity = n;
    }
    return data.get();
  }

private:
  std::unique_ptr<std::byte[]> data;
  size_t capacity = 0;
};

/// Reads blocks [firstBlock, endBlock) of one chunk, in increasing order,
/// either into a window of the shared buffer or straight into the
/// destination, and verifies each block's CRC32C exactly once before
/// handing out a byte of it. Every block read is verified, used or not.
class ChunkReader {
public:
  ChunkReader(const CheckpointMetadata &meta, const TensorEntry &tensor,
              const Chunk &chunk, WindowBuffer &buffer)
      : meta(meta), tensor(tensor), chunk(chunk), buffer(buffer),
        path(io::joinPath(meta.directory, chunk.file)) {
    int64_t b = meta.blockBytes;
    windowBlocks = std::max<int64_t>(1, kWindowBytes / b);
  }

  /// Opens the chunk's file for reading blocks [firstBlock, endBlock).
  Result<void> open(int64_t firstBlock, int64_t endBlock) {
    fd = std::make_unique<io::Fd>(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd->ok())
      return makeError(path + ": cannot open: " + io::errnoText(errno));
    rangeEnd = blockEnd(endBlock);
    advisedEnd = firstBlock * meta.blockBytes;
    // Advice only: its failure changes nothing but speed.
    (void)::posix_fadvise(fd->get(), chunk.byteOffset + advisedEnd,
                          rangeEnd - advisedEnd, POSIX_FADV_SEQUENTIAL);
    return {};
  }

  /// Makes chunk byte `pos` available; returns a pointer to it and the
  /// number of verified bytes available from it (to the end of its block).
  /// `pos` never decreases from one call to the next; blocks are read from
  /// the one holding `pos`, never beyond block `endBlock`.
  Result<std::pair<const std::byte *, int64_t>> at(int64_t pos,
                                                   int64_t endBlock) {
    const int64_t b = meta.blockBytes;
    if (pos < winBegin || pos >= winEnd) {
      MESHPLAN_TRY(retire());
      int64_t first = pos / b;
      int64_t last = std::min(endBlock, first + windowBlocks);
      winBegin = first * b;
      winEnd = blockEnd(last);
      window = buffer.get(size_t(winEnd - winBegin));
      MESHPLAN_TRY(readRaw(window, winBegin, winEnd));
      verified = winBegin;
    }
    // Verify up to the end of pos's block (and any block skipped before it).
    int64_t end = blockEnd(pos / b + 1);
    while (verified < end) {
      int64_t k = verified / b;
      MESHPLAN_TRY(check(k, window + (verified - winBegin)));
      verified = blockEnd(k + 1);
    }
    return std::pair<const std::byte *, int64_t>{window + (pos - winBegin),
                                                 end - pos};
  }

  /// Reads blocks [first, last) (after anything read before) straight into
  /// `dst`, verifying each while it is in cache.
  Result<void> readInto(std::byte *dst, int64_t first, int64_t last) {
    MESHPLAN_TRY(retire());
    const int64_t b = meta.blockBytes;
    for (int64_t k = first; k < last;) {
      int64_t next = std::min(last, k + windowBlocks);
      int64_t lo = k * b, hi = blockEnd(next);
      MESHPLAN_TRY(readRaw(dst, lo, hi));
      for (; k < next; ++k)
        MESHPLAN_TRY(check(k, dst + (k * b - lo)));
      dst += hi - lo;
    }
    return {};
  }

  /// Verifies what the window holds beyond the last byte handed out.
  Result<void> retire() {
    const int64_t b = meta.blockBytes;
    while (verified < winEnd) {
      int64_t k = verified / b;
      MESHPLAN_TRY(check(k, window + (verified - winBegin)));
      verified = blockEnd(k + 1);
    }
    winBegin = winEnd = verified = 0;
    return {};
  }

  /// Whether chunk byte `pos` is in the current window.
  bool holds(int64_t pos) const { return pos >= winBegin && pos < winEnd; }

  int64_t bytesRead = 0;

private:
  /// Chunk byte where block `k` ends (the last block is shorter).
  int64_t blockEnd(int64_t k) const {
    return std::min(k * meta.blockBytes, chunk.length);
  }

  /// Reads chunk bytes [lo, hi) into `dst`, asking the kernel for what
  /// follows.
  Result<void> readRaw(std::byte *dst, int64_t lo, int64_t hi) {
    int64_t ahead = std::min(rangeEnd, hi + kReadAheadBytes);
    if (advisedEnd < ahead) {
      int64_t from = std::max(advisedEnd, hi);
      if (from < ahead)
        (void)::posix_fadvise(fd->get(), chunk.byteOffset + from, ahead - from,
                              POSIX_FADV_WILLNEED);
      advisedEnd = ahead;
    }
    MESHPLAN_TRY(io::preadAll(fd->get(), dst, size_t(hi - lo),
                              chunk.byteOffset + lo, path));
    bytesRead += hi - lo;
    return {};
  }

  /// Verifies block `k`, whose bytes are at `p`.
  Result<void> check(int64_t k, const std::byte *p) {
    const int64_t b = meta.blockBytes;
    int64_t n = std::min(b, chunk.length - k * b);
    uint32_t crc = crc32c(p, size_t(n));
    if (crc != chunk.crc32c[size_t(k)])
      return makeError(
          "tensor \"" + tensor.name + "\": checksum mismatch in " + path +
          " at byte " + std::to_string(chunk.byteOffset + k * b) + " (" +
          std::to_string(n) + "-byte block " + std::to_string(k) +
          " of the chunk " + formatBox(chunk.box) + "): stored " +
          hex8(chunk.crc32c[size_t(k)]) + ", computed " + hex8(crc));
    return {};
  }

  const CheckpointMetadata &meta;
  const TensorEntry &tensor;
  const Chunk &chunk;
  WindowBuffer &buffer;
  std::string path;
  std::unique_ptr<io::Fd> fd;
  int64_t windowBlocks = 1;
  std::byte *window = nullptr;
  int64_t winBegin = 0, winEnd = 0, verified = 0;
  int64_t rangeEnd = 0, advisedEnd = 0;
};

/// Row-major linear index of `coord - origin` in a box of `shape`.
int64_t linearIndex(const std::vector<int64_t> &coord,
                    const std::vector<int64_t> &origin,
                    const std::vector<int64_t> &shape) {
  int64_t idx = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    idx = idx * shape[d] + (coord[d] - origin[d]);
  return idx;
}

/// Copies the intersection `inter` of a chunk and a target box from the
/// chunk's bytes into the target's, in runs as long as both layouts allow.
/// Whole blocks inside one run are read straight into the target; the
/// others through the window, from which every run they hold is copied.
Result<void> copyIntersection(const CheckpointMetadata &meta,
                              const TensorEntry &tensor, const Chunk &chunk,
                              const Box &target, const Box &inter,
                              std::span<std::byte> out, WindowBuffer &buffer) {
  const int64_t eb = plan::dtypeBytes(tensor.dtype);
  const int n = inter.rank();
  // Inner dims that are whole in the chunk and the target are contiguous in
  // both: merge them into one run.
  int outer = n;
  int64_t run = 1;
  if (n > 0) {
    outer = n - 1;
    run = inter.shape[n - 1];
    while (outer > 0 && inter.shape[outer] == chunk.box.shape[outer] &&
           inter.shape[outer] == target.shape[outer]) {
      --outer;
      run *= inter.shape[outer];
    }
  }
  std::vector<int64_t> last(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d)
    last[d] = inter.offset[d] + inter.shape[d] - 1;
  // Blocks are read from the one holding the first run's first byte up to
  // the one holding the last run's last byte.
  const int64_t endByte =
      (linearIndex(last, chunk.box.offset, chunk.box.shape) + 1) * eb;
  const int64_t b = meta.blockBytes;
  const int64_t endBlock = (endByte + b - 1) / b;
  const int64_t firstBlock =
      linearIndex(inter.offset, chunk.box.offset, chunk.box.shape) * eb / b;
  const int64_t chunkBlocks = (chunk.length + b - 1) / b;

  ChunkReader reader(meta, tensor, chunk, buffer);
  MESHPLAN_TRY(reader.open(firstBlock, endBlock));
  std::vector<int64_t> coord = inter.offset;
  const int64_t runBytes = run * eb;
  while (true) {
    int64_t src = linearIndex(coord, chunk.box.offset, chunk.box.shape) * eb;
    int64_t dst = linearIndex(coord, target.offset, target.shape) * eb;
    for (int64_t left = runBytes; left > 0;) {
      if (src % b == 0 && !reader.holds(src)) {
        // The whole blocks from here within the run (the chunk's last,
        // shorter block too when the run reaches the chunk's end).
        int64_t endWhole =
            src + left == chunk.length ? chunkBlocks : (src + left) / b;
        if (endWhole > src / b) {
          MESHPLAN_TRY(reader.readInto(out.data() + dst, src / b, endWhole));
          int64_t k = std::min(endWhole * b, chunk.length) - src;
          src += k;
          dst += k;
          left -= k;
          continue;
        }
      }
      auto piece = reader.at(src, endBlock);
      if (!piece)
        return piece.error();
      int64_t k = std::min(left, piece->second);
      std::memcpy(out.data() + dst, piece->first, size_t(k));
      src += k;
      dst += k;
      left -= k;
    }
    // Next run: odometer over the outer dims, minor to major.
    int d = outer - 1;
    while (d >= 0) {
      if (++coord[d] <= last[d])
        break;
      coord[d] = inter.offset[d];
      --d;
    }
    if (d < 0)
      break;
  }
  return reader.retire();
}

} // namespace

Result<CheckpointMetadata> readCheckpointMetadata(const std::string &dir) {
  std::string name = baseName(dir);
  if (name.size() > 1 && name.front() == '.' && name.ends_with(".partial"))
    return makeError(dir + ": is the staging directory of a save that was "
                           "not committed (or an old checkpoint being "
                           "deleted), not a checkpoint");
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::string why = ::stat(dir.c_str(), &st) != 0
                          ? io::errnoText(errno)
                          : std::string("not a directory");
    std::string staging = stagingDirOf(dir);
    std::string previous =
        staging.empty() ? ""
                        : staging.substr(0, staging.size() - 8) + ".previous";
    if (!previous.empty() && ::stat(previous.c_str(), &st) == 0)
      why += "; a save was interrupted while replacing it: the previous "
             "checkpoint is " +
             previous;
    else if (!staging.empty() && ::stat(staging.c_str(), &st) == 0)
      why += "; " + staging + " is an uncommitted save, not a checkpoint";
    return makeError(dir + ": no checkpoint here: " + why);
  }
  std::string path = io::joinPath(dir, kMetadataFileName);
  Result<std::string> text = json::readFile(path, kMaxPlanFileBytes);
  if (!text)
    return text.error();
  Result<CheckpointMetadata> meta = parseMetadata(*text);
  if (!meta)
    return meta.error().within(path);
  meta->directory = dir;
  // Sizes now, so that a truncated data file is named before anything is
  // read from it (chunk ranges were checked against the recorded sizes).
  for (size_t i = 0; i < meta->files.size(); ++i) {
    const DataFile &f = meta->files[i];
    std::string dataPath = io::joinPath(dir, f.name);
    if (::stat(dataPath.c_str(), &st) != 0)
      return makeError(dataPath + ": " + io::errnoText(errno) + " (listed in " +
                       path + " at /files/" + std::to_string(i) + ")");
    if (!S_ISREG(st.st_mode))
      return makeError(dataPath + ": not a regular file");
    if (int64_t(st.st_size) != f.bytes)
      return makeError(
          dataPath + ": " + std::to_string(st.st_size) + " bytes, but " + path +
          " (/files/" + std::to_string(i) + "/bytes) says " +
          std::to_string(f.bytes) +
          (int64_t(st.st_size) < f.bytes ? ": the file is truncated" : ""));
  }
  return meta;
}

static Result<const TensorEntry *>
findChecked(const CheckpointMetadata &meta, std::string_view tensor,
            const std::vector<int64_t> &globalShape, plan::DType dtype) {
  const TensorEntry *t = meta.findTensor(tensor);
  std::string where = meta.directory.empty() ? "checkpoint" : meta.directory;
  if (!t) {
    std::vector<std::string_view> names;
    for (const TensorEntry &e : meta.tensors)
      names.push_back(e.name);
    return makeError(where + ": no tensor " + json::quote(tensor) +
                     json::didYouMean(tensor, names));
  }
  if (t->shape != globalShape)
    return makeError(where + ": tensor " + json::quote(tensor) + " has shape " +
                     formatInts(t->shape) + " in the checkpoint but " +
                     formatInts(globalShape) + " in the plan");
  if (t->dtype != dtype)
    return makeError(where + ": tensor " + json::quote(tensor) + " is " +
                     std::string(plan::dtypeName(t->dtype)) +
                     " in the checkpoint but " +
                     std::string(plan::dtypeName(dtype)) +
                     " in the plan (no conversion on load without an explicit "
                     "cast: --dtype-cast)");
  return t;
}

Result<void> checkLoadable(const CheckpointMetadata &meta,
                           std::span<const PersistentBox> boxes) {
  for (const PersistentBox &b : boxes) {
    Result<const TensorEntry *> t =
        findChecked(meta, b.tensor, b.globalShape, b.dtype);
    if (!t)
      return t.error();
  }
  return {};
}

Result<void> loadBoxInto(const CheckpointMetadata &meta,
                         std::string_view tensor,
                         const std::vector<int64_t> &globalShape,
                         const Box &target, plan::DType dtype,
                         std::span<std::byte> out) {
  Result<const TensorEntry *> found =
      findChecked(meta, tensor, globalShape, dtype);
  if (!found)
    return found.error();
  const TensorEntry &t = **found;
  if (!boxWithin(target, t.shape))
    return makeError("tensor " + json::quote(tensor) + ": box " +
                     formatBox(target) + " lies outside its shape " +
                     formatInts(t.shape));
  int64_t bytes = 0;
  if (mulOverflows(target.numElements(), plan::dtypeBytes(dtype), &bytes) ||
      int64_t(out.size()) != bytes)
    return makeError("tensor " + json::quote(tensor) + ": box " +
                     formatBox(target) + " holds " + std::to_string(bytes) +
                     " bytes but the destination has " +
                     std::to_string(out.size()));
  if (bytes == 0)
    return {};
  // Chunks tile the tensor (validated on reading), so the intersections
  // cover the target exactly once. One read buffer serves every chunk.
  WindowBuffer buffer;
  for (const Chunk &c : t.chunks) {
    std::optional<Box> inter = intersectBoxes(c.box, target);
    if (!inter)
      continue;
    MESHPLAN_TRY(copyIntersection(meta, t, c, target, *inter, out, buffer));
  }
  return {};
}

Result<std::vector<std::byte>> loadBox(const CheckpointMetadata &meta,
                                       std::string_view tensor,
                                       const std::vector<int64_t> &globalShape,
                                       const Box &target, plan::DType dtype) {
  if (!boxWithin(target, globalShape))
    return makeError("tensor " + json::quote(tensor) + ": box " +
                     formatBox(target) + " lies outside the shape " +
                     formatInts(globalShape));
  int64_t bytes = 0;
  if (mulOverflows(target.numElements(), plan::dtypeBytes(dtype), &bytes))
    return makeError("tensor " + json::quote(tensor) + ": box too large");
  std::vector<std::byte> out(static_cast<size_t>(bytes));
  MESHPLAN_TRY(loadBoxInto(meta, tensor, globalShape, target, dtype, out));
  return out;
}

Result<VerifyReport>
verifyCheckpoint(const std::string &dir,
                 const std::function<void(int64_t, int64_t)> &progress) {
  Result<CheckpointMetadata> meta = readCheckpointMetadata(dir);
  if (!meta)
    return meta.error();
  // Progress by bytes, not chunks: one large tensor's chunks dominate.
  int64_t total = 0;
  for (const TensorEntry &t : meta->tensors)
    for (const Chunk &c : t.chunks)
      total += c.length;
  int64_t checked = 0;
  VerifyReport report;
  WindowBuffer buffer;
  for (const TensorEntry &t : meta->tensors) {
    ++report.tensors;
    for (const Chunk &c : t.chunks) {
      ++report.chunks;
      ChunkReader reader(*meta, t, c, buffer);
      int64_t endBlock = (c.length + meta->blockBytes - 1) / meta->blockBytes;
      MESHPLAN_TRY(reader.open(0, endBlock));
      for (int64_t pos = 0; pos < c.length;) {
        auto piece = reader.at(pos, endBlock);
        if (!piece)
          return piece.error();
        pos += piece->second;
      }
      report.bytes += reader.bytesRead;
      checked += c.length;
      if (progress)
        progress(checked, total);
    }
  }
  return report;
}

} // namespace meshplan::ckpt
