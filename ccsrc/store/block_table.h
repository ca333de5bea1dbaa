// The block store's table: every block's seqlock, fill mark and per-tier copies, the block ids,
// and the one metadata mutex (with its condition variable) that guards them.
//
// Locking contract
//  * Only BlockTable::Lock() makes a TableLock, and every function that reads or changes guarded
//    state (the fields marked "guarded" below, the tiers' slot bookkeeping, the id lists) takes
//    one, so it cannot be called without the mutex held.
//  * A `const TableLock&` parameter: the function keeps the mutex held throughout.
//    A `TableLock&` parameter: the function may release and retake it (TableLock::Unlocked, or a
//    wait on the table's condition); the caller re-checks what it read before the call.
//  * The mutex is never held during bulk data copies or disk I/O: a block being copied between
//    tiers carries `moving`, a block being written carries `writing`, and other threads wait on
//    the table's condition variable (NotifyAll after clearing either flag).
//  * Lock-free readers see only the atomics: `seq`, `fill` and each copy's `version` (seqlock.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "store/memory_tier.h"
#include "store/seqlock.h"
#include "store/store_types.h"

namespace mshyper::store {

// Proof that the caller holds the table's mutex (see the locking contract above).
class TableLock {
 public:
  TableLock(TableLock&&) = default;
  TableLock& operator=(TableLock&&) = delete;

  // Releases the mutex for its scope and retakes it on exit (also when unwinding).
  class Unlocked {
   public:
    explicit Unlocked(TableLock& lock) : lock_(lock.lock_) { lock_.unlock(); }
    ~Unlocked() { lock_.lock(); }
    Unlocked(const Unlocked&) = delete;
    Unlocked& operator=(const Unlocked&) = delete;

   private:
    std::unique_lock<std::mutex>& lock_;
  };

 private:
  friend class BlockTable;
  explicit TableLock(std::mutex& mu) : lock_(mu) {}
  std::unique_lock<std::mutex> lock_;
};

// One tier's copy of a block.
struct Copy {
  std::atomic<uint64_t> version{kNoVersion};  // the seq whose data it holds (seqlock.h)
  int64_t slot = -1;       // guarded: the tier slot, -1 for none
  uint32_t pins = 0;       // guarded: all pins (Pin() callers and transient ones)
  uint32_t held = 0;       // guarded: pins taken through Pin()
  bool in_lru = false;     // guarded
  MemoryTier::LruPosition lru_it;  // guarded
};

struct Block {
  std::atomic<uint64_t> seq{0};
  Copy copy[kNumTiers];
  // guarded:
  bool allocated = false;
  bool moving = false;   // a copy between tiers is in progress (writers wait)
  bool writing = false;  // a write is in progress (writers serialise per block)
  int priority = 0;      // eviction hint: lower goes first
  uint32_t disk_crc = 0;
  uint64_t disk_len = 0;  // bytes of the disk copy (written and CRC-checked)
  // End of the written range; bytes beyond read as zero. Stored only while seq is odd (by the
  // writer) or under the mutex for a block nobody else can see; read inside a seqlock window or
  // under the mutex while no write is in progress.
  std::atomic<uint64_t> fill{0};

  // The seqlock state of the copy in tier t, for SeqlockRead.
  SeqlockView View(Tier t) const { return SeqlockView{seq, copy[TierIndex(t)].version, fill}; }
};

// Whether the block's copy in tier t holds its current data.
bool Valid(const Block& b, Tier t, const TableLock&);
// Whether a copy other than the one in memory tier t (device or host) is valid, so that one can be
// dropped without writing it down.
bool Covered(const Block& b, Tier t, const TableLock&);

class BlockTable {
 public:
  BlockTable();
  ~BlockTable();
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  TableLock Lock() const { return TableLock(mu_); }
  void Wait(TableLock& lock) const { cv_.wait(lock.lock_); }
  template <class Predicate>
  void Wait(TableLock& lock, Predicate ready) const { cv_.wait(lock.lock_, ready); }
  void WaitFor(TableLock& lock, std::chrono::milliseconds timeout) const { cv_.wait_for(lock.lock_, timeout); }
  void NotifyAll() const { cv_.notify_all(); }

  // Lock-free lookup of an id ever handed out; throws StoreError on an unknown id. The Block
  // lives as long as the table.
  Block& Get(uint64_t id) const;
  // Get, also checking that the block is allocated (StoreError).
  Block& GetAllocated(uint64_t id, const TableLock&) const;

  // An unused id (a freed one first); its Block may hold fields of a previous life. Raises
  // CapacityError when the ids ran out.
  uint64_t TakeId(const TableLock&);
  void ReturnId(uint64_t id, const TableLock&);
  // Allocated blocks (counted by the store when an allocation completes or a block is freed).
  uint64_t live(const TableLock&) const { return live_; }
  void CountLive(int delta, const TableLock&) { live_ += delta; }

 private:
  static constexpr uint64_t kChunkBits = 12;
  static constexpr uint64_t kChunk = 1ull << kChunkBits;
  static constexpr uint64_t kMaxChunks = 4096;  // up to 16M blocks

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // Blocks in chunks of kChunk, created on first use and never moved, so Get needs no lock.
  std::unique_ptr<std::atomic<Block*>[]> chunks_;
  uint64_t next_id_ = 0;            // guarded
  std::vector<uint64_t> free_ids_;  // guarded
  uint64_t live_ = 0;               // guarded
};

}  // namespace mshyper::store
