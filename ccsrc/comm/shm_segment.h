// Layout of a shared-memory group's segment and the checks a rank applies before it trusts one.
//
// A segment is a header (magic, geometry, attach count, abort flag, every rank's pid) followed by
// size*size channels (ChannelHeader + `capacity` data bytes each). Every rank computes the layout
// from its own arguments (SegmentLayout::For) and never takes a size, capacity or offset from the
// segment: what the segment says is compared with the layout once, at attach (ValidateSegment),
// and the hot path uses the layout only. The file itself is checked before it is mapped
// (CheckSegmentFile): a regular file of this user with mode 0600, so no other user can have
// created it, read it or written it.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/channel.h"

namespace mshyper::comm {

constexpr int kShmMaxRanks = 256;
constexpr uint64_t kShmMagic = 0x4d5348595045524dULL;  // "MSHYPERM"

struct alignas(64) ShmHeader {
  uint64_t magic;
  uint32_t header_bytes;  // sizeof(ShmHeader) of the creator's build
  int32_t size;
  uint64_t channel_bytes;
  uint64_t total_bytes;
  std::atomic<int32_t> ready;
  std::atomic<int32_t> attached;
  std::atomic<int32_t> aborted;  // 0 no, 1 being written, 2 aborted (abort_msg valid)
  int32_t pad;
  char abort_msg[512];
  std::atomic<int32_t> pids[kShmMaxRanks];
  uint64_t probe_addr[kShmMaxRanks];  // where each rank's process maps pids[rank] (direct-read probe)
};

// Geometry of the segment of a group, computed from this rank's own arguments.
struct SegmentLayout {
  int size = 0;
  uint64_t capacity = 0;  // data bytes per channel: a multiple of 64, at least 4096
  size_t header_bytes = 0;
  size_t total_bytes = 0;

  // CommError when `size` is outside [1, kShmMaxRanks] or the segment would not fit in memory.
  static SegmentLayout For(int size, size_t channel_bytes);
  size_t channels() const { return static_cast<size_t>(size) * static_cast<size_t>(size); }
  size_t ChannelOffset(size_t i) const { return header_bytes + i * (sizeof(ChannelHeader) + capacity); }
};

// Rank 0: writes the header and every channel header into the fresh segment at `base` and
// publishes it (ready = 1, release).
void InitSegment(char* base, const SegmentLayout& layout, int32_t creator_pid);

// Once `ready` was seen: the segment at `base` (`mapped` bytes) against this rank's layout --
// magic, header size, group size, channel bytes, total bytes, attach count, abort state, every
// pid, every channel's capacity and head - tail <= capacity. CommMismatch (the ranks were given
// different sizes or channel bytes) or CommError (a corrupt segment), naming `name`.
void ValidateSegment(const char* base, size_t mapped, const SegmentLayout& layout, const std::string& name);

// The file behind `fd`, before it is mapped: a regular file owned by this process's effective
// user with mode 0600; returns its size. CommError naming `name`, the owner and the mode otherwise.
uint64_t CheckSegmentFile(int fd, const std::string& name);

// `name` as a POSIX shared-memory name ("/" prefixed); CommError when it holds another '/' or is
// longer than NAME_MAX (a long group name must be hashed first: see mindspore_hyper.comm.shm).
std::string ShmName(const std::string& name);

}  // namespace mshyper::comm
