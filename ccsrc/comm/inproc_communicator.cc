#include "comm/inproc_communicator.h"

#include <exception>
#include <string>
#include <thread>

namespace mshyper::comm {

InProcCommunicator::InProcCommunicator(int n, std::shared_ptr<const Topology> topology, std::vector<int> devices,
                         size_t channel_bytes, double timeout, TransportParams params)
    : timeout_(timeout) {
  if (n <= 0) throw CommError("in-process group needs at least one rank, got " + std::to_string(n));
  hub_ = std::make_shared<InProcHub>(n, channel_bytes);
  agg_hub_ = std::make_shared<InProcHub>(n, channel_bytes);
  std::vector<int> members;
  for (int r = 0; r < n; ++r) members.push_back(r);
  for (int r = 0; r < n; ++r) {
    auto t = std::make_shared<InProcTransport>(hub_, r);
    t->set_timeout(timeout);
    comms_.push_back(std::make_shared<Communicator>(t, members, topology, devices, params));
    auto ta = std::make_shared<InProcTransport>(agg_hub_, r);
    ta->set_timeout(timeout);
    agg_comms_.push_back(std::make_shared<Communicator>(ta, members, topology, devices, params));
  }
}

InProcCommunicator::~InProcCommunicator() {
  CloseAggregators();
  StopWorkers();
}

void InProcCommunicator::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    quit_ = true;
  }
  pool_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void InProcCommunicator::Worker(int rank) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(pool_mu_);
  while (true) {
    pool_cv_.wait(lock, [&] { return quit_ || generation_ != seen; });
    if (quit_) return;
    seen = generation_;
    const std::function<void(int)>* job = job_;
    lock.unlock();
    (*job)(rank);
    lock.lock();
    if (--remaining_ == 0) done_cv_.notify_all();
  }
}

void InProcCommunicator::Run(const std::function<void(int)>& fn) {
  const int n = size();
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::string> messages(n);
  auto body = [&](int r) {
    try {
      fn(r);
    } catch (const std::exception& e) {
      errors[r] = std::current_exception();
      messages[r] = e.what();
      if (dynamic_cast<const CommMismatch*>(&e) == nullptr) {
        hub_->set_aborted("rank " + std::to_string(r) + " failed: " + e.what());
      }
    } catch (...) {
      errors[r] = std::current_exception();
      messages[r] = "unknown error";
      hub_->set_aborted("rank " + std::to_string(r) + " failed");
    }
  };
  std::lock_guard<std::mutex> run_lock(run_mu_);
  if (n == 1) {
    body(0);
  } else {
    std::function<void(int)> job = body;
    std::unique_lock<std::mutex> lock(pool_mu_);
    if (workers_.empty()) {
      for (int r = 0; r < n; ++r) workers_.emplace_back([this, r] { Worker(r); });
    }
    job_ = &job;
    remaining_ = n;
    ++generation_;
    pool_cv_.notify_all();
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
    job_ = nullptr;
  }
  std::exception_ptr root, any;
  for (int r = 0; r < n; ++r) {
    if (!errors[r]) continue;
    if (!any) any = errors[r];
    if (!root && messages[r].find("group was aborted") == std::string::npos) root = errors[r];
  }
  std::string why;
  if (hub_->aborted(&why)) hub_->reset_abort();  // every thread joined: channels can be reset
  if (root) std::rethrow_exception(root);
  if (any) std::rethrow_exception(any);
}

void InProcCommunicator::EnableAggregation(size_t packet_bytes, double max_delay_s) {
  CloseAggregators();
  for (auto& c : agg_comms_) {
    aggs_.push_back(std::make_shared<Aggregator>(std::make_shared<CommunicatorBackend>(c), packet_bytes, max_delay_s, timeout_));
  }
}

Aggregator& InProcCommunicator::aggregator(int rank) {
  if (aggs_.empty()) throw CommError("in-process group: aggregation is not enabled");
  return *aggs_.at(rank);
}

void InProcCommunicator::FlushAll() {
  for (auto& a : aggs_) a->RequestFlush();
  for (auto& a : aggs_) a->WaitFlushed();
}

void InProcCommunicator::CloseAggregators() {
  for (auto& a : aggs_) a->Close();
  aggs_.clear();
  std::string why;
  if (agg_hub_->aborted(&why)) agg_hub_->reset_abort();  // every executor joined: channels can be reset
}

}  // namespace mshyper::comm
