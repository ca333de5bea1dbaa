// Python bindings of the tensor store and of the store handles the MindSpore kernels use.
// Every call that copies data releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bind/arg_helpers.h"
#include "bind/bindings.h"
#include "store/store_handles.h"
#include "store/tensor_store.h"

namespace py = pybind11;

namespace mshyper::bind {
namespace {

using store::BlockStore;
using store::TensorStore;
using store::Tier;

}  // namespace

void BindTensorStore(py::module_& m) {
  py::class_<TensorStore, std::shared_ptr<TensorStore>>(m, "TensorStore",
      "Tensors over a BlockStore: large ones span blocks, small ones are packed.")
      .def(py::init<std::shared_ptr<BlockStore>>(), py::arg("block_store"))
      .def_property_readonly("block_store", &TensorStore::blocks)
      .def("put", [](TensorStore& s, py::buffer data) {
             py::buffer_info info;
             ConstBytes b = BytesOf(data, info);
             py::gil_scoped_release nogil;
             return s.Put(b.ptr, b.len);
           }, py::arg("data"))
      .def("update", [](TensorStore& s, uint64_t tid, py::buffer data) {
             py::buffer_info info;
             ConstBytes b = BytesOf(data, info);
             py::gil_scoped_release nogil;
             s.Update(tid, b.ptr, b.len);
           }, py::arg("tid"), py::arg("data"))
      .def("get_into", [](TensorStore& s, uint64_t tid, py::buffer out) {
             py::buffer_info info;
             uint64_t len;
             void* p = WritableBytesOf(out, info, &len);
             py::gil_scoped_release nogil;
             s.Get(tid, p, len);
           }, py::arg("tid"), py::arg("out"))
      .def("get_pinned_into", [](TensorStore& s, uint64_t tid, const std::string& tier, py::buffer out) {
             py::buffer_info info;
             uint64_t len;
             void* p = WritableBytesOf(out, info, &len);
             const Tier t = ParseTier(tier);
             py::gil_scoped_release nogil;
             s.GetPinned(tid, t, p, len);
           }, py::arg("tid"), py::arg("tier"), py::arg("out"))
      .def("get_bytes", [](TensorStore& s, uint64_t tid) {
             const uint64_t n = s.Size(tid);
             py::array_t<uint8_t> out(static_cast<ssize_t>(n));
             uint8_t* p = out.mutable_data();
             {
               py::gil_scoped_release nogil;
               s.Get(tid, p, n);
             }
             return out;
           }, py::arg("tid"))
      .def("size", &TensorStore::Size)
      .def("contains", &TensorStore::Contains)
      .def("extents", [](TensorStore& s, uint64_t tid) {
             py::list out;
             for (const auto& e : s.Extents(tid)) out.append(py::make_tuple(e.block, e.offset, e.length));
             return out;
           })
      .def("blocks", &TensorStore::Blocks)
      .def("erase", &TensorStore::Erase, py::call_guard<py::gil_scoped_release>())
      .def("discard", &TensorStore::Discard, py::arg("tid"), py::call_guard<py::gil_scoped_release>())
      .def("close_pack", &TensorStore::ClosePack, py::call_guard<py::gil_scoped_release>())
      .def("__len__", &TensorStore::Count);

  m.def("register_tensor_store", &store::RegisterTensorStore, py::arg("store"),
        "A fresh handle by which the MindSpore kernels reach `store` (ops.StoreFetch / StorePut).");
  m.def("release_tensor_store", &store::ReleaseTensorStore, py::arg("handle"),
        "Forgets a handle; kernels naming it fail from then on.");
  m.def("find_tensor_store", &store::FindTensorStore, py::arg("handle"),
        "The store of a handle, or None if unknown or released.");
}

}  // namespace mshyper::bind
