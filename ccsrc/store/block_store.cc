#include "store/block_store.h"

#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

#include "store/crc32c.h"

namespace mshyper::store {
namespace {

constexpr int kD = static_cast<int>(Tier::kDevice);
constexpr int kH = static_cast<int>(Tier::kHost);
constexpr int kK = static_cast<int>(Tier::kDisk);

inline int Ti(Tier t) { return static_cast<int>(t); }

// Times one block move (or one coalesced read): while it lasts the store's transfer clock is busy,
// and its duration, failed or not, is added to its tier pair's copy time (so the busy time, a union
// of these intervals, never exceeds the sum of the copy times).
class MoveTimer {
 public:
  MoveTimer(BusyClock& clock, std::atomic<uint64_t>& ns)
      : clock_(clock), ns_(ns), start_(std::chrono::steady_clock::now()) {
    clock_.Begin();
  }
  ~MoveTimer() {
    clock_.End();
    ns_.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now() - start_)
                                            .count()),
                  std::memory_order_relaxed);
  }
  MoveTimer(const MoveTimer&) = delete;
  MoveTimer& operator=(const MoveTimer&) = delete;

 private:
  BusyClock& clock_;
  std::atomic<uint64_t>& ns_;
  const std::chrono::steady_clock::time_point start_;
};

// The configuration with its block size checked (StoreError) and at least one block per file.
StoreConfig Checked(StoreConfig config) {
  if (config.block_size == 0 || config.block_size % 64 != 0) {
    throw StoreError("block_size must be a positive multiple of 64 bytes, got " +
                     std::to_string(config.block_size));
  }
  if (config.blocks_per_file == 0) config.blocks_per_file = 1;
  return config;
}

// Per-thread staging buffer for write-down snapshots (a seqlock snapshot must be private before
// it is handed to pwrite).
struct Staging {
  uint8_t* p = nullptr;
  uint64_t n = 0;
  ~Staging() { std::free(p); }
  uint8_t* Get(uint64_t bytes) {
    if (n < bytes) {
      std::free(p);
      p = AllocBlockBuffer(bytes);
      n = p ? bytes : 0;
      if (!p) throw CapacityError("out of host memory for a disk staging buffer");
    }
    return p;
  }
};

}  // namespace

BlockStore::BlockStore(const StoreConfig& config)
    : config_(Checked(config)),
      words_(config_.block_size / 8),
      mem_{std::make_unique<MemoryTier>(Tier::kDevice, config_.device_capacity, config_.block_size),
           std::make_unique<MemoryTier>(Tier::kHost, config_.host_capacity, config_.block_size)},
      disk_(config_) {
  chunks_.reset(new std::atomic<Block*>[kMaxChunks]);
  for (uint64_t i = 0; i < kMaxChunks; ++i) chunks_[i].store(nullptr, std::memory_order_relaxed);
}

BlockStore::~BlockStore() {
  for (uint64_t i = 0; i < kMaxChunks; ++i) delete[] chunks_[i].load(std::memory_order_relaxed);
}

BlockStore::Block& BlockStore::Get(uint64_t id) const {
  const uint64_t c = id >> kChunkBits;
  Block* chunk = c < kMaxChunks ? chunks_[c].load(std::memory_order_acquire) : nullptr;
  if (chunk == nullptr) throw StoreError("unknown block id " + std::to_string(id));
  return chunk[id & (kChunk - 1)];
}

BlockStore::Block& BlockStore::GetAllocated(uint64_t id) const {
  Block& b = Get(id);
  if (!b.allocated) throw StoreError("block " + std::to_string(id) + " is not allocated");
  return b;
}

uint64_t BlockStore::CopyLen(uint64_t fill) const {
  // Whole 4KB pages (page cache and DMA granularity); an empty block (never written, or
  // discarded) moves nothing.
  return std::min(config_.block_size, RoundUp(fill, 4096));
}

bool BlockStore::Valid(const Block& b, Tier t) const {
  const Copy& c = b.copy[Ti(t)];
  if (c.slot < 0) return false;
  return CopyIsCurrent(b.seq.load(std::memory_order_relaxed), c.version.load(std::memory_order_relaxed));
}

void BlockStore::Touch(Block& b, uint64_t id, Tier t) {
  if (t == Tier::kDisk) return;
  Copy& c = b.copy[Ti(t)];
  if (c.in_lru) {
    Mem(t).MakeMostRecent(c.lru_it);
  } else {
    c.lru_it = Mem(t).AddMostRecent(id);
    c.in_lru = true;
  }
}

