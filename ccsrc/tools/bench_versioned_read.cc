// Versioned (seqlock) block reads vs a std::shared_mutex-protected block store, under 1 writer
// and 1-2 readers. Both stores hold the same number of blocks of the same size in memory; the
// writer rewrites blocks round-robin as fast as it can, readers copy random blocks out.
// The BlockStore path: blocks pinned in the device tier, readers use ReadPinned (lock-free
// seqlock read: relaxed atomic word loads + acquire fence + re-check).
//
// usage: bench_versioned_read [block_bytes=65536] [blocks=64] [seconds=1.0] [write_rate=0]
// write_rate: writes per second of the writer (0 = as fast as it can).
// prints one line per (store, readers): reads/s and GB/s, then the ratios.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/block_store.h"

using mshyper::store::BlockStore;
using mshyper::store::StoreConfig;
using mshyper::store::Tier;

namespace {

struct SharedMutexStore {
  struct Block {
    std::shared_mutex mu;
    std::vector<uint8_t> data;
  };
  std::vector<std::unique_ptr<Block>> blocks;
  SharedMutexStore(int n, size_t bs) {
    for (int i = 0; i < n; ++i) {
      blocks.emplace_back(new Block);
      blocks.back()->data.assign(bs, 0);
    }
  }
  void Read(int i, void* dst) {
    std::shared_lock<std::shared_mutex> g(blocks[i]->mu);
    std::memcpy(dst, blocks[i]->data.data(), blocks[i]->data.size());
  }
  void Write(int i, const void* src) {
    std::unique_lock<std::shared_mutex> g(blocks[i]->mu);
    std::memcpy(blocks[i]->data.data(), src, blocks[i]->data.size());
  }
};

struct Result {
  double reads_per_s;
  double writes_per_s;
};

template <typename ReadFn, typename WriteFn>
Result Run(int readers, double seconds, int nblocks, size_t bs, double write_rate, ReadFn read,
           WriteFn write) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, writes{0};
  std::vector<std::thread> ts;
  ts.emplace_back([&] {
    std::vector<uint8_t> src(bs, 1);
    uint64_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
      if (write_rate > 0) {  // paced writer: n writes due after n / rate seconds
        const auto due = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(n / write_rate));
        if (std::chrono::steady_clock::now() < due) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          continue;
        }
      }
      src[0] = static_cast<uint8_t>(n);
      write(static_cast<int>(n % nblocks), src.data());
      ++n;
    }
    writes.fetch_add(n);
  });
  for (int r = 0; r < readers; ++r) {
    ts.emplace_back([&, r] {
      std::mt19937 rng(r + 1);
      std::vector<uint8_t> dst(bs);
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        read(static_cast<int>(rng() % nblocks), dst.data());
        ++n;
      }
      reads.fetch_add(n);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& t : ts) t.join();
  return Result{reads.load() / seconds, writes.load() / seconds};
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bs = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 65536;
  const int nblocks = argc > 2 ? std::atoi(argv[2]) : 64;
  const double seconds = argc > 3 ? std::atof(argv[3]) : 1.0;
  const double write_rate = argc > 4 ? std::atof(argv[4]) : 0.0;

  StoreConfig c;
  c.block_size = bs;
  c.device_capacity = bs * nblocks;
  c.host_capacity = bs * nblocks;
  BlockStore store(c);
  std::vector<uint64_t> ids;
  for (int i = 0; i < nblocks; ++i) {
    ids.push_back(store.Allocate());
    store.Pin(ids.back(), Tier::kDevice);
  }
  SharedMutexStore ref(nblocks, bs);

  std::printf("block_bytes=%zu blocks=%d seconds=%.2f write_rate=%s\n", bs, nblocks, seconds,
              write_rate > 0 ? std::to_string(static_cast<long>(write_rate)).c_str() : "unlimited");
  for (int readers = 1; readers <= 2; ++readers) {
    Result v = Run(readers, seconds, nblocks, bs, write_rate,
                   [&](int i, void* dst) { store.ReadPinned(ids[i], Tier::kDevice, 0, dst, bs); },
                   [&](int i, const void* src) { store.Write(ids[i], 0, src, bs); });
    Result m = Run(readers, seconds, nblocks, bs, write_rate, [&](int i, void* dst) { ref.Read(i, dst); },
                   [&](int i, const void* src) { ref.Write(i, src); });
    std::printf("readers=%d versioned: %.0f reads/s (%.2f GB/s), writer %.0f writes/s | shared_mutex: %.0f "
                "reads/s (%.2f GB/s), writer %.0f writes/s | read ratio %.2fx\n",
                readers, v.reads_per_s, v.reads_per_s * bs / 1e9, v.writes_per_s, m.reads_per_s,
                m.reads_per_s * bs / 1e9, m.writes_per_s, v.reads_per_s / m.reads_per_s);
  }
  auto st = store.Stats();
  std::printf("seqlock read retries: %llu\n", (unsigned long long)st.read_retries);
  for (uint64_t id : ids) store.Unpin(id, Tier::kDevice);
  return 0;
}
