#include "comm/types.h"

#include <algorithm>
#include <cstring>

namespace mshyper::comm {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kFloat64: return 8;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  throw CommError("unknown dtype code " + std::to_string(static_cast<int>(dtype)));
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kInt32: return "int32";
    case DType::kFloat64: return "float64";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

const char* OpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kAvg: return "avg";
  }
  return "unknown";
}

DType DTypeFromName(const std::string& name) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kInt32, DType::kFloat64, DType::kInt64, DType::kUInt8}) {
    if (name == DTypeName(d)) return d;
  }
  throw CommError("unsupported dtype '" + name + "': expected float32, float16, int32, float64, int64 or uint8");
}

bool DTypeFromCode(uint64_t code, DType* out) {
  if (code > static_cast<uint64_t>(DType::kUInt8)) return false;
  *out = static_cast<DType>(code);
  return true;
}

uint64_t CheckedMul(uint64_t a, uint64_t b, const char* what) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw CommError(std::string(what) + ": " + std::to_string(a) + " x " + std::to_string(b) + " overflows 64 bits");
  }
  return r;
}

uint64_t CheckedAdd(uint64_t a, uint64_t b, const char* what) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    throw CommError(std::string(what) + ": " + std::to_string(a) + " + " + std::to_string(b) + " overflows 64 bits");
  }
  return r;
}

uint64_t ByteCount(uint64_t count, DType dtype, const char* what) {
  return CheckedMul(count, DTypeSize(dtype), what);
}

std::chrono::steady_clock::duration WaitDuration(double seconds) {
  constexpr double kMaxSeconds = 1e8;
  if (!(seconds > 0)) return std::chrono::steady_clock::duration::zero();
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(seconds, kMaxSeconds)));
}

void CheckTimeout(const char* what, double seconds) {
  if (!(seconds > 0)) {
    throw CommError(std::string(what) + " must be > 0 seconds (inf: no limit), got " + std::to_string(seconds));
  }
}

ReduceOp OpFromName(const std::string& name) {
  for (ReduceOp o : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
    if (name == OpName(o)) return o;
  }
  throw CommError("unsupported reduce op '" + name + "': expected sum, max, min or avg");
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {  // round to nearest even, like numpy
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal half or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // half subnormal = m * 2^(e-150) / 2^-24: drop (126 - e) bits
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t e = ((absx >> 23) - 112) << 10;
  uint32_t m = (absx >> 13) & 0x3ffu;
  uint32_t h = e | m;
  uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: still correct
  return static_cast<uint16_t>(sign | h);
}

namespace {

template <typename T>
void ReduceT(T* d, const T* s, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + s[i]);
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) d[i] = std::max(d[i], s[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) d[i] = std::min(d[i], s[i]);
      break;
  }
}

void ReduceHalf(uint16_t* d, const uint16_t* s, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    float a = HalfToFloat(d[i]), b = HalfToFloat(s[i]);
    float r;
    switch (op) {
      case ReduceOp::kMax: r = std::max(a, b); break;
      case ReduceOp::kMin: r = std::min(a, b); break;
      default: r = a + b; break;
    }
    d[i] = FloatToHalf(r);
  }
}

}  // namespace

void ReduceInto(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32: ReduceT(static_cast<float*>(dst), static_cast<const float*>(src), count, op); break;
    case DType::kFloat64: ReduceT(static_cast<double*>(dst), static_cast<const double*>(src), count, op); break;
    case DType::kInt32: ReduceT(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count, op); break;
    case DType::kInt64: ReduceT(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, op); break;
    case DType::kUInt8: ReduceT(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, op); break;
    case DType::kFloat16: ReduceHalf(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count, op); break;
  }
}

void ScaleAvg(void* buf, size_t count, DType dtype, int n) {
  switch (dtype) {
    case DType::kFloat32: {
      float* p = static_cast<float*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= static_cast<float>(n);
      break;
    }
    case DType::kFloat64: {
      double* p = static_cast<double*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= n;
      break;
    }
    case DType::kInt32: {
      int32_t* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= n;
      break;
    }
    case DType::kInt64: {
      int64_t* p = static_cast<int64_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] /= n;
      break;
    }
    case DType::kUInt8: {
      uint8_t* p = static_cast<uint8_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = static_cast<uint8_t>(p[i] / n);
      break;
    }
    case DType::kFloat16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = FloatToHalf(HalfToFloat(p[i]) / static_cast<float>(n));
      break;
    }
  }
}

}  // namespace mshyper::comm
