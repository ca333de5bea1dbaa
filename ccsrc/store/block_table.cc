#include "store/block_table.h"

#include <string>

namespace mshyper::store {

bool Valid(const Block& b, Tier t, const TableLock&) {
  const Copy& c = b.copy[TierIndex(t)];
  if (c.slot < 0) return false;
  return CopyIsCurrent(b.seq.load(std::memory_order_relaxed), c.version.load(std::memory_order_relaxed));
}

bool Covered(const Block& b, Tier t, const TableLock& lock) {
  return t == Tier::kDevice ? (Valid(b, Tier::kHost, lock) || Valid(b, Tier::kDisk, lock))
                            : (Valid(b, Tier::kDisk, lock) || Valid(b, Tier::kDevice, lock));
}

BlockTable::BlockTable() : chunks_(new std::atomic<Block*>[kMaxChunks]) {
  for (uint64_t i = 0; i < kMaxChunks; ++i) chunks_[i].store(nullptr, std::memory_order_relaxed);
}

BlockTable::~BlockTable() {
  for (uint64_t i = 0; i < kMaxChunks; ++i) delete[] chunks_[i].load(std::memory_order_relaxed);
}

Block& BlockTable::Get(uint64_t id) const {
  const uint64_t c = id >> kChunkBits;
  Block* chunk = c < kMaxChunks ? chunks_[c].load(std::memory_order_acquire) : nullptr;
  if (chunk == nullptr) throw StoreError("unknown block id " + std::to_string(id));
  return chunk[id & (kChunk - 1)];
}

Block& BlockTable::GetAllocated(uint64_t id, const TableLock&) const {
  Block& b = Get(id);
  if (!b.allocated) throw StoreError("block " + std::to_string(id) + " is not allocated");
  return b;
}

uint64_t BlockTable::TakeId(const TableLock&) {
  if (!free_ids_.empty()) {
    const uint64_t id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }
  const uint64_t id = next_id_;
  const uint64_t c = id >> kChunkBits;
  if (c >= kMaxChunks) throw CapacityError("block store is out of block ids");
  if (chunks_[c].load(std::memory_order_relaxed) == nullptr) {
    chunks_[c].store(new Block[kChunk], std::memory_order_release);
  }
  ++next_id_;
  return id;
}

void BlockTable::ReturnId(uint64_t id, const TableLock&) { free_ids_.push_back(id); }

}  // namespace mshyper::store
