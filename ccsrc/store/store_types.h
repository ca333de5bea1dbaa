// The block store's vocabulary: tiers, errors, configuration and per-tier statistics.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mshyper::store {

enum class Tier : int { kDevice = 0, kHost = 1, kDisk = 2 };
constexpr int kNumTiers = 3;
constexpr int TierIndex(Tier t) { return static_cast<int>(t); }
inline const char* TierName(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kDisk: return "disk";
  }
  return "?";
}

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A memory tier has no evictable block left (everything pinned or in use), or ids ran out.
class CapacityError : public StoreError {
 public:
  using StoreError::StoreError;
};
// The disk tier cannot be used: unwritable directory, disk full, I/O error.
class DiskError : public StoreError {
 public:
  using StoreError::StoreError;
};
// A disk block failed its checksum; the message names the block, the file and the offset.
class CorruptBlockError : public StoreError {
 public:
  using StoreError::StoreError;
};

struct StoreConfig {
  uint64_t block_size = 128ull << 20;   // bytes; a multiple of 64
  uint64_t device_capacity = 1ull << 30;  // bytes of the device tier (>= one block)
  uint64_t host_capacity = 4ull << 30;    // bytes of the host DRAM pool (>= one block)
  std::string disk_dir;                   // "" = $TMPDIR or /tmp
  uint64_t disk_capacity = 0;             // bytes; 0 = grow until the file system is full
  uint32_t blocks_per_file = 8;           // disk files are preallocated this many blocks at a time
  // Keep the page cache out of disk I/O (benchmarks): O_DIRECT when the block size is a multiple
  // of 4KB and the file system accepts it (no copy through the page cache), else
  // posix_fadvise(DONTNEED) after each read and after each write (once written, sync_file_range).
  bool drop_page_cache = false;
  bool direct_io = true;  // with drop_page_cache: try O_DIRECT (false: always posix_fadvise)
};

struct TierStats {
  uint64_t capacity_blocks = 0;  // slots the tier may hold (disk: 0 = unlimited)
  uint64_t used_blocks = 0;      // slots currently assigned (holding a copy or reserved)
  uint64_t peak_blocks = 0;      // high-water mark of used_blocks
  uint64_t evictions = 0;        // copies dropped from this tier to make room
};

inline uint64_t RoundUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace mshyper::store
