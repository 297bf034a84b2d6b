//===- Metadata.cpp - checkpoint.json: reader, validator, writer ----------===//
//
// checkpoint.json is untrusted: it may be truncated, hand-edited or written
// by something else. It is read through meshplan/Support/JsonReader.h (the
// plan reader's tokenizer: no exceptions, no DOM; a checkpoint of a large
// model lists every chunk of every tensor), every field is type-checked,
// every size is checked with overflow-safe arithmetic before it is used, and
// the chunks must tile each tensor exactly once, so that a loader can trust
// any box it is handed afterwards.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Checkpoint.h"

#include "meshplan/Support/Hash.h"
#include "meshplan/Support/Json.h"
#include "meshplan/Support/JsonReader.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

namespace meshplan::ckpt {

using namespace meshplan::json;

const TensorEntry *CheckpointMetadata::findTensor(std::string_view name) const {
  for (const TensorEntry &t : tensors)
    if (t.name == name)
      return &t;
  return nullptr;
}

namespace {

using T = JsonType;
const SectionRule kRootRule = {
    "",
    {
        {.name = "format", .type = T::String, .required = true},
        {.name = "version", .type = T::Integer, .required = true},
        {.name = "metadata_checksum", .type = T::String},
        {.name = "model", .type = T::Object, .required = true},
        {.name = "spec", .type = T::Object, .required = true},
        {.name = "training", .type = T::Object, .required = true},
        {.name = "written_by", .type = T::Object},
        {.name = "checksum", .type = T::Object, .required = true},
        {.name = "files",
         .type = T::Array,
         .required = true,
         .items = T::Object},
        {.name = "tensors",
         .type = T::Array,
         .required = true,
         .items = T::Object},
    }};
const SectionRule kSourceRule = {
    "source",
    {
        {.name = "name", .type = T::String, .required = true},
        {.name = "fingerprint", .type = T::String, .required = true},
    }};
const SectionRule kTrainingRule = {
    "training",
    {
        {.name = "step", .type = T::Integer, .required = true},
        {.name = "seed", .type = T::Integer, .required = true},
        {.name = "stochastic_rounding", .type = T::Boolean, .required = true},
    }};
const SectionRule kWrittenByRule = {
    "written_by",
    {
        {.name = "mesh", .type = T::String},
        {.name = "generator", .type = T::String},
        {.name = "from", .type = T::String},
        {.name = "conversion", .type = T::String},
    }};
const SectionRule kChecksumRule = {
    "checksum",
    {
        {.name = "algorithm",
         .type = T::String,
         .required = true,
         .values = {"crc32c"}},
        {.name = "block_bytes", .type = T::Integer, .required = true},
    }};
const SectionRule kFileRule = {
    "files",
    {
        {.name = "name", .type = T::String, .required = true},
        {.name = "bytes", .type = T::Integer, .required = true},
    }};
const SectionRule kTensorRule = {
    "tensors",
    {
        {.name = "name", .type = T::String, .required = true},
        {.name = "kind",
         .type = T::String,
         .required = true,
         .values = {"parameter", "optimizer_state"}},
        {.name = "tensor_id", .type = T::Integer},
        {.name = "dtype", .type = T::String, .required = true},
        {.name = "shape",
         .type = T::Array,
         .required = true,
         .items = T::Integer},
        {.name = "layout", .type = T::String},
        {.name = "chunks",
         .type = T::Array,
         .required = true,
         .items = T::Object},
    }};
const SectionRule kChunkRule = {
    "chunks",
    {
        {.name = "offset",
         .type = T::Array,
         .required = true,
         .items = T::Integer},
        {.name = "shape",
         .type = T::Array,
         .required = true,
         .items = T::Integer},
        {.name = "file", .type = T::String, .required = true},
        {.name = "byte_offset", .type = T::Integer, .required = true},
        {.name = "length", .type = T::Integer, .required = true},
        {.name = "crc32c",
         .type = T::Array,
         .required = true,
         .items = T::String},
    }};

std::string formatInts(const std::vector<int64_t> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

/// dump() that cannot throw: invalid UTF-8 in a caller's name is replaced
/// rather than aborting a -fno-exceptions build.
std::string dumpJson(const Json &j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

Result<uint32_t> parseHex8(Value v, const Path &path) {
  std::string_view text;
  if (!v.isString())
    return typeError(path, v, "a string");
  text = v.string();
  uint32_t out = 0;
  bool ok = text.size() == 8;
  for (char c : text) {
    if (!ok)
      break;
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                   : -1;
    ok = d >= 0;
    out = out << 4 | uint32_t(d);
  }
  if (!ok)
    return errorAt(path, "expected a CRC32C as 8 lowercase hex digits, got " +
                             quote(text));
  return out;
}

/// A data file name must stay inside the checkpoint directory: a plain
/// name, no separators, not "." or "..", not the metadata file.
bool plainFileName(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
      name == kMetadataFileName)
    return false;
  for (char c : name)
    if (c == '/' || c == '\0' || c == '\\')
      return false;
  return true;
}

/// The format says integers are JSON integers; the shared reader (as
/// JSON Schema) also takes 0.0 or 1e3 for one. A checkpoint is
/// machine-written, so a fraction or exponent where an integer belongs is
/// an edit or another writer's mistake: refused, naming the field. Runs on
/// an object that passed checkObject with `section`.
Result<void> checkIntegers(Value v, const Path &path,
                           const SectionRule &section) {
  auto check = [](Value x, const Path &at) -> Result<void> {
    if (x.kind() != ValueKind::Float)
      return {};
    return errorAt(at, "expected an integer, got number " + dump(x) +
                           " (integers are written without a fraction or "
                           "exponent)");
  };
  for (Member m : v.members())
    for (const KeyRule &rule : section.keys) {
      if (!sameText(rule.name, m.key))
        continue;
      Path at = path.child(m.key);
      if (rule.type == T::Integer)
        MESHPLAN_TRY(check(m.value, at));
      else if (rule.type == T::Array && rule.items == T::Integer) {
        size_t i = 0;
        for (Value e : m.value.elements())
          MESHPLAN_TRY(check(e, at.child(i++)));
      }
      break;
    }
  return {};
}

Result<SourceRef> readSource(Value v, const Path &path) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kSourceRule));
  SourceRef s;
  MESHPLAN_TRY(readStringInto(f.at("name"), path.child("name"), s.name));
  MESHPLAN_TRY(readStringInto(f.at("fingerprint"), path.child("fingerprint"),
                              s.fingerprint));
  return s;
}

