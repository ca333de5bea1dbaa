#include "comm/shm_segment.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <new>

#include "comm/types.h"

namespace mshyper::comm {

namespace {

std::string Octal(unsigned mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0%o", mode);
  return buf;
}

[[noreturn]] void Corrupt(const std::string& name, const std::string& what) {
  throw CommError("shm transport: segment " + name + " is corrupt: " + what);
}

}  // namespace

SegmentLayout SegmentLayout::For(int size, size_t channel_bytes) {
  if (size <= 0 || size > kShmMaxRanks) {
    throw CommError("shm transport: group size " + std::to_string(size) + " outside [1, " +
                    std::to_string(kShmMaxRanks) + "]");
  }
  SegmentLayout l;
  l.size = size;
  l.capacity = std::max<uint64_t>(4096, channel_bytes & ~static_cast<uint64_t>(63));
  l.header_bytes = (sizeof(ShmHeader) + 63) & ~static_cast<size_t>(63);
  const uint64_t stride = CheckedAdd(sizeof(ChannelHeader), l.capacity, "shm transport: channel_bytes");
  l.total_bytes = CheckedAdd(l.header_bytes, CheckedMul(l.channels(), stride, "shm transport: channel_bytes"),
                             "shm transport: channel_bytes");
  return l;
}

void InitSegment(char* base, const SegmentLayout& layout, int32_t creator_pid) {
  auto* hdr = new (base) ShmHeader;
  hdr->magic = kShmMagic;
  hdr->header_bytes = sizeof(ShmHeader);
  hdr->size = layout.size;
  hdr->channel_bytes = layout.capacity;
  hdr->total_bytes = layout.total_bytes;
  hdr->attached.store(0);
  hdr->aborted.store(0);
  for (int i = 0; i < kShmMaxRanks; ++i) {
    hdr->pids[i].store(0);
    hdr->probe_addr[i] = 0;
  }
  for (size_t i = 0; i < layout.channels(); ++i) {
    auto* ch = new (base + layout.ChannelOffset(i)) ChannelHeader;
    Channel::Init(ch, layout.capacity);
  }
  hdr->pids[0].store(creator_pid);
  hdr->ready.store(1, std::memory_order_release);
}

void ValidateSegment(const char* base, size_t mapped, const SegmentLayout& layout, const std::string& name) {
  if (mapped < layout.total_bytes) {
    Corrupt(name, std::to_string(mapped) + " bytes mapped, the layout needs " + std::to_string(layout.total_bytes));
  }
  const auto* hdr = reinterpret_cast<const ShmHeader*>(base);
  if (hdr->magic != kShmMagic) Corrupt(name, "bad magic (not a mindspore_hyper group segment)");
  if (hdr->header_bytes != sizeof(ShmHeader)) {
    throw CommMismatch("shm transport: segment " + name + " has a " + std::to_string(hdr->header_bytes) +
                       "-byte header, this build expects " + std::to_string(sizeof(ShmHeader)) +
                       " (ranks run different builds of mindspore_hyper)");
  }
  if (hdr->size != layout.size || hdr->channel_bytes != layout.capacity) {
    throw CommMismatch("shm transport: rank 0 created " + name + " for size " + std::to_string(hdr->size) +
                       " with channel_bytes " + std::to_string(hdr->channel_bytes) + ", this rank expects size " +
                       std::to_string(layout.size) + " with channel_bytes " + std::to_string(layout.capacity));
  }
  if (hdr->total_bytes != layout.total_bytes) {
    Corrupt(name, "total_bytes " + std::to_string(hdr->total_bytes) + ", expected " +
                      std::to_string(layout.total_bytes));
  }
  const int32_t attached = hdr->attached.load(std::memory_order_acquire);
  if (attached < 0 || attached >= layout.size) {
    Corrupt(name, "attach count " + std::to_string(attached) + " outside [0, " + std::to_string(layout.size) + ")");
  }
  const int32_t aborted = hdr->aborted.load(std::memory_order_acquire);
  if (aborted < 0 || aborted > 2) Corrupt(name, "abort state " + std::to_string(aborted) + " outside [0, 2]");
  for (int r = 0; r < kShmMaxRanks; ++r) {
    const int32_t pid = hdr->pids[r].load(std::memory_order_relaxed);
    if (pid < 0 || (r >= layout.size && pid != 0)) {
      Corrupt(name, "pid of rank " + std::to_string(r) + " is " + std::to_string(pid));
    }
  }
  for (size_t i = 0; i < layout.channels(); ++i) {
    const auto* ch = reinterpret_cast<const ChannelHeader*>(base + layout.ChannelOffset(i));
    const uint64_t head = ch->head.load(std::memory_order_acquire), tail = ch->tail.load(std::memory_order_acquire);
    if (ch->capacity != layout.capacity || head - tail > layout.capacity) {
      Corrupt(name, "channel " + std::to_string(i / layout.size) + " -> " + std::to_string(i % layout.size) +
                        " has capacity " + std::to_string(ch->capacity) + " (expected " +
                        std::to_string(layout.capacity) + "), head " + std::to_string(head) + ", tail " +
                        std::to_string(tail));
    }
  }
}

uint64_t CheckSegmentFile(int fd, const std::string& name) {
  struct stat st;
  if (fstat(fd, &st) != 0) throw CommError("shm transport: cannot stat segment " + name);
  const unsigned mode = static_cast<unsigned>(st.st_mode) & 07777u;
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || mode != 0600u) {
    throw CommError("shm transport: segment " + name + " is not this user's private segment (owner uid " +
                    std::to_string(st.st_uid) + ", mode " + Octal(mode) + "; expected uid " +
                    std::to_string(geteuid()) + ", mode 0600): refusing to attach to it");
  }
  if (st.st_size < 0) throw CommError("shm transport: segment " + name + " has a negative size");
  return static_cast<uint64_t>(st.st_size);
}

std::string ShmName(const std::string& name) {
  const std::string shm = name.empty() || name[0] != '/' ? "/" + name : name;
  if (shm.size() < 2 || shm.find('/', 1) != std::string::npos || shm.size() - 1 > NAME_MAX) {
    throw CommError("shm transport: segment name '" + name + "' must be 1 to " + std::to_string(NAME_MAX) +
                    " characters without '/' (got " + std::to_string(shm.size() - 1) + ")");
  }
  return shm;
}

}  // namespace mshyper::comm
