#include "kernels/kernel_fence.h"

#include "kernels/tensor_mailbox.h"

namespace mshyper::kernels {
namespace {

MailboxTable g_fences;  // a fence is a mailbox delivered without bytes when the kernel runs

}  // namespace

uint64_t FenceNewId() { return g_fences.NewId(); }

void FenceSignal(uint64_t id) { g_fences.Deliver(id, nullptr, 0); }

bool FencePoll(uint64_t id) { return g_fences.Take(id, 0.0, nullptr); }

bool FenceWait(uint64_t id, double timeout_s) { return g_fences.Take(id, timeout_s, nullptr); }

void FenceForget(uint64_t id) { g_fences.Forget(id); }

size_t FencePending() { return g_fences.Pending(); }

}  // namespace mshyper::kernels
