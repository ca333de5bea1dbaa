#include "moe/routing_bits.h"

#include <cstring>

namespace mshyper::moe {

std::size_t PackedRoutingBytes(std::size_t num_tokens, std::size_t num_experts) {
  return (num_tokens * num_experts + 7) / 8;
}

bool PackRouting(const std::uint8_t* mask, std::size_t num_tokens, std::size_t num_experts, std::uint8_t* out,
                 std::string* error) {
  const std::size_t n = num_tokens * num_experts;
  const std::size_t bytes = PackedRoutingBytes(num_tokens, num_experts);
  std::memset(out, 0, bytes);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t v = mask[i];
    if (v > 1) {
      *error = "mask entry " + std::to_string(i / num_experts) + "," + std::to_string(i % num_experts) + " is " +
               std::to_string(v) + "; expected 0 or 1";
      return false;
    }
    out[i >> 3] |= static_cast<std::uint8_t>(v << (i & 7));
  }
  return true;
}

bool UnpackRouting(const std::uint8_t* packed, std::size_t num_tokens, std::size_t num_experts, std::uint8_t* mask,
                   std::string* error) {
  const std::size_t n = num_tokens * num_experts;
  for (std::size_t i = 0; i < n; ++i) mask[i] = (packed[i >> 3] >> (i & 7)) & 1u;
  const std::size_t used = n & 7;
  if (used != 0 && (packed[n >> 3] >> used) != 0) {
    *error = "padding bits of the last byte are not zero (corrupted or mis-sized routing message)";
    return false;
  }
  return true;
}

}  // namespace mshyper::moe
