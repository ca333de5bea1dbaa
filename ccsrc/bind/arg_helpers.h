// Argument helpers shared by the store, tensor-store, kernel and prefetch bindings: tier names,
// buffers viewed as bytes, wait timeouts.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "store/block_store.h"

namespace mshyper::bind {

// "device", "host" or "disk"; ValueError otherwise.
store::Tier ParseTier(const std::string& name);

struct ConstBytes {
  const void* ptr;
  uint64_t len;
};

// A C-contiguous buffer of any dtype viewed as bytes (ValueError naming `what` if not C-contiguous:
// a strided view's bytes are not its elements, a reversed one's lie partly before its pointer).
ConstBytes BytesOf(const pybind11::buffer& buf, pybind11::buffer_info& info, const char* what = "buffer");
// The same for a writeable buffer; `len` receives its size in bytes.
void* WritableBytesOf(const pybind11::buffer& buf, pybind11::buffer_info& info, uint64_t* len);
// A mailbox / fence wait's timeout: any number of seconds (<= 0: no wait; inf: no limit) but NaN.
void CheckTimeoutArg(double timeout_s);

}  // namespace mshyper::bind
