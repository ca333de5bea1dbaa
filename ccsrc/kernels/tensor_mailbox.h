// Tensor mailboxes: a tensor's bytes handed from MindSpore's kernel stream to a host thread
// without synchronizing the stream. `MsHyperCopyOut(x, id)` (an aot kernel, see
// store_kernels.cc) copies x into mailbox `id` when MindSpore executes it; a host thread waits for
// the delivery on a condition variable. `Tensor.asnumpy()` would instead wait for every kernel
// launched so far, from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mshyper::kernels {

// Ids, each delivered once (with bytes) by one thread and taken once by another, which may wait.
// Also the mechanism of the kernel fences (kernel_fence.cc: deliveries without bytes).
class MailboxTable {
 public:
  // A fresh id (never 0, never reused by this table).
  uint64_t NewId();
  // Stores a copy of `n` bytes at `data` as `id`'s content and wakes its waiter; dropped if `id`
  // was forgotten.
  void Deliver(uint64_t id, const void* data, size_t n);
  // Waits up to `timeout_s` seconds for `id` (<= 0 or NaN: no wait; huge or inf: clamped to ~3
  // years); true (content moved to `out` if not null, `id` forgotten) if it was delivered.
  bool Take(uint64_t id, double timeout_s, std::vector<uint8_t>* out);
  // Forgets `id` whether or not it was delivered (its owner stopped waiting).
  void Forget(uint64_t id);
  // Ids delivered but not taken, plus those forgotten before their delivery.
  size_t Pending();

 private:
  uint64_t next_id_ = 1;  // guarded by mu_
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<uint64_t, std::vector<uint8_t>> delivered_;  // guarded by mu_
  std::unordered_set<uint64_t> forgotten_;  // abandoned before delivery; guarded by mu_
};

// The process-wide table of tensor copies.
uint64_t MailboxNewId();
void MailboxDeliver(uint64_t id, const void* data, size_t n);
bool MailboxTake(uint64_t id, double timeout_s, std::vector<uint8_t>* out);
void MailboxForget(uint64_t id);
size_t MailboxPending();

}  // namespace mshyper::kernels
