// Tensors over the block store: a tensor of at least one block spans dedicated blocks; smaller
// tensors are packed (64-byte aligned) into shared blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "store/block_store.h"

namespace mshyper::store {

struct Extent {
  uint64_t block;
  uint64_t offset;
  uint64_t length;
};

class TensorStore {
 public:
  explicit TensorStore(std::shared_ptr<BlockStore> store);
  ~TensorStore();
  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;

  const std::shared_ptr<BlockStore>& blocks() const { return store_; }

  // Stores `nbytes` bytes as a new tensor and returns its id.
  uint64_t Put(const void* data, uint64_t nbytes);
  // Overwrites a tensor with new contents of the same size (each block's update is atomic;
  // a tensor spanning blocks is updated block by block).
  void Update(uint64_t tid, const void* data, uint64_t nbytes);
  // The tensor's content is no longer needed: its dedicated blocks are discarded (they read as
  // zeros, without a disk write); a packed tensor, which shares its block, is zeroed by a write.
  void Discard(uint64_t tid);
  // Copies a tensor out; `nbytes` must equal its size.
  void Get(uint64_t tid, void* dst, uint64_t nbytes) const;
  // Same, for a caller that holds pins on all of the tensor's blocks in `tier` (lock-free path).
  void GetPinned(uint64_t tid, Tier tier, void* dst, uint64_t nbytes) const;
  uint64_t Size(uint64_t tid) const;
  bool Contains(uint64_t tid) const;
  std::vector<Extent> Extents(uint64_t tid) const;
  // Distinct blocks of the tensor in order.
  std::vector<uint64_t> Blocks(uint64_t tid) const;
  void Erase(uint64_t tid);
  size_t Count() const;
  // Starts a fresh pack block for the next small tensor (so the tensors of one offload unit share
  // no block with the previous unit's).
  void ClosePack();

 private:
  struct Entry {
    uint64_t nbytes = 0;
    bool packed = false;
    std::vector<Extent> extents;
  };
  const Entry& Find(uint64_t tid) const;  // under mu_
  // The tensor's extents after checking it holds `nbytes` (error names `what`: update/destination).
  std::vector<Extent> SizedExtents(uint64_t tid, uint64_t nbytes, const char* what) const;

  std::shared_ptr<BlockStore> store_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> tensors_;
  std::unordered_map<uint64_t, uint64_t> pack_refs_;  // packed block -> live tensors in it
  uint64_t next_tid_ = 1;
  int64_t pack_block_ = -1;
  uint64_t pack_fill_ = 0;
};

}  // namespace mshyper::store
