#include "comm/frame.h"

namespace mshyper::comm {

namespace {

struct P2PDType {
  const char* name;
  size_t size;
};
constexpr P2PDType kP2PDTypes[kP2PNumDTypes] = {{"float32", 4}, {"float16", 2}, {"float64", 8},
                                                {"int8", 1},    {"int16", 2},   {"int32", 4},
                                                {"int64", 8},   {"uint8", 1},   {"bool", 1}};

[[noreturn]] void Bad(const std::string& field, int64_t value, const std::string& expected) {
  throw FrameError("field '" + field + "' = " + std::to_string(value) + ": expected " + expected);
}

// Reads the descriptor's words in order; running past the end is a FrameError naming the field.
class Reader {
 public:
  Reader(const int64_t* words, size_t n) : words_(words), n_(n) {}
  int64_t Take(const std::string& field) {
    if (pos_ >= n_) {
      throw FrameError("field '" + field + "' is missing: the descriptor ends after " + std::to_string(n_) + " words");
    }
    return words_[pos_++];
  }
  // A length word in [lo, hi].
  int64_t Length(const std::string& field, int64_t lo, int64_t hi) {
    const int64_t v = Take(field);
    if (v < lo || v > hi) Bad(field, v, "a length in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
  }
  size_t left() const { return n_ - pos_; }

 private:
  const int64_t* words_;
  size_t n_;
  size_t pos_ = 0;
};

}  // namespace

uint64_t CheckMessageHeader(const uint64_t header[2], int peer, DType* dtype) {
  if (!DTypeFromCode(header[1], dtype)) {
    throw FrameError("recv: rank " + std::to_string(peer) + " sent a header with field 'dtype' = " +
                     std::to_string(header[1]) + ": expected a dtype code in [0, 5]");
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(header[0], static_cast<uint64_t>(DTypeSize(*dtype)), &bytes)) {
    throw FrameError("recv: rank " + std::to_string(peer) + " sent a header with field 'count' = " +
                     std::to_string(header[0]) + " x " + DTypeName(*dtype) + ": the bytes overflow 64 bits");
  }
  return bytes;
}

uint64_t CheckPeerCount(uint64_t count, size_t esz, uint64_t max_bytes, int peer, const char* what) {
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(esz), &bytes) || bytes > max_bytes) {
    throw FrameError(std::string(what) + ": rank " + std::to_string(peer) + " announced field 'count' = " +
                     std::to_string(count) + " elements of " + std::to_string(esz) +
                     " bytes: expected at most max_message_bytes = " + std::to_string(max_bytes) + " bytes");
  }
  return bytes;
}

const char* P2PDTypeName(int code) { return code >= 0 && code < kP2PNumDTypes ? kP2PDTypes[code].name : nullptr; }

size_t P2PDTypeSize(int code) { return code >= 0 && code < kP2PNumDTypes ? kP2PDTypes[code].size : 0; }

size_t P2PMaxDescriptorWords() {
  return 1 + kP2PMaxTag + 1 + kP2PMaxMeta + 1 + static_cast<size_t>(kP2PMaxArrays) * (2 + kP2PMaxDims);
}

size_t CheckP2PDescriptorLength(int64_t n) {
  if (n < 3 || static_cast<uint64_t>(n) > P2PMaxDescriptorWords()) {
    Bad("descriptor length", n, "a word count in [3, " + std::to_string(P2PMaxDescriptorWords()) + "]");
  }
  return static_cast<size_t>(n);
}

P2PFrame ParseP2PDescriptor(const int64_t* words, size_t n, uint64_t max_message_bytes) {
  Reader in(words, n);
  P2PFrame f;
  const int64_t ntag = in.Length("tag length", 1, kP2PMaxTag);
  for (int64_t i = 0; i < ntag; ++i) f.tag.push_back(in.Take("tag[" + std::to_string(i) + "]"));
  const int64_t nmeta = in.Length("meta length", 0, kP2PMaxMeta);
  for (int64_t i = 0; i < nmeta; ++i) f.meta.push_back(in.Take("meta[" + std::to_string(i) + "]"));
  const int64_t narrays = in.Length("array count", 0, kP2PMaxArrays);
  f.arrays.reserve(static_cast<size_t>(narrays));
  for (int64_t a = 0; a < narrays; ++a) {
    const std::string field = "arrays[" + std::to_string(a) + "]";
    P2PArrayLayout layout;
    const int64_t code = in.Take(field + ".dtype");
    if (code < 0 || code >= kP2PNumDTypes) {
      Bad(field + ".dtype", code, "a dtype code in [0, " + std::to_string(kP2PNumDTypes - 1) + "]");
    }
    layout.code = static_cast<int>(code);
    const int64_t ndim = in.Length(field + ".ndim", 0, kP2PMaxDims);
    uint64_t bytes = P2PDTypeSize(layout.code);
    for (int64_t d = 0; d < ndim; ++d) {
      const std::string dim = field + ".shape[" + std::to_string(d) + "]";
      const int64_t v = in.Take(dim);
      if (v < 0) Bad(dim, v, "a dimension >= 0");
      layout.shape.push_back(v);
      if (bytes != 0 && (__builtin_mul_overflow(bytes, static_cast<uint64_t>(v), &bytes) || bytes > max_message_bytes)) {
        Bad(dim, v, "an array of at most max_message_bytes = " + std::to_string(max_message_bytes) + " bytes");
      }
    }
    if (ndim > 0 && bytes == 0) {  // an empty array: its other dimensions are still bounded
      for (int64_t v : layout.shape) {
        if (static_cast<uint64_t>(v) > max_message_bytes) {
          Bad(field + ".shape", v, "dimensions of at most " + std::to_string(max_message_bytes));
        }
      }
    }
    layout.bytes = bytes;
    if (__builtin_add_overflow(f.payload_bytes, bytes, &f.payload_bytes) || f.payload_bytes > max_message_bytes) {
      Bad(field + ".bytes", static_cast<int64_t>(bytes),
          "a message of at most max_message_bytes = " + std::to_string(max_message_bytes) + " bytes in all");
    }
    f.arrays.push_back(std::move(layout));
  }
  if (in.left() != 0) {
    throw FrameError("the descriptor has " + std::to_string(in.left()) + " words after its last field (" +
                     std::to_string(n) + " words announced)");
  }
  return f;
}

}  // namespace mshyper::comm
