// Basic vocabulary of the communication library: element types, reduction ops, errors and the
// reduction kernels every algorithm uses.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace mshyper::comm {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kInt32 = 2, kFloat64 = 3, kInt64 = 4, kUInt8 = 5 };
enum class ReduceOp : int32_t { kSum = 0, kMax = 1, kMin = 2, kAvg = 3 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
const char* OpName(ReduceOp op);
DType DTypeFromName(const std::string& name);   // "float32", "float16", "int32", "float64", "int64", "uint8"
ReduceOp OpFromName(const std::string& name);   // "sum", "max", "min", "avg"

// Base error of the library; CommTimeout when a peer stalls or dies; CommMismatch when ranks
// disagree on sizes, dtypes or the collective being called.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};
class CommMismatch : public CommError {
 public:
  using CommError::CommError;
};

// dst[i] = op(dst[i], src[i]) for `count` elements; kAvg reduces as kSum (see ScaleAvg).
void ReduceInto(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
// buf[i] /= n (integers: truncating division), the final step of an average.
void ScaleAvg(void* buf, size_t count, DType dtype, int n);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

inline size_t RoundUp8(size_t n) { return (n + 7) & ~static_cast<size_t>(7); }

// The dtype of a wire code (a value a peer sent), or false when it names none.
bool DTypeFromCode(uint64_t code, DType* out);
// Overflow-checked size arithmetic at the library's boundary: CommError naming `what` when the
// exact result does not fit in 64 bits.
uint64_t CheckedMul(uint64_t a, uint64_t b, const char* what);
uint64_t CheckedAdd(uint64_t a, uint64_t b, const char* what);
// Bytes of `count` elements of `dtype` (CheckedMul).
uint64_t ByteCount(uint64_t count, DType dtype, const char* what);
// Sum of `counts` (CheckedAdd).
template <class Counts>
uint64_t CheckedSum(const Counts& counts, const char* what) {
  uint64_t total = 0;
  for (auto c : counts) total = CheckedAdd(total, static_cast<uint64_t>(c), what);
  return total;
}

// `seconds` as a steady-clock duration that cannot overflow: NaN and negative give 0, anything
// above ~3 years (inf included) gives ~3 years, i.e. "no limit" for a wait.
std::chrono::steady_clock::duration WaitDuration(double seconds);
// Throws CommError naming `what` unless `seconds` is > 0 (inf allowed: no limit).
void CheckTimeout(const char* what, double seconds);

}  // namespace mshyper::comm
