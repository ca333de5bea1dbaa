// BlockStore's table, copies and pins, reads, writes and queries; the moves between tiers are in
// block_moves.cc.
#include "store/block_store.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "store/crc32c.h"

namespace mshyper::store {
namespace {

constexpr int kD = TierIndex(Tier::kDevice);
constexpr int kH = TierIndex(Tier::kHost);
constexpr int kK = TierIndex(Tier::kDisk);

// The configuration with its block size checked (StoreError) and at least one block per file.
StoreConfig Checked(StoreConfig config) {
  if (config.block_size == 0 || config.block_size % 64 != 0) {
    throw StoreError("block_size must be a positive multiple of 64 bytes, got " +
                     std::to_string(config.block_size));
  }
  if (config.blocks_per_file == 0) config.blocks_per_file = 1;
  return config;
}

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
  const Copy& c = b.copy[TierIndex(t)];
  if (c.slot < 0) return false;
  return CopyIsCurrent(b.seq.load(std::memory_order_relaxed), c.version.load(std::memory_order_relaxed));
}

void BlockStore::Touch(Block& b, uint64_t id, Tier t) {
  if (t == Tier::kDisk) return;
  Copy& c = b.copy[TierIndex(t)];
  if (c.in_lru) {
    Mem(t).MakeMostRecent(c.lru_it);
  } else {
    c.lru_it = Mem(t).AddMostRecent(id);
    c.in_lru = true;
  }
}

void BlockStore::ReleaseSlot(Tier t, int64_t slot) { Mem(t).ReleaseSlot(slot); }

void BlockStore::DropCopy(Block& b, uint64_t /*id*/, Tier t) {
  Copy& c = b.copy[TierIndex(t)];
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
  Copy& c = b.copy[TierIndex(t)];
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
  return SeqlockRead(SeqlockView{b.seq, b.copy[TierIndex(t)].version, b.fill}, base, off, dst, len, fill_out,
                     read_retries_);
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
      base = SlotPtr(t, bp->copy[TierIndex(t)].slot);
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
  const int64_t slot = b.copy[TierIndex(tier)].slot;
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
      if (u == t || b.copy[TierIndex(u)].slot < 0) continue;
      if (Valid(b, u) && b.copy[TierIndex(u)].pins != 0) {
        PinLocked(b, u);
        targets[ntargets++] = u;
      } else if (b.copy[TierIndex(u)].pins == 0) {
        DropCopy(b, id, u);
      }
    }
    for (int i = 0; i < ntargets; ++i) bases[i] = SlotPtr(targets[i], b.copy[TierIndex(targets[i])].slot);
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
  for (int i = 0; i < ntargets; ++i) b.copy[TierIndex(targets[i])].version.store(v + 2, std::memory_order_relaxed);
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
  ++b.copy[TierIndex(tier)].held;
}

void BlockStore::Unpin(uint64_t id, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("only the device and host tiers can be pinned");
  Lock lock(mu_);
  Block& b = GetAllocated(id);
  if (b.copy[TierIndex(tier)].held == 0) {
    throw StoreError("unpin of block " + std::to_string(id) + " in the " + TierName(tier) +
                     " tier, which is not pinned");
  }
  --b.copy[TierIndex(tier)].held;
  UnpinLocked(b, id, tier);
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
  return static_cast<int>(GetAllocated(id).copy[TierIndex(tier)].held);
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