Result<Chunk> readChunk(Value v, const Path &path) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kChunkRule));
  MESHPLAN_TRY(checkIntegers(v, path, kChunkRule));
  Chunk c;
  MESHPLAN_TRY(
      readIntArrayInto(f.at("offset"), path.child("offset"), c.box.offset, 0));
  MESHPLAN_TRY(readIntArrayInto(f.at("shape"), path.child("shape"), c.box.shape,
                                0, kMaxTensorElements));
  MESHPLAN_TRY(readStringInto(f.at("file"), path.child("file"), c.file));
  MESHPLAN_ASSIGN(c.byteOffset,
                  readInt(f.at("byte_offset"), path.child("byte_offset"), 0));
  MESHPLAN_ASSIGN(c.length, readInt(f.at("length"), path.child("length"), 0));
  Value crcs = f.at("crc32c");
  Path crcPath = path.child("crc32c");
  // As many as the file lists (the tape holds them all already);
  // validateMetadata checks the exact count.
  c.crc32c.reserve(crcs.size());
  size_t i = 0;
  for (Value crc : crcs.elements()) {
    uint32_t value = 0;
    MESHPLAN_ASSIGN(value, parseHex8(crc, crcPath.child(i++)));
    c.crc32c.push_back(value);
  }
  return c;
}

/// Reads a tensor's chunks from pieces of the text parsed one by one
/// (parseMetadata), instead of from its "chunks" value.
using ChunkSource = std::function<Result<void>(TensorEntry &, const Path &)>;

Result<TensorEntry> readTensor(Value v, const Path &path,
                               const ChunkSource *chunkSource = nullptr) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kTensorRule));
  MESHPLAN_TRY(checkIntegers(v, path, kTensorRule));
  TensorEntry t;
  MESHPLAN_TRY(readStringInto(f.at("name"), path.child("name"), t.name));
  t.kind = f.at("kind").string() == "parameter" ? TensorKind::Parameter
                                                : TensorKind::OptimizerState;
  if (std::optional<Value> id = f.get("tensor_id")) {
    int64_t n = 0;
    MESHPLAN_ASSIGN(n, readInt(*id, path.child("tensor_id"), 0));
    t.tensorId = n;
  }
  std::string_view dtype = f.at("dtype").string();
  std::optional<plan::DType> d = plan::parseDType(dtype);
  if (!d)
    return errorAt(path.child("dtype"),
                   "unknown dtype " + quote(dtype) +
                       "; expected one of float32, bfloat16, float16, "
                       "float8_e4m3fn, float8_e5m2, float64, int8, uint8, "
                       "int32, int64");
  t.dtype = *d;
  MESHPLAN_TRY(readIntArrayInto(f.at("shape"), path.child("shape"), t.shape, 0,
                                kMaxTensorElements));
  if (std::optional<Value> layout = f.get("layout"))
    MESHPLAN_TRY(readStringInto(*layout, path.child("layout"), t.layout));
  Value chunks = f.at("chunks");
  Path chunksPath = path.child("chunks");
  if (chunkSource) {
    MESHPLAN_TRY((*chunkSource)(t, chunksPath));
    return t;
  }
  t.chunks.reserve(chunks.size());
  size_t i = 0;
  for (Value chunk : chunks.elements()) {
    Chunk c;
    MESHPLAN_ASSIGN(c, readChunk(chunk, chunksPath.child(i++)));
    t.chunks.push_back(std::move(c));
  }
  return t;
}

/// Chunk pointers, for messages.
std::string chunkPtr(size_t t, size_t c) {
  return "/tensors/" + std::to_string(t) + "/chunks/" + std::to_string(c);
}

