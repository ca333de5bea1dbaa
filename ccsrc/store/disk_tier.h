// The disk tier of the block store: block-sized slots in files preallocated a few blocks at a time
// in one directory, read and written with pread/pwrite (preadv for runs of adjacent slots),
// optionally keeping the page cache out (O_DIRECT, else posix_fadvise DONTNEED). The files have
// no name (O_TMPFILE, or unlinked right after open), so a killed process leaves none behind.
//
// Slot bookkeeping (Reserve, Release, Locate, counters) is guarded by the BlockStore's mutex. The
// I/O calls take a DiskExtent located under that mutex and touch no shared state, so they run
// without it (file descriptors stay valid until the tier is destroyed).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <vector>

#include "store/store_types.h"

namespace mshyper::store {

// Where one disk slot lives.
struct DiskExtent {
  int fd = -1;
  bool direct = false;  // the file was opened with O_DIRECT
  uint64_t offset = 0;  // bytes into the file
  std::string path;     // names the file in messages (it has no name on disk)
};

class DiskTier {
 public:
  // Creates the directory (config.disk_dir, "" = $TMPDIR or /tmp) and checks it takes a new file.
  // Raises DiskError otherwise.
  explicit DiskTier(const StoreConfig& config);
  // Closes the tier's files (unnamed: their space is freed).
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const std::string& dir() const { return dir_; }
  // A free slot, growing the files if needed. Raises DiskError when the tier is full or a file
  // cannot be created.
  int64_t Reserve();
  void Release(int64_t slot);
  DiskExtent Locate(int64_t slot) const;
  TierStats Stats() const;
  void ResetPeak() { peak_ = used_; }

  // I/O of `len` bytes at a slot; `what` names the block in errors (DiskError).
  void Read(const DiskExtent& at, void* dst, uint64_t len, const std::string& what) const;
  void Write(const DiskExtent& at, const void* src, uint64_t len, const std::string& what) const;
  // One preadv of `iov` starting at `first`; true if it read all `total` bytes (else the caller
  // reads the slots one by one). Drops the range from the page cache as Read does.
  bool ReadRun(const DiskExtent& first, std::vector<iovec>& iov, uint64_t total) const;

 private:
  struct DiskFile {
    int fd = -1;
    bool direct = false;  // opened with O_DIRECT
    std::string path;
  };
  void DropCache(const DiskExtent& at, uint64_t len) const;

  const uint64_t block_size_;
  const uint64_t capacity_;          // bytes; 0 = unlimited
  const uint32_t blocks_per_file_;
  const bool drop_page_cache_, direct_io_;
  std::string dir_;
  std::vector<DiskFile> files_;
  std::vector<int64_t> free_slots_;
  uint64_t slots_ = 0, used_ = 0, peak_ = 0;
};

}  // namespace mshyper::store
