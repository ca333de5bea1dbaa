#include "store/crc32c.h"

#include <array>
#include <cstring>

namespace mshyper::store {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles but a throughput of 1 per cycle, so one
// dependency chain runs at a third of the possible speed. Long buffers are processed as three
// interleaved lanes of kLane bytes each, combined with the CRC register's linearity:
//   R(c, A B C) = S(S(R(c, A)) ^ R(0, B)) ^ R(0, C),   S(x) = R(x, kLane zero bytes),
// where R is the raw register update (no pre/post inversion) and S is a linear map on 32 bits,
// applied through four byte tables.
constexpr size_t kLane = 8192;

__attribute__((target("sse4.2"))) uint32_t ZerosRaw(uint32_t c, size_t n) {
  uint64_t r = c;
  for (size_t i = 0; i < n; i += 8) r = __builtin_ia32_crc32di(r, 0);
  return static_cast<uint32_t>(r);
}

struct ShiftTables {
  uint32_t t[4][256];
  ShiftTables() {
    uint32_t basis[32];
    for (int i = 0; i < 32; ++i) basis[i] = ZerosRaw(1u << i, kLane);
    for (int b = 0; b < 4; ++b) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t r = 0;
        for (int k = 0; k < 8; ++k) {
          if ((v >> k) & 1) r ^= basis[8 * b + k];
        }
        t[b][v] = r;
      }
    }
  }
  uint32_t Shift(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t Crc32cHw(const void* data, size_t len, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (len && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = __builtin_ia32_crc32qi(static_cast<uint32_t>(c), *p++);
    --len;
  }
  if (len >= 3 * kLane) {
    static const ShiftTables shift;
    while (len >= 3 * kLane) {
      uint64_t c0 = c, c1 = 0, c2 = 0;
      for (size_t i = 0; i < kLane; i += 8) {
        uint64_t a, b, d;
        std::memcpy(&a, p + i, 8);
        std::memcpy(&b, p + kLane + i, 8);
        std::memcpy(&d, p + 2 * kLane + i, 8);
        c0 = __builtin_ia32_crc32di(c0, a);
        c1 = __builtin_ia32_crc32di(c1, b);
        c2 = __builtin_ia32_crc32di(c2, d);
      }
      c = shift.Shift(shift.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
      p += 3 * kLane;
      len -= 3 * kLane;
    }
  }
  while (len >= 8) {
    uint64_t a;
    std::memcpy(&a, p, 8);
    c = __builtin_ia32_crc32di(c, a);
    p += 8;
    len -= 8;
  }
  while (len--) c = __builtin_ia32_crc32qi(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}
#endif

}  // namespace

uint32_t Crc32cSoftware(const void* data, size_t len, uint32_t crc) {
  const auto& t = GetTables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (len >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

bool Crc32cHardware() {
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  return hw;
#else
  return false;
#endif
}

uint32_t Crc32c(const void* data, size_t len, uint32_t crc) {
#if defined(__x86_64__)
  if (Crc32cHardware()) return Crc32cHw(data, len, crc);
#endif
  return Crc32cSoftware(data, len, crc);
}

}  // namespace mshyper::store
