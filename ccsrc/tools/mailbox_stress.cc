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

#include "kernels/kernel_fence.h"
#include "kernels/tensor_mailbox.h"

namespace kernels = mshyper::kernels;

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
    mail[i] = kernels::MailboxNewId();
    fences[i] = kernels::FenceNewId();
  }
  // Every 7th mailbox is abandoned before anything is delivered to it.
  for (int i = 0; i < n; i += 7) kernels::MailboxForget(mail[i]);

  std::atomic<int> wrong{0}, missing{0}, unexpected{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = p; i < n; i += kProducers) {
        const std::vector<uint64_t> data = Payload(mail[i]);
        kernels::MailboxDeliver(mail[i], data.data(), data.size() * sizeof(uint64_t));
        kernels::FenceSignal(fences[i]);
      }
    });
  }
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&, c] {
      std::vector<uint8_t> bytes;
      for (int i = c; i < n; i += 2) {
        if (!kernels::FenceWait(fences[i], 30.0)) ++missing;
        if (i % 7 == 0) {
          if (kernels::MailboxTake(mail[i], 0.0, &bytes)) ++unexpected;  // abandoned: never served
          continue;
        }
        if (!kernels::MailboxTake(mail[i], 30.0, &bytes)) {
          ++missing;
          continue;
        }
        const std::vector<uint64_t> want = Payload(mail[i]);
        if (bytes.size() != want.size() * sizeof(uint64_t) ||
            std::memcmp(bytes.data(), want.data(), bytes.size()) != 0) {
          ++wrong;
        }
        if (kernels::MailboxTake(mail[i], 0.0, &bytes)) ++unexpected;  // served once only
      }
    });
  }
  for (auto& t : threads) t.join();
  // Any timeout converts without overflow: huge or infinite ones wait for the delivery, zero,
  // negative or NaN ones poll.
  for (double timeout : {1e30, HUGE_VAL}) {
    const uint64_t id = kernels::MailboxNewId();
    std::thread late([id] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const std::vector<uint64_t> data = Payload(id);
      kernels::MailboxDeliver(id, data.data(), data.size() * sizeof(uint64_t));
    });
    std::vector<uint8_t> bytes;
    if (!kernels::MailboxTake(id, timeout, &bytes)) ++missing;
    late.join();
  }
  for (double timeout : {0.0, -1.0, -1e30, -HUGE_VAL, std::nan("")}) {
    const uint64_t id = kernels::FenceNewId();
    if (kernels::FenceWait(id, timeout)) ++unexpected;
    kernels::FenceSignal(id);
    if (!kernels::FenceWait(id, timeout)) ++missing;
  }
  // Everything taken, waited for or dropped: nothing is left behind.
  const size_t left = kernels::MailboxPending() + kernels::FencePending();
  std::printf("ids=%d wrong=%d missing=%d unexpected=%d left=%zu\n", n, wrong.load(), missing.load(),
              unexpected.load(), left);
  if (wrong || missing || unexpected || left) return 1;
  std::printf("MAILBOX STRESS OK\n");
  return 0;
}
