#include "comm/shm_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

namespace mshyper::comm {

namespace {

constexpr uint64_t kMagic = 0x4d5348595045524dULL;  // "MSHYPERM"
constexpr int kMaxRanks = 256;

struct alignas(64) ShmHeader {
  uint64_t magic;
  int32_t size;
  int32_t pad;
  uint64_t channel_bytes;
  uint64_t total_bytes;
  std::atomic<int32_t> ready;
  std::atomic<int32_t> attached;
  std::atomic<int32_t> aborted;
  int32_t pad2;
  char abort_msg[512];
  std::atomic<int32_t> pids[kMaxRanks];
  uint64_t probe_addr[kMaxRanks];  // where each rank's process maps pids[rank] (direct-read probe)
};

size_t HeaderBytes() { return (sizeof(ShmHeader) + 63) & ~static_cast<size_t>(63); }

size_t ChannelStride(size_t cap) { return sizeof(ChannelHeader) + cap; }

std::string ShmName(const std::string& name) { return name.empty() || name[0] != '/' ? "/" + name : name; }

bool ProcessGone(int pid, std::string* detail) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) {
    *detail = "pid " + std::to_string(pid) + " no longer exists";
    return true;
  }
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  if (stat && std::getline(stat, content)) {
    size_t close = content.rfind(')');
    if (close != std::string::npos && close + 2 < content.size()) {
      char state = content[close + 2];
      if (state == 'Z' || state == 'X') {
        *detail = "pid " + std::to_string(pid) + " exited (zombie)";
        return true;
      }
    }
  }
  return false;
}

// Creator of segment `name` from its header: its pid (0 if not readable or not initialised yet)
// and whether the segment is one of ours (magic).
struct SegmentOwner {
  bool ours = false;
  int pid = 0;
};

SegmentOwner ReadOwner(const std::string& name) {
  SegmentOwner owner;
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return owner;
  struct stat st;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(ShmHeader)) {
    void* mem = mmap(nullptr, sizeof(ShmHeader), PROT_READ, MAP_SHARED, fd, 0);
    if (mem != MAP_FAILED) {
      const auto* hdr = static_cast<const ShmHeader*>(mem);
      owner.ours = hdr->magic == kMagic;
      owner.pid = hdr->pids[0].load();
      munmap(mem, sizeof(ShmHeader));
    }
  }
  close(fd);
  return owner;
}

// Ours, and the process that created it is gone (a crashed run's leftover).
bool SegmentStale(const std::string& name) {
  SegmentOwner owner = ReadOwner(name);
  std::string detail;
  return owner.ours && ProcessGone(owner.pid, &detail);
}

// Rank 0's new segment. An existing one of the same name is removed only when it is stale: a
// live one belongs to another group (another job, or a group of this job not yet complete).
int CreateSegment(const std::string& name) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  int err = errno;
  if (fd < 0 && err == EEXIST && SegmentStale(name)) {
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    err = errno;
  }
  if (fd >= 0) return fd;
  if (err != EEXIST) throw CommError("shm transport: cannot create " + name + ": " + std::strerror(err));
  SegmentOwner owner = ReadOwner(name);
  std::string who = !owner.ours       ? "is not a mindspore_hyper group segment"
                    : owner.pid > 0 ? "belongs to the live process " + std::to_string(owner.pid)
                                    : "is being created by another process";
  throw CommError("shm transport: segment " + name + " already exists and " + who +
                  ": another group uses the same name (give each group of a job, and each job, its own name)");
}

}  // namespace

