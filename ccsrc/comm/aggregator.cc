#include "comm/aggregator.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>

namespace mshyper::comm {

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The digest of the requests [first, last).
template <class It>
QueueDigest Digest(It first, It last) {
  uint64_t h = 1469598103934665603ULL;
  QueueDigest d;
  for (It it = first; it != last; ++it) {
    const Request& r = **it;
    for (uint64_t v : {static_cast<uint64_t>(r.count()), static_cast<uint64_t>(r.dtype()),
                       static_cast<uint64_t>(r.op())}) {
      h = (h ^ v) * 1099511628211ULL;
    }
    d.bytes += static_cast<int64_t>(r.bytes());
    ++d.length;
  }
  d.hash = static_cast<int64_t>(h >> 12);  // 52 bits: exact through a float64 transport
  return d;
}

// `maxed` = MAX over ranks of {hash, -hash, bytes, -bytes}: whether every hash equals `mine`'s.
Agreement FromMaxed(int64_t min_length, int64_t max_length, const int64_t* maxed, const QueueDigest& mine) {
  return {min_length, max_length, maxed[0] == mine.hash && -maxed[1] == mine.hash, -maxed[3], maxed[2]};
}

CommMismatch Mismatch(const Agreement& a, const QueueDigest& mine) {
  std::ostringstream os;
  os << "aggregated all_reduce requests differ across ranks: this rank's batch of " << mine.length
     << " requests holds " << mine.bytes << " bytes, the ranks hold between " << a.min_bytes << " and "
     << a.max_bytes << " bytes (request sizes, dtypes or ops differ)";
  return CommMismatch(os.str());
}

}  // namespace

void Request::Finish(int error_kind, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  error_kind_ = error_kind;
  error_ = error;
  cv_.notify_all();
}

bool Request::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Request::Wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout_s < 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, WaitDuration(timeout_s), [&] { return done_; })) {
    throw CommTimeout("aggregated all_reduce request not completed within " + std::to_string(timeout_s) +
                      " s (did every rank submit it, and flush?)");
  }
  switch (error_kind_) {
    case 0: return;
    case 2: throw CommTimeout(error_);
    case 3: throw CommMismatch(error_);
    default: throw CommError(error_);
  }
}

Agreement CommunicatorBackend::Negotiate(const QueueDigest& mine) {
  Agreement a{mine.length, mine.length, true, mine.bytes, mine.bytes};
  for (const QueueDigest& d : comm_->GatherQueueDigests(mine)) {
    a.min_length = std::min(a.min_length, d.length);
    a.max_length = std::max(a.max_length, d.length);
    a.same_hash = a.same_hash && d.hash == mine.hash;
    a.min_bytes = std::min(a.min_bytes, d.bytes);
    a.max_bytes = std::max(a.max_bytes, d.bytes);
  }
  return a;
}

Aggregator::Aggregator(std::shared_ptr<PacketBackend> backend, size_t packet_bytes, double max_delay_s,
                       double flush_timeout_s)
    : backend_(std::move(backend)), packet_bytes_(packet_bytes), max_delay_s_(max_delay_s),
      flush_timeout_s_(flush_timeout_s) {
  CheckTimeout("aggregator: flush timeout", flush_timeout_s_);
  if (packet_bytes_ < 8) throw CommError("aggregator: packet_bytes must be >= 8, got " + std::to_string(packet_bytes));
  if (!(max_delay_s_ >= 0)) {
    throw CommError("aggregator: max_delay must be >= 0 seconds, got " + std::to_string(max_delay_s));
  }
  thread_ = std::thread([this] { Loop(); });
}

Aggregator::~Aggregator() { Close(); }

void Aggregator::Close() {
  uint64_t unfinished = 0;
  std::thread executor;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unfinished = stop_ ? 0 : submitted_ - finished_;
    stop_ = true;
    executor = std::move(thread_);  // joined by exactly one caller
    cv_.notify_all();
  }
  if (unfinished > 0) {
    backend_->Abort("an aggregator was closed with " + std::to_string(unfinished) + " requests unfinished");
  }
  if (executor.joinable()) executor.join();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return !running_; });  // a batch a flusher runs inline
}

std::shared_ptr<Request> Aggregator::Submit(const void* data, size_t count, DType dtype, ReduceOp op) {
  return SubmitMany({RequestSpec{data, count, dtype}}, op)[0];
}

