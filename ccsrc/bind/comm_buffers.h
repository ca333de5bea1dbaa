// Python buffers as the communication library's element buffers, per-rank argument checks and
// GIL-safe ownership, shared by the shared-memory and in-process group bindings.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/types.h"

namespace mshyper::bind {

// A C-contiguous Python buffer holding `count` elements of a dtype (item size and format checked). The buffer stays exported (its
// owner cannot free or resize it) for as long as this object lives: keep it alive across the GIL
// release and until the last use of ptr().
struct Buf {
  pybind11::buffer_info info;
  size_t bytes = 0;
  size_t count = 0;
  void* ptr() const { return info.ptr; }
};

// `what` names the call and the argument in errors ("ShmCommunicator.all_reduce: buf").
Buf GetBuf(const pybind11::buffer& b, bool writable, comm::DType dtype, const std::string& what);
// GetBuf of each rank's buffer (`what[r]` in errors).
std::vector<Buf> Bufs(const std::vector<pybind11::buffer>& list, bool writable, const std::vector<std::string>& dtypes,
                      const std::string& what);
// Raises ValueError unless every per-rank list argument (name, length) has one entry per rank.
void CheckPerRank(const std::string& call, std::initializer_list<std::pair<std::string, size_t>> args, int size);
// Raises ValueError unless `buf` holds exactly `count` elements (the counts a collective reads or
// writes at the raw pointer).
void CheckElements(const std::string& what, const Buf& buf, uint64_t count);
// The sum of `counts`; ValueError naming `what` when it overflows 64 bits.
uint64_t Sum(const std::string& what, const std::vector<size_t>& counts);
// A uint8 numpy array owning `v`'s bytes (no copy).
pybind11::array_t<uint8_t> ToArray(std::vector<char>&& v);

// A shared_ptr whose deleter releases the GIL (when this thread holds it) around `delete`: the
// destructors join threads, and a thread that needs the GIL to finish (a Python callback) must
// be able to take it.
template <class T>
std::shared_ptr<T> GilFreeDelete(T* p) {
  return std::shared_ptr<T>(p, [](T* q) {
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release rel;
      delete q;
    } else {
      delete q;
    }
  });
}

}  // namespace mshyper::bind