void BlockStore::ReleaseSlot(Tier t, int64_t slot) { Mem(t).ReleaseSlot(slot); }

void BlockStore::DropCopy(Block& b, uint64_t /*id*/, Tier t) {
  Copy& c = b.copy[Ti(t)];
  c.version.store(kNoVersion, std::memory_order_relaxed);
  if (c.slot < 0) return;
  if (t == Tier::kDisk) {
    disk_.Release(c.slot);
  } else {
    ReleaseSlot(t, c.slot);
    if (c.in_lru) {
      Mem(t).RemoveFromLru(c.lru_it);
      c.in_lru = false;
    }
  }
  c.slot = -1;
}

void BlockStore::UnpinLocked(Block& b, uint64_t id, Tier t) {
  Copy& c = b.copy[Ti(t)];
  if (c.pins == 0) {
    throw StoreError("unpin of block " + std::to_string(id) + " in the " + TierName(t) +
                     " tier, which is not pinned");
  }
  if (--c.pins == 0 && t != Tier::kDisk && c.slot >= 0 && !Valid(b, t) && !b.writing) {
    DropCopy(b, id, t);  // a stale copy kept alive only by the pin
  }
}

uint64_t BlockStore::SeqRead(Block& b, Tier t, const uint8_t* base, uint64_t off, void* dst,
                             uint64_t len, uint64_t* fill_out) {
  return SeqlockRead(SeqlockView{b.seq, b.copy[Ti(t)].version, b.fill}, base, off, dst, len, fill_out,
                     read_retries_);
}

void BlockStore::Migrate(Block& b, uint64_t id, Tier src, Tier dst, Lock& lock) {
  const uint64_t bs = config_.block_size;
  b.moving = true;
  if (src != Tier::kDisk) PinLocked(b, src);
  int64_t dslot = -1;
  try {
    if (dst == Tier::kDisk) {
      dslot = b.copy[kK].slot;
      if (dslot < 0) {
        dslot = disk_.Reserve();
        b.copy[kK].slot = dslot;
      }
      b.copy[kK].version.store(kNoVersion, std::memory_order_relaxed);
    } else {
      dslot = ReserveSlot(dst, lock);
    }
  } catch (...) {
    if (src != Tier::kDisk) UnpinLocked(b, id, src);
    b.moving = false;
    cv_.notify_all();
    throw;
  }
  const int64_t kslot = b.copy[kK].slot;
  const uint64_t disk_version = b.copy[kK].version.load(std::memory_order_relaxed);
  const uint32_t disk_crc = b.disk_crc;
  const uint64_t disk_len = b.disk_len;
  const DiskExtent at = kslot >= 0 ? disk_.Locate(kslot) : DiskExtent{};
  const uint8_t* sbase = src != Tier::kDisk ? SlotPtr(src, b.copy[Ti(src)].slot) : nullptr;
  uint8_t* dbase = dst != Tier::kDisk ? SlotPtr(dst, dslot) : nullptr;
  // Writers wait for `moving` to clear before they start, so when no write is in progress now,
  // none can run during this copy: the source can then be copied with plain memcpy (no data
  // race). Otherwise fall back to the seqlock read (atomic word loads + retry).
  const bool exclusive = !b.writing;
  const uint64_t seq_now = b.seq.load(std::memory_order_relaxed);
  // With no write in progress the fill mark is stable: only the first CopyLen(fill) bytes of the
  // source hold data, the rest reads as zero and need not move.
  uint64_t n = exclusive ? CopyLen(b.fill.load(std::memory_order_relaxed)) : bs;
  lock.unlock();

  uint64_t v = kNoVersion;
  uint32_t crc = 0;
  std::exception_ptr err;
  try {
    MoveTimer timer(transfer_clock_, copy_ns_[Ti(src)][Ti(dst)]);
    if (src == Tier::kDisk) {
      // The disk copy holds disk_len bytes (those written down, covering its fill mark).
      n = disk_len;
      disk_.Read(at, dbase, n, "block " + std::to_string(id) + " from '" + at.path + "'");
      const uint32_t got = Crc32c(dbase, n);
      if (got != disk_crc) {
        crc_failures_.fetch_add(1, std::memory_order_relaxed);
        std::ostringstream msg;
        msg << "corrupted block " << id << ": disk copy in '" << at.path << "' at offset " << at.offset
            << " failed its CRC32C check (stored 0x" << std::hex << disk_crc << ", computed 0x" << got
            << ")";
        throw CorruptBlockError(msg.str());
      }
      v = disk_version;
    } else if (dst == Tier::kDisk) {
      const uint8_t* buf = sbase;
      if (exclusive) {
        v = seq_now;
      } else {
        thread_local Staging staging;
        uint8_t* snapshot = staging.Get(bs);
        uint64_t fill = 0;
        v = SeqRead(b, src, sbase, 0, snapshot, bs, &fill);
        n = CopyLen(fill);
        buf = snapshot;
      }
      if (v != kNoVersion) {
        crc = Crc32c(buf, n);
        disk_.Write(at, buf, n, "block " + std::to_string(id) + " to '" + at.path + "'");
      }
    } else if (exclusive) {
      std::memcpy(dbase, sbase, n);
      v = seq_now;
    } else {
      v = SeqRead(b, src, sbase, 0, dbase, bs);  // n == bs: beyond the fill mark it writes zeros
    }
    if (v != kNoVersion) {
      bytes_moved_[Ti(src)][Ti(dst)].fetch_add(n, std::memory_order_relaxed);
      copies_[Ti(src)][Ti(dst)].fetch_add(1, std::memory_order_relaxed);
    }
  } catch (...) {
    err = std::current_exception();
  }

  lock.lock();
  b.moving = false;
  if (src != Tier::kDisk) UnpinLocked(b, id, src);
  const bool ok = !err && v != kNoVersion && b.allocated &&
                  b.seq.load(std::memory_order_relaxed) == v;
  if (dst == Tier::kDisk) {
    if (ok) {
      b.disk_crc = crc;
      b.disk_len = n;
      b.copy[kK].version.store(v, std::memory_order_release);
    }
  } else if (ok && b.copy[Ti(dst)].slot < 0) {
    b.copy[Ti(dst)].slot = dslot;
    b.copy[Ti(dst)].version.store(v, std::memory_order_release);
    Touch(b, id, dst);
  } else {
    ReleaseSlot(dst, dslot);
  }
  cv_.notify_all();
  if (err) std::rethrow_exception(err);
}

