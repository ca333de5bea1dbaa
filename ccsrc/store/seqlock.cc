#include "store/seqlock.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace mshyper::store {
namespace {

inline void CpuRelax(int& spins) {
  if (++spins > 64) {
    std::this_thread::yield();
  } else {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

}  // namespace

uint64_t SeqlockRead(const SeqlockView& block, const uint8_t* base, uint64_t off, void* dst, uint64_t len,
                     uint64_t* fill_out, std::atomic<uint64_t>& retries) {
  const auto* words = reinterpret_cast<const uint64_t*>(base);
  int spins = 0;
  for (;;) {
    const uint64_t v1 = block.seq.load(std::memory_order_acquire);
    if (v1 & 1) {
      CpuRelax(spins);
      continue;
    }
    if (block.copy_version.load(std::memory_order_acquire) != v1) return kNoVersion;
    // Bytes at or beyond the fill mark read as zero (the slot may hold anything there).
    const uint64_t fill = block.fill.load(std::memory_order_relaxed);
    const uint64_t n = off >= fill ? 0 : std::min(len, fill - off);
    if (n > 0) AtomicCopyOut(dst, words, off, n);
    if (n < len) std::memset(static_cast<uint8_t*>(dst) + n, 0, len - n);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (block.seq.load(std::memory_order_relaxed) == v1) {
      if (fill_out != nullptr) *fill_out = fill;
      return v1;
    }
    retries.fetch_add(1, std::memory_order_relaxed);
    CpuRelax(spins);
  }
}

void AtomicCopyOut(void* dst, const uint64_t* words, uint64_t offset, uint64_t len) {
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t w = offset / 8;
  const uint64_t head = offset % 8;
  if (head != 0 && len > 0) {
    const uint64_t x = __atomic_load_n(&words[w++], __ATOMIC_RELAXED);
    const uint64_t n = std::min<uint64_t>(8 - head, len);
    std::memcpy(out, reinterpret_cast<const uint8_t*>(&x) + head, n);
    out += n;
    len -= n;
  }
  while (len >= 32) {
    const uint64_t a = __atomic_load_n(&words[w], __ATOMIC_RELAXED);
    const uint64_t b = __atomic_load_n(&words[w + 1], __ATOMIC_RELAXED);
    const uint64_t c = __atomic_load_n(&words[w + 2], __ATOMIC_RELAXED);
    const uint64_t d = __atomic_load_n(&words[w + 3], __ATOMIC_RELAXED);
    std::memcpy(out, &a, 8);
    std::memcpy(out + 8, &b, 8);
    std::memcpy(out + 16, &c, 8);
    std::memcpy(out + 24, &d, 8);
    w += 4;
    out += 32;
    len -= 32;
  }
  while (len >= 8) {
    const uint64_t x = __atomic_load_n(&words[w++], __ATOMIC_RELAXED);
    std::memcpy(out, &x, 8);
    out += 8;
    len -= 8;
  }
  if (len > 0) {
    const uint64_t x = __atomic_load_n(&words[w], __ATOMIC_RELAXED);
    std::memcpy(out, &x, len);
  }
}

void AtomicCopyIn(uint64_t* words, uint64_t offset, const void* src, uint64_t len) {
  const auto* in = static_cast<const uint8_t*>(src);
  uint64_t w = offset / 8;
  const uint64_t head = offset % 8;
  if (head != 0 && len > 0) {
    // The writer owns the block exclusively, so read-merge-write of a partial word is safe.
    uint64_t x = __atomic_load_n(&words[w], __ATOMIC_RELAXED);
    const uint64_t n = std::min<uint64_t>(8 - head, len);
    std::memcpy(reinterpret_cast<uint8_t*>(&x) + head, in, n);
    __atomic_store_n(&words[w++], x, __ATOMIC_RELAXED);
    in += n;
    len -= n;
  }
  while (len >= 8) {
    uint64_t x;
    std::memcpy(&x, in, 8);
    __atomic_store_n(&words[w++], x, __ATOMIC_RELAXED);
    in += 8;
    len -= 8;
  }
  if (len > 0) {
    uint64_t x = __atomic_load_n(&words[w], __ATOMIC_RELAXED);
    std::memcpy(&x, in, len);
    __atomic_store_n(&words[w], x, __ATOMIC_RELAXED);
  }
}

void AtomicZero(uint64_t* words, uint64_t offset, uint64_t len) {
  uint64_t w = offset / 8;
  const uint64_t head = offset % 8;
  if (head != 0 && len > 0) {
    uint64_t x = __atomic_load_n(&words[w], __ATOMIC_RELAXED);
    const uint64_t n = std::min<uint64_t>(8 - head, len);
    std::memset(reinterpret_cast<uint8_t*>(&x) + head, 0, n);
    __atomic_store_n(&words[w++], x, __ATOMIC_RELAXED);
    len -= n;
  }
  for (; len >= 8; len -= 8) __atomic_store_n(&words[w++], uint64_t{0}, __ATOMIC_RELAXED);
  if (len > 0) {
    uint64_t x = __atomic_load_n(&words[w], __ATOMIC_RELAXED);
    std::memset(&x, 0, len);
    __atomic_store_n(&words[w], x, __ATOMIC_RELAXED);
  }
}

}  // namespace mshyper::store
