// BlockStore's moves between tiers: copies of a block from one tier to the next (Migrate), a free
// memory slot made by eviction (ReserveSlot), coalesced loads from disk (LoadFromDiskBatch), and
// the calls built on them (Fetch, Evict, WriteBack). The table, pins, reads and writes are in
// block_store.cc; the concurrency design is in block_store.h.
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

#include "store/block_store.h"
#include "store/crc32c.h"

namespace mshyper::store {
namespace {

constexpr int kH = TierIndex(Tier::kHost);
constexpr int kK = TierIndex(Tier::kDisk);

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
  const uint8_t* sbase = src != Tier::kDisk ? SlotPtr(src, b.copy[TierIndex(src)].slot) : nullptr;
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
    MoveTimer timer(transfer_clock_, copy_ns_[TierIndex(src)][TierIndex(dst)]);
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
      bytes_moved_[TierIndex(src)][TierIndex(dst)].fetch_add(n, std::memory_order_relaxed);
      copies_[TierIndex(src)][TierIndex(dst)].fetch_add(1, std::memory_order_relaxed);
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
  } else if (ok && b.copy[TierIndex(dst)].slot < 0) {
    b.copy[TierIndex(dst)].slot = dslot;
    b.copy[TierIndex(dst)].version.store(v, std::memory_order_release);
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
      if (c.copy[TierIndex(t)].held != 0) ++held;
      if (c.copy[TierIndex(t)].pins != 0) continue;
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
        if (c.copy[TierIndex(t)].pins != 0 || c.moving || c.writing) continue;
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
    Copy& c = b.copy[TierIndex(tier)];
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

}  // namespace mshyper::store
