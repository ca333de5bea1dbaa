// Stress test of the communication library, built by `make asan` (AddressSanitizer +
// UndefinedBehaviorSanitizer) and `make tsan` (ThreadSanitizer); also runs without them.
//  1. In-process group of 4 ranks: every collective and algorithm, exact int32 results.
//  2. Aggregators of that group: many small requests of mixed sizes, dtypes and ops from one
//     thread per rank, one by one and in batches, a third of the handles dropped at once; the
//     kept results must be exact.
//  3. Misuse under load: two submitter threads per rank at once (the order differs between
//     ranks, so a batch may fail with CommMismatch: never anything else), then a close with
//     requests pending (they fail with CommError).
//  4. Shared-memory group of 2 ranks on two threads: collectives and an aggregator.
//
// usage: comm_stress [rounds=10]
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/aggregator.h"
#include "comm/communicator.h"
#include "comm/inproc_communicator.h"
#include "comm/shm_transport.h"

using namespace mshyper::comm;

namespace {

constexpr int kRanks = 4;
const TransportParams kParams{2e-6, 2e-10, 2.5e-10};

std::atomic<int> g_failures{0};

void Expect(bool ok, const std::string& what) {
  if (!ok) {
    if (g_failures.fetch_add(1) < 20) std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  }
}

// Value of element i on rank r in round k (small: sums of 4 ranks stay exact in int32 and float32).
int32_t Value(int r, size_t i, int k) { return static_cast<int32_t>(r * 1000 + static_cast<int>(i % 97) + k); }

void RunOnThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// ----- 1. collectives ------------------------------------------------------------------------
void Collectives(InProcCommunicator& g, int round) {
  for (const char* algo : {"ring", "recursive_doubling", "ring_direct"}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{70000}}) {
      std::vector<std::vector<int32_t>> bufs(kRanks, std::vector<int32_t>(n));
      for (int r = 0; r < kRanks; ++r)
        for (size_t i = 0; i < n; ++i) bufs[r][i] = Value(r, i, round);
      g.Run([&](int r) { g.comm(r).AllReduce(bufs[r].data(), n, DType::kInt32, ReduceOp::kSum, algo); });
      bool ok = true;
      for (int r = 0; r < kRanks; ++r)
        for (size_t i = 0; i < n; ++i) ok &= bufs[r][i] == 6000 + 4 * (static_cast<int>(i % 97) + round);
      Expect(ok, std::string("all_reduce ") + algo + " of " + std::to_string(n));
    }
  }
  // all_gather_v: rank r contributes r + 1 elements
  std::vector<size_t> counts = {1, 2, 3, 4};
  std::vector<std::vector<int32_t>> ins(kRanks), outs(kRanks, std::vector<int32_t>(10));
  for (int r = 0; r < kRanks; ++r) ins[r].assign(counts[r], Value(r, 0, round));
  g.Run([&](int r) { g.comm(r).AllGatherV(ins[r].data(), outs[r].data(), counts, DType::kInt32); });
  for (int r = 0; r < kRanks; ++r) {
    size_t off = 0;
    bool ok = true;
    for (int s = 0; s < kRanks; ++s)
      for (size_t i = 0; i < counts[s]; ++i) ok &= outs[r][off++] == Value(s, 0, round);
    Expect(ok, "all_gather_v");
  }
  // reduce_scatter: uneven parts, one empty
  std::vector<size_t> parts = {3, 0, 5, 2};
  std::vector<std::vector<int32_t>> rs_in(kRanks, std::vector<int32_t>(10)), rs_out(kRanks, std::vector<int32_t>(5));
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < 10; ++i) rs_in[r][i] = Value(r, i, round);
  g.Run([&](int r) {
    g.comm(r).ReduceScatter(rs_in[r].data(), rs_out[r].data(), parts, DType::kInt32, ReduceOp::kMax);
  });
  size_t start = 0;
  for (int r = 0; r < kRanks; ++r) {
    bool ok = true;
    for (size_t i = 0; i < parts[r]; ++i) ok &= rs_out[r][i] == Value(kRanks - 1, start + i, round);
    Expect(ok, "reduce_scatter");
    start += parts[r];
  }
  // all_to_all_v: rank r sends (r + j) % 3 elements to rank j
  std::vector<std::vector<int32_t>> a2a(kRanks);
  std::vector<std::vector<size_t>> send(kRanks, std::vector<size_t>(kRanks));
  for (int r = 0; r < kRanks; ++r)
    for (int j = 0; j < kRanks; ++j) {
      send[r][j] = static_cast<size_t>((r + j) % 3);
      for (size_t i = 0; i < send[r][j]; ++i) a2a[r].push_back(Value(r, static_cast<size_t>(j), round));
    }
  std::vector<std::vector<char>> got(kRanks);
  std::vector<std::vector<size_t>> recv(kRanks);
  g.Run([&](int r) { got[r] = g.comm(r).AllToAllV(a2a[r].data(), send[r], DType::kInt32, &recv[r]); });
  for (int j = 0; j < kRanks; ++j) {
    const auto* v = reinterpret_cast<const int32_t*>(got[j].data());
    size_t off = 0;
    bool ok = true;
    for (int r = 0; r < kRanks; ++r) {
      ok &= recv[j][r] == send[r][j];
      for (size_t i = 0; i < send[r][j]; ++i) ok &= v[off++] == Value(r, static_cast<size_t>(j), round);
    }
    Expect(ok, "all_to_all_v");
  }
  // broadcast, both algorithms, rotating root
  for (const char* algo : {"binomial", "pipelined_chain"}) {
    const int root = round % kRanks;
    std::vector<std::vector<int32_t>> b(kRanks, std::vector<int32_t>(5000));
    for (int r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < b[r].size(); ++i) b[r][i] = Value(r, i, round);
    g.Run([&](int r) { g.comm(r).Broadcast(b[r].data(), b[r].size(), DType::kInt32, root, algo); });
    bool ok = true;
    for (int r = 0; r < kRanks; ++r) ok &= b[r] == b[root];
    Expect(ok && b[0][3] == Value(root, 3, round), std::string("broadcast ") + algo);
  }
  g.Run([&](int r) { g.comm(r).Barrier(); });
}

