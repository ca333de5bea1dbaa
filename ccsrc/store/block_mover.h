// The block store's moves of single blocks between tiers: a copy from one tier to the next
// (Migrate), a free memory slot made by eviction (ReserveSlot), and what is built on them (a valid,
// pinned copy in a tier; eviction; write-behind). Every call takes the table's lock and may release
// and retake it around the data copy (block_table.h states the contract).
#pragma once

#include <cstdint>

#include "store/block_table.h"
#include "store/store_counters.h"
#include "store/tier_copies.h"

namespace mshyper::store {

// What the store's parts work on (each owned by the BlockStore): the block size in bytes, the
// table, the tiers' copies and the counters.
struct StoreParts {
  uint64_t block_size;
  BlockTable& table;
  TierCopies& copies;
  StoreCounters& counters;
};

class BlockMover {
 public:
  explicit BlockMover(const StoreParts& parts) : parts_(parts) {}

  // A free slot in memory tier t, evicting (and writing the only valid copy down) if needed.
  // Slots busy for a moment (moving, being written) are waited for (bounded), unless
  // wait_for_busy is false: then -1 when no slot is free or evictable now.
  // Raises CapacityError if every slot is held by Pin() callers.
  int64_t ReserveSlot(Tier t, TableLock& lock, bool wait_for_busy = true);
  // Copies block b from tier src to tier dst (dst = src +/- 1); b must not be moving. Returns when
  // done (dst may still be invalid if a concurrent write intervened; callers loop).
  void Migrate(Block& b, uint64_t id, Tier src, Tier dst, TableLock& lock);
  // Ensures a valid copy in tier t (device/host), moving it up or down, and pins it (transiently).
  void EnsurePinned(Block& b, uint64_t id, Tier t, TableLock& lock);
  // Ensures a valid copy in some memory tier (fastest first) and pins it; returns the tier.
  Tier EnsureInMemoryPinned(Block& b, uint64_t id, TableLock& lock);
  // BlockStore::Evict and BlockStore::WriteBack (block_store.h) under the lock.
  bool Evict(Block& b, uint64_t id, Tier tier, TableLock& lock);
  size_t WriteBack(size_t max_blocks, TableLock& lock);

 private:
  const StoreParts parts_;
};

// The error for a disk copy of block `id` at `at` whose CRC32C `computed` differs from `stored`.
CorruptBlockError CorruptCopyError(uint64_t id, const DiskExtent& at, uint32_t stored, uint32_t computed);

}  // namespace mshyper::store