/// Exact tiling: no two chunks overlap, and their element counts add up to
/// the tensor's. Overlaps are found by a sweep along the dim with the most
/// distinct chunk offsets (chunks are compared only with those overlapping
/// them along it), so the usual layouts cost O(k log k), not O(k^2).
Result<void> checkTiling(const TensorEntry &t, size_t ti) {
  const std::string tensorPtr = "/tensors/" + std::to_string(ti);
  const std::string name = "tensor " + quote(t.name);
  int64_t total = 1;
  for (int64_t s : t.shape)
    total *= s; // bounded by checkShape
  if (t.chunks.empty()) {
    if (total == 0)
      return {};
    return errorAt(tensorPtr + "/chunks", name + " has no chunks but " +
                                              std::to_string(total) +
                                              " elements");
  }
  const int rank = static_cast<int>(t.shape.size());
  int sweepDim = 0;
  size_t best = 0;
  for (int d = 0; d < rank; ++d) {
    std::set<int64_t> distinct;
    for (const Chunk &c : t.chunks)
      distinct.insert(c.box.offset[d]);
    if (distinct.size() > best) {
      best = distinct.size();
      sweepDim = d;
    }
  }
  std::vector<size_t> order(t.chunks.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  auto start = [&](size_t i) {
    return rank ? t.chunks[i].box.offset[sweepDim] : 0;
  };
  auto end = [&](size_t i) {
    return rank ? t.chunks[i].box.offset[sweepDim] +
                      t.chunks[i].box.shape[sweepDim]
                : 1;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return start(a) < start(b); });
  std::vector<size_t> active;
  int64_t covered = 0;
  for (size_t i : order) {
    std::erase_if(active, [&](size_t a) { return end(a) <= start(i); });
    for (size_t a : active)
      if (intersectBoxes(t.chunks[a].box, t.chunks[i].box) || rank == 0) {
        size_t lo = std::min(a, i), hi = std::max(a, i);
        return errorAt(chunkPtr(ti, hi),
                       name + ": chunk " + formatBox(t.chunks[hi].box) +
                           " overlaps chunk " + std::to_string(lo) + " " +
                           formatBox(t.chunks[lo].box));
      }
    active.push_back(i);
    covered += t.chunks[i].box.numElements(); // disjoint, within the tensor
  }
  if (covered != total)
    return errorAt(tensorPtr + "/chunks",
                   name + ": the chunks cover " + std::to_string(covered) +
                       " of its " + std::to_string(total) +
                       " elements (a gap)");
  return {};
}

} // namespace

