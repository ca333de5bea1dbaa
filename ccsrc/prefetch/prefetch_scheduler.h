// Predictive prefetch scheduler over the block store (docs/offload.md, "Prefetch scheduler").
//
// The consumer calls BeginStep() at every step boundary and Acquire(ids)/Release(ids) around each
// use of blocks. During the first step the scheduler records the block access order (the trace).
// In later steps it follows the trace: after each access it predicts the next `depth` blocks
// (wrapping into the next step) and queues asynchronous copies to the target tier, which its own
// I/O worker threads execute soonest-needed first; a worker takes several queued requests at once
// so the store can coalesce adjacent disk reads into one preadv. With a device target, the
// `host_depth` blocks after those are read from disk into the host tier ahead of time (the host
// pool is usually larger than the device tier), so the disk keeps working while the device window
// is full. An access that does not match
// the trace invalidates it: queued prefetches are cancelled, the access is served on demand, and
// the order of the current step is recorded as the new trace.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "store/block_store.h"

namespace mshyper::prefetch {

using store::BlockStore;
using store::Tier;

struct PrefetchStats {
  uint64_t hits = 0;        // accesses whose block was already valid in the target tier
  uint64_t late = 0;        // accesses whose block was queued or in flight (waited for it)
  uint64_t misses = 0;      // accesses not predicted: fetched on demand
  uint64_t stall_ns = 0;    // time Acquire spent waiting for blocks that were not hits
  uint64_t issued = 0;      // prefetch requests queued
  uint64_t completed = 0;   // prefetch requests a worker finished
  uint64_t cancelled = 0;   // queued requests dropped (trace invalidated or demanded first)
  uint64_t dropped = 0;     // requests that failed (target tier full of pinned blocks, errors)
  uint64_t trace_invalidations = 0;
  uint64_t written_back = 0;  // dirty host blocks written to disk by idle workers (write-behind)
  uint64_t steps = 0;
  uint64_t trace_length = 0;
  bool trace_valid = false;
  std::string last_error;
};

class PrefetchScheduler {
 public:
  // write_behind: idle workers write dirty host blocks to disk ahead of their eviction.
  // host_depth < 0: the same as depth. worker_nice: the workers' nice value (0..19,
  // MakeBackgroundThread), so that they yield the cores to the compute.
  PrefetchScheduler(std::shared_ptr<BlockStore> store, int depth, int workers = 2,
                    Tier target = Tier::kDevice, int max_batch = 4, bool write_behind = true,
                    int host_depth = -1, int worker_nice = 0);
  ~PrefetchScheduler();
  PrefetchScheduler(const PrefetchScheduler&) = delete;
  PrefetchScheduler& operator=(const PrefetchScheduler&) = delete;

  void SetDepth(int depth);
  int depth() const;
  void SetHostDepth(int host_depth);  // < 0: the same as depth
  int host_depth() const;
  Tier target() const { return target_; }
  const std::shared_ptr<BlockStore>& store() const { return store_; }

  // Marks a step boundary: a first (or re-)recorded step becomes the trace.
  void BeginStep();
  // Pins `ids` in the target tier (in order), recording/following the trace and issuing
  // prefetches for the predicted next blocks. Each Acquire needs a matching Release. All or
  // nothing: if a block cannot be pinned (e.g. CapacityError), the ones pinned are unpinned.
  // record=false: pin (and count hits/stalls) without an access in the trace -- for a caller
  // that pins blocks ahead of their use and reports the use itself later with Touch.
  void Acquire(const std::vector<uint64_t>& ids, bool record = true);
  void Release(const std::vector<uint64_t>& ids);
  // Follows/records the access without pinning (for callers that read the block otherwise).
  void Touch(const std::vector<uint64_t>& ids);

  // The next `n` blocks predicted from the trace and the current position (empty if no trace).
  std::vector<uint64_t> Predict(size_t n) const;
  std::vector<uint64_t> Trace() const;
  size_t Position() const;
  // Blocks until no prefetch is queued or in flight.
  void Drain();
  PrefetchStats Stats() const;
  void ResetStats();

 private:
  enum class Mode { kRecording, kReplay };
  void Access(uint64_t id, std::unique_lock<std::mutex>& lock);  // trace bookkeeping
  void IssueWindow(std::unique_lock<std::mutex>& lock);
  void CancelQueued(std::unique_lock<std::mutex>& lock);
  void WorkerLoop();
  int HostDepthLocked() const;  // host_depth with "< 0" resolved; mu_ held

  std::shared_ptr<BlockStore> store_;
  const Tier target_;
  const int max_batch_;
  const bool write_behind_;
  const int worker_nice_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  bool stop_ = false;
  int depth_;
  int host_depth_;

  Mode mode_ = Mode::kRecording;
  std::vector<uint64_t> trace_, recording_;
  size_t pos_ = 0;        // index into trace_ of the next expected access
  uint64_t cursor_ = 0;   // absolute access counter (orders the queue across steps)

  std::map<uint64_t, uint64_t> queue_;              // due (absolute access index) -> block
  std::unordered_map<uint64_t, uint64_t> queued_;   // block -> due
  std::unordered_set<uint64_t> inflight_;
  std::unordered_set<uint64_t> host_only_;          // queued blocks bound for the host tier only
  std::unordered_set<uint64_t> hinted_;             // blocks given a keep-priority hint
  PrefetchStats stats_;
  std::vector<std::thread> workers_;
};

}  // namespace mshyper::prefetch
