// Versioned cache-block store over three tiers: device (a budgeted arena; on CPU host memory),
// host DRAM pool, and disk (preallocated files, pread/pwrite, CRC32C per block).
//
// Concurrency design
//  * One metadata mutex (mu_) guards the block table entries' slot assignments, pin counts, LRU
//    lists and free lists. It is never held during bulk data copies or disk I/O: a block being
//    moved between tiers carries a `moving` flag, others wait on a condition variable.
//  * Every block has a seqlock `seq` (even = stable, odd = a write in progress). Each tier copy
//    records the seq value whose data it holds (`Copy::version`, atomic). A copy is valid when its
//    version equals the block's current (even) seq. Writers serialise per block (`writing`
//    flag), make seq odd, store the data with relaxed atomic word stores, publish the copy's
//    version and make seq even with release. Readers follow Boehm's pattern: acquire-load seq,
//    check the copy's version, copy the data with relaxed atomic word loads, acquire fence,
//    relaxed re-load of seq; retry on a change. No plain access ever races with a write.
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
#include <stdexcept>
#include <string>
#include <vector>

#include "store/busy_clock.h"

namespace mshyper::store {

enum class Tier : int { kDevice = 0, kHost = 1, kDisk = 2 };
constexpr int kNumTiers = 3;
const char* TierName(Tier t);

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A memory tier has no evictable block left (everything pinned or in use), or ids ran out.
class CapacityError : public StoreError {
 public:
  using StoreError::StoreError;
};
// The disk tier cannot be used: unwritable directory, disk full, I/O error.
class DiskError : public StoreError {
 public:
  using StoreError::StoreError;
};
// A disk block failed its checksum; the message names the block, the file and the offset.
class CorruptBlockError : public StoreError {
 public:
  using StoreError::StoreError;
};

struct StoreConfig {
  uint64_t block_size = 128ull << 20;   // bytes; a multiple of 64
  uint64_t device_capacity = 1ull << 30;  // bytes of the device tier (>= one block)
  uint64_t host_capacity = 4ull << 30;    // bytes of the host DRAM pool (>= one block)
  std::string disk_dir;                   // "" = $TMPDIR or /tmp
  uint64_t disk_capacity = 0;             // bytes; 0 = grow until the file system is full
  uint32_t blocks_per_file = 8;           // disk files are preallocated this many blocks at a time
  // Keep the page cache out of disk I/O (benchmarks): O_DIRECT when the block size is a multiple
  // of 4KB and the file system accepts it (no copy through the page cache), else
  // posix_fadvise(DONTNEED) after each read and after each write (once written, sync_file_range).
  bool drop_page_cache = false;
  bool direct_io = true;  // with drop_page_cache: try O_DIRECT (false: always posix_fadvise)
};

struct TierStats {
  uint64_t capacity_blocks = 0;  // slots the tier may hold (disk: 0 = unlimited)
  uint64_t used_blocks = 0;      // slots currently assigned (holding a copy or reserved)
  uint64_t peak_blocks = 0;      // high-water mark of used_blocks
  uint64_t evictions = 0;        // copies dropped from this tier to make room
};

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
    std::list<uint64_t>::iterator lru_it;
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
  static constexpr uint64_t kNoVersion = ~0ull;
  static constexpr uint64_t kChunkBits = 12;
  static constexpr uint64_t kChunk = 1ull << kChunkBits;
  static constexpr uint64_t kMaxChunks = 4096;  // up to 16M blocks

  struct MemTier {
    uint64_t capacity = 0;
    std::vector<uint8_t*> buffers;  // one aligned buffer per slot ever created
    std::vector<int64_t> free_slots;
    uint64_t used = 0, peak = 0, evictions = 0;
    std::list<uint64_t> lru;  // block ids, front = least recently used
  };
  struct DiskFile {
    int fd = -1;
    bool direct = false;  // opened with O_DIRECT
    std::string path;
  };

  using Lock = std::unique_lock<std::mutex>;

  Block& Get(uint64_t id) const;           // lock-free lookup; throws on an unknown id
  Block& GetAllocated(uint64_t id) const;  // under mu_: also checks `allocated`
  uint8_t* SlotPtr(Tier t, int64_t slot) const;
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
  int64_t ReserveDiskSlot(Lock& lock);
  // Consistent snapshot of a memory copy into dst (bytes at or beyond the block's fill mark are
  // zero-filled); returns the version read, or kNoVersion if the copy is stale. `fill_out`, if
  // given, receives the fill mark of the version read.
  uint64_t SeqRead(Block& b, Tier t, const uint8_t* base, uint64_t off, void* dst, uint64_t len,
                   uint64_t* fill_out = nullptr);
  // Bytes of a copy that must be moved for a block whose fill mark is `fill`.
  uint64_t CopyLen(uint64_t fill) const;
  std::string DiskPath(int64_t slot) const;
  void LoadFromDiskBatch(const std::vector<uint64_t>& ids, Lock& lock);

  StoreConfig config_;
  uint64_t words_;  // block_size / 8
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<std::atomic<Block*>[]> chunks_;
  uint64_t next_id_ = 0;              // guarded by mu_
  std::vector<uint64_t> free_ids_;    // guarded by mu_
  MemTier mem_[2];                    // device, host
  std::vector<DiskFile> files_;       // guarded by mu_ (fds stable once created)
  std::vector<int64_t> free_disk_slots_;
  uint64_t disk_slots_ = 0, disk_used_ = 0, disk_peak_ = 0;
  std::string disk_dir_;

  // statistics
  std::atomic<uint64_t> bytes_moved_[kNumTiers][kNumTiers] = {};
  std::atomic<uint64_t> copies_[kNumTiers][kNumTiers] = {};
  std::atomic<uint64_t> copy_ns_[kNumTiers][kNumTiers] = {};
  BusyClock transfer_clock_;
  std::atomic<uint64_t> reads_{0}, writes_{0}, read_retries_{0}, crc_failures_{0},
      coalesced_reads_{0};
  uint64_t blocks_ = 0;  // guarded by mu_
};

// Word-wise copies with relaxed atomic accesses (the seqlock's data path). `words` points to
// 8-byte aligned block memory; byte ranges need not be aligned (partial words are merged).
void AtomicCopyOut(void* dst, const uint64_t* words, uint64_t offset, uint64_t len);
void AtomicCopyIn(uint64_t* words, uint64_t offset, const void* src, uint64_t len);
void AtomicZero(uint64_t* words, uint64_t offset, uint64_t len);

}  // namespace mshyper::store
