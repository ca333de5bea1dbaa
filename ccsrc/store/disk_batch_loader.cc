#include "store/disk_batch_loader.h"

#include <sys/uio.h>

#include <algorithm>
#include <climits>
#include <exception>
#include <string>

#include "store/crc32c.h"

namespace mshyper::store {
namespace {

constexpr int kH = TierIndex(Tier::kHost);
constexpr int kK = TierIndex(Tier::kDisk);

}  // namespace

void DiskBatchLoader::Load(const std::vector<uint64_t>& ids, TableLock& lock) {
  const uint64_t bs = parts_.block_size;
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
    Block& b = parts_.table.Get(id);
    if (!b.allocated || b.moving || Valid(b, Tier::kHost, lock) || Valid(b, Tier::kDevice, lock) ||
        !Valid(b, Tier::kDisk, lock)) {
      continue;
    }
    b.moving = true;
    Item it;
    it.id = id;
    it.b = &b;
    items.push_back(std::move(it));
  }
  // Load what fits now: the batch's own slots are busy (moving) until it ends, so waiting for a
  // busy slot here would wait for itself. The rest falls back to single fetches, which wait for
  // busy slots and report a full tier.
  size_t reserved = 0;
  try {
    for (; reserved < items.size(); ++reserved) {
      const int64_t slot = mover_.ReserveSlot(Tier::kHost, lock, /*wait_for_busy=*/false);
      if (slot < 0) break;
      items[reserved].hslot = slot;
    }
  } catch (const CapacityError&) {
  }
  for (size_t i = reserved; i < items.size(); ++i) items[i].b->moving = false;
  items.resize(reserved);
  if (items.empty()) {
    parts_.table.NotifyAll();
    return;
  }
  for (Item& it : items) {
    const int64_t k = it.b->copy[kK].slot;
    it.version = it.b->copy[kK].version.load(std::memory_order_relaxed);
    it.crc = it.b->disk_crc;
    it.len = it.b->disk_len;
    it.at = parts_.copies.Disk(lock).Locate(k);
    it.buf = parts_.copies.SlotPtr(Tier::kHost, it.hslot);
  }
  std::exception_ptr err;
  {
    TableLock::Unlocked unlocked(lock);
    const DiskTier& disk = parts_.copies.DiskIo();
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return a.at.fd != b.at.fd ? a.at.fd < b.at.fd : a.at.offset < b.at.offset;
    });
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
        MoveTimer timer(parts_.counters, Tier::kDisk, Tier::kHost);
        bool done = false;
        if (j - i > 1) {
          std::vector<iovec> iov(j - i);
          for (size_t k = i; k < j; ++k) iov[k - i] = iovec{items[k].buf, items[k].len};
          if (disk.ReadRun(items[i].at, iov, total)) {
            done = true;
            parts_.counters.coalesced_reads.fetch_add(1, std::memory_order_relaxed);
          }
        }
        if (!done) {
          for (size_t k = i; k < j; ++k) {
            disk.Read(items[k].at, items[k].buf, items[k].len,
                      "block " + std::to_string(items[k].id) + " from '" + items[k].at.path + "'");
          }
        }
        for (size_t k = i; k < j; ++k) {
          const uint32_t got = Crc32c(items[k].buf, items[k].len);
          if (got != items[k].crc) {
            parts_.counters.crc_failures.fetch_add(1, std::memory_order_relaxed);
            if (!err) err = std::make_exception_ptr(CorruptCopyError(items[k].id, items[k].at, items[k].crc, got));
            continue;
          }
          items[k].ok = true;
          parts_.counters.CountMove(Tier::kDisk, Tier::kHost, items[k].len);
        }
      } catch (...) {
        if (!err) err = std::current_exception();
      }
      i = j;
    }
  }
  for (Item& it : items) {
    Block& b = *it.b;
    b.moving = false;
    if (it.ok && b.allocated && b.seq.load(std::memory_order_relaxed) == it.version) {
      b.copy[kH].slot = it.hslot;
      b.copy[kH].version.store(it.version, std::memory_order_release);
      parts_.copies.Touch(b, it.id, Tier::kHost, lock);
    } else {
      parts_.copies.ReleaseSlot(Tier::kHost, it.hslot, lock);
    }
  }
  parts_.table.NotifyAll();
  if (err) std::rethrow_exception(err);
}

}  // namespace mshyper::store
