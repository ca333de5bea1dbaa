#include "store/block_mover.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "store/crc32c.h"

namespace mshyper::store {
namespace {

constexpr int kK = TierIndex(Tier::kDisk);

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

Tier Below(Tier t) { return t == Tier::kDevice ? Tier::kHost : Tier::kDisk; }

// A write's data phase: the writer copies without the lock while seq is odd, so no copy is valid
// until it publishes; its copies become valid when it ends (it clears `writing` and notifies).
// seq is even while the writing thread itself pins the block, before its data phase.
bool WriteInFlight(const Block& b) { return b.writing && (b.seq.load(std::memory_order_acquire) & 1) != 0; }

}  // namespace

CorruptBlockError CorruptCopyError(uint64_t id, const DiskExtent& at, uint32_t stored, uint32_t computed) {
  std::ostringstream msg;
  msg << "corrupted block " << id << ": disk copy in '" << at.path << "' at offset " << at.offset
      << " failed its CRC32C check (stored 0x" << std::hex << stored << ", computed 0x" << computed << ")";
  return CorruptBlockError(msg.str());
}

void BlockMover::Migrate(Block& b, uint64_t id, Tier src, Tier dst, TableLock& lock) {
  const uint64_t bs = parts_.block_size;
  b.moving = true;
  if (src != Tier::kDisk) parts_.copies.Pin(b, src, lock);
  int64_t dslot = -1;
  try {
    if (dst == Tier::kDisk) {
      dslot = b.copy[kK].slot;
      if (dslot < 0) {
        dslot = parts_.copies.Disk(lock).Reserve();
        b.copy[kK].slot = dslot;
      }
      b.copy[kK].version.store(kNoVersion, std::memory_order_relaxed);
    } else {
      dslot = ReserveSlot(dst, lock);
    }
  } catch (...) {
    if (src != Tier::kDisk) parts_.copies.Unpin(b, id, src, lock);
    b.moving = false;
    parts_.table.NotifyAll();
    throw;
  }
  const int64_t kslot = b.copy[kK].slot;
  const uint64_t disk_version = b.copy[kK].version.load(std::memory_order_relaxed);
  const uint32_t disk_crc = b.disk_crc;
  const uint64_t disk_len = b.disk_len;
  const DiskExtent at = kslot >= 0 ? parts_.copies.Disk(lock).Locate(kslot) : DiskExtent{};
  const uint8_t* sbase = src != Tier::kDisk ? parts_.copies.SlotPtr(src, b.copy[TierIndex(src)].slot) : nullptr;
  uint8_t* dbase = dst != Tier::kDisk ? parts_.copies.SlotPtr(dst, dslot) : nullptr;
  // Writers wait for `moving` to clear before they start, so when no write is in progress now,
  // none can run during this copy: the source can then be copied with plain memcpy (no data
  // race). Otherwise fall back to the seqlock read (atomic word loads + retry).
  const bool exclusive = !b.writing;
  const uint64_t seq_now = b.seq.load(std::memory_order_relaxed);
  // With no write in progress the fill mark is stable: only the first CopyLen(fill) bytes of the
  // source hold data, the rest reads as zero and need not move.
  uint64_t n = exclusive ? parts_.copies.CopyLen(b.fill.load(std::memory_order_relaxed)) : bs;

  uint64_t v = kNoVersion;
  uint32_t crc = 0;
  std::exception_ptr err;
  {
    TableLock::Unlocked unlocked(lock);
    const DiskTier& disk = parts_.copies.DiskIo();
    try {
      MoveTimer timer(parts_.counters, src, dst);
      if (src == Tier::kDisk) {
        // The disk copy holds disk_len bytes (those written down, covering its fill mark).
        n = disk_len;
        disk.Read(at, dbase, n, "block " + std::to_string(id) + " from '" + at.path + "'");
        const uint32_t got = Crc32c(dbase, n);
        if (got != disk_crc) {
          parts_.counters.crc_failures.fetch_add(1, std::memory_order_relaxed);
          throw CorruptCopyError(id, at, disk_crc, got);
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
          v = SeqlockRead(b.View(src), sbase, 0, snapshot, bs, &fill, parts_.counters.read_retries);
          n = parts_.copies.CopyLen(fill);
          buf = snapshot;
        }
        if (v != kNoVersion) {
          crc = Crc32c(buf, n);
          disk.Write(at, buf, n, "block " + std::to_string(id) + " to '" + at.path + "'");
        }
      } else if (exclusive) {
        std::memcpy(dbase, sbase, n);
        v = seq_now;
      } else {
        // n == bs: beyond the fill mark it writes zeros
        v = SeqlockRead(b.View(src), sbase, 0, dbase, bs, nullptr, parts_.counters.read_retries);
      }
      if (v != kNoVersion) parts_.counters.CountMove(src, dst, n);
    } catch (...) {
      err = std::current_exception();
    }
  }

  b.moving = false;
  if (src != Tier::kDisk) parts_.copies.Unpin(b, id, src, lock);
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
    parts_.copies.Touch(b, id, dst, lock);
  } else {
    parts_.copies.ReleaseSlot(dst, dslot, lock);
  }
  parts_.table.NotifyAll();
  if (err) std::rethrow_exception(err);
}

