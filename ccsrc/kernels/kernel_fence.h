// Kernel fences: a point in MindSpore's kernel stream that the host can wait for without
// spinning. `MsHyperFence(id)` (an aot kernel, see store_kernels.cc) marks fence `id` as passed
// when MindSpore executes it; PyNative executes the kernels it launches in launch order, so every
// kernel launched before the fence has run by then. `_pynative_executor.sync()` waits for the
// same thing but busy-waits on the calling thread (AsyncRQueue::Wait), taking a core away from
// the kernels it waits for on a small CPU machine; a fence wait blocks on a condition variable.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mshyper::kernels {

// A fresh fence id (never 0, never reused in the process).
uint64_t FenceNewId();
// Marks fence `id` as passed and wakes its waiters (called by the kernel).
void FenceSignal(uint64_t id);
// True if fence `id` has passed; forgets it then (each fence is consumed once).
bool FencePoll(uint64_t id);
// Waits up to `timeout_s` seconds for fence `id`; true (and forgotten) if it passed.
bool FenceWait(uint64_t id, double timeout_s);
// Forgets fence `id` whether or not it has passed (a fence abandoned by its owner).
void FenceForget(uint64_t id);
// Fences that passed and were not consumed, plus those forgotten before they passed.
size_t FencePending();

}  // namespace mshyper::kernels