int64_t BlockStore::ReserveSlot(Tier t, Lock& lock) {
  MemoryTier& m = Mem(t);
  // Bounded wait for busy slots (see below); a deadline, not a count of wake-ups.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const int64_t free_slot = m.TakeFreeSlot();
    if (free_slot >= 0) return free_slot;
    // Evict: lowest priority first, least recently used among equals.
    Block* victim = nullptr;
    uint64_t vid = 0;
    int best = INT_MAX;
    uint64_t held = 0;  // slots whose copy a caller of Pin() holds (not transient pins)
    for (uint64_t id : m.lru()) {
      Block& c = Get(id);
      if (c.copy[Ti(t)].held != 0) ++held;
      if (c.copy[Ti(t)].pins != 0) continue;
      if (c.moving || c.writing) continue;
      if (c.priority < best) {
        best = c.priority;
        victim = &c;
        vid = id;
      }
    }
    if (victim == nullptr && held < m.capacity() && std::chrono::steady_clock::now() < deadline) {
      // Some slots are only busy for a moment (a read, copy or write in progress): they become
      // evictable shortly. Bounded wait, so a cycle of movers in a tiny tier ends in an error, not a hang.
      cv_.wait_for(lock, std::chrono::milliseconds(1));
      continue;
    }
    if (victim == nullptr) {
      throw CapacityError(std::string(TierName(t)) + " tier full: all " + std::to_string(m.capacity()) +
                          " blocks of " + std::to_string(config_.block_size) +
                          " bytes are pinned");
    }
    const bool covered = t == Tier::kDevice ? (Valid(*victim, Tier::kHost) || Valid(*victim, Tier::kDisk))
                                            : (Valid(*victim, Tier::kDisk) || Valid(*victim, Tier::kDevice));
    if (covered || !Valid(*victim, t)) {
      DropCopy(*victim, vid, t);
      m.CountEviction();
      continue;
    }
    // The only valid copy: write it one tier down first (the block is never lost; a disk error
    // propagates and the copy stays).
    try {
      Migrate(*victim, vid, t, t == Tier::kDevice ? Tier::kHost : Tier::kDisk, lock);
    } catch (const DiskError&) {
      // The disk cannot take the victim (full, I/O error); it stays in memory. Fall back to a
      // clean copy (another valid copy exists below), if any, rather than failing.
      bool dropped = false;
      for (uint64_t id : m.lru()) {
        Block& c = Get(id);
        if (c.copy[Ti(t)].pins != 0 || c.moving || c.writing) continue;
        const bool clean = t == Tier::kDevice ? (Valid(c, Tier::kHost) || Valid(c, Tier::kDisk))
                                              : (Valid(c, Tier::kDisk) || Valid(c, Tier::kDevice));
        if (clean) {
          DropCopy(c, id, t);
          m.CountEviction();
          dropped = true;
          break;
        }
      }
      if (!dropped) throw;
    }
  }
}