Result<void> validateMetadata(const CheckpointMetadata &meta) {
  if (meta.blockBytes < 1 || meta.blockBytes > kMaxBlockBytes)
    return errorAt("/checksum/block_bytes",
                   "block_bytes must be in [1, 2^30], got " +
                       std::to_string(meta.blockBytes));
  if (meta.training.step < 0 || meta.training.seed < 0)
    return errorAt("/training", "step and seed must be >= 0");
  for (auto [ptr, source] : {std::pair{"/model/fingerprint", &meta.model},
                             std::pair{"/spec/fingerprint", &meta.spec}}) {
    // Version 1 writers left fingerprints they did not know empty.
    if (isFingerprint(source->fingerprint) ||
        (meta.version < 2 && source->fingerprint.empty()))
      continue;
    return errorAt(ptr, "expected \"fnv1a64:\" and 16 lowercase hex digits, "
                        "got " +
                            quote(source->fingerprint));
  }
  std::unordered_map<std::string_view, size_t> files;
  for (size_t i = 0; i < meta.files.size(); ++i) {
    const DataFile &f = meta.files[i];
    std::string p = "/files/" + std::to_string(i);
    if (!plainFileName(f.name))
      return errorAt(p + "/name",
                     "data file " + quote(f.name) +
                         " is not a plain file name inside the checkpoint");
    if (f.bytes < 0)
      return errorAt(p + "/bytes", "negative size");
    if (!files.emplace(f.name, i).second)
      return errorAt(p + "/name",
                     "data file " + quote(f.name) + " is listed twice");
  }

  struct ByteRange {
    size_t file;
    int64_t begin, end;
    size_t tensor, chunk;
  };
  std::vector<ByteRange> ranges;
  std::unordered_map<std::string_view, size_t> names;
  for (size_t ti = 0; ti < meta.tensors.size(); ++ti) {
    const TensorEntry &t = meta.tensors[ti];
    std::string tp = "/tensors/" + std::to_string(ti);
    if (t.name.empty())
      return errorAt(tp + "/name", "empty tensor name");
    if (auto [it, fresh] = names.emplace(t.name, ti); !fresh)
      return errorAt(tp + "/name", "tensor " + quote(t.name) +
                                       " is also /tensors/" +
                                       std::to_string(it->second));
    if (t.tensorId && t.kind != TensorKind::Parameter)
      return errorAt(tp + "/tensor_id", "only parameters have a tensor_id");
    if (Result<void> ok = checkShape(t.shape); !ok)
      return ok.error().within(tp + "/shape");
    const int64_t eb = plan::dtypeBytes(t.dtype);
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
      const Chunk &c = t.chunks[ci];
      std::string cp = chunkPtr(ti, ci);
      std::string what = "tensor " + quote(t.name) + ": ";
      if (c.box.offset.size() != t.shape.size())
        return errorAt(cp + "/offset", what + "offset has " +
                                           std::to_string(c.box.offset.size()) +
                                           " dims, the tensor " +
                                           std::to_string(t.shape.size()));
      if (c.box.shape.size() != t.shape.size())
        return errorAt(cp + "/shape", what + "shape has " +
                                          std::to_string(c.box.shape.size()) +
                                          " dims, the tensor " +
                                          std::to_string(t.shape.size()));
      for (int64_t s : c.box.shape)
        if (s < 1)
          return errorAt(cp + "/shape", what + "empty chunk " +
                                            formatInts(c.box.shape) +
                                            " (writers store no empty boxes)");
      if (!boxWithin(c.box, t.shape))
        return errorAt(cp + "/offset", what + "box " + formatBox(c.box) +
                                           " lies outside the tensor's shape " +
                                           formatInts(t.shape));
      int64_t bytes = 0;
      // Within the tensor, so elements <= 2^50 and x 8 bytes cannot
      // overflow; checked anyway in case the limits ever grow.
      if (mulOverflows(c.box.numElements(), eb, &bytes) || c.length != bytes)
        return errorAt(cp + "/length",
                       what + "length " + std::to_string(c.length) +
                           " but the box holds " + std::to_string(bytes) +
                           " bytes of " +
                           std::string(plan::dtypeName(t.dtype)));
      auto file = files.find(c.file);
      if (file == files.end())
        return errorAt(cp + "/file", what + "data file " + quote(c.file) +
                                         " is not listed in /files");
      int64_t fileBytes = meta.files[file->second].bytes;
      int64_t endByte = 0;
      if (__builtin_add_overflow(c.byteOffset, c.length, &endByte) ||
          endByte > fileBytes)
        return errorAt(cp + "/byte_offset",
                       what + "bytes [" + std::to_string(c.byteOffset) + ", " +
                           std::to_string(c.byteOffset) + " + " +
                           std::to_string(c.length) + ") lie outside " +
                           quote(c.file) + " (" + std::to_string(fileBytes) +
                           " bytes)");
      int64_t blocks =
          c.length / meta.blockBytes + (c.length % meta.blockBytes ? 1 : 0);
      if (int64_t(c.crc32c.size()) != blocks)
        return errorAt(cp + "/crc32c", what + std::to_string(c.crc32c.size()) +
                                           " checksums but " +
                                           std::to_string(c.length) +
                                           " bytes in blocks of " +
                                           std::to_string(meta.blockBytes) +
                                           " need " + std::to_string(blocks));
      ranges.push_back({file->second, c.byteOffset, endByte, ti, ci});
    }
    MESHPLAN_TRY(checkTiling(t, ti));
  }
  // Two chunks sharing bytes would be one value stored for two boxes: never
  // written by the writer, so a sign of an edited or corrupt file.
  std::sort(ranges.begin(), ranges.end(), [](const auto &a, const auto &b) {
    return std::tie(a.file, a.begin) < std::tie(b.file, b.begin);
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const ByteRange &a = ranges[i - 1], &b = ranges[i];
    if (a.file == b.file && b.begin < a.end)
      return errorAt(chunkPtr(b.tensor, b.chunk) + "/byte_offset",
                     "bytes [" + std::to_string(b.begin) + ", " +
                         std::to_string(b.end) + ") of " +
                         quote(meta.files[b.file].name) + " overlap those of " +
                         chunkPtr(a.tensor, a.chunk));
  }
  return {};
}

