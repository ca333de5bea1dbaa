#include "prefetch/background_thread.h"

#include <stdexcept>

#ifdef __linux__
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace mshyper::prefetch {

void MakeBackgroundThread(const std::string& name, int nice) {
  if (nice < 0 || nice > kMaxNice) {
    throw std::invalid_argument("worker_nice must be in 0..19, got " + std::to_string(nice));
  }
#ifdef __linux__
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  // On Linux a nice value set through the thread id applies to that thread only.
  if (nice > CurrentThreadNice()) {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
  }
#else
  (void)name;
#endif
}

int CurrentThreadNice() {
#ifdef __linux__
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  return errno == 0 ? nice : 0;
#else
  return 0;
#endif
}

}  // namespace mshyper::prefetch
