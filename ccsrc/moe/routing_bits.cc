#include "moe/routing_bits.h"

#include <array>
#include <cstring>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "routing_bits.cc reads eight mask bytes as one little-endian word"
#endif

namespace mshyper::moe {
namespace {

// Eight 0/1 bytes (a little-endian word) -> one byte, entry j at bit j: multiplying by
// sum_j 2^(56 - 7j) moves entry j (bit 8j) to bit 56 + j without any two terms colliding.
constexpr std::uint64_t kGather = 0x0102040810204080ULL;
constexpr std::uint64_t kOnes = 0x0101010101010101ULL;

// byte -> its eight bits as eight 0/1 bytes (a little-endian word)
std::array<std::uint64_t, 256> MakeSpread() {
  std::array<std::uint64_t, 256> table{};
  for (int v = 0; v < 256; ++v) {
    std::uint64_t w = 0;
    for (int j = 0; j < 8; ++j) w |= static_cast<std::uint64_t>((v >> j) & 1) << (8 * j);
    table[v] = w;
  }
  return table;
}

const std::array<std::uint64_t, 256>& Spread() {
  static const std::array<std::uint64_t, 256> table = MakeSpread();
  return table;
}

}  // namespace

std::size_t PackedRoutingBytes(std::size_t num_tokens, std::size_t num_experts) {
  return (num_tokens * num_experts + 7) / 8;
}

bool PackRouting(const std::uint8_t* mask, std::size_t num_tokens, std::size_t num_experts, std::uint8_t* out,
                 std::string* error) {
  const std::size_t n = num_tokens * num_experts;
  const std::size_t full = n / 8;
  std::uint64_t stray = 0;  // bits of entries other than 0/1
  for (std::size_t b = 0; b < full; ++b) {  // 8 entries -> one byte, least significant first
    std::uint64_t word;
    std::memcpy(&word, mask + 8 * b, 8);
    stray |= word & ~kOnes;
    out[b] = static_cast<std::uint8_t>(((word & kOnes) * kGather) >> 56);
  }
  for (std::size_t i = 8 * full; i < n; ++i) stray |= mask[i] & ~1u;
  if (stray != 0) {
    for (std::size_t i = 0; i < n; ++i) {
      if (mask[i] > 1) {
        *error = "mask entry " + std::to_string(i / num_experts) + "," + std::to_string(i % num_experts) + " is " +
                 std::to_string(mask[i]) + "; expected 0 or 1";
        return false;
      }
    }
  }
  if (n % 8 != 0) {
    std::uint8_t last = 0;
    for (std::size_t i = 8 * full; i < n; ++i) last |= static_cast<std::uint8_t>(mask[i] << (i & 7));
    out[full] = last;
  }
  return true;
}

bool UnpackRouting(const std::uint8_t* packed, std::size_t num_tokens, std::size_t num_experts, std::uint8_t* mask,
                   std::string* error) {
  const std::size_t n = num_tokens * num_experts;
  const std::size_t full = n / 8;
  const auto& spread = Spread();
  for (std::size_t b = 0; b < full; ++b) std::memcpy(mask + 8 * b, &spread[packed[b]], 8);
  const std::size_t used = n & 7;
  if (used != 0) {
    const std::uint8_t v = packed[full];
    if ((v >> used) != 0) {
      *error = "padding bits of the last byte are not zero (corrupted or mis-sized routing message)";
      return false;
    }
    for (std::size_t j = 0; j < used; ++j) mask[8 * full + j] = (v >> j) & 1u;
  }
  return true;
}

}  // namespace mshyper::moe
