#include "store/memory_tier.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace mshyper::store {

uint8_t* AllocBlockBuffer(uint64_t bytes) {
  return static_cast<uint8_t*>(std::aligned_alloc(4096, RoundUp(bytes, 4096)));
}

MemoryTier::MemoryTier(Tier tier, uint64_t capacity_bytes, uint64_t slot_bytes)
    : tier_(tier), capacity_(capacity_bytes / slot_bytes), slot_bytes_(slot_bytes) {
  if (capacity_ == 0) {
    throw StoreError(std::string(TierName(tier)) + " tier of " + std::to_string(capacity_bytes) +
                     " bytes holds no block of " + std::to_string(slot_bytes) + " bytes");
  }
  buffers_.assign(capacity_, nullptr);
}

MemoryTier::~MemoryTier() {
  for (uint8_t* p : buffers_) std::free(p);
}

int64_t MemoryTier::TakeFreeSlot() {
  if (!free_slots_.empty()) {
    const int64_t s = free_slots_.back();
    free_slots_.pop_back();
    peak_ = std::max(peak_, ++used_);
    return s;
  }
  // Slots are created lazily; `buffers_` has one entry per possible slot.
  for (uint64_t s = 0; s < capacity_; ++s) {
    if (buffers_[s] != nullptr) continue;
    buffers_[s] = AllocBlockBuffer(slot_bytes_);
    if (buffers_[s] == nullptr) {
      throw CapacityError(std::string("out of host memory creating a ") + TierName(tier_) + " slot");
    }
    peak_ = std::max(peak_, ++used_);
    return static_cast<int64_t>(s);
  }
  return -1;
}

void MemoryTier::ReleaseSlot(int64_t slot) {
  free_slots_.push_back(slot);
  --used_;
}

}  // namespace mshyper::store
