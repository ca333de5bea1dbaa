// CRC32C (Castagnoli) checksums for disk-tier blocks.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mshyper::store {

// CRC32C of `len` bytes, continuing from `crc` (0 for a fresh checksum). Uses the SSE4.2 crc32
// instruction when the CPU has it (checked once at run time), otherwise a table-driven version.
uint32_t Crc32c(const void* data, size_t len, uint32_t crc = 0);

// The portable table-driven implementation (exposed so tests can compare both paths).
uint32_t Crc32cSoftware(const void* data, size_t len, uint32_t crc = 0);

// True when Crc32c uses the hardware instruction.
bool Crc32cHardware();

}  // namespace mshyper::store