int64_t BlockMover::ReserveSlot(Tier t, TableLock& lock, bool wait_for_busy) {
  // Bounded wait for busy slots (see below); a deadline, not a count of wake-ups.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    MemoryTier& m = parts_.copies.Mem(t, lock);
    const int64_t free_slot = m.TakeFreeSlot();
    if (free_slot >= 0) return free_slot;
    // Evict: lowest priority first, least recently used among equals.
    Block* victim = nullptr;
    uint64_t vid = 0;
    int best = INT_MAX;
    uint64_t held = 0;  // slots whose copy a caller of Pin() holds (not transient pins)
    for (uint64_t id : m.lru()) {
      Block& c = parts_.table.Get(id);
      if (c.copy[TierIndex(t)].held != 0) ++held;
      if (c.copy[TierIndex(t)].pins != 0) continue;
      if (c.moving || c.writing) continue;
      if (c.priority < best) {
        best = c.priority;
        victim = &c;
        vid = id;
      }
    }
    if (victim == nullptr && held < m.capacity() && !wait_for_busy) return -1;
    if (victim == nullptr && held < m.capacity() && std::chrono::steady_clock::now() < deadline) {
      // Some slots are only busy for a moment (a read, copy or write in progress): they become
      // evictable shortly. Bounded wait, so a cycle of movers in a tiny tier ends in an error, not a hang.
      parts_.table.WaitFor(lock, std::chrono::milliseconds(1));
      continue;
    }
    if (victim == nullptr) {
      throw CapacityError(std::string(TierName(t)) + " tier full: all " + std::to_string(m.capacity()) +
                          " blocks of " + std::to_string(parts_.block_size) + " bytes are pinned");
    }
    if (Covered(*victim, t, lock) || !Valid(*victim, t, lock)) {
      parts_.copies.DropCopy(*victim, t, lock);
      m.CountEviction();
      continue;
    }
    // The only valid copy: write it one tier down first (the block is never lost; a disk error
    // propagates and the copy stays).
    try {
      Migrate(*victim, vid, t, Below(t), lock);
    } catch (const DiskError&) {
      // The disk cannot take the victim (full, I/O error); it stays in memory. Fall back to a
      // clean copy (another valid copy exists below), if any, rather than failing.
      bool dropped = false;
      for (uint64_t id : m.lru()) {
        Block& c = parts_.table.Get(id);
        if (c.copy[TierIndex(t)].pins != 0 || c.moving || c.writing) continue;
        if (Covered(c, t, lock)) {
          parts_.copies.DropCopy(c, t, lock);
          m.CountEviction();
          dropped = true;
          break;
        }
      }
      if (!dropped) throw;
    }
  }
}

void BlockMover::EnsurePinned(Block& b, uint64_t id, Tier t, TableLock& lock) {
  for (;;) {
    if (!b.allocated) throw StoreError("block " + std::to_string(id) + " was freed");
    if (Valid(b, t, lock)) {
      parts_.copies.Pin(b, t, lock);
      parts_.copies.Touch(b, id, t, lock);
      return;
    }
    if (b.moving || WriteInFlight(b)) {
      parts_.table.Wait(lock);
      continue;
    }
    // Up from the host or down from the device for a device / host copy; from disk to host.
    const Tier other = t == Tier::kDevice ? Tier::kHost : Tier::kDevice;
    if (Valid(b, other, lock)) {
      Migrate(b, id, other, t, lock);
    } else if (Valid(b, Tier::kDisk, lock)) {
      Migrate(b, id, Tier::kDisk, Tier::kHost, lock);
    } else {
      throw StoreError(NoCopyMessage(b, id, lock));
    }
  }
}

Tier BlockMover::EnsureInMemoryPinned(Block& b, uint64_t id, TableLock& lock) {
  for (;;) {
    if (!b.allocated) throw StoreError("block " + std::to_string(id) + " was freed");
    for (Tier t : {Tier::kDevice, Tier::kHost}) {
      if (Valid(b, t, lock)) {
        parts_.copies.Pin(b, t, lock);
        parts_.copies.Touch(b, id, t, lock);
        return t;
      }
    }
    if (b.moving || WriteInFlight(b)) {
      parts_.table.Wait(lock);
      continue;
    }
    if (!Valid(b, Tier::kDisk, lock)) throw StoreError(NoCopyMessage(b, id, lock));
    Migrate(b, id, Tier::kDisk, Tier::kHost, lock);
  }
}

bool BlockMover::Evict(Block& b, uint64_t id, Tier tier, TableLock& lock) {
  for (;;) {
    Copy& c = b.copy[TierIndex(tier)];
    if (c.slot < 0) return true;
    if (c.pins != 0 || b.moving || b.writing) return false;
    if (Covered(b, tier, lock) || !Valid(b, tier, lock)) {
      parts_.copies.DropCopy(b, tier, lock);
      parts_.copies.Mem(tier, lock).CountEviction();
      return true;
    }
    Migrate(b, id, tier, Below(tier), lock);
  }
}

size_t BlockMover::WriteBack(size_t max_blocks, TableLock& lock) {
  const std::list<uint64_t>& lru = parts_.copies.Mem(Tier::kHost, lock).lru();
  std::vector<uint64_t> dirty;
  size_t scanned = 0;
  const size_t limit = std::max<size_t>(1, lru.size() / 2);  // the older half of the pool
  for (uint64_t id : lru) {
    if (scanned++ >= limit || dirty.size() >= max_blocks) break;
    const Block& b = parts_.table.Get(id);
    if (!b.moving && !b.writing && Valid(b, Tier::kHost, lock) && !Valid(b, Tier::kDisk, lock) &&
        !Valid(b, Tier::kDevice, lock)) {
      dirty.push_back(id);
    }
  }
  size_t written = 0;
  for (uint64_t id : dirty) {
    Block& b = parts_.table.Get(id);
    if (!b.allocated || b.moving || b.writing || !Valid(b, Tier::kHost, lock) || Valid(b, Tier::kDisk, lock)) {
      continue;
    }
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
