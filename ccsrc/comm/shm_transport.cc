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

#include "comm/shm_segment.h"

namespace mshyper::comm {

namespace {

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

// Creator of segment `name` from its header: whether it is this user's private segment (owner
// and mode; nothing of another user's file is mapped), its owner uid, whether it is one of ours
// (magic), whether it is still blank (not sized or no magic written yet: its creator is setting it
// up) and its creator's pid (0 if not initialised yet).
struct SegmentOwner {
  bool exists = false;
  bool private_to_us = false;
  uid_t uid = 0;
  bool ours = false;
  bool blank = false;
  int pid = 0;
};

SegmentOwner ReadOwner(const std::string& name) {
  SegmentOwner owner;
  struct stat path_st;
  if (lstat(("/dev/shm" + name).c_str(), &path_st) == 0) {
    owner.exists = true;
    owner.uid = path_st.st_uid;
  }
  int fd = shm_open(name.c_str(), O_RDONLY | O_NONBLOCK, 0);  // a FIFO of that name must not block us
  if (fd < 0) return owner;
  owner.exists = true;
  try {
    const uint64_t bytes = CheckSegmentFile(fd, name);
    owner.private_to_us = true;
    owner.uid = geteuid();
    owner.blank = bytes < sizeof(ShmHeader);
    if (!owner.blank) {
      void* mem = mmap(nullptr, sizeof(ShmHeader), PROT_READ, MAP_SHARED, fd, 0);
      if (mem != MAP_FAILED) {
        const auto* hdr = static_cast<const ShmHeader*>(mem);
        owner.ours = hdr->magic == kShmMagic;
        owner.blank = hdr->magic == 0;
        owner.pid = hdr->pids[0].load();
        munmap(mem, sizeof(ShmHeader));
      }
    }
  } catch (const CommError&) {
    struct stat st;
    if (fstat(fd, &st) == 0) owner.uid = st.st_uid;
  }
  close(fd);
  return owner;
}

// Ours, and the process that created it is gone (a crashed run's leftover).
bool SegmentStale(const std::string& name) {
  SegmentOwner owner = ReadOwner(name);
  std::string detail;
  return owner.private_to_us && owner.ours && ProcessGone(owner.pid, &detail);
}

// Rank 0's new segment, mode 0600 whatever the umask. An existing one of the same name is removed
// only when it is stale: a live one belongs to another group (another job, or a group of this job
// not yet complete), another user's can be neither used nor removed.
int CreateSegment(const std::string& name) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  int err = errno;
  if (fd < 0 && err == EEXIST && SegmentStale(name)) {
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    err = errno;
  }
  if (fd >= 0) {
    if (fchmod(fd, 0600) != 0) {
      err = errno;
      close(fd);
      shm_unlink(name.c_str());
      throw CommError("shm transport: cannot set the mode of " + name + ": " + std::strerror(err));
    }
    return fd;
  }
  if (err != EEXIST) throw CommError("shm transport: cannot create " + name + ": " + std::strerror(err));
  SegmentOwner owner = ReadOwner(name);
  std::string who = !owner.private_to_us ? "is owned by uid " + std::to_string(owner.uid) +
                                               " or not private to this user (another user created it)"
                    : owner.blank        ? "is being created by another process"
                    : !owner.ours        ? "is not a mindspore_hyper group segment"
                    : owner.pid > 0      ? "belongs to the live process " + std::to_string(owner.pid)
                                         : "is being created by another process";
  throw CommError("shm transport: segment " + name + " already exists and " + who +
                  ": another group uses the same name (give each group of a job, and each job, its own name)");
}

// Closes a descriptor on every path out of the constructor.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

ShmTransport::ShmTransport(const std::string& name, int rank, int size, size_t channel_bytes, double timeout)
    : Transport(rank, size), seg_name_(ShmName(name)), layout_(SegmentLayout::For(size, channel_bytes)) {
  if (rank < 0 || rank >= size) {
    throw CommError("shm transport: rank " + std::to_string(rank) + " outside [0, " + std::to_string(size) + ")");
  }
  set_timeout(timeout);
  total_ = layout_.total_bytes;
  const auto deadline = std::chrono::steady_clock::now() + WaitDuration(timeout);
  FdGuard fd;
  if (rank == 0) {
    fd.fd = CreateSegment(seg_name_);
    if (ftruncate(fd.fd, static_cast<off_t>(total_)) != 0) {
      int err = errno;
      shm_unlink(seg_name_.c_str());
      throw CommError("shm transport: cannot size " + seg_name_ + ": " + std::strerror(err));
    }
  } else {
    while (true) {
      fd.fd = shm_open(seg_name_.c_str(), O_RDWR | O_NONBLOCK, 0600);
      if (fd.fd < 0 && errno != ENOENT) {
        const int err = errno;
        SegmentOwner owner = ReadOwner(seg_name_);
        throw CommError("shm transport: rank " + std::to_string(rank) + " cannot open segment " + seg_name_ + ": " +
                        std::strerror(err) + (owner.exists ? " (owner uid " + std::to_string(owner.uid) + ")" : "") +
                        ": refusing to attach to a segment this user did not create");
      }
      if (fd.fd >= 0) {
        const uint64_t bytes = CheckSegmentFile(fd.fd, seg_name_);  // owner and mode before anything is mapped
        if (bytes == total_) break;
        if (bytes != 0) {
          throw CommMismatch("shm transport: segment " + seg_name_ + " has " + std::to_string(bytes) +
                             " bytes but rank " + std::to_string(rank) + " expects " + std::to_string(total_) +
                             " (group size or channel_bytes differ between ranks)");
        }
        close(fd.fd);
        fd.fd = -1;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw CommTimeout("shm transport: rank " + std::to_string(rank) + " timed out after " +
                          std::to_string(timeout) + " s waiting for rank 0 to create " + seg_name_ +
                          " (ranks of one job must share its token: see docs/comm.md, Security model)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  void* mem = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    if (rank == 0) shm_unlink(seg_name_.c_str());
    throw CommError("shm transport: mmap of " + seg_name_ + " failed: " + std::strerror(err));
  }
  base_ = static_cast<char*>(mem);
  try {
    Attach(deadline);
  } catch (...) {
    munmap(base_, total_);
    base_ = nullptr;
    throw;
  }
}

void ShmTransport::Attach(std::chrono::steady_clock::time_point deadline) {
  auto* hdr = reinterpret_cast<ShmHeader*>(base_);
  const size_t nch = layout_.channels();
  if (rank_ == 0) {
    InitSegment(base_, layout_, static_cast<int32_t>(getpid()));
  } else {
    while (hdr->ready.load(std::memory_order_acquire) != 1) {
      if (std::chrono::steady_clock::now() > deadline) {
        shm_unlink(seg_name_.c_str());
        throw CommTimeout("shm transport: rank " + std::to_string(rank_) + " timed out waiting for " + seg_name_ +
                          " to be initialised by rank 0");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ValidateSegment(base_, total_, layout_, seg_name_);
  }
  hdr->pids[rank_].store(static_cast<int32_t>(getpid()));
  hdr->probe_addr[rank_] = reinterpret_cast<uint64_t>(&hdr->pids[rank_]);
  if (hdr->attached.fetch_add(1) + 1 == size_) shm_unlink(seg_name_.c_str());  // the last one in
  channels_.resize(nch);
  for (size_t i = 0; i < nch; ++i) {
    auto* ch = reinterpret_cast<ChannelHeader*>(base_ + layout_.ChannelOffset(i));
    channels_[i] = Channel(ch, reinterpret_cast<char*>(ch) + sizeof(ChannelHeader), layout_.capacity);
  }
  while (hdr->attached.load(std::memory_order_acquire) < size_) {
    std::string detail;
    for (int p = 0; p < size_; ++p) {
      if (ProcessGone(hdr->pids[p].load(), &detail)) {
        shm_unlink(seg_name_.c_str());
        throw CommTimeout("shm transport: rank " + std::to_string(p) + " died while the group formed (" + detail + ")");
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      shm_unlink(seg_name_.c_str());
      throw CommTimeout("shm transport: rank " + std::to_string(rank_) + " timed out after " +
                        std::to_string(timeout()) + " s: only " + std::to_string(hdr->attached.load()) + " of " +
                        std::to_string(size_) + " ranks attached to " + seg_name_);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Every rank wrote its pid before it counted itself in: from here on the pids are this
  // process's own copy (a later write to the header cannot redirect a liveness check or a read).
  pids_.resize(size_);
  for (int p = 0; p < size_; ++p) {
    pids_[p] = hdr->pids[p].load(std::memory_order_acquire);
    if (pids_[p] <= 0) {
      throw CommError("shm transport: segment " + seg_name_ + " is corrupt: rank " + std::to_string(p) + "'s pid is " +
                      std::to_string(pids_[p]));
    }
  }
}

ShmTransport::~ShmTransport() {
  if (base_ != nullptr) munmap(base_, total_);
}

int ShmTransport::peer_pid(int peer) const { return pids_.at(static_cast<size_t>(peer)); }

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