namespace {

/// Reads the tensors from pieces of the text parsed one by one, instead of
/// from the document's "tensors" value (which is then `[]`).
using TensorSource =
    std::function<Result<void>(CheckpointMetadata &, const Path &)>;

/// Reads a parsed document (with `tensorSource`, one whose tensors were
/// elided and are read from it instead).
Result<CheckpointMetadata> readDocument(Value doc,
                                        const TensorSource *tensorSource) {
  const Path root;
  if (!doc.isObject())
    return typeError(root, doc, "a checkpoint metadata object");
  // Format and version first, so that a newer or foreign document is named
  // as such rather than by its first unknown key.
  std::optional<Value> format = doc.find("format");
  if (!format)
    return errorAt(root,
                   "missing required key \"format\" (checkpoint "
                   "metadata starts with \"format\": \"meshplan.checkpoint\")");
  if (!format->isString() || format->string() != kCheckpointFormat)
    return errorAt(root.child("format"), "expected " +
                                             quote(kCheckpointFormat) +
                                             ", got " + describe(*format));
  std::optional<Value> version = doc.find("version");
  if (!version)
    return errorAt(root, "missing required key \"version\"");
  if (version->kind() != ValueKind::Unsigned ||
      version->unsignedValue() < uint64_t(kOldestCheckpointVersion) ||
      version->unsignedValue() > uint64_t(kCheckpointVersion))
    return errorAt(root.child("version"),
                   "unsupported checkpoint version " + dump(*version) +
                       "; this meshplan reads versions " +
                       std::to_string(kOldestCheckpointVersion) + " to " +
                       std::to_string(kCheckpointVersion));
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(doc, root, kRootRule));
  CheckpointMetadata meta;
  meta.version = int(version->unsignedValue());
  // Version 2 protects the metadata with a checksum (checked last, once
  // everything parsed is known to be well-formed); version 1 had none.
  std::optional<Value> recorded = f.get("metadata_checksum");
  if (meta.version >= 2 && !recorded)
    return errorAt(root.child("metadata_checksum"),
                   "missing required key; expected a string "
                   "\"fnv1a64:<16 hex digits>\" (version 2 metadata is "
                   "checksummed)");
  if (meta.version < 2 && recorded)
    return errorAt(root.child("metadata_checksum"),
                   "version 1 metadata has no checksum (a version 2 file "
                   "with its version edited?)");
  MESHPLAN_ASSIGN(meta.model, readSource(f.at("model"), root.child("model")));
  MESHPLAN_ASSIGN(meta.spec, readSource(f.at("spec"), root.child("spec")));
  {
    Path p = root.child("training");
    Fields tf;
    MESHPLAN_ASSIGN(tf, checkObject(f.at("training"), p, kTrainingRule));
    MESHPLAN_TRY(checkIntegers(f.at("training"), p, kTrainingRule));
    MESHPLAN_ASSIGN(meta.training.step,
                    readInt(tf.at("step"), p.child("step"), 0));
    MESHPLAN_ASSIGN(meta.training.seed,
                    readInt(tf.at("seed"), p.child("seed"), 0));
    MESHPLAN_ASSIGN(
        meta.training.stochasticRounding,
        readBool(tf.at("stochastic_rounding"), p.child("stochastic_rounding")));
  }
  if (std::optional<Value> w = f.get("written_by")) {
    Path p = root.child("written_by");
    Fields wf;
    MESHPLAN_ASSIGN(wf, checkObject(*w, p, kWrittenByRule));
    if (std::optional<Value> m = wf.get("mesh"))
      MESHPLAN_TRY(readStringInto(*m, p.child("mesh"), meta.mesh));
    if (std::optional<Value> g = wf.get("generator"))
      MESHPLAN_TRY(readStringInto(*g, p.child("generator"), meta.generator));
    if (std::optional<Value> g = wf.get("from"))
      MESHPLAN_TRY(readStringInto(*g, p.child("from"), meta.from));
    if (std::optional<Value> g = wf.get("conversion"))
      MESHPLAN_TRY(readStringInto(*g, p.child("conversion"), meta.conversion));
  }
  {
    Path p = root.child("checksum");
    Fields cf;
    MESHPLAN_ASSIGN(cf, checkObject(f.at("checksum"), p, kChecksumRule));
    MESHPLAN_TRY(checkIntegers(f.at("checksum"), p, kChecksumRule));
    MESHPLAN_ASSIGN(meta.blockBytes,
                    readInt(cf.at("block_bytes"), p.child("block_bytes"), 1,
                            kMaxBlockBytes));
  }
  Value files = f.at("files");
  Path filesPath = root.child("files");
  meta.files.reserve(files.size());
  size_t i = 0;
  for (Value file : files.elements()) {
    Path p = filesPath.child(i++);
    Fields ff;
    MESHPLAN_ASSIGN(ff, checkObject(file, p, kFileRule));
    MESHPLAN_TRY(checkIntegers(file, p, kFileRule));
    DataFile d;
    MESHPLAN_TRY(readStringInto(ff.at("name"), p.child("name"), d.name));
    MESHPLAN_ASSIGN(d.bytes, readInt(ff.at("bytes"), p.child("bytes"), 0));
    meta.files.push_back(std::move(d));
  }
  Value tensors = f.at("tensors");
  Path tensorsPath = root.child("tensors");
  if (tensorSource)
    MESHPLAN_TRY((*tensorSource)(meta, tensorsPath));
  meta.tensors.reserve(meta.tensors.size() + tensors.size());
  i = 0;
  for (Value tensor : tensors.elements()) {
    TensorEntry t;
    MESHPLAN_ASSIGN(t, readTensor(tensor, tensorsPath.child(i++)));
    meta.tensors.push_back(std::move(t));
  }
  MESHPLAN_TRY(validateMetadata(meta));
  if (recorded) {
    std::string_view want = recorded->string();
    if (!isFingerprint(want))
      return errorAt(root.child("metadata_checksum"),
                     "expected \"fnv1a64:\" and 16 lowercase hex digits, got " +
                         quote(want));
    std::string got = metadataChecksumOf(meta);
    if (got != want)
      return errorAt(root.child("metadata_checksum"),
                     "the metadata hashes to " + got + ", not " +
                         std::string(want) +
                         ": it was changed after it was written (a value, an "
                         "order or a name edited); refusing to load state it "
                         "no longer describes");
  }
  return meta;
}

