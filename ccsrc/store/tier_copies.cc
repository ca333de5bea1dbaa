#include "store/tier_copies.h"

#include <algorithm>
#include <sstream>

namespace mshyper::store {

TierCopies::TierCopies(const StoreConfig& config)
    : block_size_(config.block_size),
      mem_{std::make_unique<MemoryTier>(Tier::kDevice, config.device_capacity, config.block_size),
           std::make_unique<MemoryTier>(Tier::kHost, config.host_capacity, config.block_size)},
      disk_(config) {}

uint64_t TierCopies::CopyLen(uint64_t fill) const {
  // Whole 4KB pages (page cache and DMA granularity); an empty block (never written, or
  // discarded) moves nothing.
  return std::min(block_size_, RoundUp(fill, 4096));
}

void TierCopies::Touch(Block& b, uint64_t id, Tier t, const TableLock& lock) {
  if (t == Tier::kDisk) return;
  Copy& c = b.copy[TierIndex(t)];
  if (c.in_lru) {
    Mem(t, lock).MakeMostRecent(c.lru_it);
  } else {
    c.lru_it = Mem(t, lock).AddMostRecent(id);
    c.in_lru = true;
  }
}

void TierCopies::DropCopy(Block& b, Tier t, const TableLock& lock) {
  Copy& c = b.copy[TierIndex(t)];
  c.version.store(kNoVersion, std::memory_order_relaxed);
  if (c.slot < 0) return;
  if (t == Tier::kDisk) {
    disk_.Release(c.slot);
  } else {
    ReleaseSlot(t, c.slot, lock);
    if (c.in_lru) {
      Mem(t, lock).RemoveFromLru(c.lru_it);
      c.in_lru = false;
    }
  }
  c.slot = -1;
}

void TierCopies::Unpin(Block& b, uint64_t id, Tier t, const TableLock& lock) {
  Copy& c = b.copy[TierIndex(t)];
  if (c.pins == 0) {
    throw StoreError("unpin of block " + std::to_string(id) + " in the " + TierName(t) +
                     " tier, which is not pinned");
  }
  if (--c.pins == 0 && t != Tier::kDisk && c.slot >= 0 && !Valid(b, t, lock) && !b.writing) {
    DropCopy(b, t, lock);  // a stale copy kept alive only by the pin
  }
}

std::vector<uint64_t> TierCopies::LruOrder(Tier t, const BlockTable& table, const TableLock& lock) const {
  if (t == Tier::kDisk) throw StoreError("the disk tier has no LRU order");
  std::vector<uint64_t> out;
  for (uint64_t id : mem_[TierIndex(t)]->lru()) {
    if (Valid(table.Get(id), t, lock)) out.push_back(id);
  }
  return out;
}

std::pair<std::string, uint64_t> TierCopies::DiskLocation(const Block& b, const TableLock&) const {
  const int64_t k = b.copy[TierIndex(Tier::kDisk)].slot;
  if (k < 0) return {std::string(), 0};
  const DiskExtent at = disk_.Locate(k);
  return {"/proc/self/fd/" + std::to_string(at.fd), at.offset};  // the file has no name of its own
}

void TierCopies::SnapshotTiers(StoreStats& s, const TableLock&) const {
  for (int t = 0; t < 2; ++t) s.tiers[t] = mem_[t]->Stats();
  s.tiers[TierIndex(Tier::kDisk)] = disk_.Stats();
}

void TierCopies::ResetPeaks(const TableLock&) {
  for (auto& m : mem_) m->ResetPeak();
  disk_.ResetPeak();
}

std::string NoCopyMessage(const Block& b, uint64_t id, const TableLock&) {
  std::ostringstream m;
  m << "block " << id << " has no valid copy (internal error; seq " << b.seq.load();
  for (int t = 0; t < kNumTiers; ++t) {
    m << ", " << TierName(static_cast<Tier>(t)) << " slot " << b.copy[t].slot << " version "
      << static_cast<int64_t>(b.copy[t].version.load()) << " pins " << b.copy[t].pins;
  }
  m << ", moving " << b.moving << ", writing " << b.writing << ")";
  return m.str();
}

}  // namespace mshyper::store
