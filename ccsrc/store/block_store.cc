// BlockStore: allocation, reads, pins, the calls its parts serve, and the queries.
#include "store/block_store.h"

#include <string>

namespace mshyper::store {
namespace {

constexpr int kH = TierIndex(Tier::kHost);

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
      copies_(config_),
      parts_{config_.block_size, table_, copies_, counters_},
      mover_(parts_),
      loader_(parts_, mover_),
      writer_(parts_, mover_) {}

uint64_t BlockStore::Allocate() {
  TableLock lock = table_.Lock();
  const uint64_t id = table_.TakeId(lock);
  Block& b = table_.Get(id);
  b.allocated = true;
  b.priority = 0;
  b.moving = true;  // not visible to anyone else yet, but keep evictors away while we wait
  int64_t slot;
  try {
    slot = mover_.ReserveSlot(Tier::kHost, lock);
  } catch (...) {
    b.allocated = false;
    b.moving = false;
    table_.ReturnId(id, lock);
    table_.NotifyAll();
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
  copies_.Touch(b, id, Tier::kHost, lock);
  table_.CountLive(+1, lock);
  table_.NotifyAll();
  return id;
}

void BlockStore::Free(uint64_t id) {
  TableLock lock = table_.Lock();
  Block& b = table_.GetAllocated(id, lock);
  table_.Wait(lock, [&] { return !b.moving && !b.writing; });
  if (!b.allocated) return;
  for (int t = 0; t < kNumTiers; ++t) {
    if (b.copy[t].pins != 0) {
      throw StoreError("block " + std::to_string(id) + " cannot be freed: pinned in the " +
                       TierName(static_cast<Tier>(t)) + " tier");
    }
  }
  for (int t = 0; t < kNumTiers; ++t) copies_.DropCopy(b, static_cast<Tier>(t), lock);
  b.allocated = false;
  b.priority = 0;
  table_.ReturnId(id, lock);
  table_.CountLive(-1, lock);
}

void BlockStore::Read(uint64_t id, uint64_t offset, void* dst, uint64_t len) {
  if (offset > config_.block_size || len > config_.block_size - offset) {
    throw StoreError("read of [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                     ") is outside block " + std::to_string(id));
  }
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  for (;;) {
    Block* bp;
    Tier t;
    const uint8_t* base;
    {
      TableLock lock = table_.Lock();
      bp = &table_.GetAllocated(id, lock);
      t = mover_.EnsureInMemoryPinned(*bp, id, lock);
      base = copies_.SlotPtr(t, bp->copy[TierIndex(t)].slot);
    }
    const uint64_t v = SeqlockRead(bp->View(t), base, offset, dst, len, nullptr, counters_.read_retries);
    {
      TableLock lock = table_.Lock();
      copies_.Unpin(*bp, id, t, lock);
    }
    if (v != kNoVersion) return;
    counters_.read_retries.fetch_add(1, std::memory_order_relaxed);
  }
}

void BlockStore::ReadPinned(uint64_t id, Tier tier, uint64_t offset, void* dst, uint64_t len) {
  if (tier == Tier::kDisk) throw StoreError("ReadPinned needs a memory tier");
  if (offset > config_.block_size || len > config_.block_size - offset) {
    throw StoreError("read outside block " + std::to_string(id));
  }
  Block& b = table_.Get(id);
  // The caller's pin keeps the slot assigned; the slot index itself was published under the
  // lock before the caller's Pin returned.
  const int64_t slot = b.copy[TierIndex(tier)].slot;
  // No shared counter is touched on this path: a read-modify-write of a shared cache line per
  // read is exactly the cost a seqlock reader avoids (pinned reads are not counted in `reads`).
  if (slot >= 0 &&
      SeqlockRead(b.View(tier), copies_.SlotPtr(tier, slot), offset, dst, len, nullptr, counters_.read_retries) !=
          kNoVersion) {
    return;
  }
  Read(id, offset, dst, len);
}

void BlockStore::Write(uint64_t id, uint64_t offset, const void* src, uint64_t len) {
  writer_.Write(id, offset, src, len);
}

void BlockStore::Discard(uint64_t id) { writer_.Discard(id); }

void BlockStore::Pin(uint64_t id, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("only the device and host tiers can be pinned");
  TableLock lock = table_.Lock();
  Block& b = table_.GetAllocated(id, lock);
  mover_.EnsurePinned(b, id, tier, lock);
  ++b.copy[TierIndex(tier)].held;
}

void BlockStore::Unpin(uint64_t id, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("only the device and host tiers can be pinned");
  TableLock lock = table_.Lock();
  Block& b = table_.GetAllocated(id, lock);
  if (b.copy[TierIndex(tier)].held == 0) {
    throw StoreError("unpin of block " + std::to_string(id) + " in the " + TierName(tier) +
                     " tier, which is not pinned");
  }
  --b.copy[TierIndex(tier)].held;
  copies_.Unpin(b, id, tier, lock);
}

void BlockStore::Fetch(const std::vector<uint64_t>& ids, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("Fetch targets the device or host tier");
  TableLock lock = table_.Lock();
  std::vector<uint64_t> disk_only;
  for (uint64_t id : ids) {
    Block& b = table_.GetAllocated(id, lock);
    if (!b.moving && !Valid(b, Tier::kHost, lock) && !Valid(b, Tier::kDevice, lock) && Valid(b, Tier::kDisk, lock)) {
      disk_only.push_back(id);
    }
  }
  if (disk_only.size() > 1) loader_.Load(disk_only, lock);
  for (uint64_t id : ids) {
    Block& b = table_.GetAllocated(id, lock);
    mover_.EnsurePinned(b, id, tier, lock);
    copies_.Unpin(b, id, tier, lock);
  }
}

bool BlockStore::Evict(uint64_t id, Tier tier) {
  if (tier == Tier::kDisk) throw StoreError("the disk tier is the last tier; nothing to evict to");
  TableLock lock = table_.Lock();
  return mover_.Evict(table_.GetAllocated(id, lock), id, tier, lock);
}

size_t BlockStore::WriteBack(size_t max_blocks) {
  TableLock lock = table_.Lock();
  return mover_.WriteBack(max_blocks, lock);
}

void BlockStore::SetPriority(uint64_t id, int priority) {
  TableLock lock = table_.Lock();
  table_.GetAllocated(id, lock).priority = priority;
}

uint64_t BlockStore::Version(uint64_t id) const {
  return table_.Get(id).seq.load(std::memory_order_acquire);
}

bool BlockStore::HasValidCopy(uint64_t id, Tier tier) const {
  TableLock lock = table_.Lock();
  return Valid(table_.GetAllocated(id, lock), tier, lock);
}

int BlockStore::PinCount(uint64_t id, Tier tier) const {
  TableLock lock = table_.Lock();
  return static_cast<int>(table_.GetAllocated(id, lock).copy[TierIndex(tier)].held);
}

std::pair<std::string, uint64_t> BlockStore::DiskLocation(uint64_t id) const {
  TableLock lock = table_.Lock();
  return copies_.DiskLocation(table_.GetAllocated(id, lock), lock);
}

std::vector<uint64_t> BlockStore::LruOrder(Tier tier) const {
  TableLock lock = table_.Lock();
  return copies_.LruOrder(tier, table_, lock);
}

StoreStats BlockStore::Stats() const {
  TableLock lock = table_.Lock();
  StoreStats s;
  copies_.SnapshotTiers(s, lock);
  counters_.Snapshot(s);
  s.blocks = table_.live(lock);
  return s;
}

void BlockStore::ResetPeaks() {
  TableLock lock = table_.Lock();
  copies_.ResetPeaks(lock);
}

}  // namespace mshyper::store