std::string BlockStore::NoCopyMessage(const Block& b, uint64_t id) const {
  std::ostringstream m;
  m << "block " << id << " has no valid copy (internal error; seq " << b.seq.load();
  for (int t = 0; t < kNumTiers; ++t) {
    m << ", " << TierName(static_cast<Tier>(t)) << " slot " << b.copy[t].slot << " version "
      << static_cast<int64_t>(b.copy[t].version.load()) << " pins " << b.copy[t].pins;
  }
  m << ", moving " << b.moving << ", writing " << b.writing << ")";
  return m.str();
}

void BlockStore::EnsurePinned(Block& b, uint64_t id, Tier t, Lock& lock) {
  for (;;) {
    if (!b.allocated) throw StoreError("block " + std::to_string(id) + " was freed");
    if (Valid(b, t)) {
      PinLocked(b, t);
      Touch(b, id, t);
      return;
    }
    if (b.moving) {
      cv_.wait(lock);
      continue;
    }
    if (t == Tier::kDevice) {
      if (Valid(b, Tier::kHost)) {
        Migrate(b, id, Tier::kHost, Tier::kDevice, lock);
      } else if (Valid(b, Tier::kDisk)) {
        Migrate(b, id, Tier::kDisk, Tier::kHost, lock);
      } else {
        throw StoreError(NoCopyMessage(b, id));
      }
    } else {
      if (Valid(b, Tier::kDevice)) {
        Migrate(b, id, Tier::kDevice, Tier::kHost, lock);
      } else if (Valid(b, Tier::kDisk)) {
        Migrate(b, id, Tier::kDisk, Tier::kHost, lock);
      } else {
        throw StoreError(NoCopyMessage(b, id));
      }
    }
  }
}

Tier BlockStore::EnsureInMemoryPinned(Block& b, uint64_t id, Lock& lock) {
  for (;;) {
    if (!b.allocated) throw StoreError("block " + std::to_string(id) + " was freed");
    if (Valid(b, Tier::kDevice)) {
      PinLocked(b, Tier::kDevice);
      Touch(b, id, Tier::kDevice);
      return Tier::kDevice;
    }
    if (Valid(b, Tier::kHost)) {
      PinLocked(b, Tier::kHost);
      Touch(b, id, Tier::kHost);
      return Tier::kHost;
    }
    if (b.moving) {
      cv_.wait(lock);
      continue;
    }
    if (!Valid(b, Tier::kDisk)) throw StoreError(NoCopyMessage(b, id));
    Migrate(b, id, Tier::kDisk, Tier::kHost, lock);
  }
}

uint64_t BlockStore::Allocate() {
  Lock lock(mu_);
  uint64_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = next_id_;
    const uint64_t c = id >> kChunkBits;
    if (c >= kMaxChunks) throw CapacityError("block store is out of block ids");
    if (chunks_[c].load(std::memory_order_relaxed) == nullptr) {
      chunks_[c].store(new Block[kChunk], std::memory_order_release);
    }
    ++next_id_;
  }
  Block& b = Get(id);
  b.allocated = true;
  b.priority = 0;
  b.moving = true;  // not visible to anyone else yet, but keep evictors away while we wait
  int64_t slot;
  try {
    slot = ReserveSlot(Tier::kHost, lock);
  } catch (...) {
    b.allocated = false;
    b.moving = false;
    free_ids_.push_back(id);
    cv_.notify_all();
    throw;
  }
  b.moving = false;
  // A fresh id keeps counting its seq from its previous life so versions never repeat.
  uint64_t v = b.seq.load(std::memory_order_relaxed);
  if (v & 1) v += 1;
  v += 2;
  // Fill mark 0: the block reads as zeros whatever the slot holds (no memset needed). No other
  // thread can see the id yet; the release store of seq publishes it.
  b.fill.store(0, std::memory_order_relaxed);
  b.disk_len = 0;
  b.seq.store(v, std::memory_order_release);
  b.copy[kH].slot = slot;
  b.copy[kH].version.store(v, std::memory_order_release);
  Touch(b, id, Tier::kHost);
  ++blocks_;
  cv_.notify_all();
  return id;
}

