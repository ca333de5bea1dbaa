#include "store/block_writer.h"

#include <cstring>
#include <string>

#include "store/crc32c.h"

namespace mshyper::store {
namespace {

constexpr int kD = TierIndex(Tier::kDevice);
constexpr int kH = TierIndex(Tier::kHost);
constexpr int kK = TierIndex(Tier::kDisk);

}  // namespace

bool BlockWriter::WriteWholeFromDisk(Block& b, uint64_t id, const void* src, TableLock& lock) {
  int64_t slot = -1;
  try {
    slot = mover_.ReserveSlot(Tier::kHost, lock);
  } catch (...) {
    b.writing = false;
    parts_.table.NotifyAll();
    throw;
  }
  if (Valid(b, Tier::kDevice, lock) || Valid(b, Tier::kHost, lock) || b.moving) {
    parts_.copies.ReleaseSlot(Tier::kHost, slot, lock);
    return false;
  }
  const uint64_t v = b.seq.load(std::memory_order_relaxed);
  b.seq.store(v + 1, std::memory_order_relaxed);  // disk copy readers will retry
  b.moving = true;
  uint8_t* dst = parts_.copies.SlotPtr(Tier::kHost, slot);
  {
    TableLock::Unlocked unlocked(lock);
    std::memcpy(dst, src, parts_.block_size);  // private slot, published below under the lock
  }
  b.fill.store(parts_.block_size, std::memory_order_relaxed);  // seq is odd: readers retry
  b.moving = false;
  b.copy[kH].slot = slot;
  b.copy[kH].version.store(v + 2, std::memory_order_relaxed);
  b.seq.store(v + 2, std::memory_order_release);
  parts_.copies.Touch(b, id, Tier::kHost, lock);
  b.writing = false;
  parts_.counters.writes.fetch_add(1, std::memory_order_relaxed);
  parts_.table.NotifyAll();
  return true;
}

void BlockWriter::Write(uint64_t id, uint64_t offset, const void* src, uint64_t len) {
  if (offset > parts_.block_size || len > parts_.block_size - offset) {
    throw StoreError("write of [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                     ") is outside block " + std::to_string(id));
  }
  Block* bp;
  Tier t;
  Tier targets[2];
  uint8_t* bases[2];
  int ntargets = 0;
  uint64_t v = 0;
  {
    TableLock lock = parts_.table.Lock();
    bp = &parts_.table.GetAllocated(id, lock);
    // Wait for other writers and for copies of this block between tiers (which rely on no write
    // starting while they run).
    parts_.table.Wait(lock, [&] { return (!bp->writing && !bp->moving) || !bp->allocated; });
    if (!bp->allocated) throw StoreError("block " + std::to_string(id) + " was freed");
    bp->writing = true;
    if (offset == 0 && len == parts_.block_size && !Valid(*bp, Tier::kDevice, lock) && !Valid(*bp, Tier::kHost, lock) &&
        !bp->moving && WriteWholeFromDisk(*bp, id, src, lock)) {
      return;
    }
    try {
      // Prefer the host copy as the write target when the device copy is not in use: the device
      // copy is then dropped instead of becoming a dirty copy that must be written down later.
      if (Valid(*bp, Tier::kHost, lock) && Valid(*bp, Tier::kDevice, lock) && bp->copy[kD].pins == 0) {
        parts_.copies.Pin(*bp, Tier::kHost, lock);
        parts_.copies.Touch(*bp, id, Tier::kHost, lock);
        t = Tier::kHost;
      } else {
        t = mover_.EnsureInMemoryPinned(*bp, id, lock);
      }
    } catch (...) {
      bp->writing = false;
      parts_.table.NotifyAll();
      throw;
    }
    // Targets: the valid copy just pinned, plus any other memory copy that is pinned (its holder
    // keeps reading it, so it is written through and stays valid). Unpinned other copies are
    // invalidated now. The seq goes odd while the lock is held, so no migration that read the old
    // data can publish a copy afterwards (it re-checks seq under the lock).
    Block& b = *bp;
    ntargets = 0;
    targets[ntargets++] = t;
    for (Tier u : {Tier::kDevice, Tier::kHost}) {
      if (u == t || b.copy[TierIndex(u)].slot < 0) continue;
      if (Valid(b, u, lock) && b.copy[TierIndex(u)].pins != 0) {
        parts_.copies.Pin(b, u, lock);
        targets[ntargets++] = u;
      } else if (b.copy[TierIndex(u)].pins == 0) {
        parts_.copies.DropCopy(b, u, lock);
      }
    }
    for (int i = 0; i < ntargets; ++i) bases[i] = parts_.copies.SlotPtr(targets[i], b.copy[TierIndex(targets[i])].slot);
    v = b.seq.load(std::memory_order_relaxed);
    b.seq.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  Block& b = *bp;
  // Seqlock write: seq odd (above), release fence, data with relaxed atomic stores, publish the
  // copies' versions, seq even with release. A write beyond the fill mark first zeroes the gap
  // between the mark and the write in every target (the slots may hold anything there), then
  // moves the mark.
  const uint64_t fill = b.fill.load(std::memory_order_relaxed);
  if (offset > fill) {
    for (int i = 0; i < ntargets; ++i) AtomicZero(reinterpret_cast<uint64_t*>(bases[i]), fill, offset - fill);
  }
  for (int i = 0; i < ntargets; ++i) AtomicCopyIn(reinterpret_cast<uint64_t*>(bases[i]), offset, src, len);
  if (offset + len > fill) b.fill.store(offset + len, std::memory_order_relaxed);
  for (int i = 0; i < ntargets; ++i) b.copy[TierIndex(targets[i])].version.store(v + 2, std::memory_order_relaxed);
  b.seq.store(v + 2, std::memory_order_release);
  parts_.counters.writes.fetch_add(1, std::memory_order_relaxed);
  {
    TableLock lock = parts_.table.Lock();
    b.writing = false;
    for (int i = 0; i < ntargets; ++i) parts_.copies.Unpin(b, id, targets[i], lock);
    parts_.table.NotifyAll();
  }
}

void BlockWriter::Discard(uint64_t id) {
  TableLock lock = parts_.table.Lock();
  Block& b = parts_.table.GetAllocated(id, lock);
  parts_.table.Wait(lock, [&] { return (!b.writing && !b.moving) || !b.allocated; });
  if (!b.allocated) throw StoreError("block " + std::to_string(id) + " was freed");
  // A new version whose content is all zeros: with the fill mark at 0 no byte of any copy is
  // read, so every copy that was valid stays valid as it is (nothing is copied or written), and a
  // disk slot becomes a valid empty copy -- the block never needs a disk write for this version.
  // Same seqlock protocol as a write (seq odd while the fill mark changes).
  const uint64_t v = b.seq.load(std::memory_order_relaxed);
  bool valid[kNumTiers];
  for (int t = 0; t < kNumTiers; ++t) valid[t] = Valid(b, static_cast<Tier>(t), lock);
  b.seq.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  b.fill.store(0, std::memory_order_relaxed);
  for (int t = 0; t < 2; ++t) {
    if (valid[t]) b.copy[t].version.store(v + 2, std::memory_order_relaxed);
  }
  if (b.copy[kK].slot >= 0) {
    b.disk_len = 0;
    b.disk_crc = Crc32c(nullptr, 0);
    b.copy[kK].version.store(v + 2, std::memory_order_relaxed);
  }
  b.seq.store(v + 2, std::memory_order_release);
  parts_.counters.writes.fetch_add(1, std::memory_order_relaxed);
  parts_.table.NotifyAll();
}

}  // namespace mshyper::store
