//===- Hash.h - The one content digest (FNV-1a, 64 bits) --------*- C++ -*-===//
//
// What tells two documents apart where no adversary is involved: a
// checkpoint's spec fingerprint ("fnv1a64:<hex>", meshplan/Checkpoint) and
// its metadata checksum (over a canonical text, fed piece by piece), an
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

/// FNV-1a's initial state (the offset basis).
inline constexpr uint64_t kFnv1a64Basis = 0xcbf29ce484222325ull;

/// FNV-1a over the bytes, 64 bits. `h` is the state after the preceding
/// bytes, so fnv1a64(b, fnv1a64(a)) == fnv1a64(a + b): a long text can be
/// hashed in pieces without being built whole. (The trainer's per-tensor
/// seed passes an older, one-digit-short basis it must keep.)
inline uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnv1a64Basis) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

/// SplitMix64's finalizer (Steele, Lea and Flood): a fixed, well-mixed
/// bijection of 64 bits, from which the trainer derives its data windows,
/// synthetic gradients and initial values. Those are part of what its
/// checkpoints and reference runs reproduce: the constants never change.
inline constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A 64-bit hash as 16 lower-case hex digits.
inline std::string hex64(uint64_t h) {
  static const char *digits = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4)
    out[size_t(i)] = digits[h & 0xF];
  return out;
}

/// `fnv1a64(bytes)` as 16 lower-case hex digits.
inline std::string fnv1a64Hex(std::string_view bytes) {
  return hex64(fnv1a64(bytes));
}

} // namespace meshplan

#endif // MESHPLAN_SUPPORT_HASH_H
