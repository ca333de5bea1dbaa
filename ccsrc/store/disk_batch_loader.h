// Loads of several disk-only blocks into the host tier at once (a prefetch): the blocks' disk
// slots are read in file order, and runs of adjacent slots are coalesced into one preadv.
#pragma once

#include <cstdint>
#include <vector>

#include "store/block_mover.h"
#include "store/block_table.h"
#include "store/store_counters.h"
#include "store/tier_copies.h"

namespace mshyper::store {

class DiskBatchLoader {
 public:
  DiskBatchLoader(const StoreParts& parts, BlockMover& mover) : parts_(parts), mover_(mover) {}

  // Loads those of `ids` that have a valid copy on disk only and are not moving, as many as the
  // host tier takes (the rest is left to single moves). Releases the lock during the I/O. Raises
  // the first I/O or CRC error after every load has ended (the failed blocks stay on disk).
  void Load(const std::vector<uint64_t>& ids, TableLock& lock);

 private:
  const StoreParts parts_;
  BlockMover& mover_;
};

}  // namespace mshyper::store
