//===- Safetensors.cpp - Hugging Face safetensors files -------------------===//

#include "meshplan/Checkpoint/Safetensors.h"

#include "meshplan/Core/Limits.h"
#include "meshplan/Support/Json.h"

#include "FileIO.h"

#include <algorithm>
#include <array>
#include <cstdio>

namespace meshplan::ckpt {

namespace {

struct CodeEntry {
  std::string_view code;
  std::optional<plan::DType> dtype; ///< nullopt: valid, but not stored here
};

// Every code of the reference implementation, so that a valid file with a
// dtype meshplan has no use for is named as such, not as "unknown".
constexpr std::array<CodeEntry, 19> kCodes = {{
    {"F32", plan::DType::Float32},
    {"BF16", plan::DType::BFloat16},
    {"F16", plan::DType::Float16},
    {"F8_E4M3", plan::DType::Float8E4M3},
    {"F8_E5M2", plan::DType::Float8E5M2},
    {"F64", plan::DType::Float64},
    {"I8", plan::DType::Int8},
    {"U8", plan::DType::UInt8},
    {"I32", plan::DType::Int32},
    {"I64", plan::DType::Int64},
    {"BOOL", std::nullopt},
    {"I16", std::nullopt},
    {"U16", std::nullopt},
    {"U32", std::nullopt},
    {"U64", std::nullopt},
    {"F8_E8M0", std::nullopt},
    {"F6_E2M3", std::nullopt},
    {"F6_E3M2", std::nullopt},
    {"F4", std::nullopt},
}};

std::string formatInts(const std::vector<int64_t> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

const json::SectionRule &tensorRule() {
  static const json::SectionRule rule{
      "tensor",
      {{"dtype", json::JsonType::String, true},
       {"shape", json::JsonType::Array, true, json::JsonType::Integer},
       {"data_offsets",
        json::JsonType::Array,
        true,
        json::JsonType::Integer,
        {},
        {},
        2}}};
  return rule;
}

struct SplitPath {
  std::string dir; ///< "." when none
  std::string name;
};
SplitPath splitPath(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

} // namespace

std::string_view safetensorsDTypeCode(plan::DType dtype) {
  for (const CodeEntry &e : kCodes)
    if (e.dtype == dtype)
      return e.code;
  return "?";
}

const SafetensorsTensor *SafetensorsHeader::find(std::string_view name) const {
  for (const SafetensorsTensor &t : tensors)
    if (t.name == name)
      return &t;
  return nullptr;
}

Result<SafetensorsHeader> parseSafetensorsHeader(std::string_view text,
                                                 int64_t dataBytes) {
  // JSON never holds a raw NUL, and nlohmann's parser takes one for the end
  // of input: a header size that reaches into the data would otherwise
  // parse.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos)
    return json::errorAt("", "a NUL byte at header byte " +
                                 std::to_string(nul) +
                                 " (JSON holds none: is the header size "
                                 "wrong?)");
  Result<json::Json> doc = json::parseJson(text);
  if (!doc)
    return doc.error();
  if (!doc->is_object())
    return json::typeError("", *doc, "an object");
  SafetensorsHeader header;
  header.dataBytes = dataBytes;
  for (const auto &[key, value] : doc->items()) {
    std::string pointer = json::childPointer("", key);
    if (key == "__metadata__") {
      if (!value.is_object())
        return json::typeError(pointer, value, "an object of strings");
      for (const auto &[mkey, mvalue] : value.items()) {
        Result<std::string> s =
            json::readString(mvalue, json::childPointer(pointer, mkey));
        if (!s)
          return s.error();
        header.metadata.emplace_back(mkey, std::move(*s));
      }
      continue;
    }
    if (key.empty())
      return json::errorAt(pointer, "a tensor needs a non-empty name");
    MESHPLAN_TRY(json::checkObject(value, pointer, tensorRule()));
    SafetensorsTensor t;
    t.name = key;
    std::string dtypePointer = json::childPointer(pointer, "dtype");
    Result<std::string> code = json::readString(value["dtype"], dtypePointer);
    if (!code)
      return code.error();
    const CodeEntry *entry = nullptr;
    for (const CodeEntry &e : kCodes)
      if (e.code == *code)
        entry = &e;
    if (!entry) {
      std::vector<std::string_view> codes;
      for (const CodeEntry &e : kCodes)
        codes.push_back(e.code);
      return json::errorAt(dtypePointer, "tensor " + json::quote(key) +
                                             ": unknown dtype code " +
                                             json::quote(*code) +
                                             json::didYouMean(*code, codes));
    }
    if (!entry->dtype)
      return json::errorAt(dtypePointer,
                           "tensor " + json::quote(key) + ": dtype " +
                               json::quote(*code) +
                               " is not one meshplan stores (F32, BF16, F16, "
                               "F8_E4M3, F8_E5M2, F64, I8, U8, I32, I64)");
    t.dtype = *entry->dtype;
    std::string shapePointer = json::childPointer(pointer, "shape");
    Result<std::vector<int64_t>> shape =
        json::readIntArray(value["shape"], shapePointer, 0);
    if (!shape)
      return shape.error();
    if (int64_t(shape->size()) > kMaxTensorRank)
      return json::errorAt(shapePointer, "tensor " + json::quote(key) + ": " +
                                             std::to_string(shape->size()) +
                                             " dims; at most " +
                                             std::to_string(kMaxTensorRank));
    t.shape = std::move(*shape);
    // Overflow-safe: the product stays below 2^50 or is refused before the
    // next multiplication.
    int64_t elements = 1;
    for (int64_t d : t.shape)
      if (mulOverflows(elements, d, &elements) || elements > kMaxTensorElements)
        return json::errorAt(shapePointer,
                             "tensor " + json::quote(key) + ": shape " +
                                 formatInts(t.shape) + " has more than " +
                                 kMaxTensorElementsText + " elements");
    int64_t bytes = elements * plan::dtypeBytes(t.dtype);
    std::string offsetsPointer = json::childPointer(pointer, "data_offsets");
    Result<std::vector<int64_t>> offsets =
        json::readIntArray(value["data_offsets"], offsetsPointer, 0);
    if (!offsets)
      return offsets.error();
    t.begin = (*offsets)[0];
    t.end = (*offsets)[1];
    if (t.begin > t.end)
      return json::errorAt(offsetsPointer,
                           "tensor " + json::quote(key) + ": begin " +
                               std::to_string(t.begin) + " is after end " +
                               std::to_string(t.end));
    if (t.end > dataBytes)
      return json::errorAt(
          offsetsPointer,
          "tensor " + json::quote(key) + ": bytes [" + std::to_string(t.begin) +
              ", " + std::to_string(t.end) + ") lie outside the data (" +
              std::to_string(dataBytes) + " bytes)");
    if (t.end - t.begin != bytes)
      return json::errorAt(offsetsPointer, "tensor " + json::quote(key) + ": " +
                                               std::to_string(t.end - t.begin) +
                                               " bytes, but shape " +
                                               formatInts(t.shape) + " of " +
                                               *code + " holds " +
                                               std::to_string(bytes));
    header.tensors.push_back(std::move(t));
  }
  // The data must be the tensors back to back: no byte shared by two
  // tensors, none belonging to no tensor.
  std::stable_sort(header.tensors.begin(), header.tensors.end(),
                   [](const SafetensorsTensor &a, const SafetensorsTensor &b) {
                     return a.begin < b.begin ||
                            (a.begin == b.begin && a.end < b.end);
                   });
  int64_t at = 0;
  for (const SafetensorsTensor &t : header.tensors) {
    std::string pointer =
        json::childPointer(json::childPointer("", t.name), "data_offsets");
    if (t.begin < at)
      return json::errorAt(pointer, "tensor " + json::quote(t.name) +
                                        ": bytes [" + std::to_string(t.begin) +
                                        ", " + std::to_string(t.end) +
                                        ") overlap the previous tensor's, "
                                        "which end at " +
                                        std::to_string(at));
    if (t.begin > at)
      return json::errorAt(pointer,
                           "tensor " + json::quote(t.name) +
                               ": starts at byte " + std::to_string(t.begin) +
                               ", leaving bytes [" + std::to_string(at) + ", " +
                               std::to_string(t.begin) + ") to no tensor");
    at = t.end;
  }
  if (at != dataBytes)
    return json::errorAt("", "the tensors end at data byte " +
                                 std::to_string(at) + ", but the file has " +
                                 std::to_string(dataBytes) +
                                 " data bytes (trailing bytes)");
  return header;
}

Result<SafetensorsHeader> readSafetensorsHeader(const std::string &path) {
  io::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok())
    return makeError(path + ": cannot open: " + io::errnoText(errno));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0)
    return makeError(path + ": " + io::errnoText(errno));
  if (!S_ISREG(st.st_mode))
    return makeError(path + ": not a regular file");
  const int64_t fileBytes = st.st_size;
  if (fileBytes < 8)
    return makeError(path + ": " + std::to_string(fileBytes) +
                     " bytes, shorter than the 8-byte header size of a "
                     "safetensors file");
  std::array<std::byte, 8> size{};
  MESHPLAN_TRY(io::preadAll(fd.get(), size.data(), 8, 0, path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | uint64_t(size[size_t(i)]);
  if (n > uint64_t(kMaxSafetensorsHeaderBytes))
    return makeError(path + ": header size " + std::to_string(n) +
                     " exceeds the limit of " +
                     std::to_string(kMaxSafetensorsHeaderBytes) +
                     " bytes (not a safetensors file?)");
  if (int64_t(n) > fileBytes - 8)
    return makeError(path + ": header size " + std::to_string(n) +
                     " runs past the end of the file (" +
                     std::to_string(fileBytes) + " bytes)");
  std::string text(size_t(n), '\0');
  MESHPLAN_TRY(io::preadAll(fd.get(), reinterpret_cast<std::byte *>(&text[0]),
                            text.size(), 8, path));
  Result<SafetensorsHeader> header =
      parseSafetensorsHeader(text, fileBytes - 8 - int64_t(n));
  if (!header)
    return header.error().within(path + ": header");
  header->headerBytes = int64_t(n);
  return header;
}

Result<void> readSafetensorsBytes(const std::string &path,
                                  const SafetensorsHeader &header,
                                  const SafetensorsTensor &tensor,
                                  int64_t offset, std::span<std::byte> out) {
  if (offset < 0 || int64_t(out.size()) > tensor.end - tensor.begin - offset)
    return makeError(path + ": tensor " + json::quote(tensor.name) +
                     ": read outside its data");
  io::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok())
    return makeError(path + ": cannot open: " + io::errnoText(errno));
  return io::preadAll(fd.get(), out.data(), out.size(),
                      8 + header.headerBytes + tensor.begin + offset, path);
}

Result<void> writeSafetensors(
    const std::string &path, std::span<const SafetensorsEntry> tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata,
    const std::function<Result<void>(size_t, std::span<std::byte>)> &fill) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int64_t sa = plan::dtypeBytes(tensors[a].dtype);
    int64_t sb = plan::dtypeBytes(tensors[b].dtype);
    return sa != sb ? sa > sb : tensors[a].name < tensors[b].name;
  });
  json::Json header = json::Json::object();
  if (!metadata.empty()) {
    json::Json meta = json::Json::object();
    for (const auto &[k, v] : metadata)
      meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::vector<int64_t> sizes(tensors.size());
  int64_t at = 0;
  for (size_t i : order) {
    const SafetensorsEntry &t = tensors[i];
    int64_t elements = 1;
    for (int64_t d : t.shape)
      if (d < 0 || mulOverflows(elements, d, &elements) ||
          elements > kMaxTensorElements)
        return makeError("tensor " + json::quote(t.name) + ": bad shape " +
                         formatInts(t.shape));
    sizes[i] = elements * plan::dtypeBytes(t.dtype);
    if (header.contains(t.name))
      return makeError("tensor " + json::quote(t.name) + " given twice");
    header[t.name] = {{"dtype", std::string(safetensorsDTypeCode(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {at, at + sizes[i]}}};
    at += sizes[i];
  }
  // Compact JSON as the reference writes it; invalid UTF-8 in a name is
  // replaced rather than thrown on.
  std::string text =
      header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  std::array<std::byte, 8> size{};
  for (int i = 0; i < 8; ++i)
    size[size_t(i)] = std::byte((uint64_t(text.size()) >> (8 * i)) & 0xff);

  SplitPath p = splitPath(path);
  std::string temp =
      io::joinPath(p.dir, "." + p.name + ".tmp" + std::to_string(::getpid()));
  io::Fd fd(
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.ok())
    return makeError(temp + ": cannot create: " + io::errnoText(errno));
  auto written = [&]() -> Result<void> {
    MESHPLAN_TRY(io::writeAll(fd.get(), size.data(), size.size(), temp));
    MESHPLAN_TRY(io::writeAll(fd.get(),
                              reinterpret_cast<const std::byte *>(text.data()),
                              text.size(), temp));
    std::vector<std::byte> buffer;
    for (size_t i : order) {
      buffer.assign(size_t(sizes[i]), std::byte{0});
      MESHPLAN_TRY(fill(i, buffer));
      MESHPLAN_TRY(io::writeAll(fd.get(), buffer.data(), buffer.size(), temp));
    }
    if (::fsync(fd.get()) != 0)
      return makeError(temp + ": fsync failed: " + io::errnoText(errno));
    if (fd.release() != 0)
      return makeError(temp + ": close failed: " + io::errnoText(errno));
    if (::rename(temp.c_str(), path.c_str()) != 0)
      return makeError(path + ": cannot rename " + temp +
                       " to it: " + io::errnoText(errno));
    return io::fsyncPath(p.dir, /*directory=*/true);
  }();
  if (!written) {
    fd.release();
    ::unlink(temp.c_str());
  }
  return written;
}

} // namespace meshplan::ckpt
