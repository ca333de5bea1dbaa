// 1-bit routing: a tokens x experts routing mask packed 8 entries per byte.
// Entry (t, e) is bit ((t * num_experts + e) % 8) (least significant first) of byte
// (t * num_experts + e) / 8; the unused high bits of the last byte are zero. The same layout
// as numpy.packbits(mask.ravel(), bitorder="little").
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mshyper::moe {

// Bytes of a packed T x E mask: ceil(T * E / 8).
std::size_t PackedRoutingBytes(std::size_t num_tokens, std::size_t num_experts);

// Packs `mask` (T*E bytes, each 0 or 1, row-major) into `out` (PackedRoutingBytes bytes).
// Returns false and sets `error` when an entry is neither 0 nor 1.
bool PackRouting(const std::uint8_t* mask, std::size_t num_tokens, std::size_t num_experts, std::uint8_t* out,
                 std::string* error);

// Unpacks `packed` (PackedRoutingBytes bytes) into `mask` (T*E bytes of 0/1). Returns false and
// sets `error` when the padding bits of the last byte are not zero (a corrupted message).
bool UnpackRouting(const std::uint8_t* packed, std::size_t num_tokens, std::size_t num_experts, std::uint8_t* mask,
                   std::string* error);

}  // namespace mshyper::moe
