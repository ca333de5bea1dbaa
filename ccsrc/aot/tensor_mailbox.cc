#include "aot/tensor_mailbox.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace mshyper::aot {
namespace {

std::atomic<uint64_t> g_next_id{1};
std::mutex g_mu;
std::condition_variable g_cv;
std::unordered_map<uint64_t, std::vector<uint8_t>> g_delivered;  // guarded by g_mu
std::unordered_set<uint64_t> g_forgotten;  // abandoned before delivery; guarded by g_mu

}  // namespace

uint64_t MailboxNewId() { return g_next_id.fetch_add(1, std::memory_order_relaxed); }

void MailboxDeliver(uint64_t id, const void* data, size_t n) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  std::vector<uint8_t> copy(bytes, bytes + n);  // copied outside the lock
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (g_forgotten.erase(id) != 0) return;
    g_delivered[id] = std::move(copy);
  }
  g_cv.notify_all();
}

bool MailboxTake(uint64_t id, double timeout_s, std::vector<uint8_t>* out) {
  std::unique_lock<std::mutex> lock(g_mu);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  if (!g_cv.wait_until(lock, deadline, [&] { return g_delivered.count(id) != 0; })) return false;
  auto it = g_delivered.find(id);
  *out = std::move(it->second);
  g_delivered.erase(it);
  return true;
}

void MailboxForget(uint64_t id) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_delivered.erase(id) == 0) g_forgotten.insert(id);
}

size_t MailboxPending() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_delivered.size() + g_forgotten.size();
}

}  // namespace mshyper::aot
