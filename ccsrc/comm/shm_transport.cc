#include "comm/shm_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
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

// Creation temporaries: rank 0 builds a group's segment under `<name>.<pid>.<n>.init` (its own
// pid, a number it never used before) and publishes it under `name` only once the header is written.
constexpr char kTempSuffix[] = ".init";

// The creation temporary of segment `name` (a "/"-prefixed shm name) for process `pid`'s `seq`-th
// creation; the name part is shortened where name + suffix would exceed NAME_MAX.
std::string TempName(const std::string& name, int pid, uint64_t seq) {
  const std::string suffix = "." + std::to_string(pid) + "." + std::to_string(seq) + kTempSuffix;
  const size_t keep = std::min(name.size() - 1, static_cast<size_t>(NAME_MAX) - suffix.size());
  return name.substr(0, 1 + keep) + suffix;
}

bool AllDigits(const std::string& s) {
  return !s.empty() && s.size() <= 19 && s.find_first_not_of("0123456789") == std::string::npos;
}

// The creator pid of a creation temporary named `fname` (`...<pid>.<n>.init`); 0 when it is not one.
int TempPid(const std::string& fname) {
  const size_t suffix = sizeof(kTempSuffix) - 1;
  if (fname.size() <= suffix || fname.compare(fname.size() - suffix, suffix, kTempSuffix) != 0) return 0;
  const std::string stem = fname.substr(0, fname.size() - suffix);
  const size_t dot_seq = stem.rfind('.');
  if (dot_seq == std::string::npos || dot_seq == 0 || !AllDigits(stem.substr(dot_seq + 1))) return 0;
  const size_t dot_pid = stem.rfind('.', dot_seq - 1);
  if (dot_pid == std::string::npos) return 0;
  const std::string pid = stem.substr(dot_pid + 1, dot_seq - dot_pid - 1);
  if (!AllDigits(pid)) return 0;
  const long long value = std::stoll(pid);
  return value > 0 && value <= INT32_MAX ? static_cast<int>(value) : 0;
}

// Seconds since the inode's last status change (creation, sizing, linking: a process cannot set it back).
double SecondsSinceChange(const struct stat& st) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec - st.st_ctim.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec - st.st_ctim.tv_nsec);
}