void BlockStore::Free(uint64_t id) {
  Lock lock(mu_);
  Block& b = GetAllocated(id);
  cv_.wait(lock, [&] { return !b.moving && !b.writing; });
  if (!b.allocated) return;
  for (int t = 0; t < kNumTiers; ++t) {
    if (b.copy[t].pins != 0) {
      throw StoreError("block " + std::to_string(id) + " cannot be freed: pinned in the " +
                       TierName(static_cast<Tier>(t)) + " tier");
    }
  }
  for (int t = 0; t < kNumTiers; ++t) DropCopy(b, id, static_cast<Tier>(t));
  b.allocated = false;
  b.priority = 0;
  free_ids_.push_back(id);
  --blocks_;
}

void BlockStore::Read(uint64_t id, uint64_t offset, void* dst, uint64_t len) {
  if (offset > config_.block_size || len > config_.block_size - offset) {
    throw StoreError("read of [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                     ") is outside block " + std::to_string(id));
  }
  reads_.fetch_add(1, std::memory_order_relaxed);
  for (;;) {
    Block* bp;
    Tier t;
    const uint8_t* base;
    {
      Lock lock(mu_);
      bp = &GetAllocated(id);
      t = EnsureInMemoryPinned(*bp, id, lock);
      base = SlotPtr(t, bp->copy[Ti(t)].slot);
    }
    const uint64_t v = SeqRead(*bp, t, base, offset, dst, len);
    {
      Lock lock(mu_);
      UnpinLocked(*bp, id, t);
    }
    if (v != kNoVersion) return;
    read_retries_.fetch_add(1, std::memory_order_relaxed);
  }
}

void BlockStore::ReadPinned(uint64_t id, Tier tier, uint64_t offset, void* dst, uint64_t len) {
  if (tier == Tier::kDisk) throw StoreError("ReadPinned needs a memory tier");
  if (offset > config_.block_size || len > config_.block_size - offset) {
    throw StoreError("read outside block " + std::to_string(id));
  }
  Block& b = Get(id);
  // The caller's pin keeps the slot assigned; the slot index itself was published under mu_
  // before the caller's Pin returned.
  const int64_t slot = b.copy[Ti(tier)].slot;
  // No shared counter is touched on this path: a read-modify-write of a shared cache line per
  // read is exactly the cost a seqlock reader avoids (pinned reads are not counted in `reads`).
  if (slot >= 0 && SeqRead(b, tier, SlotPtr(tier, slot), offset, dst, len) != kNoVersion) return;
  Read(id, offset, dst, len);
}