// ----- 2. aggregation --------------------------------------------------------------------------
struct Kept {
  std::shared_ptr<Request> req;
  DType dtype;
  ReduceOp op;
  int seed;
};

// The i-th request of every rank: its size, dtype and op agree across ranks, its values do not.
RequestSpec Spec(int r, int i, std::vector<int32_t>* ints, std::vector<float>* floats, ReduceOp* op) {
  const size_t sizes[] = {1, 3, 64, 255, 1024, 3000};
  const size_t n = sizes[i % 6];
  if (i % 2 == 0) {
    ints->assign(n, r + i);
    *op = ReduceOp::kSum;
    return {ints->data(), n, DType::kInt32};
  }
  floats->assign(n, static_cast<float>(r) * 1.5f + static_cast<float>(i));
  *op = ReduceOp::kMax;
  return {floats->data(), n, DType::kFloat32};
}

bool Correct(const Kept& k) {
  const size_t n = k.req->count();
  if (k.dtype == DType::kInt32) {
    const auto* v = static_cast<const int32_t*>(k.req->data());
    for (size_t i = 0; i < n; ++i)
      if (v[i] != 4 * k.seed + 6) return false;  // sum over r of (r + seed)
  } else {
    const auto* v = static_cast<const float*>(k.req->data());
    for (size_t i = 0; i < n; ++i)
      if (v[i] != 4.5f + static_cast<float>(k.seed)) return false;  // max over r of (1.5 r + seed)
  }
  return true;
}

void Aggregation(InProcCommunicator& g, int round) {
  g.EnableAggregation(4096, 0.001);
  const int n = 300;
  RunOnThreads(kRanks, [&](int r) {
    std::vector<Kept> kept;
    std::vector<int32_t> ints;
    std::vector<float> floats;
    for (int i = 0; i < n; ++i) {
      ReduceOp op;
      if (i % 10 == 9) {  // a batch of 8 in one storage block
        std::vector<std::vector<int32_t>> bi(8);
        std::vector<std::vector<float>> bf(8);
        std::vector<RequestSpec> specs;
        std::vector<ReduceOp> ops;
        for (int j = 0; j < 8; ++j) {
          specs.push_back(Spec(r, 1000 + i * 8 + 2 * j, &bi[j], &bf[j], &op));  // even seeds: int32, sum
        }
        auto reqs = g.aggregator(r).SubmitMany(specs, ReduceOp::kSum);
        for (int j = 0; j < 8; j += 2) kept.push_back({reqs[j], DType::kInt32, ReduceOp::kSum, 1000 + i * 8 + 2 * j});
        continue;
      }
      const RequestSpec s = Spec(r, i, &ints, &floats, &op);
      auto req = g.aggregator(r).Submit(s.data, s.count, s.dtype, op);
      if (i % 3 != 0) kept.push_back({req, s.dtype, op, i});  // every third handle dropped at once
      if (i % 50 == 49) g.aggregator(r).Flush();
    }
    g.aggregator(r).Flush();
    int wrong = 0;
    for (const Kept& k : kept) {
      try {
        k.req->Wait(30);
        wrong += Correct(k) ? 0 : 1;
      } catch (const std::exception& e) {
        ++wrong;
        std::fprintf(stderr, "rank %d request failed: %s\n", r, e.what());
      }
    }
    Expect(wrong == 0, "aggregated results of rank " + std::to_string(r) + " round " + std::to_string(round) + ": " +
                           std::to_string(wrong) + " wrong");
  });
  AggregatorStats s = g.aggregator(0).stats();
  Expect(s.requests == static_cast<uint64_t>(n - n / 10 + 8 * (n / 10)), "request count");
  Expect(s.in_place > 0, "some packets reduced in place");
}

