//===- Hash.h - The one content digest (FNV-1a, 64 bits) --------*- C++ -*-===//
//
// What tells two documents apart where no adversary is involved: a
// checkpoint's spec fingerprint ("fnv1a64:<hex>", meshplan/Checkpoint), an
// executed-step trace's plan digest (meshplan/Plan/ExecutedTrace.h), the
// Gloo slot of a tagged transfer (runtime), the trainer's per-tensor seed
// (examples/trainer, from an older basis it keeps). Not a defence against
// forgery.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_SUPPORT_HASH_H
#define MESHPLAN_SUPPORT_HASH_H

#include <cstdint>
#include <string>
#include <string_view>

namespace meshplan {

/// FNV-1a's 64-bit offset basis.
inline constexpr uint64_t kFnv1a64Basis = 0xcbf29ce484222325ull;

/// FNV-1a over the bytes, 64 bits, from `basis` (FNV-1a's own unless a
/// caller must keep the values of an older copy that started elsewhere).
inline uint64_t fnv1a64(std::string_view bytes,
                        uint64_t basis = kFnv1a64Basis) {
  uint64_t h = basis;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

/// `fnv1a64(bytes)` as 16 lower-case hex digits.
inline std::string fnv1a64Hex(std::string_view bytes) {
  static const char *digits = "0123456789abcdef";
  uint64_t h = fnv1a64(bytes);
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4)
    out[size_t(i)] = digits[h & 0xF];
  return out;
}

} // namespace meshplan

#endif // MESHPLAN_SUPPORT_HASH_H
