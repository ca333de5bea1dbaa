#include "kernels/tensor_mailbox.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace mshyper::kernels {

namespace {

// `seconds` from now as a deadline that cannot overflow the clock: NaN and negative mean now,
// anything above ~3 years (inf included) ~3 years from now.
std::chrono::steady_clock::time_point DeadlineAfter(double seconds) {
  constexpr double kMaxSeconds = 1e8;
  const double s = seconds > 0 ? std::min(seconds, kMaxSeconds) : 0.0;
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

uint64_t MailboxTable::NewId() {
  std::lock_guard<std::mutex> g(mu_);
  return next_id_++;
}

void MailboxTable::Deliver(uint64_t id, const void* data, size_t n) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  std::vector<uint8_t> copy(bytes, bytes + n);  // copied outside the lock
  {
    std::lock_guard<std::mutex> g(mu_);
    if (forgotten_.erase(id) != 0) return;
    delivered_[id] = std::move(copy);
  }
  cv_.notify_all();
}

bool MailboxTable::Take(uint64_t id, double timeout_s, std::vector<uint8_t>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, DeadlineAfter(timeout_s), [&] { return delivered_.count(id) != 0; })) return false;
  auto it = delivered_.find(id);
  if (out != nullptr) *out = std::move(it->second);
  delivered_.erase(it);
  return true;
}

void MailboxTable::Forget(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  if (delivered_.erase(id) == 0) forgotten_.insert(id);
}

size_t MailboxTable::Pending() {
  std::lock_guard<std::mutex> g(mu_);
  return delivered_.size() + forgotten_.size();
}

namespace {
MailboxTable g_tensors;
}  // namespace

uint64_t MailboxNewId() { return g_tensors.NewId(); }
void MailboxDeliver(uint64_t id, const void* data, size_t n) { g_tensors.Deliver(id, data, n); }
bool MailboxTake(uint64_t id, double timeout_s, std::vector<uint8_t>* out) {
  return g_tensors.Take(id, timeout_s, out);
}
void MailboxForget(uint64_t id) { g_tensors.Forget(id); }
size_t MailboxPending() { return g_tensors.Pending(); }

}  // namespace mshyper::kernels