void BlockStore::Write(uint64_t id, uint64_t offset, const void* src, uint64_t len) {
  if (offset > config_.block_size || len > config_.block_size - offset) {
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
    Lock lock(mu_);
    bp = &GetAllocated(id);
    // Wait for other writers and for copies of this block between tiers (which rely on no write
    // starting while they run).
    cv_.wait(lock, [&] { return (!bp->writing && !bp->moving) || !bp->allocated; });
    if (!bp->allocated) throw StoreError("block " + std::to_string(id) + " was freed");
    bp->writing = true;
    if (offset == 0 && len == config_.block_size && !Valid(*bp, Tier::kDevice) &&
        !Valid(*bp, Tier::kHost) && !bp->moving) {
      // A whole-block write of a block that is only on disk: no need to read the old data.
      int64_t slot = -1;
      try {
        slot = ReserveSlot(Tier::kHost, lock);
      } catch (...) {
        bp->writing = false;
        cv_.notify_all();
        throw;
      }
      if (!Valid(*bp, Tier::kDevice) && !Valid(*bp, Tier::kHost) && !bp->moving) {
        Block& b = *bp;
        const uint64_t v = b.seq.load(std::memory_order_relaxed);
        b.seq.store(v + 1, std::memory_order_relaxed);  // disk copy readers will retry
        b.moving = true;
        uint8_t* dst = SlotPtr(Tier::kHost, slot);
        lock.unlock();
        std::memcpy(dst, src, len);  // private slot, published below under mu_
        lock.lock();
        b.fill.store(len, std::memory_order_relaxed);  // seq is odd: readers retry
        b.moving = false;
        b.copy[kH].slot = slot;
        b.copy[kH].version.store(v + 2, std::memory_order_relaxed);
        b.seq.store(v + 2, std::memory_order_release);
        Touch(b, id, Tier::kHost);
        b.writing = false;
        writes_.fetch_add(1, std::memory_order_relaxed);
        cv_.notify_all();
        return;
      }
      ReleaseSlot(Tier::kHost, slot);
    }
    try {
      // Prefer the host copy as the write target when the device copy is not in use: the device
      // copy is then dropped instead of becoming a dirty copy that must be written down later.
      if (Valid(*bp, Tier::kHost) && Valid(*bp, Tier::kDevice) && bp->copy[kD].pins == 0) {
        PinLocked(*bp, Tier::kHost);
        Touch(*bp, id, Tier::kHost);
        t = Tier::kHost;
      } else {
        t = EnsureInMemoryPinned(*bp, id, lock);
      }
    } catch (...) {
      bp->writing = false;
      cv_.notify_all();
      throw;
    }
    // Targets: the valid copy just pinned, plus any other memory copy that is pinned (its holder
    // keeps reading it, so it is written through and stays valid). Unpinned other copies are
    // invalidated now. The seq goes odd while mu_ is held, so no migration that read the old
    // data can publish a copy afterwards (it re-checks seq under mu_).
    Block& b = *bp;
    ntargets = 0;
    targets[ntargets++] = t;
    for (Tier u : {Tier::kDevice, Tier::kHost}) {
      if (u == t || b.copy[Ti(u)].slot < 0) continue;
      if (Valid(b, u) && b.copy[Ti(u)].pins != 0) {
        PinLocked(b, u);
        targets[ntargets++] = u;
      } else if (b.copy[Ti(u)].pins == 0) {
        DropCopy(b, id, u);
      }
    }
    for (int i = 0; i < ntargets; ++i) bases[i] = SlotPtr(targets[i], b.copy[Ti(targets[i])].slot);
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
  for (int i = 0; i < ntargets; ++i) b.copy[Ti(targets[i])].version.store(v + 2, std::memory_order_relaxed);
  b.seq.store(v + 2, std::memory_order_release);
  writes_.fetch_add(1, std::memory_order_relaxed);
  {
    Lock lock(mu_);
    b.writing = false;
    for (int i = 0; i < ntargets; ++i) UnpinLocked(b, id, targets[i]);
    cv_.notify_all();
  }
}

void BlockStore::Discard(uint64_t id) {
  Lock lock(mu_);
  Block& b = GetAllocated(id);
  cv_.wait(lock, [&] { return (!b.writing && !b.moving) || !b.allocated; });
  if (!b.allocated) throw StoreError("block " + std::to_string(id) + " was freed");
  // A new version whose content is all zeros: with the fill mark at 0 no byte of any copy is
  // read, so every copy that was valid stays valid as it is (nothing is copied or written), and a
  // disk slot becomes a valid empty copy -- the block never needs a disk write for this version.
  // Same seqlock protocol as a write (seq odd while the fill mark changes).
  const uint64_t v = b.seq.load(std::memory_order_relaxed);
  bool valid[kNumTiers];
  for (int t = 0; t < kNumTiers; ++t) valid[t] = Valid(b, static_cast<Tier>(t));
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
  writes_.fetch_add(1, std::memory_order_relaxed);
  cv_.notify_all();
}

void BlockStore::Pin(uint64_t id, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("only the device and host tiers can be pinned");
  Lock lock(mu_);
  Block& b = GetAllocated(id);
  EnsurePinned(b, id, tier, lock);
  ++b.copy[Ti(tier)].held;
}

void BlockStore::Unpin(uint64_t id, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("only the device and host tiers can be pinned");
  Lock lock(mu_);
  Block& b = GetAllocated(id);
  if (b.copy[Ti(tier)].held == 0) {
    throw StoreError("unpin of block " + std::to_string(id) + " in the " + TierName(tier) +
                     " tier, which is not pinned");
  }
  --b.copy[Ti(tier)].held;
  UnpinLocked(b, id, tier);
}

void BlockStore::LoadFromDiskBatch(const std::vector<uint64_t>& ids, Lock& lock) {
  const uint64_t bs = config_.block_size;
  struct Item {
    uint64_t id = 0;
    Block* b = nullptr;
    int64_t hslot = -1;
    uint64_t version = 0;
    uint32_t crc = 0;
    uint64_t len = 0;  // bytes of the disk copy
    DiskExtent at;
    uint8_t* buf = nullptr;
    bool ok = false;
  };
  std::vector<Item> items;
  for (uint64_t id : ids) {
    Block& b = Get(id);
    if (!b.allocated || b.moving || Valid(b, Tier::kHost) || Valid(b, Tier::kDevice) ||
        !Valid(b, Tier::kDisk)) {
      continue;
    }
    b.moving = true;
    Item it;
    it.id = id;
    it.b = &b;
    items.push_back(std::move(it));
  }
  size_t reserved = 0;
  try {
    for (; reserved < items.size(); ++reserved) items[reserved].hslot = ReserveSlot(Tier::kHost, lock);
  } catch (const CapacityError&) {
    // Load what fits; the rest falls back to single fetches (which report the error if any).
  }
  for (size_t i = reserved; i < items.size(); ++i) items[i].b->moving = false;
  items.resize(reserved);
  if (items.empty()) {
    cv_.notify_all();
    return;
  }
  for (Item& it : items) {
    const int64_t k = it.b->copy[kK].slot;
    it.version = it.b->copy[kK].version.load(std::memory_order_relaxed);
    it.crc = it.b->disk_crc;
    it.len = it.b->disk_len;
    it.at = disk_.Locate(k);
    it.buf = SlotPtr(Tier::kHost, it.hslot);
  }
  lock.unlock();
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.at.fd != b.at.fd ? a.at.fd < b.at.fd : a.at.offset < b.at.offset;
  });
  std::exception_ptr err;
  size_t i = 0;
  while (i < items.size()) {
    // A run of adjacent disk slots is one contiguous file range: every block but the last must
    // have a full-size disk copy (a partly filled one ends the run).
    size_t j = i + 1;
    uint64_t total = items[i].len;
    while (j < items.size() && j - i < IOV_MAX && items[j - 1].len == bs && items[j].at.fd == items[i].at.fd &&
           items[j].at.offset == items[j - 1].at.offset + bs) {
      total += items[j].len;
      ++j;
    }
    try {
      MoveTimer timer(transfer_clock_, copy_ns_[kK][kH]);
      bool done = false;
      if (j - i > 1) {
        std::vector<iovec> iov(j - i);
        for (size_t k = i; k < j; ++k) iov[k - i] = iovec{items[k].buf, items[k].len};
        if (disk_.ReadRun(items[i].at, iov, total)) {
          done = true;
          coalesced_reads_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (!done) {
        for (size_t k = i; k < j; ++k) {
          disk_.Read(items[k].at, items[k].buf, items[k].len,
                     "block " + std::to_string(items[k].id) + " from '" + items[k].at.path + "'");
        }
      }
      for (size_t k = i; k < j; ++k) {
        const uint32_t got = Crc32c(items[k].buf, items[k].len);
        if (got != items[k].crc) {
          crc_failures_.fetch_add(1, std::memory_order_relaxed);
          if (!err) {
            std::ostringstream msg;
            msg << "corrupted block " << items[k].id << ": disk copy in '" << items[k].at.path
                << "' at offset " << items[k].at.offset << " failed its CRC32C check (stored 0x" << std::hex
                << items[k].crc << ", computed 0x" << got << ")";
            err = std::make_exception_ptr(CorruptBlockError(msg.str()));
          }
          continue;
        }
        items[k].ok = true;
        bytes_moved_[kK][kH].fetch_add(items[k].len, std::memory_order_relaxed);
        copies_[kK][kH].fetch_add(1, std::memory_order_relaxed);
      }
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    i = j;
  }
  lock.lock();
  for (Item& it : items) {
    Block& b = *it.b;
    b.moving = false;
    if (it.ok && b.allocated && b.seq.load(std::memory_order_relaxed) == it.version) {
      b.copy[kH].slot = it.hslot;
      b.copy[kH].version.store(it.version, std::memory_order_release);
      Touch(b, it.id, Tier::kHost);
    } else {
      ReleaseSlot(Tier::kHost, it.hslot);
    }
  }
  cv_.notify_all();
  if (err) std::rethrow_exception(err);
}

void BlockStore::Fetch(const std::vector<uint64_t>& ids, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("Fetch targets the device or host tier");
  Lock lock(mu_);
  std::vector<uint64_t> disk_only;
  for (uint64_t id : ids) {
    Block& b = GetAllocated(id);
    if (!b.moving && !Valid(b, Tier::kHost) && !Valid(b, Tier::kDevice) && Valid(b, Tier::kDisk)) {
      disk_only.push_back(id);
    }
  }
  if (disk_only.size() > 1) LoadFromDiskBatch(disk_only, lock);
  for (uint64_t id : ids) {
    Block& b = GetAllocated(id);
    EnsurePinned(b, id, tier, lock);
    UnpinLocked(b, id, tier);
  }
}

bool BlockStore::Evict(uint64_t id, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("the disk tier is the last tier; nothing to evict to");
  Lock lock(mu_);
  Block& b = GetAllocated(id);
  for (;;) {
    Copy& c = b.copy[Ti(tier)];
    if (c.slot < 0) return true;
    if (c.pins != 0 || b.moving || b.writing) return false;
    const bool covered = tier == Tier::kDevice ? (Valid(b, Tier::kHost) || Valid(b, Tier::kDisk))
                                               : (Valid(b, Tier::kDisk) || Valid(b, Tier::kDevice));
    if (covered || !Valid(b, tier)) {
      DropCopy(b, id, tier);
      Mem(tier).CountEviction();
      return true;
    }
    Migrate(b, id, tier, tier == Tier::kDevice ? Tier::kHost : Tier::kDisk, lock);
  }
}

size_t BlockStore::WriteBack(size_t max_blocks) {
  Lock lock(mu_);
  const std::list<uint64_t>& lru = Mem(Tier::kHost).lru();
  std::vector<uint64_t> dirty;
  size_t scanned = 0;
  const size_t limit = std::max<size_t>(1, lru.size() / 2);  // the older half of the pool
  for (uint64_t id : lru) {
    if (scanned++ >= limit || dirty.size() >= max_blocks) break;
    const Block& b = Get(id);
    if (!b.moving && !b.writing && Valid(b, Tier::kHost) && !Valid(b, Tier::kDisk) &&
        !Valid(b, Tier::kDevice)) {
      dirty.push_back(id);
    }
  }
  size_t written = 0;
  for (uint64_t id : dirty) {
    Block& b = Get(id);
    if (!b.allocated || b.moving || b.writing || !Valid(b, Tier::kHost) || Valid(b, Tier::kDisk)) continue;
    try {
      Migrate(b, id, Tier::kHost, Tier::kDisk, lock);
    } catch (const StoreError&) {
      break;
    }
    ++written;
  }
  return written;
}

void BlockStore::SetPriority(uint64_t id, int priority) {
  Lock lock(mu_);
  GetAllocated(id).priority = priority;
}

uint64_t BlockStore::Version(uint64_t id) const {
  return Get(id).seq.load(std::memory_order_acquire);
}

bool BlockStore::HasValidCopy(uint64_t id, Tier tier) const {
  Lock lock(mu_);
  return Valid(GetAllocated(id), tier);
}

int BlockStore::PinCount(uint64_t id, Tier tier) const {
  Lock lock(mu_);
  return static_cast<int>(GetAllocated(id).copy[Ti(tier)].held);
}

std::pair<std::string, uint64_t> BlockStore::DiskLocation(uint64_t id) const {
  Lock lock(mu_);
  const Block& b = GetAllocated(id);
  const int64_t k = b.copy[kK].slot;
  if (k < 0) return {std::string(), 0};
  const DiskExtent at = disk_.Locate(k);
  return {at.path, at.offset};
}

std::vector<uint64_t> BlockStore::LruOrder(Tier tier) const {
  if (tier == Tier::kDisk) throw StoreError("the disk tier has no LRU order");
  Lock lock(mu_);
  std::vector<uint64_t> out;
  for (uint64_t id : Mem(tier).lru()) {
    if (Valid(Get(id), tier)) out.push_back(id);
  }
  return out;
}

StoreStats BlockStore::Stats() const {
  Lock lock(mu_);
  StoreStats s;
  for (int t = 0; t < 2; ++t) s.tiers[t] = mem_[t]->Stats();
  s.tiers[kK] = disk_.Stats();
  for (int a = 0; a < kNumTiers; ++a) {
    for (int b = 0; b < kNumTiers; ++b) {
      s.bytes_moved[a][b] = bytes_moved_[a][b].load(std::memory_order_relaxed);
      s.copies[a][b] = copies_[a][b].load(std::memory_order_relaxed);
      s.copy_ns[a][b] = copy_ns_[a][b].load(std::memory_order_relaxed);
    }
  }
  s.reads = reads_.load(std::memory_order_relaxed);
  s.writes = writes_.load(std::memory_order_relaxed);
  s.read_retries = read_retries_.load(std::memory_order_relaxed);
  s.crc_failures = crc_failures_.load(std::memory_order_relaxed);
  s.coalesced_reads = coalesced_reads_.load(std::memory_order_relaxed);
  s.transfer_busy_ns = transfer_clock_.BusyNs();
  s.blocks = blocks_;
  return s;
}

void BlockStore::ResetPeaks() {
  Lock lock(mu_);
  for (auto& m : mem_) m->ResetPeak();
  disk_.ResetPeak();
}

}  // namespace mshyper::store
