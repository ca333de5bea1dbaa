// The block store's seqlock: a block's `seq` is even when stable and odd while a write is in
// progress; each tier copy records the seq value whose data it holds (its version). Writers
// serialise per block, make seq odd, store the data with relaxed atomic word stores, publish the
// copy versions and make seq even with release. Readers (Boehm's pattern) acquire-load seq, check
// the copy's version, copy the data with relaxed atomic word loads, acquire fence, relaxed re-load
// of seq, and retry on a change. No plain access ever races with a write.
#pragma once

#include <atomic>
#include <cstdint>

namespace mshyper::store {

// The version of a copy that holds no data.
constexpr uint64_t kNoVersion = ~0ull;

// Whether a copy at version `copy_version` is current for a block at `seq`. While a write is in
// progress (seq odd) its targets hold either the old version (seq - 1) or, just before seq turns
// even, the new one (seq + 1); both count as current.
inline bool CopyIsCurrent(uint64_t seq, uint64_t copy_version) {
  return copy_version == (seq & ~1ull) || ((seq & 1) && copy_version == seq + 1);
}

// One block's seqlock state as a reader sees it.
struct SeqlockView {
  const std::atomic<uint64_t>& seq;           // the block's sequence number
  const std::atomic<uint64_t>& copy_version;  // the version the copy being read holds
  const std::atomic<uint64_t>& fill;          // end of the written range (bytes beyond read as 0)
};

// Consistent snapshot of bytes [off, off+len) of a copy at `base` into dst (bytes at or beyond the
// fill mark are zero-filled). Returns the version read, or kNoVersion if the copy is stale;
// `fill_out`, if given, receives the fill mark of that version. Every retry adds one to `retries`.
uint64_t SeqlockRead(const SeqlockView& block, const uint8_t* base, uint64_t off, void* dst, uint64_t len,
                     uint64_t* fill_out, std::atomic<uint64_t>& retries);

// Word-wise copies with relaxed atomic accesses (the seqlock's data path). `words` points to
// 8-byte aligned block memory; byte ranges need not be aligned (partial words are merged).
void AtomicCopyOut(void* dst, const uint64_t* words, uint64_t offset, uint64_t len);
void AtomicCopyIn(uint64_t* words, uint64_t offset, const void* src, uint64_t len);
void AtomicZero(uint64_t* words, uint64_t offset, uint64_t len);

}  // namespace mshyper::store
