#include "aot/kernel_fence.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_set>

namespace mshyper::aot {
namespace {

std::atomic<uint64_t> g_next_id{1};
std::mutex g_mu;
std::condition_variable g_cv;
std::unordered_set<uint64_t> g_passed;    // guarded by g_mu
std::unordered_set<uint64_t> g_forgotten;  // abandoned before they passed; guarded by g_mu

}  // namespace

uint64_t FenceNewId() { return g_next_id.fetch_add(1, std::memory_order_relaxed); }

void FenceSignal(uint64_t id) {
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (g_forgotten.erase(id) != 0) return;
    g_passed.insert(id);
  }
  g_cv.notify_all();
}

bool FencePoll(uint64_t id) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_passed.erase(id) != 0;
}

bool FenceWait(uint64_t id, double timeout_s) {
  std::unique_lock<std::mutex> lock(g_mu);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  if (!g_cv.wait_until(lock, deadline, [&] { return g_passed.count(id) != 0; })) return false;
  g_passed.erase(id);
  return true;
}

void FenceForget(uint64_t id) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_passed.erase(id) == 0) g_forgotten.insert(id);
}

size_t FencePending() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_passed.size() + g_forgotten.size();
}

}  // namespace mshyper::aot