ShmTransport::ShmTransport(const std::string& name, int rank, int size, size_t channel_bytes, double timeout)
    : Transport(rank, size), seg_name_(ShmName(name)) {
  if (size <= 0 || size > kMaxRanks) {
    throw CommError("shm transport: group size " + std::to_string(size) + " outside [1, 256]");
  }
  if (rank < 0 || rank >= size) {
    throw CommError("shm transport: rank " + std::to_string(rank) + " outside [0, " + std::to_string(size) + ")");
  }
  set_timeout(timeout);
  size_t cap = std::max<size_t>(4096, channel_bytes & ~static_cast<size_t>(63));
  size_t nch = static_cast<size_t>(size) * size;
  total_ = HeaderBytes() + nch * ChannelStride(cap);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  int fd = -1;
  if (rank == 0) {
    fd = CreateSegment(seg_name_);
    if (ftruncate(fd, static_cast<off_t>(total_)) != 0) {
      int err = errno;
      close(fd);
      shm_unlink(seg_name_.c_str());
      throw CommError("shm transport: cannot size " + seg_name_ + ": " + std::strerror(err));
    }
  } else {
    while (true) {
      fd = shm_open(seg_name_.c_str(), O_RDWR, 0600);
      if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == total_) break;
        if (fstat(fd, &st) == 0 && st.st_size != 0 && static_cast<size_t>(st.st_size) != total_) {
          close(fd);
          throw CommMismatch("shm transport: segment " + seg_name_ + " has " + std::to_string(st.st_size) +
                             " bytes but rank " + std::to_string(rank) + " expects " + std::to_string(total_) +
                             " (group size or channel_bytes differ between ranks)");
        }
        close(fd);
        fd = -1;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw CommTimeout("shm transport: rank " + std::to_string(rank) + " timed out after " +
                          std::to_string(timeout) + " s waiting for rank 0 to create " + seg_name_);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  void* mem = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED) {
    if (rank == 0) shm_unlink(seg_name_.c_str());
    throw CommError("shm transport: mmap of " + seg_name_ + " failed: " + std::strerror(errno));
  }
  base_ = static_cast<char*>(mem);
  auto* hdr = reinterpret_cast<ShmHeader*>(base_);
  if (rank == 0) {
    new (hdr) ShmHeader;
    hdr->magic = kMagic;
    hdr->size = size;
    hdr->channel_bytes = cap;
    hdr->total_bytes = total_;
    hdr->attached.store(0);
    hdr->aborted.store(0);
    for (int i = 0; i < kMaxRanks; ++i) hdr->pids[i].store(0);
    for (size_t i = 0; i < nch; ++i) {
      auto* ch = reinterpret_cast<ChannelHeader*>(base_ + HeaderBytes() + i * ChannelStride(cap));
      new (ch) ChannelHeader;
      Channel::Init(ch, cap);
    }
    hdr->pids[0].store(static_cast<int32_t>(getpid()));
    hdr->ready.store(1, std::memory_order_release);
  } else {
    while (hdr->ready.load(std::memory_order_acquire) != 1) {
      if (std::chrono::steady_clock::now() > deadline) {
        munmap(base_, total_);
        base_ = nullptr;
        shm_unlink(seg_name_.c_str());
        throw CommTimeout("shm transport: rank " + std::to_string(rank) + " timed out waiting for " + seg_name_ +
                          " to be initialised by rank 0");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (hdr->magic != kMagic || hdr->size != size || hdr->channel_bytes != cap) {
      int other = hdr->size;
      uint64_t other_cap = hdr->channel_bytes;
      munmap(base_, total_);
      base_ = nullptr;
      throw CommMismatch("shm transport: rank 0 created " + seg_name_ + " for size " + std::to_string(other) +
                         " with channel_bytes " + std::to_string(other_cap) + ", rank " + std::to_string(rank) +
                         " expects size " + std::to_string(size) + " with channel_bytes " + std::to_string(cap));
    }
  }
  hdr->pids[rank].store(static_cast<int32_t>(getpid()));
  hdr->probe_addr[rank] = reinterpret_cast<uint64_t>(&hdr->pids[rank]);
  if (hdr->attached.fetch_add(1) + 1 == size) shm_unlink(seg_name_.c_str());  // the last one in
  channels_.resize(nch);
  for (size_t i = 0; i < nch; ++i) {
    auto* ch = reinterpret_cast<ChannelHeader*>(base_ + HeaderBytes() + i * ChannelStride(cap));
    channels_[i] = Channel(ch, reinterpret_cast<char*>(ch) + sizeof(ChannelHeader));
  }
  while (hdr->attached.load(std::memory_order_acquire) < size) {
    std::string detail;
    for (int p = 0; p < size; ++p) {
      if (ProcessGone(hdr->pids[p].load(), &detail)) {
        shm_unlink(seg_name_.c_str());
        throw CommTimeout("shm transport: rank " + std::to_string(p) + " died while the group formed (" + detail + ")");
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      shm_unlink(seg_name_.c_str());
      throw CommTimeout("shm transport: rank " + std::to_string(rank) + " timed out after " + std::to_string(timeout) +
                        " s: only " + std::to_string(hdr->attached.load()) + " of " + std::to_string(size) +
                        " ranks attached to " + seg_name_);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

ShmTransport::~ShmTransport() {
  if (base_ != nullptr) munmap(base_, total_);
}

int ShmTransport::peer_pid(int peer) const {
  return reinterpret_cast<ShmHeader*>(base_)->pids[peer].load();
}

bool ShmTransport::DirectCapable() {
  if (direct_ >= 0) return direct_ == 1;
  direct_ = 1;
  auto* hdr = reinterpret_cast<ShmHeader*>(base_);
  for (int p = 0; p < size_ && direct_ == 1; ++p) {
    if (p == rank_) continue;
    int32_t value = 0;
    struct iovec local{&value, sizeof(value)};
    struct iovec remote{reinterpret_cast<void*>(hdr->probe_addr[p]), sizeof(value)};
    ssize_t got = process_vm_readv(peer_pid(p), &local, 1, &remote, 1, 0);
    if (got != static_cast<ssize_t>(sizeof(value)) || value != peer_pid(p)) direct_ = 0;
  }
  return direct_ == 1;
}

void ShmTransport::DirectRead(int peer, uint64_t remote, void* local, size_t n, const char* what) {
  size_t done = 0;
  while (done < n) {
    struct iovec l{static_cast<char*>(local) + done, n - done};
    struct iovec r{reinterpret_cast<void*>(remote + done), n - done};
    ssize_t got = process_vm_readv(peer_pid(peer), &l, 1, &r, 1, 0);
    if (got <= 0) {
      int err = errno;
      std::string detail;
      if (err == ESRCH || PeerDead(peer, &detail)) {
        std::string msg = "shm transport: rank " + std::to_string(rank_) + " timed out in " + what + ": peer rank " +
                          std::to_string(peer) + " died (" + (detail.empty() ? "no such process" : detail) + ")";
        SetAborted(msg);
        throw CommTimeout(msg);
      }
      std::string msg = "shm transport: direct read from rank " + std::to_string(peer) + " failed in " + what + ": " +
                        std::strerror(err);
      SetAborted(msg);
      throw CommError(msg);
    }
    done += static_cast<size_t>(got);
  }
}

bool ShmTransport::PeerDead(int peer, std::string* detail) {
  return ProcessGone(peer_pid(peer), detail);
}

bool ShmTransport::IsAborted(std::string* why) {
  auto* hdr = reinterpret_cast<ShmHeader*>(base_);
  if (hdr->aborted.load(std::memory_order_acquire) != 2) return false;
  *why = std::string(hdr->abort_msg, strnlen(hdr->abort_msg, sizeof(hdr->abort_msg)));
  return true;
}

void ShmTransport::SetAborted(const std::string& why) {
  auto* hdr = reinterpret_cast<ShmHeader*>(base_);
  int32_t expected = 0;
  if (hdr->aborted.compare_exchange_strong(expected, 1)) {
    size_t n = std::min(why.size(), sizeof(hdr->abort_msg) - 1);
    std::memcpy(hdr->abort_msg, why.data(), n);
    hdr->abort_msg[n] = '\0';
    hdr->aborted.store(2, std::memory_order_release);
  }
}

int ShmTransport::CleanupStale(const std::string& prefix) {
  std::string pre = prefix.empty() || prefix[0] != '/' ? prefix : prefix.substr(1);
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* ent = readdir(dir)) {
    std::string fname = ent->d_name;
    if (fname.rfind(pre, 0) != 0 || fname == "." || fname == "..") continue;
    const bool stale = SegmentStale("/" + fname);
    if (stale && shm_unlink(("/" + fname).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace mshyper::comm
