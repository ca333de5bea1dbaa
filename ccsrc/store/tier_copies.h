// The block store's tiers and the bookkeeping of each block's copies in them: the device and host
// MemoryTier (slots, LRU) and the DiskTier, and the slot, LRU position and pin count of every
// copy. Every call that changes or reads this bookkeeping takes the table's lock (block_table.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "store/block_table.h"
#include "store/disk_tier.h"
#include "store/memory_tier.h"
#include "store/store_counters.h"
#include "store/store_types.h"

namespace mshyper::store {

class TierCopies {
 public:
  explicit TierCopies(const StoreConfig& config);

  MemoryTier& Mem(Tier t, const TableLock&) { return *mem_[TierIndex(t)]; }
  DiskTier& Disk(const TableLock&) { return disk_; }
  // The disk tier for I/O only (Read, Write, ReadRun on an extent located under the lock): these
  // touch no bookkeeping, so they run with the lock released.
  const DiskTier& DiskIo() const { return disk_; }
  // The buffer of a memory slot. Needs no lock once the slot is assigned to a copy the caller
  // pinned (slot buffers are created under the lock before they are handed out, never moved).
  uint8_t* SlotPtr(Tier t, int64_t slot) const { return mem_[TierIndex(t)]->SlotPtr(slot); }
  // Bytes of a copy that must be moved for a block whose fill mark is `fill`.
  uint64_t CopyLen(uint64_t fill) const;

  void ReleaseSlot(Tier t, int64_t slot, const TableLock& lock) { Mem(t, lock).ReleaseSlot(slot); }
  // Moves the block's copy in t to the tail of t's LRU list (adding it if absent); no-op for disk.
  void Touch(Block& b, uint64_t id, Tier t, const TableLock&);
  // Releases the slot of the block's copy in t and marks it as holding no data.
  void DropCopy(Block& b, Tier t, const TableLock&);
  // Transient pins (a read, copy or write in progress); Pin() callers also count in `held`.
  void Pin(Block& b, Tier t, const TableLock&) { ++b.copy[TierIndex(t)].pins; }
  // Drops a copy that became stale while the pin kept it alive. StoreError if it is not pinned.
  void Unpin(Block& b, uint64_t id, Tier t, const TableLock&);

  // Ids of the blocks with a valid copy in memory tier t, least recently used first.
  std::vector<uint64_t> LruOrder(Tier t, const BlockTable& table, const TableLock&) const;
  // /proc/self/fd/N of the block's disk file (it has no name) and the slot offset (empty path if none).
  std::pair<std::string, uint64_t> DiskLocation(const Block& b, const TableLock&) const;
  void SnapshotTiers(StoreStats& s, const TableLock&) const;
  void ResetPeaks(const TableLock&);

 private:
  const uint64_t block_size_;
  std::unique_ptr<MemoryTier> mem_[2];  // device, host
  DiskTier disk_;
};

// The message of the internal error "a block has no valid copy", with its copies' state.
std::string NoCopyMessage(const Block& b, uint64_t id, const TableLock&);

}  // namespace mshyper::store
