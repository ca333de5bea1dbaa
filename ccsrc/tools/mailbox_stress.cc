// Concurrency stress test of the kernel fences and tensor mailboxes (built by `make tsan` with
// -fsanitize=thread; also runs without it). Producer threads (as MindSpore's kernels would)
// deliver payloads and signal fences; consumer threads (as the offload's updater threads would)
// take each payload and wait for each fence; a third thread abandons some mailboxes before their
// delivery. Every payload must arrive whole, exactly once, and an abandoned one never; at the
// end nothing is left in the mailbox and fence tables. Waits with huge, infinite, zero, negative
// and NaN timeouts must behave (under UBSan: convert without overflow).
//
// usage: mailbox_stress [ids_per_producer=2000]
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "aot/kernel_fence.h"
#include "aot/tensor_mailbox.h"

namespace aot = mshyper::aot;

namespace {

constexpr int kProducers = 2;
constexpr size_t kWords = 64;

std::vector<uint64_t> Payload(uint64_t id) { return std::vector<uint64_t>(kWords, id * 2654435761u); }

}  // namespace

int main(int argc, char** argv) {
  const int per = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int n = per * kProducers;
  std::vector<uint64_t> mail(n), fences(n);
  for (int i = 0; i < n; ++i) {
    mail[i] = aot::MailboxNewId();
    fences[i] = aot::FenceNewId();
  }
  // Every 7th mailbox is abandoned before anything is delivered to it.
  for (int i = 0; i < n; i += 7) aot::MailboxForget(mail[i]);

  std::atomic<int> wrong{0}, missing{0}, unexpected{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = p; i < n; i += kProducers) {
        const std::vector<uint64_t> data = Payload(mail[i]);
        aot::MailboxDeliver(mail[i], data.data(), data.size() * sizeof(uint64_t));
        aot::FenceSignal(fences[i]);
      }
    });
  }
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&, c] {
      std::vector<uint8_t> bytes;
      for (int i = c; i < n; i += 2) {
        if (!aot::FenceWait(fences[i], 30.0)) ++missing;
        if (i % 7 == 0) {
          if (aot::MailboxTake(mail[i], 0.0, &bytes)) ++unexpected;  // abandoned: never served
          continue;
        }
        if (!aot::MailboxTake(mail[i], 30.0, &bytes)) {
          ++missing;
          continue;
        }
        const std::vector<uint64_t> want = Payload(mail[i]);
        if (bytes.size() != want.size() * sizeof(uint64_t) ||
            std::memcmp(bytes.data(), want.data(), bytes.size()) != 0) {
          ++wrong;
        }
        if (aot::MailboxTake(mail[i], 0.0, &bytes)) ++unexpected;  // served once only
      }
    });
  }
  for (auto& t : threads) t.join();
  // Any timeout converts without overflow: huge or infinite ones wait for the delivery, zero,
  // negative or NaN ones poll.
  for (double timeout : {1e30, HUGE_VAL}) {
    const uint64_t id = aot::MailboxNewId();
    std::thread late([id] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const std::vector<uint64_t> data = Payload(id);
      aot::MailboxDeliver(id, data.data(), data.size() * sizeof(uint64_t));
    });
    std::vector<uint8_t> bytes;
    if (!aot::MailboxTake(id, timeout, &bytes)) ++missing;
    late.join();
  }
  for (double timeout : {0.0, -1.0, -1e30, -HUGE_VAL, std::nan("")}) {
    const uint64_t id = aot::FenceNewId();
    if (aot::FenceWait(id, timeout)) ++unexpected;
    aot::FenceSignal(id);
    if (!aot::FenceWait(id, timeout)) ++missing;
  }
  // Everything taken, waited for or dropped: nothing is left behind.
  const size_t left = aot::MailboxPending() + aot::FencePending();
  std::printf("ids=%d wrong=%d missing=%d unexpected=%d left=%zu\n", n, wrong.load(), missing.load(),
              unexpected.load(), left);
  if (wrong || missing || unexpected || left) return 1;
  std::printf("MAILBOX STRESS OK\n");
  return 0;
}
