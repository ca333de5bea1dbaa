#pragma once
// Wall time during which at least one activity was in progress (the union of their intervals),
// e.g. the time the store was moving blocks between tiers on any thread. Thread-safe.
#include <chrono>
#include <cstdint>
#include <mutex>

namespace mshyper::store {

class BusyClock {
 public:
  // An activity starts / ends (each Begin needs one End).
  void Begin() {
    std::lock_guard<std::mutex> g(mu_);
    if (active_++ == 0) start_ = Clock::now();
  }
  void End() {
    std::lock_guard<std::mutex> g(mu_);
    if (--active_ == 0) busy_ns_ += Since(start_);
  }

  // Nanoseconds of busy time so far (an interval in progress counts up to now).
  uint64_t BusyNs() const {
    std::lock_guard<std::mutex> g(mu_);
    uint64_t ns = busy_ns_;
    if (active_ > 0) ns += Since(start_);
    return ns;
  }

 private:
  using Clock = std::chrono::steady_clock;

  static uint64_t Since(Clock::time_point t) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
  }

  mutable std::mutex mu_;
  int active_ = 0;
  Clock::time_point start_;
  uint64_t busy_ns_ = 0;
};

}  // namespace mshyper::store
