// Writes to the block store's blocks under the seqlock protocol (seqlock.h): a write waits for
// other writers and for moves of the block, makes seq odd, copies the data into every memory copy
// that stays valid (the one written plus copies pinned by Pin() callers: write-through), drops the
// other copies and publishes the new version. Discard makes a new, all-zero version in place.
#pragma once

#include <cstdint>

#include "store/block_mover.h"
#include "store/block_table.h"
#include "store/store_counters.h"
#include "store/tier_copies.h"

namespace mshyper::store {

class BlockWriter {
 public:
  BlockWriter(const StoreParts& parts, BlockMover& mover) : parts_(parts), mover_(mover) {}

  // BlockStore::Write and BlockStore::Discard (block_store.h); each takes the lock itself.
  void Write(uint64_t id, uint64_t offset, const void* src, uint64_t len);
  void Discard(uint64_t id);

 private:
  // A whole-block write of a block whose only valid copy is on disk, into a fresh host slot (the
  // old data is not read). False if a concurrent move made a memory copy valid meanwhile.
  bool WriteWholeFromDisk(Block& b, uint64_t id, const void* src, TableLock& lock);

  const StoreParts parts_;
  BlockMover& mover_;
};

}  // namespace mshyper::store
