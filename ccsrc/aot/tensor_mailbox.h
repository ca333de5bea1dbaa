// Tensor mailboxes: a tensor's bytes handed from MindSpore's kernel stream to a host thread
// without synchronizing the stream. `MsHyperCopyOut(x, id)` (an aot kernel, see
// store_kernels.cc) copies x into mailbox `id` when MindSpore executes it; a host thread waits for
// the delivery on a condition variable. `Tensor.asnumpy()` would instead wait for every kernel
// launched so far, from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mshyper::aot {

// A fresh mailbox id (never 0, never reused in the process).
uint64_t MailboxNewId();
// Stores a copy of `n` bytes at `data` as mailbox `id`'s content and wakes its waiter (the
// kernel); dropped if the mailbox was forgotten.
void MailboxDeliver(uint64_t id, const void* data, size_t n);
// Waits up to `timeout_s` seconds for mailbox `id`; true (content moved to `out`, mailbox
// forgotten) if it was delivered.
bool MailboxTake(uint64_t id, double timeout_s, std::vector<uint8_t>* out);
// Forgets mailbox `id` whether or not it was delivered (its owner stopped waiting).
void MailboxForget(uint64_t id);
// Mailboxes holding something no one has taken, plus those forgotten before their delivery.
size_t MailboxPending();

}  // namespace mshyper::aot