//===----------------------------------------------------------------------===//
// Reading in pieces
//===----------------------------------------------------------------------===//
//
// A tape of the whole document costs 16 bytes per value: 1 GiB at the limit
// of 2^26 values, on top of the text and the structures read from it
// (docs/limits.md). Instead, the text is cut, without being tokenized, at
// the elements of "tensors" and of each tensor's "chunks"; the document with
// those arrays' contents elided, each tensor header with its chunks elided,
// and each chunk are then tokenized on their own (each a small tape, reused
// from one piece to the next), with one value limit over all of them. The
// cuts only skip strings and balance brackets: each piece is then fully
// checked by the tokenizer, and the separators between pieces here. Where
// the cutting or a piece's tokenizing fails (malformed JSON, a duplicate
// key, a nesting or string limit), the whole document is parsed as one, so
// that the error is the exact one (line and column, JSON pointer) it always
// was.

constexpr size_t kNpos = std::string_view::npos;

size_t skipSpace(std::string_view t, size_t i) {
  while (i < t.size() &&
         (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t'))
    ++i;
  return i;
}

/// The end of the string starting at t[i] == '"'.
size_t stringEnd(std::string_view t, size_t i) {
  for (size_t k = i + 1; k < t.size(); ++k) {
    if (t[k] == '\\')
      ++k;
    else if (t[k] == '"')
      return k + 1;
  }
  return kNpos;
}

/// The end of the value starting at t[i]: a string, a container (brackets
/// balanced, strings skipped) or a scalar (up to a separator).
size_t valueEnd(std::string_view t, size_t i) {
  if (i >= t.size())
    return kNpos;
  if (t[i] == '"')
    return stringEnd(t, i);
  if (t[i] == '[' || t[i] == '{') {
    size_t depth = 0;
    for (size_t k = i; k < t.size(); ++k) {
      char c = t[k];
      if (c == '"') {
        k = stringEnd(t, k);
        if (k == kNpos)
          return kNpos;
        --k;
      } else if (c == '[' || c == '{') {
        ++depth;
      } else if (c == ']' || c == '}') {
        if (--depth == 0)
          return k + 1;
      }
    }
    return kNpos;
  }
  size_t k = i;
  while (k < t.size() && t[k] != ',' && t[k] != ']' && t[k] != '}' &&
         t[k] != ' ' && t[k] != '\n' && t[k] != '\r' && t[k] != '\t')
    ++k;
  return k == i ? kNpos : k;
}

struct Span {
  size_t begin, end;
};

/// The elements of the array at t[i] == '[', and where it ends; false when
/// it is not well formed at this level.
bool arrayElements(std::string_view t, size_t i, std::vector<Span> &out,
                   size_t &end) {
  size_t k = skipSpace(t, i + 1);
  if (k < t.size() && t[k] == ']') {
    end = k + 1;
    return true;
  }
  while (true) {
    size_t e = valueEnd(t, k);
    if (e == kNpos)
      return false;
    out.push_back({k, e});
    k = skipSpace(t, e);
    if (k >= t.size())
      return false;
    if (t[k] == ']') {
      end = k + 1;
      return true;
    }
    if (t[k] != ',')
      return false;
    k = skipSpace(t, k + 1);
  }
}

/// Where the value of member `key` (written without escapes) of the object
/// at t[i] == '{' starts, if it is an array; kNpos otherwise.
size_t arrayMember(std::string_view t, size_t i, std::string_view key) {
  size_t k = skipSpace(t, i + 1);
  while (k < t.size() && t[k] == '"') {
    size_t keyEnd = stringEnd(t, k);
    if (keyEnd == kNpos)
      return kNpos;
    std::string_view name = t.substr(k + 1, keyEnd - k - 2);
    k = skipSpace(t, keyEnd);
    if (k >= t.size() || t[k] != ':')
      return kNpos;
    k = skipSpace(t, k + 1);
    if (name == key)
      return k < t.size() && t[k] == '[' ? k : kNpos;
    size_t e = valueEnd(t, k);
    if (e == kNpos)
      return kNpos;
    k = skipSpace(t, e);
    if (k >= t.size() || t[k] != ',')
      return kNpos;
    k = skipSpace(t, k + 1);
  }
  return kNpos;
}

/// `text` with the contents of the array member `key` of the object at
/// `at` elided (`[]` left), and the array's elements; false when the text
/// cannot be cut there.
bool elideArray(std::string_view text, size_t at, std::string_view key,
                std::string &rest, std::vector<Span> &elements) {
  size_t open = arrayMember(text, at, key);
  size_t end = 0;
  if (open == kNpos || !arrayElements(text, open, elements, end))
    return false;
  rest.assign(text.substr(0, open + 1));
  rest += ']';
  rest.append(text.substr(end));
  return true;
}

/// The whole document as one tape (malformed documents, and those the
/// cutting does not apply to).
Result<CheckpointMetadata> parseWhole(std::string_view text) {
  Result<Document> parsed =
      Document::parse(text, kMaxPlanJsonDepth, kMaxCheckpointJsonValues,
                      kMaxCheckpointJsonValuesText);
  if (!parsed)
    return parsed.error();
  return readDocument(parsed->root(), nullptr);
}

} // namespace

Result<CheckpointMetadata> parseMetadata(std::string_view text) {
  // The document: a root object (after a byte order mark, if any).
  size_t at = skipSpace(text, text.starts_with("\xEF\xBB\xBF") ? 3 : 0);
  std::string header;
  std::vector<Span> tensorSpans;
  if (at >= text.size() || text[at] != '{' ||
      !elideArray(text, at, "tensors", header, tensorSpans))
    return parseWhole(text);
  Result<Document> parsed =
      Document::parse(header, kMaxPlanJsonDepth, kMaxCheckpointJsonValues,
                      kMaxCheckpointJsonValuesText);
  if (!parsed)
    return parseWhole(text); // its line and column in the whole text
  int64_t values = parsed->valueCount(); // one limit over every piece
  // A piece's tokenizing failed: the whole document names the error
  // exactly, except for the value limit, which is named here (parsing the
  // whole document would need the very tape this avoids).
  bool fallback = false;
  auto tokenize = [&](std::string_view piece, int depth,
                      const Path &path) -> Result<Document> {
    Result<Document> d = Document::parse(piece, kMaxPlanJsonDepth - depth,
                                         kMaxCheckpointJsonValues - values);
    if (!d) {
      if (d.error().message.ends_with("values (docs/limits.md)"))
        return errorAt(path, std::string("the document has more than ") +
                                 kMaxCheckpointJsonValuesText +
                                 " values (docs/limits.md)");
      fallback = true;
      return d.error();
    }
    values += d->valueCount();
    return d;
  };
  TensorSource tensors = [&](CheckpointMetadata &meta,
                             const Path &tensorsPath) -> Result<void> {
    meta.tensors.reserve(tensorSpans.size());
    std::string tensorHeader;
    std::vector<Span> chunkSpans;
    for (size_t i = 0; i < tensorSpans.size(); ++i) {
      Path path = tensorsPath.child(i);
      std::string_view tensorText = text.substr(
          tensorSpans[i].begin, tensorSpans[i].end - tensorSpans[i].begin);
      chunkSpans.clear();
      if (tensorText.empty() || tensorText[0] != '{' ||
          !elideArray(tensorText, 0, "chunks", tensorHeader, chunkSpans)) {
        // Not an object with a chunks array: read as it is, and named.
        Result<Document> d = tokenize(tensorText, 2, path);
        if (!d)
          return d.error();
        Result<TensorEntry> t = readTensor(d->root(), path);
        if (!t)
          return t.error();
        meta.tensors.push_back(std::move(*t));
        continue;
      }
      Result<Document> d = tokenize(tensorHeader, 2, path);
      if (!d)
        return d.error();
      ChunkSource chunks = [&](TensorEntry &t,
                               const Path &chunksPath) -> Result<void> {
        t.chunks.reserve(chunkSpans.size());
        for (size_t j = 0; j < chunkSpans.size(); ++j) {
          Path chunkPath = chunksPath.child(j);
          Result<Document> c = tokenize(
              tensorText.substr(chunkSpans[j].begin,
                                chunkSpans[j].end - chunkSpans[j].begin),
              4, chunkPath);
          if (!c)
            return c.error();
          Result<Chunk> chunk = readChunk(c->root(), chunkPath);
          if (!chunk)
            return chunk.error();
          t.chunks.push_back(std::move(*chunk));
        }
        return {};
      };
      Result<TensorEntry> t = readTensor(d->root(), path, &chunks);
      if (!t)
        return t.error();
      meta.tensors.push_back(std::move(*t));
    }
    return {};
  };
  Result<CheckpointMetadata> meta = readDocument(parsed->root(), &tensors);
  if (!meta && fallback)
    return parseWhole(text);
  return meta;
}

namespace {

/// Appends a JSON string exactly as nlohmann's dump (no ASCII escaping,
/// invalid UTF-8 replaced) writes it, the canonical form's one string
/// encoding; printable ASCII without quotes or backslashes, the usual case,
/// without building a Json.
void appendQuoted(std::string &out, std::string_view s) {
  for (unsigned char c : s)
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      out += dumpJson(Json(std::string(s)));
      return;
    }
  out += '"';
  out += s;
  out += '"';
}

void appendInt(std::string &out, int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

void appendInts(std::string &out, const std::vector<int64_t> &v) {
  out += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i)
      out += ',';
    appendInt(out, v[i]);
  }
  out += ']';
}

