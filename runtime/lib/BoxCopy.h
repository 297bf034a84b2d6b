//===- BoxCopy.h - Moving boxes of tensors between buffers ----------------===//
//
// Every buffer of a plan holds one box of a global row-major tensor, stored
// packed. Collectives move boxes: an all-gather packs this rank's shard into
// a chunk padded to the layout's padded shape (box at the chunk's origin,
// zeros elsewhere, as FSDP2 pads its shards) and unpacks every member's chunk
// into the gathered box. copyBox does one such move, converting the element
// type on the way (fp32 -> bf16, fp32/bf16 -> float8 with a scale, and back).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_LIB_BOXCOPY_H
#define MESHPLAN_RUNTIME_LIB_BOXCOPY_H

#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Runtime/Device.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace meshplan::runtime {

/// A packed box of a global tensor in memory.
struct BoxRef {
  std::byte *data = nullptr;
  plan::DType dtype = plan::DType::Float32;
  const std::vector<int64_t> *shape = nullptr;  ///< local (packed) shape
  const std::vector<int64_t> *origin = nullptr; ///< global offset of [0..]
};

/// True when dtype `from` converts to `to` in copyBox.
bool canConvert(plan::DType from, plan::DType to);

/// Copies the global region [offset, offset + size) from `src` to `dst`
/// (both must contain it), converting src.dtype to dst.dtype. `scale`
/// multiplies values cast to float8 and divides values read from float8.
void copyBox(const BoxRef &src, const BoxRef &dst,
             const std::vector<int64_t> &offset,
             const std::vector<int64_t> &size, float scale = 1.0f);

/// The same on boxes given by spans (DeviceBoxRef's data in host memory):
/// what the host devices run, with no copy of the shapes.
void copyBox(const DeviceBoxRef &src, const DeviceBoxRef &dst,
             std::span<const int64_t> offset, std::span<const int64_t> size,
             float scale);

/// True when the region lies inside the box.
bool boxContains(std::span<const int64_t> origin,
                 std::span<const int64_t> shape,
                 std::span<const int64_t> offset,
                 std::span<const int64_t> size);

/// Converts n contiguous elements.
void convertElements(const std::byte *in, plan::DType from, std::byte *out,
                     plan::DType to, int64_t n, float scale);

int64_t product(const std::vector<int64_t> &shape);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_LIB_BOXCOPY_H
