#include "prefetch/prefetch_scheduler.h"

#include "prefetch/background_thread.h"

#include <chrono>
#include <string>
#include <utility>

namespace mshyper::prefetch {
namespace {
uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
}  // namespace

PrefetchScheduler::PrefetchScheduler(std::shared_ptr<BlockStore> store, int depth, int workers,
                                     Tier target, int max_batch, bool write_behind, int host_depth,
                                     int worker_nice)
    : store_(std::move(store)), target_(target), max_batch_(max_batch < 1 ? 1 : max_batch),
      write_behind_(write_behind), worker_nice_(worker_nice), depth_(depth), host_depth_(host_depth) {
  if (!store_) throw store::StoreError("PrefetchScheduler needs a BlockStore");
  if (target_ == Tier::kDisk) throw store::StoreError("prefetch target must be device or host");
  if (depth < 0) throw store::StoreError("prefetch depth must be >= 0");
  if (worker_nice < 0 || worker_nice > kMaxNice) {
    throw store::StoreError("worker_nice must be in 0..19, got " + std::to_string(worker_nice));
  }
  if (workers < 1) workers = 1;
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

PrefetchScheduler::~PrefetchScheduler() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    queue_.clear();
    queued_.clear();
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void PrefetchScheduler::SetDepth(int depth) {
  if (depth < 0) throw store::StoreError("prefetch depth must be >= 0");
  std::lock_guard<std::mutex> g(mu_);
  depth_ = depth;
}

int PrefetchScheduler::depth() const {
  std::lock_guard<std::mutex> g(mu_);
  return depth_;
}

void PrefetchScheduler::SetHostDepth(int host_depth) {
  std::lock_guard<std::mutex> g(mu_);
  host_depth_ = host_depth;
}

int PrefetchScheduler::host_depth() const {
  std::lock_guard<std::mutex> g(mu_);
  return HostDepthLocked();
}

int PrefetchScheduler::HostDepthLocked() const { return host_depth_ < 0 ? depth_ : host_depth_; }

void PrefetchScheduler::BeginStep() {
  std::unique_lock<std::mutex> lock(mu_);
  ++stats_.steps;
  if (mode_ == Mode::kRecording) {
    if (!recording_.empty()) {
      trace_ = std::move(recording_);
      recording_.clear();
      mode_ = Mode::kReplay;
    }
  } else if (pos_ != 0 && pos_ != trace_.size()) {
    // The previous step stopped early: its order differed from the trace.
    ++stats_.trace_invalidations;
    CancelQueued(lock);
    trace_.clear();
    mode_ = Mode::kRecording;
  }
  pos_ = 0;
  if (mode_ == Mode::kReplay) IssueWindow(lock);
}

void PrefetchScheduler::CancelQueued(std::unique_lock<std::mutex>& /*lock*/) {
  stats_.cancelled += queue_.size();
  queue_.clear();
  queued_.clear();
  host_only_.clear();
}

void PrefetchScheduler::Access(uint64_t id, std::unique_lock<std::mutex>& lock) {
  ++cursor_;
  if (mode_ == Mode::kRecording) {
    recording_.push_back(id);
    return;
  }
  if (pos_ < trace_.size() && trace_[pos_] == id) {
    ++pos_;
    IssueWindow(lock);
    return;
  }
  // The order changed: drop the trace and its queued predictions, record this step afresh
  // (the part of the step already seen matched the trace).
  ++stats_.trace_invalidations;
  CancelQueued(lock);
  recording_.assign(trace_.begin(), trace_.begin() + static_cast<long>(pos_));
  recording_.push_back(id);
  trace_.clear();
  pos_ = 0;
  mode_ = Mode::kRecording;
}

void PrefetchScheduler::IssueWindow(std::unique_lock<std::mutex>& /*lock*/) {
  if (trace_.empty() || depth_ == 0 || stop_) return;
  const size_t n = trace_.size();
  bool added = false;
  std::unordered_set<uint64_t> seen;
  const size_t dev = static_cast<size_t>(depth_);
  const size_t total = dev + (target_ == Tier::kHost ? 0 : static_cast<size_t>(HostDepthLocked()));
  for (size_t k = 0; k < n && seen.size() < total; ++k) {
    const uint64_t id = trace_[(pos_ + k) % n];
    if (!seen.insert(id).second) continue;
    const bool to_host = seen.size() > dev;  // beyond the device window: disk -> host only
    if (queued_.count(id)) {
      if (!to_host) host_only_.erase(id);  // now in the device window: a queued host read goes all the way
      continue;
    }
    if (inflight_.count(id)) continue;
    try {
      if (store_->HasValidCopy(id, target_)) continue;
      if (to_host && store_->HasValidCopy(id, Tier::kHost)) continue;
    } catch (const store::StoreError&) {
      continue;  // a block of the trace was freed since: nothing to prefetch
    }
    const uint64_t due = cursor_ + k;
    queue_.emplace(due, id);
    queued_.emplace(id, due);
    if (to_host) host_only_.insert(id);
    ++stats_.issued;
    added = true;
  }
  // Keep-hints: sooner-needed blocks get higher priority (evicted last); others drop back to 0.
  int prio = static_cast<int>(seen.size());
  std::vector<std::pair<uint64_t, int>> hints;
  for (size_t k = 0, got = 0; k < n && got < seen.size(); ++k) {
    const uint64_t id = trace_[(pos_ + k) % n];
    bool first = true;
    for (auto& h : hints) first = first && h.first != id;
    if (!first) continue;
    hints.emplace_back(id, prio--);
    ++got;
  }
  for (uint64_t id : hinted_) {
    if (!seen.count(id)) hints.emplace_back(id, 0);
  }
  hinted_ = std::move(seen);
  for (auto& h : hints) {
    try {
      store_->SetPriority(h.first, h.second);
    } catch (const store::StoreError&) {
      // freed block: nothing to hint
    }
  }
  if (added) work_cv_.notify_all();
}

void PrefetchScheduler::Touch(const std::vector<uint64_t>& ids) {
  std::unique_lock<std::mutex> lock(mu_);
  for (uint64_t id : ids) Access(id, lock);
}

void PrefetchScheduler::Acquire(const std::vector<uint64_t>& ids, bool record) {
  for (size_t k = 0; k < ids.size(); ++k) {
    const uint64_t id = ids[k];
    bool was_pending = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto q = queued_.find(id);
      if (q != queued_.end()) {
        // Needed now: take it out of the queue and fetch it here.
        queue_.erase(q->second);
        queued_.erase(q);
        host_only_.erase(id);
        ++stats_.cancelled;
        was_pending = true;
      } else if (inflight_.count(id)) {
        was_pending = true;
      }
    }
    const bool hit = store_->HasValidCopy(id, target_);
    const uint64_t t0 = NowNs();
    try {
      store_->Pin(id, target_);  // waits for an in-flight copy, or fetches on demand
    } catch (...) {
      // All or nothing: unpin what this call pinned, so the caller can make room and retry.
      for (size_t j = 0; j < k; ++j) store_->Unpin(ids[j], target_);
      throw;
    }
    const uint64_t dt = NowNs() - t0;
    // Only now (the block is pinned) follow the trace and issue the next window, so the
    // prefetches cannot evict the block being acquired.
    std::unique_lock<std::mutex> lock(mu_);
    if (hit) {
      ++stats_.hits;
    } else {
      stats_.stall_ns += dt;
      if (was_pending) {
        ++stats_.late;
      } else {
        ++stats_.misses;
      }
    }
    if (record) Access(id, lock);
  }
}

void PrefetchScheduler::Release(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) store_->Unpin(id, target_);
}

