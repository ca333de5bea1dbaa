// Single-producer single-consumer byte ring in a caller-provided memory region (process heap for
// the in-process transport, a POSIX shared-memory segment for the shared-memory transport).
// `head` counts bytes ever written, `tail` bytes ever consumed; both only grow. The region holds
// a ChannelHeader followed by `capacity` data bytes (capacity a multiple of 64).
//
// The ring's capacity is this process's own value, never re-read from the (shared) header, so
// every access stays inside the region whatever a peer writes there; head and tail, which the
// peer does write, are bounded per step (head - tail <= capacity): a violation is kCorrupt.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

namespace mshyper::comm {

struct alignas(64) ChannelHeader {
  std::atomic<uint64_t> head;
  char pad0[56];
  std::atomic<uint64_t> tail;
  char pad1[56];
  uint64_t capacity;
  char pad2[56];
};
static_assert(sizeof(ChannelHeader) == 192, "channel header layout");

class Channel {
 public:
  Channel() = default;
  // `capacity` is the data bytes at `data` as this process laid them out (non-zero).
  Channel(ChannelHeader* hdr, char* data, uint64_t capacity) : hdr_(hdr), data_(data), cap_(capacity) {}

  // Writable / Readable when head and tail are inconsistent (head - tail > capacity): the ring's
  // memory was overwritten; the caller fails the transfer.
  static constexpr size_t kCorrupt = ~static_cast<size_t>(0);

  static void Init(ChannelHeader* hdr, uint64_t capacity) {
    hdr->head.store(0, std::memory_order_relaxed);
    hdr->tail.store(0, std::memory_order_relaxed);
    hdr->capacity = capacity;
  }

  // Producer: contiguous writable bytes at the current write position (or kCorrupt).
  size_t Writable(char** ptr) const {
    uint64_t head = hdr_->head.load(std::memory_order_relaxed);
    uint64_t tail = hdr_->tail.load(std::memory_order_acquire);
    if (head - tail > cap_) return kCorrupt;
    uint64_t free_bytes = cap_ - (head - tail);
    uint64_t off = head % cap_;
    *ptr = data_ + off;
    return static_cast<size_t>(std::min<uint64_t>(free_bytes, cap_ - off));
  }
  void Commit(size_t n) { hdr_->head.fetch_add(n, std::memory_order_release); }

  // Consumer: contiguous readable bytes at the current read position (or kCorrupt).
  size_t Readable(const char** ptr) const {
    uint64_t tail = hdr_->tail.load(std::memory_order_relaxed);
    uint64_t head = hdr_->head.load(std::memory_order_acquire);
    uint64_t avail = head - tail;
    if (avail > cap_) return kCorrupt;
    uint64_t off = tail % cap_;
    *ptr = data_ + off;
    return static_cast<size_t>(std::min<uint64_t>(avail, cap_ - off));
  }
  void Consume(size_t n) { hdr_->tail.fetch_add(n, std::memory_order_release); }

  bool valid() const { return hdr_ != nullptr; }
  uint64_t capacity() const { return cap_; }

 private:
  ChannelHeader* hdr_ = nullptr;
  char* data_ = nullptr;
  uint64_t cap_ = 0;
};

}  // namespace mshyper::comm
