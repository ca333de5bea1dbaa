// Versioned cache-block store over three tiers: device (a budgeted arena; on CPU host memory),
// host DRAM pool, and disk (preallocated files, pread/pwrite, CRC32C per block). BlockStore is the
// facade; it owns its parts, which share the table and its lock under the contract of
// block_table.h:
//   BlockTable      (block_table.h)       the blocks, their ids, the mutex and condition variable
//   TierCopies      (tier_copies.h)       the tiers (MemoryTier: slots, LRU; DiskTier: files, I/O)
//                                         and each copy's slot, LRU position and pins
//   BlockMover      (block_mover.h)       moves of one block between tiers, eviction, write-behind
//   DiskBatchLoader (disk_batch_loader.h) coalesced loads of several blocks from disk
//   BlockWriter     (block_writer.h)      writes and discards (the seqlock's writer side)
//   StoreCounters   (store_counters.h)    the statistics
// BlockStore itself keeps allocation, reads, pins and the queries.
//
// Concurrency design
//  * One metadata mutex (the table's) guards the block table entries' slot assignments, pin
//    counts, LRU lists and free lists. It is never held during bulk data copies or disk I/O: a
//    block being moved between tiers carries a `moving` flag, others wait on a condition variable.
//  * Every block has a seqlock `seq` (even = stable, odd = a write in progress; seqlock.h). Each
//    tier copy records the seq value whose data it holds (`Copy::version`, atomic). A copy is
//    valid when its version equals the block's current (even) seq. Writers serialise per block
//    (`writing` flag).
//  * A write makes every other tier copy stale (their versions no longer match) and frees their
//    memory slots once unpinned; the disk slot stays assigned but is never served while stale.
//  * A block always keeps at least one valid copy: evicting the only valid copy first writes it
//    to the next tier down; if that fails (disk full, I/O error) the eviction is abandoned and
//    the error reported, the block stays where it was.
//  * Fill mark: every block records `fill`, the end of the highest byte range ever written to it
//    (atomic; changed only by a writer while seq is odd). Bytes at and beyond `fill` read as zero
//    whatever the slot memory holds, so moves between tiers, disk I/O and CRCs cover only the
//    first CopyLen(fill) bytes (fill rounded up to 4KB): a partly used block (the shared block of
//    packed small tensors, the last block of a tensor) costs its used size, not the block size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "store/block_mover.h"
#include "store/block_table.h"
#include "store/block_writer.h"
#include "store/disk_batch_loader.h"
#include "store/store_counters.h"
#include "store/store_types.h"
#include "store/tier_copies.h"

namespace mshyper::store {

class BlockStore {
 public:
  explicit BlockStore(const StoreConfig& config);
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  const StoreConfig& config() const { return config_; }
  uint64_t block_size() const { return config_.block_size; }

  // A new zero-filled block (placed in the host tier, evicting to disk if the pool is full).
  uint64_t Allocate();
  // Drops every copy of a block; its id may be reused. The block must not be pinned.
  void Free(uint64_t id);

  // Copies bytes [offset, offset+len) of the block out / in. Thread-safe; reads never observe a
  // partially written range. A write bumps the version by 2 and makes other tier copies stale.
  void Read(uint64_t id, uint64_t offset, void* dst, uint64_t len);
  void Write(uint64_t id, uint64_t offset, const void* src, uint64_t len);
  // Makes the block's content all zeros (a new version) without copying or writing anything:
  // its data is no longer needed (e.g. a consumed gradient), so it never goes to disk.
  void Discard(uint64_t id);
  // Lock-free read for a caller that holds a pin on the block in `tier` (device or host).
  // Falls back to Read if the pinned copy became stale.
  void ReadPinned(uint64_t id, Tier tier, uint64_t offset, void* dst, uint64_t len);

  // Ensures a valid copy in `tier` (device or host), moving it up through the tiers, and pins it:
  // a pinned copy is never evicted, and a write to the block updates it too (write-through), so
  // it stays valid. Every Pin needs one Unpin. Raises CapacityError if every slot of the tier is
  // held by Pin() callers.
  void Pin(uint64_t id, Tier tier);
  void Unpin(uint64_t id, Tier tier);
  // Ensures a valid copy in `tier` without pinning (a prefetch). Disk reads of `ids` whose disk
  // slots are adjacent are coalesced into one preadv.
  void Fetch(const std::vector<uint64_t>& ids, Tier tier);
  // Writes the block down to the next tier if needed and drops its copy in `tier` (device/host).
  // Returns false if the copy is pinned or busy.
  bool Evict(uint64_t id, Tier tier);

  // Write-behind: writes up to `max_blocks` of the least recently used host copies that are the
  // only valid copy of their block down to disk, keeping them in the host tier (so evicting them
  // later costs no I/O). Returns how many were written. Disk errors stop it silently (the blocks
  // stay dirty; an eviction that needs the disk reports the error).
  size_t WriteBack(size_t max_blocks);

  // Eviction priority hint: among unpinned copies, lower priority goes first, then LRU order.
  void SetPriority(uint64_t id, int priority);

  uint64_t Version(uint64_t id) const;  // current seq (even unless a write is in progress)
  bool HasValidCopy(uint64_t id, Tier tier) const;
  int PinCount(uint64_t id, Tier tier) const;
  // A path this process can open to the block's disk file (/proc/self/fd/N: the file itself has no
  // name) and the slot's byte offset in it (empty path if it has none).
  std::pair<std::string, uint64_t> DiskLocation(uint64_t id) const;
  // Ids of the blocks with a valid copy in `tier`, least recently used first.
  std::vector<uint64_t> LruOrder(Tier tier) const;

  StoreStats Stats() const;
  void ResetPeaks();

 private:
  // The parts, in construction order (each refers to those before it).
  StoreConfig config_;
  BlockTable table_;
  TierCopies copies_;
  StoreCounters counters_;
  StoreParts parts_;
  BlockMover mover_;
  DiskBatchLoader loader_;
  BlockWriter writer_;
};

}  // namespace mshyper::store
