// Framing of the messages peers send each other, and its validation on receive: what a peer
// announces (a dtype code, a count, a shape) is checked against limits before anything is
// allocated or read for it. Spec: docs/comm.md, "Framing".
//
// * Send/recv of a Communicator: a 16-byte header {count (u64), dtype code (u64)}, then the
//   payload (count elements), padded to 8 bytes like every transport message.
// * All-to-all: every rank first sends each peer the element count it will send it (u64).
// * P2P (mindspore_hyper.comm.p2p): a 32-word int64 head {n, first n words of the descriptor},
//   the descriptor's remaining words when n > 31, then each non-empty array's bytes. Descriptor:
//   tag_len, tag..., meta_len, meta..., n_arrays, then per array: dtype code, ndim, dims...
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/types.h"

namespace mshyper::comm {

// A peer's message violates the framing; the message names the field.
class FrameError : public CommError {
 public:
  using CommError::CommError;
};

// ----- Communicator send/recv and all-to-all ------------------------------------------------
// The dtype a send/recv header announces and its payload bytes; FrameError naming `peer` and the
// field unless the code is a known dtype and count * element size fits in 64 bits.
uint64_t CheckMessageHeader(const uint64_t header[2], int peer, DType* dtype);
// The bytes of `count` elements of `esz` bytes a peer announced for one message; FrameError
// naming `peer` and `what` unless they fit in `max_bytes` (the group's max_message_bytes).
uint64_t CheckPeerCount(uint64_t count, size_t esz, uint64_t max_bytes, int peer, const char* what);

// ----- P2P messages ---------------------------------------------------------------------------
constexpr int kP2PHeadWords = 32;
constexpr int kP2PMaxTag = 8;
constexpr int kP2PMaxMeta = 64;
constexpr int kP2PMaxDims = 32;
constexpr int kP2PMaxArrays = 1024;
constexpr int kP2PNumDTypes = 9;  // codes of float32, float16, float64, int8, int16, int32, int64, uint8, bool

const char* P2PDTypeName(int code);  // nullptr outside [0, kP2PNumDTypes)
size_t P2PDTypeSize(int code);
// The longest descriptor a frame may announce (words).
size_t P2PMaxDescriptorWords();

struct P2PArrayLayout {
  int code = 0;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

struct P2PFrame {
  std::vector<int64_t> tag;
  std::vector<int64_t> meta;
  std::vector<P2PArrayLayout> arrays;
  uint64_t payload_bytes = 0;
};

// The descriptor length `n` of a frame's head; FrameError unless in [3, P2PMaxDescriptorWords()].
size_t CheckP2PDescriptorLength(int64_t n);
// Parses a descriptor of exactly `n` words; FrameError naming the field unless every length is
// within the limits above, every dtype code known, every dimension >= 0, every array's bytes and
// their sum within `max_message_bytes`, and no word is left over.
P2PFrame ParseP2PDescriptor(const int64_t* words, size_t n, uint64_t max_message_bytes);

}  // namespace mshyper::comm