std::vector<std::shared_ptr<Request>> Aggregator::SubmitMany(const std::vector<RequestSpec>& specs, ReduceOp op) {
  size_t total = 0;
  for (const auto& s : specs) total += RoundUp8(s.count * DTypeSize(s.dtype));
  std::shared_ptr<char[]> block(new char[total]);
  std::vector<std::shared_ptr<Request>> reqs;
  reqs.reserve(specs.size());
  const double now = Now();
  size_t off = 0;
  for (const auto& s : specs) {
    const size_t n = s.count * DTypeSize(s.dtype);
    if (n > 0) std::memcpy(block.get() + off, s.data, n);
    reqs.push_back(std::make_shared<Request>(block, block.get() + off, s.count, s.dtype, op));
    reqs.back()->submit_time_ = now;
    off += RoundUp8(n);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) throw CommError("aggregator is closed: no request can be submitted after close()");
  if (broken_kind_ != 0) {
    for (auto& r : reqs) r->Finish(broken_kind_, "the group failed earlier: " + broken_);
    return reqs;
  }
  const bool was_empty = queue_.empty();
  for (auto& r : reqs) {
    queue_.push_back(r);
    queued_bytes_ += r->bytes();
  }
  submitted_ += reqs.size();
  stats_.requests += reqs.size();
  if (queued_bytes_ >= packet_bytes_ || (was_empty && !queue_.empty())) cv_.notify_all();
  return reqs;
}

void Aggregator::Flush(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (submitted_ > flush_target_) flush_target_ = submitted_;
  WaitFinished(lock, flush_target_, timeout_s, /*run_inline=*/true, "flush");
}

void Aggregator::RequestFlush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (submitted_ > flush_target_) flush_target_ = submitted_;
  cv_.notify_all();
}

void Aggregator::WaitFlushed(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitFinished(lock, flush_target_, timeout_s, false, "flush");
}

void Aggregator::WaitFinished(std::unique_lock<std::mutex>& lock, uint64_t target, double timeout_s, bool run_inline,
                              const char* what) {
  const double limit = timeout_s < 0 ? flush_timeout_s_ : timeout_s;
  auto deadline = std::chrono::steady_clock::now() + WaitDuration(limit);
  uint64_t seen = finished_;
  while (finished_ < target && !stop_) {
    if (run_inline && !running_ && !queue_.empty()) {
      RunBatch(lock);  // on this thread: no hand-off to the executor and back
    } else if (done_cv_.wait_until(lock, deadline) == std::cv_status::timeout && finished_ == seen &&
               finished_ < target && !stop_) {
      throw CommTimeout("aggregator " + std::string(what) + ": " + std::to_string(target - finished_) +
                        " requests unfinished after " + std::to_string(limit) +
                        " s without progress (did every rank submit the same requests, and flush? is the "
                        "transport stalled?)");
    }
    if (finished_ != seen) {
      seen = finished_;
      deadline = std::chrono::steady_clock::now() + WaitDuration(limit);
    }
  }
}

AggregatorStats Aggregator::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Aggregator::Fail(std::vector<std::shared_ptr<Request>>& reqs, int kind, const std::string& why) {
  for (auto& r : reqs) r->Finish(kind, why);
}

void Aggregator::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (queue_.empty() || running_) {
      cv_.wait(lock);
      continue;
    }
    const bool full = queued_bytes_ >= packet_bytes_;
    const bool flushing = finished_ < flush_target_;
    const double age = Now() - queue_.front()->submit_time_;
    if (full || flushing || age >= max_delay_s_) {
      RunBatch(lock);
    } else {
      cv_.wait_for(lock, WaitDuration(max_delay_s_ - age));
    }
  }
  std::vector<std::shared_ptr<Request>> rest(queue_.begin(), queue_.end());
  queue_.clear();
  queued_bytes_ = 0;
  finished_ += rest.size();
  lock.unlock();
  Fail(rest, 1, "aggregator closed before the request was sent");
  done_cv_.notify_all();
}

