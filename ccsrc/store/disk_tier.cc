#include "store/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace mshyper::store {
namespace {

std::string Errno(int err) { return std::strerror(err); }

void MkdirP(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part;
    if (::mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST) {
      throw DiskError("offload directory '" + dir + "' cannot be created (" + cur + "): " +
                      Errno(errno));
    }
    cur += "/";
  }
}

void PreadFull(int fd, void* dst, uint64_t len, uint64_t off, const std::string& what) {
  auto* p = static_cast<uint8_t*>(dst);
  while (len > 0) {
    const ssize_t n = ::pread(fd, p, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DiskError("read of " + what + " failed: " + Errno(errno));
    }
    if (n == 0) throw DiskError("read of " + what + " failed: unexpected end of file");
    p += n;
    off += n;
    len -= n;
  }
}

void PwriteFull(int fd, const void* src, uint64_t len, uint64_t off, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(src);
  while (len > 0) {
    const ssize_t n = ::pwrite(fd, p, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DiskError("write of " + what + " failed: " + Errno(errno));
    }
    p += n;
    off += n;
    len -= n;
  }
}

int OpenFlags(bool direct) { return O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0); }

// A new file in `dir` that no other process sees and that no exit, crash or SIGKILL leaves
// behind: anonymous (O_TMPFILE) where the file system supports it, else created as `path` and
// unlinked at once. Returns -1 with errno set on failure.
int OpenUnlinked(const std::string& dir, const std::string& path, bool direct) {
  int fd = ::open(dir.c_str(), O_TMPFILE | OpenFlags(direct), 0600);
  if (fd >= 0) return fd;
  fd = ::open(path.c_str(), O_CREAT | O_EXCL | OpenFlags(direct), 0600);
  if (fd >= 0) ::unlink(path.c_str());
  return fd;
}

}  // namespace

DiskTier::DiskTier(const StoreConfig& config)
    : block_size_(config.block_size),
      capacity_(config.disk_capacity),
      blocks_per_file_(config.blocks_per_file == 0 ? 1 : config.blocks_per_file),
      drop_page_cache_(config.drop_page_cache),
      direct_io_(config.direct_io),
      dir_(config.disk_dir) {
  if (dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = (tmp && *tmp) ? tmp : "/tmp";
  }
  MkdirP(dir_);
  // Probe: the directory must accept a new file now, not at the first eviction.
  std::string probe = dir_ + "/.mshyper_probe_" + std::to_string(::getpid()) + "_" +
                      std::to_string(reinterpret_cast<uintptr_t>(this));
  int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw DiskError("offload directory '" + dir_ + "' is not writable: " + Errno(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

DiskTier::~DiskTier() {
  for (auto& f : files_) {
    if (f.fd >= 0) ::close(f.fd);  // the file has no name: closing it frees its blocks
  }
}

int64_t DiskTier::Reserve() {
  if (!free_slots_.empty()) {
    int64_t s = free_slots_.back();
    free_slots_.pop_back();
    ++used_;
    peak_ = std::max(peak_, used_);
    return s;
  }
  const uint64_t bs = block_size_;
  if (capacity_ != 0 && (slots_ + 1) * bs > capacity_) {
    throw DiskError("disk tier full: its capacity of " + std::to_string(capacity_) + " bytes (" +
                    std::to_string(slots_) + " blocks) is in use");
  }
  const uint64_t bpf = blocks_per_file_;
  if (slots_ % bpf == 0) {
    DiskFile f;
    f.path = dir_ + "/mshyper_store_" + std::to_string(::getpid()) + "_" +
             std::to_string(reinterpret_cast<uintptr_t>(this)) + "_" + std::to_string(files_.size()) +
             ".blk";
    // Direct I/O needs 4KB-aligned buffers, offsets and lengths: slots are 4KB-aligned, disk
    // offsets are multiples of the block size and copies are whole 4KB pages (CopyLen).
    const bool want_direct = drop_page_cache_ && direct_io_ && bs % 4096 == 0;
    f.fd = OpenUnlinked(dir_, f.path, want_direct);
    f.direct = want_direct && f.fd >= 0;
    if (f.fd < 0 && want_direct && errno == EINVAL) {  // the file system refuses O_DIRECT
      f.fd = OpenUnlinked(dir_, f.path, false);
    }
    if (f.fd < 0) {
      throw DiskError("cannot create disk-tier file '" + f.path + "': " + Errno(errno));
    }
    const int rc = ::posix_fallocate(f.fd, 0, static_cast<off_t>(bpf * bs));
    if (rc != 0) {
      ::close(f.fd);
      throw DiskError("cannot preallocate " + std::to_string(bpf * bs) + " bytes for disk-tier file '" +
                      f.path + "': " + Errno(rc));
    }
    files_.push_back(f);
  }
  const int64_t s = static_cast<int64_t>(slots_++);
  ++used_;
  peak_ = std::max(peak_, used_);
  return s;
}

void DiskTier::Release(int64_t slot) {
  free_slots_.push_back(slot);
  --used_;
}

DiskExtent DiskTier::Locate(int64_t slot) const {
  const DiskFile& f = files_[slot / blocks_per_file_];
  return DiskExtent{f.fd, f.direct, (slot % blocks_per_file_) * block_size_, f.path};
}

TierStats DiskTier::Stats() const { return TierStats{capacity_ / block_size_, used_, peak_, 0}; }

void DiskTier::DropCache(const DiskExtent& at, uint64_t len) const {
  if (drop_page_cache_ && !at.direct && len > 0) ::posix_fadvise(at.fd, at.offset, len, POSIX_FADV_DONTNEED);
}

void DiskTier::Read(const DiskExtent& at, void* dst, uint64_t len, const std::string& what) const {
  PreadFull(at.fd, dst, len, at.offset, what);
  DropCache(at, len);
}

void DiskTier::Write(const DiskExtent& at, const void* src, uint64_t len, const std::string& what) const {
  PwriteFull(at.fd, src, len, at.offset, what);
  if (drop_page_cache_ && !at.direct && len > 0) {
    ::sync_file_range(at.fd, at.offset, len,
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
  }
  DropCache(at, len);
}

bool DiskTier::ReadRun(const DiskExtent& first, std::vector<iovec>& iov, uint64_t total) const {
  const ssize_t n = ::preadv(first.fd, iov.data(), static_cast<int>(iov.size()), static_cast<off_t>(first.offset));
  if (n != static_cast<ssize_t>(total)) return false;
  DropCache(first, total);
  return true;
}

}  // namespace mshyper::store
