#include "bind/comm_buffers.h"

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

namespace {

// Whether a buffer-protocol format string describes elements of `dtype` (native or little-endian
// byte order; the item size is compared separately).
bool FormatHolds(const std::string& format, DType dtype) {
  std::string f = format;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || (f[0] == '<' && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__))) {
    f = f.substr(1);
  }
  if (f.size() != 1) return false;
  switch (dtype) {
    case DType::kFloat32: return f[0] == 'f';
    case DType::kFloat16: return f[0] == 'e';
    case DType::kFloat64: return f[0] == 'd';
    case DType::kInt32: return f[0] == 'i' || f[0] == 'l';
    case DType::kInt64: return f[0] == 'l' || f[0] == 'q';
    case DType::kUInt8: return f[0] == 'B';
  }
  return false;
}

}  // namespace

Buf GetBuf(const py::buffer& b, bool writable, DType dtype, const std::string& what) {
  Buf out;
  try {
    out.info = b.request(writable);
  } catch (py::error_already_set& e) {
    throw py::value_error(what + (writable ? ": needs a writable buffer (" : ": needs a buffer (") + e.what() + ")");
  }
  const py::buffer_info& info = out.info;
  ssize_t expect = info.itemsize;
  for (ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] != 1 && info.strides[i] != expect) throw py::value_error(what + ": buffer must be C-contiguous");
    expect *= info.shape[i];
  }
  const size_t esz = DTypeSize(dtype);
  if (static_cast<size_t>(info.itemsize) != esz) {
    throw py::value_error(what + ": buffer items have " + std::to_string(info.itemsize) + " bytes but dtype " +
                          DTypeName(dtype) + " has " + std::to_string(esz));
  }
  if (!FormatHolds(info.format, dtype)) {
    throw py::value_error(what + ": buffer format '" + info.format + "' does not hold " + DTypeName(dtype) +
                          " elements (a different element type or byte order)");
  }
  out.bytes = static_cast<size_t>(info.size * info.itemsize);
  out.count = out.bytes / esz;
  return out;
}

std::vector<Buf> Bufs(const std::vector<py::buffer>& list, bool writable, const std::vector<std::string>& dtypes,
                      const std::string& what) {
  std::vector<Buf> out;
  for (size_t r = 0; r < list.size(); ++r) {
    out.push_back(GetBuf(list[r], writable, DTypeFromName(dtypes[r]), what + "[" + std::to_string(r) + "]"));
  }
  return out;
}

void CheckPerRank(const std::string& call, std::initializer_list<std::pair<std::string, size_t>> args, int size) {
  for (const auto& [arg, got] : args) {
    if (got != static_cast<size_t>(size)) {
      throw py::value_error(call + ": " + arg + " has " + std::to_string(got) + " entries, expected " +
                            std::to_string(size) + " (one per rank)");
    }
  }
}

void CheckElements(const std::string& what, const Buf& buf, uint64_t count) {
  if (buf.count != count) {
    throw py::value_error(what + ": buffer holds " + std::to_string(buf.count) + " elements but the counts need " +
                          std::to_string(count));
  }
}

uint64_t Sum(const std::string& what, const std::vector<size_t>& counts) {
  uint64_t total = 0;
  for (size_t c : counts) {
    if (__builtin_add_overflow(total, static_cast<uint64_t>(c), &total)) {
      throw py::value_error(what + ": the counts' sum overflows 64 bits");
    }
  }
  return total;
}

py::array_t<uint8_t> ToArray(std::vector<char>&& v) {
  auto* holder = new std::vector<char>(std::move(v));
  py::capsule owner(holder, [](void* p) { delete static_cast<std::vector<char>*>(p); });
  return py::array_t<uint8_t>({static_cast<ssize_t>(holder->size())}, {1}, reinterpret_cast<uint8_t*>(holder->data()),
                              owner);
}

}  // namespace mshyper::bind