void Aggregator::RunBatch(std::unique_lock<std::mutex>& lock) {
  running_ = true;
  const QueueDigest queued = Digest(queue_.begin(), queue_.end());
  lock.unlock();
  std::vector<std::shared_ptr<Request>> batch;
  bool negotiated = false;
  int kind = 0;
  std::string why;
  try {
    const Agreement a = backend_->Negotiate(queued);
    negotiated = true;
    const int64_t m = a.min_length;
    lock.lock();
    for (int64_t i = 0; i < m && !queue_.empty(); ++i) {
      batch.push_back(queue_.front());
      queued_bytes_ -= queue_.front()->bytes();
      queue_.pop_front();
    }
    ++stats_.batches;
    lock.unlock();
    if (a.max_length == m) {  // every rank sends its whole queue: the hashes compared are the batch's
      if (!a.same_hash) throw Mismatch(a, queued);
    } else {  // the hashes of the first m requests, in a second exchange
      const QueueDigest mine = Digest(batch.begin(), batch.end());
      auto maxed = std::make_shared<std::array<int64_t, 4>>(
          std::array<int64_t, 4>{mine.hash, -mine.hash, mine.bytes, -mine.bytes});
      backend_->AllReduce({maxed->data(), 4, DType::kInt64, ReduceOp::kMax, maxed, true});
      const Agreement first_m = FromMaxed(m, m, maxed->data(), mine);
      if (!first_m.same_hash) throw Mismatch(first_m, mine);
    }
    SendPackets(batch);
  } catch (const CommMismatch& e) {
    kind = 3;
    why = e.what();
  } catch (const CommTimeout& e) {
    kind = 2;
    why = e.what();
  } catch (const std::exception& e) {
    kind = 1;
    why = e.what();
  }
  std::vector<std::shared_ptr<Request>> failed;
  lock.lock();
  if (!negotiated) {  // the negotiation itself failed: so do the requests this rank offered in it
    for (int64_t i = 0; i < queued.length && !queue_.empty(); ++i) {
      batch.push_back(queue_.front());
      queued_bytes_ -= queue_.front()->bytes();
      queue_.pop_front();
    }
  }
  finished_ += batch.size();
  if (kind != 0) {
    for (auto& r : batch)
      if (!r->done()) failed.push_back(r);
    if (kind != 3) {  // the transport failed: the group is unusable, fail everything queued
      broken_kind_ = kind;
      broken_ = why;
      failed.insert(failed.end(), queue_.begin(), queue_.end());
      finished_ += queue_.size();
      queue_.clear();
      queued_bytes_ = 0;
    }
  }
  running_ = false;
  lock.unlock();
  Fail(failed, kind, why);
  lock.lock();
  done_cv_.notify_all();
  cv_.notify_all();
}

char* Aggregator::PacketSpace(size_t bytes) {
  if (!packet_ || packet_capacity_ < bytes || packet_.use_count() > 1) {
    packet_capacity_ = std::max(packet_capacity_, bytes);
    packet_.reset(new char[packet_capacity_]);
  }
  return packet_.get();
}

void Aggregator::SendPackets(std::vector<std::shared_ptr<Request>>& batch) {
  // Group by (dtype, op) in order of first appearance; pack up to packet_bytes; bypass large ones.
  std::vector<std::pair<int, std::vector<Request*>>> keys;
  std::map<int, size_t> index;
  for (auto& r : batch) {
    int key = static_cast<int>(r->dtype_) * 16 + static_cast<int>(r->op_);
    auto it = index.find(key);
    if (it == index.end()) {
      index[key] = keys.size();
      keys.push_back({key, {r.get()}});
    } else {
      keys[it->second].second.push_back(r.get());
    }
  }
  for (auto& [key, reqs] : keys) {
    DType dtype = reqs[0]->dtype_;
    ReduceOp op = reqs[0]->op_;
    const size_t esz = DTypeSize(dtype);
    std::vector<Request*> pending;
    size_t fill = 0;
    auto send_packet = [&]() {
      if (pending.empty()) return;
      // One all-reduce of `fill` bytes per packet on every rank; whether it runs in place (the
      // requests lie back to back) or on a packed copy is this rank's own business.
      bool in_place = true;
      for (size_t i = 1; i < pending.size() && in_place; ++i) {
        in_place = pending[i]->storage_ == pending[0]->storage_ &&
                   pending[i]->data_ == pending[i - 1]->data_ + pending[i - 1]->bytes();
      }
      if (in_place) {
        backend_->AllReduce({pending[0]->data_, fill / esz, dtype, op, pending[0]->storage_, true});
      } else {
        char* packet = PacketSpace(fill);
        size_t off = 0;
        for (Request* r : pending) {
          std::memcpy(packet + off, r->data_, r->bytes());
          off += r->bytes();
        }
        backend_->AllReduce({packet, fill / esz, dtype, op, packet_, true});
        off = 0;
        for (Request* r : pending) {
          std::memcpy(r->data_, packet + off, r->bytes());
          off += r->bytes();
        }
      }
      {  // counted before the waiters wake, so a caller that waited sees its packet counted
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.packets;
        if (in_place) ++stats_.in_place;
        stats_.bytes += fill;
      }
      for (Request* r : pending) r->Finish(0, "");
      pending.clear();
      fill = 0;
    };
    for (Request* r : reqs) {
      if (r->bytes() > packet_bytes_) {
        backend_->AllReduce({r->data_, r->count_, dtype, op, r->storage_, true});
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.bypassed;
          stats_.bytes += r->bytes();
        }
        r->Finish(0, "");
        continue;
      }
      if (fill + r->bytes() > packet_bytes_) send_packet();
      pending.push_back(r);
      fill += r->bytes();
    }
    send_packet();
  }
}

}  // namespace mshyper::comm
