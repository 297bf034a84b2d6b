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

#include "meshplan/Support/Json.h"
#include "meshplan/Support/JsonReader.h"

#include <algorithm>
#include <array>
#include <cstdio>
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

Result<TensorEntry> readTensor(Value v, const Path &path) {
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(v, path, kTensorRule));
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

Result<CheckpointMetadata> parseMetadata(std::string_view text) {
  Result<Document> parsed =
      Document::parse(text, kMaxPlanJsonDepth, kMaxCheckpointJsonValues,
                      kMaxCheckpointJsonValuesText);
  if (!parsed)
    return parsed.error();
  Value doc = parsed->root();
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
      version->unsignedValue() != static_cast<uint64_t>(kCheckpointVersion))
    return errorAt(root.child("version"),
                   "unsupported checkpoint version " + dump(*version) +
                       "; this meshplan reads version " +
                       std::to_string(kCheckpointVersion));
  Fields f;
  MESHPLAN_ASSIGN(f, checkObject(doc, root, kRootRule));
  CheckpointMetadata meta;
  MESHPLAN_ASSIGN(meta.model, readSource(f.at("model"), root.child("model")));
  MESHPLAN_ASSIGN(meta.spec, readSource(f.at("spec"), root.child("spec")));
  {
    Path p = root.child("training");
    Fields tf;
    MESHPLAN_ASSIGN(tf, checkObject(f.at("training"), p, kTrainingRule));
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
    DataFile d;
    MESHPLAN_TRY(readStringInto(ff.at("name"), p.child("name"), d.name));
    MESHPLAN_ASSIGN(d.bytes, readInt(ff.at("bytes"), p.child("bytes"), 0));
    meta.files.push_back(std::move(d));
  }
  Value tensors = f.at("tensors");
  Path tensorsPath = root.child("tensors");
  meta.tensors.reserve(tensors.size());
  i = 0;
  for (Value tensor : tensors.elements()) {
    TensorEntry t;
    MESHPLAN_ASSIGN(t, readTensor(tensor, tensorsPath.child(i++)));
    meta.tensors.push_back(std::move(t));
  }
  MESHPLAN_TRY(validateMetadata(meta));
  return meta;
}

std::string writeMetadata(const CheckpointMetadata &meta) {
  // One file, one tensor header and one chunk per line: diffable, and
  // greppable by tensor name or file.
  auto source = [](const SourceRef &s) {
    Json j = Json::object();
    j["name"] = s.name;
    j["fingerprint"] = s.fingerprint;
    return dumpJson(j);
  };
  std::string out = "{\n";
  out += " \"format\": " + Json(std::string(kCheckpointFormat)).dump() + ",\n";
  out += " \"version\": " + std::to_string(kCheckpointVersion) + ",\n";
  out += " \"model\": " + source(meta.model) + ",\n";
  out += " \"spec\": " + source(meta.spec) + ",\n";
  Json training = Json::object();
  training["step"] = meta.training.step;
  training["seed"] = meta.training.seed;
  training["stochastic_rounding"] = meta.training.stochasticRounding;
  out += " \"training\": " + dumpJson(training) + ",\n";
  Json writtenBy = Json::object();
  writtenBy["mesh"] = meta.mesh;
  writtenBy["generator"] = meta.generator;
  // Provenance of an imported or converted checkpoint; absent otherwise, so
  // that a checkpoint without it reads as before.
  if (!meta.from.empty())
    writtenBy["from"] = meta.from;
  if (!meta.conversion.empty())
    writtenBy["conversion"] = meta.conversion;
  out += " \"written_by\": " + dumpJson(writtenBy) + ",\n";
  Json checksum = Json::object();
  checksum["algorithm"] = "crc32c";
  checksum["block_bytes"] = meta.blockBytes;
  out += " \"checksum\": " + dumpJson(checksum) + ",\n";
  out += " \"files\": [";
  for (size_t i = 0; i < meta.files.size(); ++i) {
    Json f = Json::object();
    f["name"] = meta.files[i].name;
    f["bytes"] = meta.files[i].bytes;
    out += (i ? ",\n  " : "\n  ") + dumpJson(f);
  }
  out += meta.files.empty() ? "],\n" : "\n ],\n";
  out += " \"tensors\": [";
  for (size_t i = 0; i < meta.tensors.size(); ++i) {
    const TensorEntry &t = meta.tensors[i];
    Json h = Json::object();
    h["name"] = t.name;
    h["kind"] = std::string(tensorKindName(t.kind));
    if (t.tensorId)
      h["tensor_id"] = *t.tensorId;
    h["dtype"] = std::string(plan::dtypeName(t.dtype));
    h["shape"] = t.shape;
    h["layout"] = t.layout;
    std::string head = dumpJson(h);
    head.pop_back(); // reopen the object to append the chunks
    out += (i ? ",\n  " : "\n  ") + head + ",\"chunks\":[";
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const Chunk &ch = t.chunks[c];
      Json j = Json::object();
      j["offset"] = ch.box.offset;
      j["shape"] = ch.box.shape;
      j["file"] = ch.file;
      j["byte_offset"] = ch.byteOffset;
      j["length"] = ch.length;
      Json crcs = Json::array();
      for (uint32_t v : ch.crc32c)
        crcs.push_back(hex8(v));
      j["crc32c"] = std::move(crcs);
      out += (c ? ",\n   " : "\n   ") + dumpJson(j);
    }
    out += t.chunks.empty() ? "]}" : "\n  ]}";
  }
  out += meta.tensors.empty() ? "]\n}\n" : "\n ]\n}\n";
  return out;
}

} // namespace meshplan::ckpt