/// The text of checkpoint.json, handed to `sink` in pieces of about 64 KiB
/// (so that the checksum of a 256 MiB document needs no 256 MiB string).
/// Without `checksum` it is the canonical text the checksum is taken of;
/// with it, the file, which has one line more. One file, one tensor header
/// and one chunk per line: diffable, and greppable by tensor name or file.
template <class Sink>
void emitMetadata(const CheckpointMetadata &meta, const std::string *checksum,
                  Sink &&sink) {
  std::string out;
  out.reserve(size_t(1) << 17);
  auto flush = [&](bool force) {
    if (force || out.size() >= (size_t(1) << 16)) {
      sink(std::string_view(out));
      out.clear();
    }
  };
  auto source = [&](const SourceRef &s) {
    out += "{\"name\":";
    appendQuoted(out, s.name);
    out += ",\"fingerprint\":";
    appendQuoted(out, s.fingerprint);
    out += '}';
  };
  out += "{\n \"format\": ";
  appendQuoted(out, kCheckpointFormat);
  out += ",\n \"version\": " + std::to_string(kCheckpointVersion) + ",\n";
  if (checksum) {
    out += " \"metadata_checksum\": ";
    appendQuoted(out, *checksum);
    out += ",\n";
  }
  out += " \"model\": ";
  source(meta.model);
  out += ",\n \"spec\": ";
  source(meta.spec);
  out += ",\n \"training\": {\"step\":";
  appendInt(out, meta.training.step);
  out += ",\"seed\":";
  appendInt(out, meta.training.seed);
  out += ",\"stochastic_rounding\":";
  out += meta.training.stochasticRounding ? "true" : "false";
  out += "},\n \"written_by\": {\"mesh\":";
  appendQuoted(out, meta.mesh);
  out += ",\"generator\":";
  appendQuoted(out, meta.generator);
  // Provenance of an imported or converted checkpoint; absent otherwise, so
  // that a checkpoint without it reads as before.
  if (!meta.from.empty()) {
    out += ",\"from\":";
    appendQuoted(out, meta.from);
  }
  if (!meta.conversion.empty()) {
    out += ",\"conversion\":";
    appendQuoted(out, meta.conversion);
  }
  out += "},\n \"checksum\": {\"algorithm\":\"crc32c\",\"block_bytes\":";
  appendInt(out, meta.blockBytes);
  out += "},\n \"files\": [";
  for (size_t i = 0; i < meta.files.size(); ++i) {
    out += i ? ",\n  {\"name\":" : "\n  {\"name\":";
    appendQuoted(out, meta.files[i].name);
    out += ",\"bytes\":";
    appendInt(out, meta.files[i].bytes);
    out += '}';
  }
  out += meta.files.empty() ? "],\n" : "\n ],\n";
  out += " \"tensors\": [";
  for (size_t i = 0; i < meta.tensors.size(); ++i) {
    const TensorEntry &t = meta.tensors[i];
    out += i ? ",\n  {\"name\":" : "\n  {\"name\":";
    appendQuoted(out, t.name);
    out += ",\"kind\":";
    appendQuoted(out, tensorKindName(t.kind));
    if (t.tensorId) {
      out += ",\"tensor_id\":";
      appendInt(out, *t.tensorId);
    }
    out += ",\"dtype\":";
    appendQuoted(out, plan::dtypeName(t.dtype));
    out += ",\"shape\":";
    appendInts(out, t.shape);
    out += ",\"layout\":";
    appendQuoted(out, t.layout);
    out += ",\"chunks\":[";
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const Chunk &ch = t.chunks[c];
      out += c ? ",\n   {\"offset\":" : "\n   {\"offset\":";
      appendInts(out, ch.box.offset);
      out += ",\"shape\":";
      appendInts(out, ch.box.shape);
      out += ",\"file\":";
      appendQuoted(out, ch.file);
      out += ",\"byte_offset\":";
      appendInt(out, ch.byteOffset);
      out += ",\"length\":";
      appendInt(out, ch.length);
      out += ",\"crc32c\":[";
      for (size_t k = 0; k < ch.crc32c.size(); ++k) {
        out += k ? ",\"" : "\"";
        out += hex8(ch.crc32c[k]);
        out += '"';
      }
      out += "]}";
      flush(false);
    }
    out += t.chunks.empty() ? "]}" : "\n  ]}";
  }
  out += meta.tensors.empty() ? "]\n}\n" : "\n ]\n}\n";
  flush(true);
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string out;
  appendInts(out, shape);
  return out;
}

} // namespace

