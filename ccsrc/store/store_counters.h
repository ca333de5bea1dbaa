// The block store's statistics: lock-free counters of reads, writes and moves between tiers, the
// time spent moving, and the snapshot handed to callers (StoreStats).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "store/busy_clock.h"
#include "store/store_types.h"

namespace mshyper::store {

struct StoreStats {
  TierStats tiers[kNumTiers];
  uint64_t bytes_moved[kNumTiers][kNumTiers] = {};  // [src][dst]
  uint64_t copies[kNumTiers][kNumTiers] = {};       // number of block copies [src][dst]
  uint64_t copy_ns[kNumTiers][kNumTiers] = {};      // time spent moving blocks [src][dst] (I/O,
                                                    // CRC32C, memcpy; failed moves too), summed over threads
  uint64_t transfer_busy_ns = 0;  // wall time with at least one tier-to-tier copy in progress
  uint64_t reads = 0;  // Read() calls (lock-free ReadPinned() calls are not counted)
  uint64_t writes = 0, read_retries = 0, crc_failures = 0;
  uint64_t coalesced_reads = 0;   // preadv calls that served more than one block
  uint64_t blocks = 0;            // allocated blocks
};

// Counters shared by the store's parts; each is a relaxed atomic, so no lock is needed.
struct StoreCounters {
  std::atomic<uint64_t> bytes_moved[kNumTiers][kNumTiers] = {};
  std::atomic<uint64_t> copies[kNumTiers][kNumTiers] = {};
  std::atomic<uint64_t> copy_ns[kNumTiers][kNumTiers] = {};
  BusyClock transfer_clock;
  std::atomic<uint64_t> reads{0}, writes{0}, read_retries{0}, crc_failures{0}, coalesced_reads{0};

  // One block copy of `bytes` from src to dst completed.
  void CountMove(Tier src, Tier dst, uint64_t bytes) {
    bytes_moved[TierIndex(src)][TierIndex(dst)].fetch_add(bytes, std::memory_order_relaxed);
    copies[TierIndex(src)][TierIndex(dst)].fetch_add(1, std::memory_order_relaxed);
  }
  // Fills every field of `s` but `tiers` and `blocks` (kept by the table and the tiers).
  void Snapshot(StoreStats& s) const;
};

// Times one block move (or one coalesced read) from src to dst: while it lasts the transfer clock
// is busy, and its duration, failed or not, is added to the tier pair's copy time (so the busy
// time, a union of these intervals, never exceeds the sum of the copy times).
class MoveTimer {
 public:
  MoveTimer(StoreCounters& counters, Tier src, Tier dst);
  ~MoveTimer();
  MoveTimer(const MoveTimer&) = delete;
  MoveTimer& operator=(const MoveTimer&) = delete;

 private:
  BusyClock& clock_;
  std::atomic<uint64_t>& ns_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace mshyper::store