// Creator of segment `name` from its header: whether it is this user's private segment (owner
// and mode; nothing of another user's file is mapped), its owner uid, whether it is one of ours
// (magic), whether it is blank (not sized or no magic: a creator died before writing the header,
// or an older version of this library is still writing it), its creator's pid (0 if blank) and
// the seconds since its inode last changed.
struct SegmentOwner {
  bool exists = false;
  bool private_to_us = false;
  uid_t uid = 0;
  bool ours = false;
  bool blank = false;
  int pid = 0;
  double age_s = 0;
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
    struct stat st;
    if (fstat(fd, &st) == 0) owner.age_s = SecondsSinceChange(st);
    owner.blank = bytes < sizeof(ShmHeader);
    if (!owner.blank) {
      void* mem = mmap(nullptr, sizeof(ShmHeader), PROT_READ, MAP_SHARED, fd, 0);
      if (mem != MAP_FAILED) {
        const auto* hdr = static_cast<const ShmHeader*>(mem);
        owner.ours = hdr->magic == kShmMagic;
        owner.blank = hdr->magic == 0;
        owner.pid = owner.blank ? 0 : hdr->pids[0].load();
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

// A segment under a group's final name that may be removed: ours and its creator is gone (a crashed
// run's leftover), or blank for longer than `blank_age_s` (a creator of an older version, which
// published the name before writing the header, died in between: no pid says so, its age does).
bool SegmentStale(const SegmentOwner& owner, double blank_age_s) {
  if (!owner.private_to_us) return false;  // another user's: neither used nor removed
  if (owner.blank) return owner.age_s > blank_age_s;
  std::string detail;
  return owner.ours && ProcessGone(owner.pid, &detail);
}

// A creation temporary that may be removed: the pid in its name is gone, and so is the creator pid
// in its header where one was written (never a temporary whose creator is alive).
bool TempStale(const std::string& name, int name_pid) {
  const SegmentOwner owner = ReadOwner(name);
  std::string detail;
  if (!owner.private_to_us || !ProcessGone(name_pid, &detail)) return false;
  return !owner.ours || owner.pid <= 0 || owner.pid == name_pid || ProcessGone(owner.pid, &detail);
}

// Why rank 0 cannot publish its segment under `name`, which exists and is not stale.
std::string Refusal(const std::string& name, const SegmentOwner& owner, double blank_age_s) {
  std::string who;
  if (!owner.private_to_us) {
    who = "is owned by uid " + std::to_string(owner.uid) + " or not private to this user (another user created it)";
  } else if (owner.blank) {
    who = "is blank (no header: an older mindspore_hyper is still creating it, or its creator died before writing "
          "one; changed " + std::to_string(owner.age_s) + " s ago, removed once older than the group timeout, " +
          std::to_string(blank_age_s) + " s)";
  } else if (!owner.ours) {
    who = "is not a mindspore_hyper group segment";
  } else if (owner.pid > 0) {
    who = "belongs to the live process " + std::to_string(owner.pid);
  } else {
    who = "is a mindspore_hyper group segment without a creator pid (corrupt; remove it by hand)";
  }
  return "shm transport: segment " + name + " already exists and " + who +
         ": another group uses the same name (give each group of a job, and each job, its own name)";
}

// A descriptor closed on every path out.
struct FdGuard {
  int fd = -1;
  FdGuard() = default;
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  ~FdGuard() {
    if (fd >= 0) close(fd);
  }
};

// A shared mapping unmapped on every path out unless released to its owner.
class Mapping {
 public:
  Mapping(int fd, size_t bytes, const std::string& name) : bytes_(bytes) {
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
      const int err = errno;
      throw CommError("shm transport: mmap of " + name + " failed: " + std::strerror(err));
    }
    base_ = static_cast<char*>(mem);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  char* get() const { return base_; }
  char* release() {
    char* base = base_;
    base_ = nullptr;
    return base;
  }

 private:
  char* base_ = nullptr;
  size_t bytes_;
};

// A creation temporary, mode 0600 whatever the umask, unlinked on every path out (once published,
// the segment lives on under its final name).
class TempSegment {
 public:
  explicit TempSegment(const std::string& final_name) {
    static std::atomic<uint64_t> next_seq{0};  // never reused in this process: two threads never share a temporary
    name_ = TempName(final_name, static_cast<int>(getpid()), next_seq.fetch_add(1));
    fd_.fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd_.fd < 0 && errno == EEXIST) {
      // this process never used this number: an earlier process with the same pid left it
      shm_unlink(name_.c_str());
      fd_.fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd_.fd < 0) {
      const int err = errno;
      throw CommError("shm transport: cannot create " + name_ + " (the creation temporary of " + final_name +
                      "): " + std::strerror(err));
    }
    created_ = true;
    if (fchmod(fd_.fd, 0600) != 0) {
      const int err = errno;
      throw CommError("shm transport: cannot set the mode of " + name_ + ": " + std::strerror(err));
    }
  }
  TempSegment(const TempSegment&) = delete;
  TempSegment& operator=(const TempSegment&) = delete;
  ~TempSegment() {
    if (created_) shm_unlink(name_.c_str());
  }
  int fd() const { return fd_.fd; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  FdGuard fd_;
  bool created_ = false;
};

// Makes the initialised temporary visible under `name` at once, header included: link() never
// replaces an existing name (EEXIST). A stale segment of that name is removed and the link tried
// again; a live, blank-but-young, foreign or other user's one is refused, naming why.
void Publish(const TempSegment& tmp, const std::string& name, double blank_age_s) {
  const std::string from = "/dev/shm" + tmp.name(), to = "/dev/shm" + name;
  constexpr int kAttempts = 3;  // the name vanishing or turning stale again between two tries is rare
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (link(from.c_str(), to.c_str()) == 0) return;
    const int err = errno;
    if (err != EEXIST) {
      throw CommError("shm transport: cannot publish " + name + " (link from " + tmp.name() + "): " +
                      std::strerror(err));
    }
    const SegmentOwner owner = ReadOwner(name);
    if (!owner.exists) continue;  // its last rank unlinked it meanwhile
    if (!SegmentStale(owner, blank_age_s)) throw CommError(Refusal(name, owner, blank_age_s));
    shm_unlink(name.c_str());
  }
  throw CommError("shm transport: cannot publish " + name + ": the name reappeared " + std::to_string(kAttempts) +
                  " times after its stale segment was removed (another process creates the same group)");
}

// Rank 0's new segment, mapped, its header and channels initialised, published under `name`.
char* CreateSegment(const std::string& name, const SegmentLayout& layout, double blank_age_s) {
  TempSegment tmp(name);
  if (ftruncate(tmp.fd(), static_cast<off_t>(layout.total_bytes)) != 0) {
    const int err = errno;
    throw CommError("shm transport: cannot size " + tmp.name() + ": " + std::strerror(err));
  }
  Mapping map(tmp.fd(), layout.total_bytes, tmp.name());
  InitSegment(map.get(), layout, static_cast<int32_t>(getpid()));
  Publish(tmp, name, blank_age_s);
  return map.release();
}

// A rank > 0's descriptor of the segment rank 0 published under `name` (this user's, mode 0600,
// `total` bytes), waiting for it until `deadline`.
int OpenSegment(const std::string& name, int rank, size_t total, double timeout,
                std::chrono::steady_clock::time_point deadline) {
  while (true) {
    FdGuard fd;
    fd.fd = shm_open(name.c_str(), O_RDWR | O_NONBLOCK, 0600);
    if (fd.fd < 0 && errno != ENOENT) {
      const int err = errno;
      SegmentOwner owner = ReadOwner(name);
      throw CommError("shm transport: rank " + std::to_string(rank) + " cannot open segment " + name + ": " +
                      std::strerror(err) + (owner.exists ? " (owner uid " + std::to_string(owner.uid) + ")" : "") +
                      ": refusing to attach to a segment this user did not create");
    }
    if (fd.fd >= 0) {
      const uint64_t bytes = CheckSegmentFile(fd.fd, name);  // owner and mode before anything is mapped
      if (bytes == total) {
        const int out = fd.fd;
        fd.fd = -1;
        return out;
      }
      if (bytes != 0) {  // 0: an older version's rank 0 publishing before sizing
        throw CommMismatch("shm transport: segment " + name + " has " + std::to_string(bytes) + " bytes but rank " +
                           std::to_string(rank) + " expects " + std::to_string(total) +
                           " (group size or channel_bytes differ between ranks)");
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw CommTimeout("shm transport: rank " + std::to_string(rank) + " timed out after " + std::to_string(timeout) +
                        " s waiting for rank 0 to create " + name +
                        " (ranks of one job must share its token: see docs/comm.md, Security model)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

ShmTransport::ShmTransport(const std::string& name, int rank, int size, size_t channel_bytes, double timeout)
    : Transport(rank, size), seg_name_(ShmName(name)), layout_(SegmentLayout::For(size, channel_bytes)) {
  if (rank < 0 || rank >= size) {
    throw CommError("shm transport: rank " + std::to_string(rank) + " outside [0, " + std::to_string(size) + ")");
  }
  if (TempPid(seg_name_.substr(1)) > 0) {
    throw CommError("shm transport: segment name '" + name + "' ends like a creation temporary (.<pid>.<n>" +
                    kTempSuffix + "), which cleanup_stale_segments removes once that pid is gone: choose another");
  }
  set_timeout(timeout);
  total_ = layout_.total_bytes;
  const auto deadline = std::chrono::steady_clock::now() + WaitDuration(timeout);
  if (rank == 0) {
    base_ = CreateSegment(seg_name_, layout_, timeout);
  } else {
    FdGuard fd;
    fd.fd = OpenSegment(seg_name_, rank, total_, timeout, deadline);
    base_ = Mapping(fd.fd, total_, seg_name_).release();
  }
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
  if (rank_ > 0) {  // rank 0 initialised the segment before publishing it
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

int ShmTransport::CleanupStale(const std::string& prefix, double blank_age_s) {
  if (!(blank_age_s >= 0)) {
    throw CommError("shm transport: cleanup_stale_segments: blank_age_s must be >= 0 seconds (inf: never), got " +
                    std::to_string(blank_age_s));
  }
  std::string pre = prefix.empty() || prefix[0] != '/' ? prefix : prefix.substr(1);
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* ent = readdir(dir)) {
    std::string fname = ent->d_name;
    if (fname.rfind(pre, 0) != 0 || fname == "." || fname == "..") continue;
    const std::string name = "/" + fname;
    const int temp_pid = TempPid(fname);
    const bool stale = temp_pid > 0 ? TempStale(name, temp_pid) : SegmentStale(ReadOwner(name), blank_age_s);
    if (stale && shm_unlink(name.c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace mshyper::comm
