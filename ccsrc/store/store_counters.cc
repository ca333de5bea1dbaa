#include "store/store_counters.h"

namespace mshyper::store {

void StoreCounters::Snapshot(StoreStats& s) const {
  for (int a = 0; a < kNumTiers; ++a) {
    for (int b = 0; b < kNumTiers; ++b) {
      s.bytes_moved[a][b] = bytes_moved[a][b].load(std::memory_order_relaxed);
      s.copies[a][b] = copies[a][b].load(std::memory_order_relaxed);
      s.copy_ns[a][b] = copy_ns[a][b].load(std::memory_order_relaxed);
    }
  }
  s.reads = reads.load(std::memory_order_relaxed);
  s.writes = writes.load(std::memory_order_relaxed);
  s.read_retries = read_retries.load(std::memory_order_relaxed);
  s.crc_failures = crc_failures.load(std::memory_order_relaxed);
  s.coalesced_reads = coalesced_reads.load(std::memory_order_relaxed);
  s.transfer_busy_ns = transfer_clock.BusyNs();
}

MoveTimer::MoveTimer(StoreCounters& counters, Tier src, Tier dst)
    : clock_(counters.transfer_clock),
      ns_(counters.copy_ns[TierIndex(src)][TierIndex(dst)]),
      start_(std::chrono::steady_clock::now()) {
  clock_.Begin();
}

MoveTimer::~MoveTimer() {
  clock_.End();
  ns_.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now() - start_)
                                          .count()),
                std::memory_order_relaxed);
}

}  // namespace mshyper::store
