//===- Cast.cpp - Explicit dtype casts on checkpoint load -----------------===//

#include "meshplan/Checkpoint/Cast.h"

#include "meshplan/Support/Json.h"

#include <bit>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

namespace meshplan::ckpt {

bool isCastableDType(plan::DType dtype) {
  return dtype == plan::DType::Float32 || dtype == plan::DType::BFloat16 ||
         dtype == plan::DType::Float16;
}

uint16_t floatToBFloat16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return 0x7FC0; // c10::BFloat16's round_to_nearest_even
  // Adding 0x7FFF plus the lowest kept bit rounds the dropped half to
  // nearest, ties to even; a carry moves into the exponent (up to infinity).
  uint32_t bias = 0x7FFFu + ((bits >> 16) & 1u);
  return uint16_t((bits + bias) >> 16);
}

uint16_t floatToFloat16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u)
    return sign | 0x7E00u;
  // 65520 = 65504 + half an ulp: the tie rounds to the even neighbour,
  // which is infinity (65504's mantissa is odd).
  if (abs >= 0x477FF000u)
    return sign | 0x7C00u;
  if (abs >= 0x38800000u) { // normal in float16 (>= 2^-14)
    // Rebias the exponent (127 -> 15) and round away 13 mantissa bits to
    // nearest even; a carry into the exponent is the right result.
    uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
    return sign | uint16_t((rounded - 0x38000000u) >> 13);
  }
  // Subnormal in float16: units of 2^-24. The float's significand m (with
  // its implicit bit) times 2^(e - 150) is m >> (126 - e) units.
  uint32_t exponent = abs >> 23;
  if (exponent < 102) // below 2^-25: rounds to zero (2^-25 itself is a tie)
    return sign;
  uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126 - exponent; // 14 .. 24
  uint32_t units = mantissa >> shift;
  uint32_t rest = mantissa & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (units & 1u)))
    ++units; // may become 0x400, the smallest normal: still right
  return sign | uint16_t(units);
}

float bfloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(uint32_t(bits) << 16);
}

float float16ToFloat(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 31) // infinity, or NaN with its payload
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    // mantissa * 2^-24, exact in float.
    float v = float(mantissa) * std::bit_cast<float>(uint32_t(103) << 23);
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                              (mantissa << 13));
}

namespace {

float readElement(plan::DType dtype, const std::byte *p) {
  if (dtype == plan::DType::Float32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return dtype == plan::DType::BFloat16 ? bfloat16ToFloat(bits)
                                        : float16ToFloat(bits);
}

void writeElement(plan::DType dtype, float v, std::byte *p) {
  if (dtype == plan::DType::Float32) {
    std::memcpy(p, &v, 4);
    return;
  }
  uint16_t bits =
      dtype == plan::DType::BFloat16 ? floatToBFloat16(v) : floatToFloat16(v);
  std::memcpy(p, &bits, 2);
}

std::string dtypeText(plan::DType dtype) {
  return std::string(plan::dtypeName(dtype));
}

} // namespace

Result<void> castElements(plan::DType from, std::span<const std::byte> in,
                          plan::DType to, std::span<std::byte> out) {
  if (!isCastableDType(from) || !isCastableDType(to))
    return makeError("cannot cast " + dtypeText(from) + " to " + dtypeText(to) +
                     ": casts convert only float32, bfloat16 and float16");
  const size_t inBytes = size_t(plan::dtypeBytes(from));
  const size_t outBytes = size_t(plan::dtypeBytes(to));
  if (in.size() % inBytes != 0 || in.size() / inBytes * outBytes != out.size())
    return makeError("cast " + dtypeText(from) + " -> " + dtypeText(to) + ": " +
                     std::to_string(in.size()) + " bytes in, " +
                     std::to_string(out.size()) + " bytes out");
  const size_t n = in.size() / inBytes;
  if (from == to) {
    std::memcpy(out.data(), in.data(), in.size());
    return {};
  }
  // Through float32, which holds every bfloat16 and float16 value exactly:
  // one rounding, at the narrowing write.
  for (size_t i = 0; i < n; ++i)
    writeElement(to, readElement(from, in.data() + i * inBytes),
                 out.data() + i * outBytes);
  return {};
}

/// The stored entry of a box when a cast applies to it, else null.
static const TensorEntry *castSource(const CheckpointMetadata &meta,
                                     const PersistentBox &b,
                                     const LoadOptions &options) {
  if (!options.dtypeCast)
    return nullptr;
  const TensorEntry *t = meta.findTensor(b.tensor);
  if (!t || t->dtype == b.dtype || !isCastableDType(t->dtype) ||
      !isCastableDType(b.dtype))
    return nullptr;
  return t;
}

static bool skipped(const PersistentBox &b, const LoadOptions &options) {
  return options.resetOptimizerState && b.kind == TensorKind::OptimizerState;
}

Result<void> checkLoadable(const CheckpointMetadata &meta,
                           std::span<const PersistentBox> boxes,
                           const LoadOptions &options) {
  for (const PersistentBox &b : boxes) {
    if (skipped(b, options))
      continue;
    PersistentBox asStored = b;
    if (const TensorEntry *t = castSource(meta, b, options))
      asStored.dtype = t->dtype; // the names and shapes still must match
    MESHPLAN_TRY(checkLoadable(meta, std::span(&asStored, 1)));
  }
  return {};
}

Result<void> loadPersistentBoxInto(const CheckpointMetadata &meta,
                                   const PersistentBox &b,
                                   const LoadOptions &options,
                                   std::span<std::byte> out) {
  if (skipped(b, options)) {
    std::memset(out.data(), 0, out.size());
    return {};
  }
  const TensorEntry *t = castSource(meta, b, options);
  if (!t)
    return loadBoxInto(meta, b.tensor, b.globalShape, b.box, b.dtype, out);
  auto stored = loadBox(meta, b.tensor, b.globalShape, b.box, t->dtype);
  if (!stored)
    return stored.error();
  if (auto ok = castElements(t->dtype, *stored, b.dtype, out); !ok)
    return ok.error().within("tensor " + json::quote(b.tensor));
  return {};
}

std::string describeConversion(const CheckpointMetadata &meta,
                               std::span<const PersistentBox> boxes,
                               const LoadOptions &options) {
  // (kind, from, to) -> tensors, each tensor once however many boxes.
  std::map<std::tuple<int, plan::DType, plan::DType>, std::set<std::string>>
      casts;
  bool reset = false;
  for (const PersistentBox &b : boxes) {
    if (skipped(b, options)) {
      reset = true;
      continue;
    }
    if (const TensorEntry *t = castSource(meta, b, options))
      casts[{int(b.kind), t->dtype, b.dtype}].insert(b.tensor);
  }
  std::string out;
  for (const auto &[key, names] : casts) {
    const auto &[kind, from, to] = key;
    out += (out.empty() ? "" : "; ") + std::to_string(names.size()) +
           (kind == int(TensorKind::Parameter) ? " parameters "
                                               : " optimizer states ") +
           dtypeText(from) + "->" + dtypeText(to) + " (round to nearest even)";
  }
  if (reset)
    out += std::string(out.empty() ? "" : "; ") + "optimizer state reset";
  return out;
}

} // namespace meshplan::ckpt
