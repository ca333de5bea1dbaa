// Single-producer single-consumer byte ring in a caller-provided memory region (process heap for
// the in-process transport, a POSIX shared-memory segment for the shared-memory transport).
// `head` counts bytes ever written, `tail` bytes ever consumed; both only grow. The region holds
// a ChannelHeader followed by `capacity` data bytes (capacity a multiple of 64).
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
  Channel(ChannelHeader* hdr, char* data) : hdr_(hdr), data_(data), cap_(hdr->capacity) {}

  static void Init(ChannelHeader* hdr, uint64_t capacity) {
    hdr->head.store(0, std::memory_order_relaxed);
    hdr->tail.store(0, std::memory_order_relaxed);
    hdr->capacity = capacity;
  }

  // Producer: contiguous writable bytes at the current write position.
  size_t Writable(char** ptr) const {
    uint64_t head = hdr_->head.load(std::memory_order_relaxed);
    uint64_t tail = hdr_->tail.load(std::memory_order_acquire);
    uint64_t free_bytes = cap_ - (head - tail);
    uint64_t off = head % cap_;
    *ptr = data_ + off;
    return static_cast<size_t>(std::min<uint64_t>(free_bytes, cap_ - off));
  }
  void Commit(size_t n) { hdr_->head.fetch_add(n, std::memory_order_release); }

  // Consumer: contiguous readable bytes at the current read position.
  size_t Readable(const char** ptr) const {
    uint64_t tail = hdr_->tail.load(std::memory_order_relaxed);
    uint64_t head = hdr_->head.load(std::memory_order_acquire);
    uint64_t avail = head - tail;
    uint64_t off = tail % cap_;
    *ptr = data_ + off;
    return static_cast<size_t>(std::min<uint64_t>(avail, cap_ - off));
  }
  void Consume(size_t n) { hdr_->tail.fetch_add(n, std::memory_order_release); }

  bool valid() const { return hdr_ != nullptr; }

 private:
  ChannelHeader* hdr_ = nullptr;
  char* data_ = nullptr;
  uint64_t cap_ = 0;
};

}  // namespace mshyper::comm
