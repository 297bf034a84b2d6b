//===- Crc32c.cpp - CRC32C checksums and document fingerprints ------------===//
//
// CRC32C rather than CRC32 (zlib) because x86 has an instruction for it
// (SSE4.2) and it detects more error patterns on long messages; implemented
// here rather than taken from a library because it is forty lines and the
// checkpoint format must not depend on what a distribution ships.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Checkpoint.h"
#include "meshplan/Support/Hash.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace meshplan::ckpt {

namespace {

/// Reflected Castagnoli polynomial.
constexpr uint32_t kPoly = 0x82F63B78u;

/// Slicing-by-8: table[k][b] is the CRC of byte b followed by k zero bytes,
/// so eight input bytes are folded with eight lookups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;
constexpr Tables makeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i)
      c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b)
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  return t;
}
constexpr Tables kTables = makeTables();

uint32_t updatePortable(uint32_t c, const unsigned char *p, size_t n) {
  while (n >= 8) {
    // Little-endian load: the format and the hosts meshplan runs on are
    // little-endian, and memcpy keeps unaligned input defined.
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^
        kTables[5][(lo >> 16) & 0xFF] ^ kTables[4][lo >> 24] ^
        kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^
        kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--)
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__x86_64__)
/// The crc32 instruction has a latency of 3 cycles and a throughput of 1 per
/// cycle, so one dependent chain runs at a third of the instruction's rate.
/// Inputs of at least 3 * kStream bytes are therefore checksummed as three
/// independent chains over consecutive kStream-byte streams, joined with
/// shift(): the register after kStream more zero bytes. CRC is linear, so
/// crc(A B C) = shift(shift(crc(A)) ^ crc0(B)) ^ crc0(C), where crc0 starts
/// from a zero register. With 16 KiB streams the join (eight table lookups)
/// is negligible beside the 6,144 crc32 instructions between two joins.
/// 16.5 GB/s instead of 4.0 on 1 MiB blocks (one core of the AMD EPYC VM of
/// docs/performance.md, section G).
constexpr size_t kStream = size_t(16) << 10;

/// shift() as four 256-entry tables, one per byte of the register: the
/// operator is linear over GF(2), so it is the XOR of its values on the bytes.
struct ShiftTables {
  std::array<std::array<uint32_t, 256>, 4> t;
  ShiftTables() {
    // The images of the 32 basis registers, by feeding kStream zero bytes
    // through the portable implementation (once per process, well under a
    // millisecond).
    static const unsigned char zeros[kStream] = {};
    uint32_t basis[32];
    for (int i = 0; i < 32; ++i)
      basis[i] = updatePortable(uint32_t(1) << i, zeros, kStream);
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int j = 0; j < 8; ++j)
          if (b & (1u << j))
            v ^= basis[8 * k + j];
        t[size_t(k)][b] = v;
      }
  }
  uint32_t shift(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^
           t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t
updateSse42(uint32_t c, const unsigned char *p, size_t n) {
  uint64_t c64 = c;
  if (n >= 3 * kStream) {
    static const ShiftTables tables;
    do {
      uint64_t a = c64, b = 0, d = 0;
      const unsigned char *p1 = p + kStream, *p2 = p + 2 * kStream;
      for (size_t i = 0; i < kStream; i += 8) {
        uint64_t va, vb, vd;
        std::memcpy(&va, p + i, 8);
        std::memcpy(&vb, p1 + i, 8);
        std::memcpy(&vd, p2 + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        d = _mm_crc32_u64(d, vd);
      }
      c64 = tables.shift(tables.shift(uint32_t(a)) ^ uint32_t(b)) ^ uint32_t(d);
      p += 3 * kStream;
      n -= 3 * kStream;
    } while (n >= 3 * kStream);
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--)
    c = _mm_crc32_u8(c, *p++);
  return c;
}

bool haveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

} // namespace

uint32_t crc32cPortable(const void *data, size_t size, uint32_t crc) {
  return ~updatePortable(~crc, static_cast<const unsigned char *>(data), size);
}

uint32_t crc32c(const void *data, size_t size, uint32_t crc) {
#if defined(__x86_64__)
  if (haveSse42())
    return ~updateSse42(~crc, static_cast<const unsigned char *>(data), size);
#endif
  return crc32cPortable(data, size, crc);
}

std::string fingerprintOf(std::string_view bytes) {
  return "fnv1a64:" + fnv1a64Hex(bytes);
}

bool isFingerprint(std::string_view text) {
  constexpr std::string_view prefix = "fnv1a64:";
  if (text.size() != prefix.size() + 16 || !text.starts_with(prefix))
    return false;
  for (char c : text.substr(prefix.size()))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return false;
  return true;
}

} // namespace meshplan::ckpt