// ----- 3. misuse under load --------------------------------------------------------------------
void ConcurrentSubmitters(InProcCommunicator& g) {
  g.EnableAggregation(2048, 0.0005);
  std::atomic<int> ok{0}, mismatched{0}, other{0};
  RunOnThreads(kRanks, [&](int r) {
    std::vector<std::shared_ptr<Request>> reqs[2];
    RunOnThreads(2, [&](int t) {
      for (int i = 0; i < 200; ++i) {
        std::vector<int32_t> v(t == 0 ? 64 : 16, r);
        auto q = g.aggregator(r).Submit(v.data(), v.size(), DType::kInt32, ReduceOp::kSum);
        if (i % 4 != 0) reqs[t].push_back(q);
      }
    });
    g.aggregator(r).Flush();
    for (auto& list : reqs)
      for (auto& q : list) {
        try {
          q->Wait(30);
          ++ok;
        } catch (const CommMismatch&) {
          ++mismatched;
        } catch (const std::exception& e) {
          ++other;
          std::fprintf(stderr, "unexpected failure: %s\n", e.what());
        }
      }
  });
  Expect(other == 0, "concurrent submitters: only CommMismatch may fail a request");
  std::printf("concurrent submitters: %d completed, %d CommMismatch\n", ok.load(), mismatched.load());
  // Close with requests pending: they fail with CommError, nobody waits for a timeout.
  g.EnableAggregation(1 << 20, 3600.0);
  std::vector<std::shared_ptr<Request>> pending;
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < 5; ++i) {
      int32_t x = i;
      pending.push_back(g.aggregator(r).Submit(&x, 1, DType::kInt32, ReduceOp::kSum));
    }
  }
  g.CloseAggregators();
  int failed = 0;
  for (auto& q : pending) {
    try {
      q->Wait(30);
    } catch (const CommError&) {
      ++failed;
    }
  }
  Expect(failed == static_cast<int>(pending.size()), "requests pending at close fail");
}

// ----- 4. shared memory -----------------------------------------------------------------------
void SharedMemory(int rounds) {
  const std::string name = "/mshyper_comm_stress_" + std::to_string(getpid());
  RunOnThreads(2, [&](int r) {
    auto t = std::make_shared<ShmTransport>(name, r, 2, 64 << 10, 30.0);
    auto comm = std::make_shared<Communicator>(t, std::vector<int>{}, nullptr, std::vector<int>{}, kParams);
    for (int k = 0; k < rounds; ++k) {
      for (const char* algo : {"ring", "recursive_doubling", "ring_direct"}) {
        std::vector<int32_t> v(40000);
        for (size_t i = 0; i < v.size(); ++i) v[i] = Value(r, i, k);
        comm->AllReduce(v.data(), v.size(), DType::kInt32, ReduceOp::kSum, algo);
        bool ok = true;
        for (size_t i = 0; i < v.size(); ++i) ok &= v[i] == 1000 + 2 * (static_cast<int>(i % 97) + k);
        Expect(ok, std::string("shm all_reduce ") + algo);
      }
      std::vector<int32_t> b(3000, r);
      comm->Broadcast(b.data(), b.size(), DType::kInt32, 1, "pipelined_chain");
      Expect(b[2999] == 1, "shm broadcast");
      comm->Barrier();
    }
    Aggregator agg(std::make_shared<CommunicatorBackend>(comm), 4096, 0.001, 30.0);
    std::vector<std::shared_ptr<Request>> kept;
    for (int i = 0; i < 300; ++i) {
      std::vector<int32_t> v(1 + i % 50, r + i);
      auto q = agg.Submit(v.data(), v.size(), DType::kInt32, ReduceOp::kSum);
      if (i % 3 != 0) kept.push_back(q);
    }
    agg.Flush();
    bool ok = true;
    for (size_t j = 0; j < kept.size(); ++j) {
      kept[j]->Wait(30);
      const int i = static_cast<int>(j + j / 2 + 1);  // the indices not divisible by 3
      const auto* v = static_cast<const int32_t*>(kept[j]->data());
      for (size_t e = 0; e < kept[j]->count(); ++e) ok &= v[e] == 2 * i + 1;
    }
    Expect(ok, "shm aggregated results");
    agg.Close();
  });
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
  try {
    InProcCommunicator g(kRanks, nullptr, {}, 64 << 10, 30.0, kParams);
    for (int k = 0; k < rounds; ++k) Collectives(g, k);
    std::printf("collectives: %d rounds\n", rounds);
    for (int k = 0; k < rounds; ++k) Aggregation(g, k);
    std::printf("aggregation: %d rounds\n", rounds);
    ConcurrentSubmitters(g);
    SharedMemory(rounds);
    std::printf("shared memory: %d rounds\n", rounds);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    return 1;
  }
  if (g_failures.load() != 0) {
    std::printf("COMM STRESS FAILED (%d checks)\n", g_failures.load());
    return 1;
  }
  std::printf("COMM STRESS OK\n");
  return 0;
}
