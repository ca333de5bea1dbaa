#pragma once
// Marks the calling thread as background work of the offload runtime: a name profilers show and
// a lower CPU priority, so that on a machine where the compute and the offload share the cores
// (CPU simulation) the compute threads are not preempted by transfers and host updates.
#include <string>

namespace mshyper::prefetch {

// The highest nice value Linux accepts (lowest priority).
constexpr int kMaxNice = 19;

// Names the calling thread (first 15 characters) and raises its nice value to `nice` (0..19;
// never lowers it: that needs privileges). Linux only; elsewhere a no-op. Throws
// std::invalid_argument for a nice value outside 0..19.
void MakeBackgroundThread(const std::string& name, int nice);

// The calling thread's nice value (Linux; 0 elsewhere).
int CurrentThreadNice();

}  // namespace mshyper::prefetch
