// CPU cost of the transport's hot path, on one thread (so the figures are thread CPU time, not
// wall time, and hardly move with the machine's load): built from two trees by
// benchmarks/bench_shm_hot_path.py, which compares them.
//   ring_4k     a 4 KB message through an in-process channel: StepSend, then StepRecv
//   sendrecv_64 Communicator::Send of 8 float64 to rank 1, then rank 1's Recv (header included)
// Prints one line: `ring_4k <ns per message> sendrecv_64 <ns per message>`.
//
// usage: comm_hot_path [messages=200000]
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/transport.h"

using namespace mshyper::comm;

namespace {

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 200000;
  auto hub = std::make_shared<InProcHub>(2, 64 << 10);
  auto t0 = std::make_shared<InProcTransport>(hub, 0), t1 = std::make_shared<InProcTransport>(hub, 1);
  std::vector<char> src(4096, 1), dst(4096);
  double start = ThreadSeconds();
  for (long i = 0; i < n; ++i) {
    Xfer s(1, src.data(), src.size()), r(0, dst.data(), dst.size());
    while (!s.complete()) t0->StepSend(s);
    while (!r.complete()) t1->StepRecv(r);
  }
  const double ring = (ThreadSeconds() - start) / static_cast<double>(n) * 1e9;
  const TransportParams params{2e-6, 2e-10, 2.5e-10};
  Communicator c0(t0, {0, 1}, nullptr, {}, params), c1(t1, {0, 1}, nullptr, {}, params);
  std::vector<double> a(8, 1.0), b(8);
  start = ThreadSeconds();
  for (long i = 0; i < n; ++i) {
    c0.Send(a.data(), a.size(), DType::kFloat64, 1);
    c1.Recv(b.data(), b.size(), DType::kFloat64, 0);
  }
  const double sendrecv = (ThreadSeconds() - start) / static_cast<double>(n) * 1e9;
  if (b[7] != 1.0) return 1;
  std::printf("ring_4k %.1f sendrecv_64 %.1f\n", ring, sendrecv);
  return 0;
}
