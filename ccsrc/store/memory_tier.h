// One memory tier of the block store (device or host): block-sized slots whose aligned buffers are
// created on first use, the free slots, the LRU list of the block ids holding a copy, and the
// tier's counters. Not thread-safe: the BlockStore's mutex guards every call.
#pragma once

#include <cstdint>
#include <list>
#include <vector>

#include "store/store_types.h"

namespace mshyper::store {

// A 4KB-aligned buffer of at least `bytes` (whole pages), freed with std::free; nullptr when out
// of memory.
uint8_t* AllocBlockBuffer(uint64_t bytes);

class MemoryTier {
 public:
  using LruPosition = std::list<uint64_t>::iterator;

  // Raises StoreError if `capacity_bytes` holds no slot of `slot_bytes`.
  MemoryTier(Tier tier, uint64_t capacity_bytes, uint64_t slot_bytes);
  ~MemoryTier();
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

  uint64_t capacity() const { return capacity_; }
  // A free slot, creating its buffer if it has none yet; -1 when every slot is assigned.
  // Raises CapacityError when the process is out of memory for a new buffer.
  int64_t TakeFreeSlot();
  void ReleaseSlot(int64_t slot);
  uint8_t* SlotPtr(int64_t slot) const { return buffers_[slot]; }

  // The LRU list (front = least recently used) of the block ids with a copy in this tier.
  const std::list<uint64_t>& lru() const { return lru_; }
  LruPosition AddMostRecent(uint64_t id) { return lru_.insert(lru_.end(), id); }
  void MakeMostRecent(LruPosition pos) { lru_.splice(lru_.end(), lru_, pos); }
  void RemoveFromLru(LruPosition pos) { lru_.erase(pos); }

  void CountEviction() { ++evictions_; }
  TierStats Stats() const { return TierStats{capacity_, used_, peak_, evictions_}; }
  void ResetPeak() { peak_ = used_; }

 private:
  const Tier tier_;
  const uint64_t capacity_;    // slots
  const uint64_t slot_bytes_;
  std::vector<uint8_t*> buffers_;  // one aligned buffer per slot ever created
  std::vector<int64_t> free_slots_;
  uint64_t used_ = 0, peak_ = 0, evictions_ = 0;
  std::list<uint64_t> lru_;
};

}  // namespace mshyper::store