std::string metadataChecksumOf(const CheckpointMetadata &meta) {
  uint64_t h = kFnv1a64Basis;
  emitMetadata(meta, nullptr,
               [&](std::string_view piece) { h = fnv1a64(piece, h); });
  return "fnv1a64:" + hex64(h);
}

std::string writeMetadata(const CheckpointMetadata &meta) {
  std::string checksum = metadataChecksumOf(meta);
  std::string out;
  emitMetadata(meta, &checksum,
               [&](std::string_view piece) { out.append(piece); });
  return out;
}

std::string parameterListFingerprint(const CheckpointMetadata &meta) {
  std::vector<const TensorEntry *> params;
  for (const TensorEntry &t : meta.tensors)
    if (t.kind == TensorKind::Parameter)
      params.push_back(&t);
  std::sort(params.begin(), params.end(), [](auto *a, auto *b) {
    return std::tie(a->tensorId, a->name) < std::tie(b->tensorId, b->name);
  });
  std::string text;
  for (const TensorEntry *t : params)
    text += (t->tensorId ? std::to_string(*t->tensorId) : std::string("-")) +
            " " + t->name + " " + shapeText(t->shape) + "\n";
  return fingerprintOf(text);
}

std::string layoutFingerprint(const CheckpointMetadata &meta) {
  std::string text = meta.mesh + "\n";
  for (const TensorEntry &t : meta.tensors)
    text += t.name + " " + t.layout + "\n";
  return fingerprintOf(text);
}

} // namespace meshplan::ckpt