std::vector<uint64_t> PrefetchScheduler::Predict(size_t n) const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<uint64_t> out;
  if (mode_ != Mode::kReplay || trace_.empty()) return out;
  for (size_t k = 0; k < n; ++k) out.push_back(trace_[(pos_ + k) % trace_.size()]);
  return out;
}

std::vector<uint64_t> PrefetchScheduler::Trace() const {
  std::lock_guard<std::mutex> g(mu_);
  return trace_;
}

size_t PrefetchScheduler::Position() const {
  std::lock_guard<std::mutex> g(mu_);
  return pos_;
}

void PrefetchScheduler::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && inflight_.empty(); });
}

PrefetchStats PrefetchScheduler::Stats() const {
  std::lock_guard<std::mutex> g(mu_);
  PrefetchStats s = stats_;
  s.trace_valid = mode_ == Mode::kReplay && !trace_.empty();
  s.trace_length = trace_.size();
  return s;
}

void PrefetchScheduler::ResetStats() {
  std::lock_guard<std::mutex> g(mu_);
  const uint64_t steps = stats_.steps, inv = stats_.trace_invalidations;
  stats_ = PrefetchStats();
  stats_.steps = steps;
  stats_.trace_invalidations = inv;
}

void PrefetchScheduler::WorkerLoop() {
  MakeBackgroundThread("mshyper-io", worker_nice_);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Idle workers do write-behind: dirty host blocks go to disk in the background so that
    // evicting them later (on the consumer's thread) needs no I/O.
    while (!stop_ && queue_.empty()) {
      if (write_behind_ &&
          work_cv_.wait_for(lock, std::chrono::milliseconds(2)) == std::cv_status::timeout &&
          queue_.empty() && !stop_) {
        lock.unlock();
        size_t n = 0;
        try {
          n = store_->WriteBack(1);
        } catch (const std::exception&) {
        }
        lock.lock();
        stats_.written_back += n;
        if (n == 0) work_cv_.wait_for(lock, std::chrono::milliseconds(20));
      } else if (!write_behind_) {
        work_cv_.wait(lock);
      }
    }
    if (stop_) return;
    std::vector<uint64_t> batch, to_target, to_host;
    while (!queue_.empty() && static_cast<int>(batch.size()) < max_batch_) {
      auto it = queue_.begin();
      batch.push_back(it->second);
      (host_only_.erase(it->second) != 0 ? to_host : to_target).push_back(it->second);
      queued_.erase(it->second);
      inflight_.insert(it->second);
      queue_.erase(it);
    }
    lock.unlock();
    std::string err;
    bool failed = false;
    try {
      if (!to_target.empty()) store_->Fetch(to_target, target_);
      if (!to_host.empty()) store_->Fetch(to_host, Tier::kHost);
    } catch (const std::exception& e) {
      failed = true;
      err = e.what();
    }
    lock.lock();
    for (uint64_t id : batch) inflight_.erase(id);
    if (failed) {
      stats_.dropped += batch.size();
      stats_.last_error = err;
    } else {
      stats_.completed += batch.size();
    }
    if (queue_.empty() && inflight_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace mshyper::prefetch
