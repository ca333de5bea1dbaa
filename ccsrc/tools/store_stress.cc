// Concurrency stress test of the block store and prefetch scheduler (built by `make tsan` with
// -fsanitize=thread; also runs without it). Writers fill whole blocks with a stamp
// (block id, writer, counter) in every 8-byte word; readers check that every block they read
// carries one stamp throughout (a torn read would mix stamps). The tiers are tiny so blocks move
// between device, host and disk all the time, and a prefetch thread pins/unpins in a trace order.
// A discarder empties blocks now and then (an empty block reads as zeros, which Check accepts).
//
// usage: store_stress [iterations_per_thread=3000] [disk_dir=""]
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "prefetch/prefetch_scheduler.h"
#include "store/block_store.h"

using mshyper::prefetch::PrefetchScheduler;
using mshyper::store::BlockStore;
using mshyper::store::StoreConfig;
using mshyper::store::Tier;

namespace {

constexpr uint64_t kBlock = 8192;
constexpr int kBlocks = 16;
std::atomic<uint64_t> g_torn{0}, g_reads{0}, g_writes{0}, g_errors{0};

uint64_t Stamp(uint64_t block, uint64_t writer, uint64_t counter) {
  return (block << 48) | (writer << 40) | (counter & ((1ull << 40) - 1));
}

bool Check(const std::vector<uint64_t>& buf, uint64_t block) {
  const uint64_t first = buf[0];
  if (first != 0 && (first >> 48) != block) return false;
  for (uint64_t w : buf) {
    if (w != first) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 3000;
  StoreConfig c;
  c.block_size = kBlock;
  c.device_capacity = 4 * kBlock;
  c.host_capacity = 8 * kBlock;
  c.disk_dir = argc > 2 ? argv[2] : "";
  c.blocks_per_file = 4;
  auto store = std::make_shared<BlockStore>(c);
  std::vector<uint64_t> ids;
  for (int i = 0; i < kBlocks; ++i) ids.push_back(store->Allocate());

  std::vector<std::thread> threads;
  // Writers: two, each over all blocks.
  for (uint64_t w = 1; w <= 2; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w);
      std::vector<uint64_t> buf(kBlock / 8);
      for (int i = 0; i < iters; ++i) {
        const int k = static_cast<int>(rng() % kBlocks);
        std::fill(buf.begin(), buf.end(), Stamp(static_cast<uint64_t>(k), w, static_cast<uint64_t>(i) + 1));
        try {
          store->Write(ids[k], 0, buf.data(), kBlock);
          g_writes.fetch_add(1);
        } catch (const std::exception& e) {
          g_errors.fetch_add(1);
          std::fprintf(stderr, "write error: %s\n", e.what());
        }
      }
    });
  }
  // Plain readers.
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::mt19937_64 rng(100 + r);
      std::vector<uint64_t> buf(kBlock / 8);
      for (int i = 0; i < iters; ++i) {
        const int k = static_cast<int>(rng() % kBlocks);
        try {
          store->Read(ids[k], 0, buf.data(), kBlock);
          g_reads.fetch_add(1);
          if (!Check(buf, static_cast<uint64_t>(k))) g_torn.fetch_add(1);
        } catch (const std::exception& e) {
          g_errors.fetch_add(1);
          std::fprintf(stderr, "read error: %s\n", e.what());
        }
      }
    });
  }
  // Pinned reader: pin in device, lock-free reads, unpin.
  threads.emplace_back([&] {
    std::mt19937_64 rng(7);
    std::vector<uint64_t> buf(kBlock / 8);
    for (int i = 0; i < iters; ++i) {
      const int k = static_cast<int>(rng() % kBlocks);
      try {
        store->Pin(ids[k], Tier::kDevice);
        for (int j = 0; j < 3; ++j) {
          store->ReadPinned(ids[k], Tier::kDevice, 0, buf.data(), kBlock);
          g_reads.fetch_add(1);
          if (!Check(buf, static_cast<uint64_t>(k))) g_torn.fetch_add(1);
        }
        store->Unpin(ids[k], Tier::kDevice);
      } catch (const std::exception& e) {
        g_errors.fetch_add(1);
        std::fprintf(stderr, "pinned read error: %s\n", e.what());
      }
    }
  });
  // Prefetch consumer: a fixed trace (each step visits blocks 0..kBlocks-1 in order); every
  // 50 steps the order changes once, invalidating the trace.
  std::atomic<uint64_t> steps{0};
  threads.emplace_back([&] {
    PrefetchScheduler sched(store, 2, 2, Tier::kDevice, 2);
    std::vector<uint64_t> buf(kBlock / 8);
    const int nsteps = std::max(1, iters / kBlocks);
    for (int s = 0; s < nsteps; ++s) {
      sched.BeginStep();
      for (int k = 0; k < kBlocks; ++k) {
        const int kk = (s % 50 == 49) ? kBlocks - 1 - k : k;
        try {
          sched.Acquire({ids[kk]});
          store->ReadPinned(ids[kk], Tier::kDevice, 0, buf.data(), kBlock);
          g_reads.fetch_add(1);
          if (!Check(buf, static_cast<uint64_t>(kk))) g_torn.fetch_add(1);
          sched.Release({ids[kk]});
        } catch (const std::exception& e) {
          g_errors.fetch_add(1);
          std::fprintf(stderr, "prefetch error: %s\n", e.what());
        }
      }
      steps.fetch_add(1);
    }
    sched.Drain();
    auto st = sched.Stats();
    std::printf("prefetch: steps=%llu hits=%llu late=%llu misses=%llu issued=%llu invalidations=%llu\n",
                (unsigned long long)st.steps, (unsigned long long)st.hits, (unsigned long long)st.late,
                (unsigned long long)st.misses, (unsigned long long)st.issued,
                (unsigned long long)st.trace_invalidations);
  });
  // Discarder: empties blocks (they read as zeros, no copy or I/O), racing with all of the above;
  // the fill mark goes to 0 and back to the whole block with the next write.
  threads.emplace_back([&] {
    std::mt19937_64 rng(11);
    for (int i = 0; i < iters / 4; ++i) {
      const int k = static_cast<int>(rng() % kBlocks);
      try {
        store->Discard(ids[k]);
      } catch (const std::exception& e) {
        g_errors.fetch_add(1);
        std::fprintf(stderr, "discard error: %s\n", e.what());
      }
    }
  });
  // Evictor: pushes blocks down explicitly.
  threads.emplace_back([&] {
    std::mt19937_64 rng(9);
    for (int i = 0; i < iters; ++i) {
      const int k = static_cast<int>(rng() % kBlocks);
      try {
        store->Evict(ids[k], (i & 1) ? Tier::kDevice : Tier::kHost);
      } catch (const std::exception& e) {
        g_errors.fetch_add(1);
        std::fprintf(stderr, "evict error: %s\n", e.what());
      }
    }
  });
  for (auto& t : threads) t.join();

  // Final check: every block holds one stamp and the tiers respected their capacity.
  std::vector<uint64_t> buf(kBlock / 8);
  for (int k = 0; k < kBlocks; ++k) {
    store->Read(ids[k], 0, buf.data(), kBlock);
    if (!Check(buf, static_cast<uint64_t>(k))) g_torn.fetch_add(1);
  }
  auto s = store->Stats();
  std::printf("reads=%llu writes=%llu torn=%llu errors=%llu read_retries=%llu\n",
              (unsigned long long)g_reads.load(), (unsigned long long)g_writes.load(),
              (unsigned long long)g_torn.load(), (unsigned long long)g_errors.load(),
              (unsigned long long)s.read_retries);
  std::printf("device peak %llu/%llu blocks, host peak %llu/%llu blocks, disk->host %llu, host->disk %llu, "
              "host->device %llu, device->host %llu copies\n",
              (unsigned long long)s.tiers[0].peak_blocks, (unsigned long long)s.tiers[0].capacity_blocks,
              (unsigned long long)s.tiers[1].peak_blocks, (unsigned long long)s.tiers[1].capacity_blocks,
              (unsigned long long)s.copies[2][1], (unsigned long long)s.copies[1][2],
              (unsigned long long)s.copies[1][0], (unsigned long long)s.copies[0][1]);
  // The transfer clock is the union of the (concurrent) moves' intervals: at most their sum.
  uint64_t copy_ns = 0;
  for (const auto& row : s.copy_ns) {
    for (uint64_t ns : row) copy_ns += ns;
  }
  std::printf("transfer busy %.3f s, moves %.3f s summed over threads\n", s.transfer_busy_ns / 1e9, copy_ns / 1e9);
  const bool ok = g_torn.load() == 0 && g_errors.load() == 0 &&
                  s.tiers[0].peak_blocks <= s.tiers[0].capacity_blocks &&
                  s.tiers[1].peak_blocks <= s.tiers[1].capacity_blocks && s.transfer_busy_ns > 0 &&
                  s.transfer_busy_ns <= copy_ns;
  std::printf("%s\n", ok ? "STRESS OK" : "STRESS FAILED");
  return ok ? 0 : 1;
}
