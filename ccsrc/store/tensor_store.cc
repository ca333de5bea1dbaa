#include "store/tensor_store.h"

#include <algorithm>
#include <string>
#include <utility>

namespace mshyper::store {
namespace {
constexpr uint64_t kAlign = 64;
}  // namespace

TensorStore::TensorStore(std::shared_ptr<BlockStore> store) : store_(std::move(store)) {
  if (!store_) throw StoreError("TensorStore needs a BlockStore");
}

TensorStore::~TensorStore() = default;

const TensorStore::Entry& TensorStore::Find(uint64_t tid) const {
  auto it = tensors_.find(tid);
  if (it == tensors_.end()) throw StoreError("unknown tensor id " + std::to_string(tid));
  return it->second;
}

uint64_t TensorStore::Put(const void* data, uint64_t nbytes) {
  const uint64_t bs = store_->block_size();
  Entry e;
  e.nbytes = nbytes;
  std::vector<uint64_t> fresh;  // blocks allocated here (freed again on failure)
  uint64_t tid;
  try {
    if (nbytes >= bs) {
      for (uint64_t off = 0; off < nbytes; off += bs) {
        const uint64_t id = store_->Allocate();
        fresh.push_back(id);
        e.extents.push_back(Extent{id, 0, std::min(bs, nbytes - off)});
      }
    } else if (nbytes > 0) {
      e.packed = true;
      std::lock_guard<std::mutex> g(mu_);
      if (pack_block_ < 0 || pack_fill_ + nbytes > bs) {
        if (pack_block_ >= 0 && pack_refs_[pack_block_] == 0) {
          pack_refs_.erase(pack_block_);
          store_->Free(pack_block_);
        }
        pack_block_ = static_cast<int64_t>(store_->Allocate());
        pack_fill_ = 0;
        pack_refs_[pack_block_] = 0;
      }
      e.extents.push_back(Extent{static_cast<uint64_t>(pack_block_), pack_fill_, nbytes});
      pack_fill_ = (pack_fill_ + nbytes + kAlign - 1) / kAlign * kAlign;
      ++pack_refs_[pack_block_];
    }
    const auto* p = static_cast<const uint8_t*>(data);
    for (const Extent& x : e.extents) {
      store_->Write(x.block, x.offset, p, x.length);
      p += x.length;
    }
    std::lock_guard<std::mutex> g(mu_);
    tid = next_tid_++;
    tensors_.emplace(tid, std::move(e));
  } catch (...) {
    for (uint64_t id : fresh) {
      try {
        store_->Free(id);
      } catch (...) {
      }
    }
    if (e.packed && !e.extents.empty()) {
      std::lock_guard<std::mutex> g(mu_);
      --pack_refs_[e.extents[0].block];
    }
    throw;
  }
  return tid;
}

void TensorStore::Update(uint64_t tid, const void* data, uint64_t nbytes) {
  const std::vector<Extent> ext = SizedExtents(tid, nbytes, "update");
  const auto* p = static_cast<const uint8_t*>(data);
  for (const Extent& x : ext) {
    store_->Write(x.block, x.offset, p, x.length);
    p += x.length;
  }
}

void TensorStore::Discard(uint64_t tid) {
  Entry e;
  {
    std::lock_guard<std::mutex> g(mu_);
    e = Find(tid);
  }
  if (e.packed) {
    for (const Extent& x : e.extents) {
      std::vector<uint8_t> zeros(x.length, 0);
      store_->Write(x.block, x.offset, zeros.data(), x.length);
    }
    return;
  }
  for (const Extent& x : e.extents) store_->Discard(x.block);
}

void TensorStore::Get(uint64_t tid, void* dst, uint64_t nbytes) const {
  const std::vector<Extent> ext = SizedExtents(tid, nbytes, "destination");
  auto* p = static_cast<uint8_t*>(dst);
  for (const Extent& x : ext) {
    store_->Read(x.block, x.offset, p, x.length);
    p += x.length;
  }
}

void TensorStore::GetPinned(uint64_t tid, Tier tier, void* dst, uint64_t nbytes) const {
  const std::vector<Extent> ext = SizedExtents(tid, nbytes, "destination");
  auto* p = static_cast<uint8_t*>(dst);
  for (const Extent& x : ext) {
    store_->ReadPinned(x.block, tier, x.offset, p, x.length);
    p += x.length;
  }
}

uint64_t TensorStore::Size(uint64_t tid) const {
  std::lock_guard<std::mutex> g(mu_);
  return Find(tid).nbytes;
}

bool TensorStore::Contains(uint64_t tid) const {
  std::lock_guard<std::mutex> g(mu_);
  return tensors_.count(tid) != 0;
}

std::vector<Extent> TensorStore::SizedExtents(uint64_t tid, uint64_t nbytes, const char* what) const {
  std::lock_guard<std::mutex> g(mu_);
  const Entry& e = Find(tid);
  if (e.nbytes != nbytes) {
    throw StoreError("tensor " + std::to_string(tid) + " holds " + std::to_string(e.nbytes) + " bytes, " +
                     what + " has " + std::to_string(nbytes));
  }
  return e.extents;
}

std::vector<Extent> TensorStore::Extents(uint64_t tid) const {
  std::lock_guard<std::mutex> g(mu_);
  return Find(tid).extents;
}

std::vector<uint64_t> TensorStore::Blocks(uint64_t tid) const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<uint64_t> out;
  for (const Extent& x : Find(tid).extents) {
    if (out.empty() || out.back() != x.block) out.push_back(x.block);
  }
  return out;
}

void TensorStore::Erase(uint64_t tid) {
  std::vector<uint64_t> to_free;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = tensors_.find(tid);
    if (it == tensors_.end()) throw StoreError("unknown tensor id " + std::to_string(tid));
    Entry e = std::move(it->second);
    tensors_.erase(it);
    if (e.packed) {
      const uint64_t blk = e.extents[0].block;
      if (--pack_refs_[blk] == 0 && static_cast<int64_t>(blk) != pack_block_) {
        pack_refs_.erase(blk);
        to_free.push_back(blk);
      }
    } else {
      for (const Extent& x : e.extents) to_free.push_back(x.block);
    }
  }
  for (uint64_t id : to_free) store_->Free(id);
}

void TensorStore::ClosePack() {
  std::lock_guard<std::mutex> g(mu_);
  if (pack_block_ >= 0 && pack_refs_[pack_block_] == 0) {
    pack_refs_.erase(pack_block_);
    store_->Free(pack_block_);
  }
  pack_block_ = -1;
  pack_fill_ = 0;
}

size_t TensorStore::Count() const {
  std::lock_guard<std::mutex> g(mu_);
  return tensors_.size();
}

}  // namespace mshyper::store
