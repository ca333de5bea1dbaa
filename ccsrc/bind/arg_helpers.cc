#include "bind/arg_helpers.h"

#include <cmath>
#include <string>

namespace py = pybind11;

namespace mshyper::bind {

using store::Tier;

Tier ParseTier(const std::string& name) {
  if (name == "device") return Tier::kDevice;
  if (name == "host") return Tier::kHost;
  if (name == "disk") return Tier::kDisk;
  throw py::value_error("tier must be 'device', 'host' or 'disk', got '" + name + "'");
}

ConstBytes BytesOf(const py::buffer& buf, py::buffer_info& info, const char* what) {
  info = buf.request();
  ssize_t expect = info.itemsize;
  for (ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expect) {
      throw py::value_error(std::string(what) + " must be C-contiguous");
    }
    expect *= info.shape[d];
  }
  return ConstBytes{info.ptr, static_cast<uint64_t>(info.size * info.itemsize)};
}

void* WritableBytesOf(const py::buffer& buf, py::buffer_info& info, uint64_t* len) {
  info = buf.request(true);
  ConstBytes b = BytesOf(buf, info);
  *len = b.len;
  return info.ptr;
}

void CheckTimeoutArg(double timeout_s) {
  if (std::isnan(timeout_s)) throw py::value_error("timeout_s must be a number of seconds, got nan");
}

}  // namespace mshyper::bind
