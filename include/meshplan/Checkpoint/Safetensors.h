//===- Safetensors.h - Hugging Face safetensors files ---------------------===//
//
// `meshplan ckpt export` and `import` move whole parameter tensors between a
// checkpoint and Hugging Face's safetensors format: an 8-byte little-endian
// header size N, N bytes of JSON header (padded with spaces to a multiple of
// 8, as the reference writer does), then the tensors' bytes back to back.
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets relative to the first byte after the header) and
// may hold "__metadata__", an object of string values.
//
// The reader treats a file as untrusted, as the reference implementation
// does: header size bounds, JSON validity (no duplicate keys), closed
// tensor objects, known dtype codes, shape products checked against the
// byte ranges with overflow-safe arithmetic, and data ranges that are
// contiguous, non-overlapping and cover the data exactly. Like the rest of
// MeshplanCheckpoint it never throws.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CHECKPOINT_SAFETENSORS_H
#define MESHPLAN_CHECKPOINT_SAFETENSORS_H

#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshplan::ckpt {

/// Largest header accepted, the reference implementation's limit.
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// The safetensors dtype code of a plan dtype (F32, BF16, F16, F8_E4M3,
/// F8_E5M2, F64, I8, U8, I32, I64).
std::string_view safetensorsDTypeCode(plan::DType dtype);

struct SafetensorsTensor {
  std::string name;
  plan::DType dtype = plan::DType::Float32;
  std::vector<int64_t> shape;
  int64_t begin = 0; ///< relative to the first data byte
  int64_t end = 0;
};

struct SafetensorsHeader {
  /// The tensors in data order (by begin offset).
  std::vector<SafetensorsTensor> tensors;
  /// "__metadata__", in document order.
  std::vector<std::pair<std::string, std::string>> metadata;
  int64_t headerBytes = 0; ///< N
  int64_t dataBytes = 0;   ///< the file's size - 8 - N

  const SafetensorsTensor *find(std::string_view name) const;
};

/// Parses and checks a header's JSON text against `dataBytes` bytes of
/// data. Errors start with the JSON pointer of the item.
Result<SafetensorsHeader> parseSafetensorsHeader(std::string_view text,
                                                 int64_t dataBytes);

/// Reads and checks the header of the file at `path`. Errors start with the
/// path.
Result<SafetensorsHeader> readSafetensorsHeader(const std::string &path);

/// Reads `out.size()` bytes of `tensor` starting `offset` bytes into its
/// data (the range must lie within the tensor).
Result<void> readSafetensorsBytes(const std::string &path,
                                  const SafetensorsHeader &header,
                                  const SafetensorsTensor &tensor,
                                  int64_t offset, std::span<std::byte> out);

/// A tensor to write; its bytes come from a callback so that one tensor at
/// a time is in memory.
struct SafetensorsEntry {
  std::string name;
  plan::DType dtype = plan::DType::Float32;
  std::vector<int64_t> shape;
};

/// Writes `path` atomically (a temporary file beside it, fsynced, renamed
/// over it, the directory fsynced; removed on failure). Data order, and so
/// the order of the header's keys after "__metadata__": by element size,
/// largest first, then by name, as the reference writer orders them (every
/// tensor's data is then aligned to its element size). `fill(i, out)` writes
/// entry i's row-major little-endian bytes into `out`.
Result<void> writeSafetensors(
    const std::string &path, std::span<const SafetensorsEntry> tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata,
    const std::function<Result<void>(size_t, std::span<std::byte>)> &fill);

} // namespace meshplan::ckpt

#endif // MESHPLAN_CHECKPOINT_SAFETENSORS_H
