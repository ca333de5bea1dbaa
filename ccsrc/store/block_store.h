// Versioned cache-block store over three tiers: device (a budgeted arena; on CPU host memory),
// host DRAM pool, and disk (preallocated files, pread/pwrite, CRC32C per block). BlockStore keeps
// the block table, the pins and the moves between tiers; the tiers' slots are MemoryTier
// (memory_tier.h: slots, LRU) and DiskTier (disk_tier.h: files, I/O), the versioning is the
// seqlock of seqlock.h.
//
// Concurrency design
//  * One metadata mutex (mu_) guards the block table entries' slot assignments, pin counts, LRU
//    lists and free lists. It is never held during bulk data copies or disk I/O: a block being
//    moved between tiers carries a `moving` flag, others wait on a condition variable.
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

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store/busy_clock.h"
#include "store/disk_tier.h"
#include "store/memory_tier.h"
#include "store/seqlock.h"
#include "store/store_types.h"

namespace mshyper::store {

struct StoreStats {
  TierStats tiers[kNumTiers];
  uint64_t bytes_moved[kNumTiers][kNumTiers] = {};  // [src][dst]
  uint64_t copies[kNumTiers][kNumTiers] = {};       // number of block copies [src][dst]
  uint64_t copy_ns[kNumTiers][kNumTiers] = {};      // time spent moving blocks [src][dst] (I/O,
                                                    // CRC32C, memcpy; failed moves too), summed over threads
  uint64_t transfer_busy_ns = 0;  // wall time with at least one tier-to-tier copy in progress
  uint64_t reads = 0;  // Read() calls (lock-free ReadPinned() calls are not counted)
  uint64_t writes = 0, read_retries = 0, crc_failures = 0;
  uint64_t coalesced_reads = 0;   // preadv calls that served more than one block
  uint64_t blocks = 0;            // allocated blocks
};

class BlockStore {
 public:
  explicit BlockStore(const StoreConfig& config);
  ~BlockStore();
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
  // File path and byte offset of the block's disk slot (empty path if it has none).
  std::pair<std::string, uint64_t> DiskLocation(uint64_t id) const;
  // Ids of the blocks with a valid copy in `tier`, least recently used first.
  std::vector<uint64_t> LruOrder(Tier tier) const;

  StoreStats Stats() const;
  void ResetPeaks();

 private:
  struct Copy {
    std::atomic<uint64_t> version{kNoVersion};
    int64_t slot = -1;       // guarded by mu_
    uint32_t pins = 0;       // guarded by mu_: all pins (Pin() callers and transient ones)
    uint32_t held = 0;       // guarded by mu_: pins taken through Pin()
    bool in_lru = false;     // guarded by mu_
    MemoryTier::LruPosition lru_it;
  };
  struct Block {
    std::atomic<uint64_t> seq{0};
    Copy copy[kNumTiers];
    // guarded by mu_:
    bool allocated = false;
    bool moving = false;
    bool writing = false;
    int priority = 0;
    uint32_t disk_crc = 0;
    uint64_t disk_len = 0;  // bytes of the disk copy (written and CRC-checked); guarded by mu_
    // End of the written range; bytes beyond read as zero. Stored only while seq is odd (by the
    // writer) or under mu_ for a block nobody else can see; read inside a seqlock window or
    // under mu_ while no write is in progress.
    std::atomic<uint64_t> fill{0};
  };
  static constexpr uint64_t kChunkBits = 12;
  static constexpr uint64_t kChunk = 1ull << kChunkBits;
  static constexpr uint64_t kMaxChunks = 4096;  // up to 16M blocks

  using Lock = std::unique_lock<std::mutex>;

  Block& Get(uint64_t id) const;           // lock-free lookup; throws on an unknown id
  Block& GetAllocated(uint64_t id) const;  // under mu_: also checks `allocated`
  uint8_t* SlotPtr(Tier t, int64_t slot) const { return Mem(t).SlotPtr(slot); }
  MemoryTier& Mem(Tier t) { return *mem_[static_cast<int>(t)]; }
  const MemoryTier& Mem(Tier t) const { return *mem_[static_cast<int>(t)]; }
  bool Valid(const Block& b, Tier t) const;  // under mu_
  std::string NoCopyMessage(const Block& b, uint64_t id) const;
  void Touch(Block& b, uint64_t id, Tier t);  // move to the LRU tail
  void DropCopy(Block& b, uint64_t id, Tier t);  // release the slot of a memory copy (under mu_)
  void PinLocked(Block& b, Tier t) { ++b.copy[static_cast<int>(t)].pins; }
  void UnpinLocked(Block& b, uint64_t id, Tier t);

  // Ensures a valid copy in tier t (device/host) and pins it. May drop and retake the lock.
  void EnsurePinned(Block& b, uint64_t id, Tier t, Lock& lock);
  // Ensures a valid copy in some memory tier (fastest first) and pins it; returns the tier.
  Tier EnsureInMemoryPinned(Block& b, uint64_t id, Lock& lock);
  // Copies block b from tier src to tier dst (dst = src +/- 1). Caller holds lock, b not moving.
  // Returns when done (dst may still be invalid if a concurrent write intervened; callers loop).
  void Migrate(Block& b, uint64_t id, Tier src, Tier dst, Lock& lock);
  // A free slot in memory tier t, evicting if needed. May drop and retake the lock.
  int64_t ReserveSlot(Tier t, Lock& lock);
  void ReleaseSlot(Tier t, int64_t slot);
  // SeqlockRead of the block's copy in memory tier t at `base`.
  uint64_t SeqRead(Block& b, Tier t, const uint8_t* base, uint64_t off, void* dst, uint64_t len,
                   uint64_t* fill_out = nullptr);
  // Bytes of a copy that must be moved for a block whose fill mark is `fill`.
  uint64_t CopyLen(uint64_t fill) const;
  void LoadFromDiskBatch(const std::vector<uint64_t>& ids, Lock& lock);

  StoreConfig config_;
  uint64_t words_;  // block_size / 8
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<std::atomic<Block*>[]> chunks_;
  uint64_t next_id_ = 0;              // guarded by mu_
  std::vector<uint64_t> free_ids_;    // guarded by mu_
  std::unique_ptr<MemoryTier> mem_[2];  // device, host; guarded by mu_
  DiskTier disk_;                       // slot bookkeeping guarded by mu_

  // statistics
  std::atomic<uint64_t> bytes_moved_[kNumTiers][kNumTiers] = {};
  std::atomic<uint64_t> copies_[kNumTiers][kNumTiers] = {};
  std::atomic<uint64_t> copy_ns_[kNumTiers][kNumTiers] = {};
  BusyClock transfer_clock_;
  std::atomic<uint64_t> reads_{0}, writes_{0}, read_retries_{0}, crc_failures_{0},
      coalesced_reads_{0};
  uint64_t blocks_ = 0;  // guarded by mu_
};

}  // namespace mshyper::store
