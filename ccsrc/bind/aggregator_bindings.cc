// Python bindings of the message aggregator (comm submodule): request handles, the Aggregator,
// and an aggregator over a Python all-reduce callable (the MindSpore transport).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bind/bindings.h"
#include "bind/comm_buffers.h"
#include "bind/comm_requests.h"
#include "comm/aggregator.h"

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

namespace {

// Packets through a Python callable fn(buffer, dtype_name, op_name) that all-reduces `buffer` (a
// 1-D uint8 numpy array over the packet) in place: the MindSpore transport (mint.distributed under
// msrun). The array keeps the packet's memory alive, so a callable may keep it beyond the call.
class PyBackend : public PacketBackend {
 public:
  PyBackend(py::function fn, int size) : fn_(std::move(fn)), size_(size) {}
  ~PyBackend() override {
    py::gil_scoped_acquire gil;
    fn_ = py::function();
  }
  void AllReduce(const Packet& p) override {
    py::gil_scoped_acquire gil;
    py::capsule keep(new std::shared_ptr<void>(p.owner), [](void* o) { delete static_cast<std::shared_ptr<void>*>(o); });
    py::array_t<uint8_t> view({static_cast<ssize_t>(p.count * DTypeSize(p.dtype))}, {1}, static_cast<uint8_t*>(p.buf),
                              keep);
    try {
      fn_(view, DTypeName(p.dtype), OpName(p.op));
    } catch (py::error_already_set& e) {
      throw CommError(std::string("MindSpore transport: ") + e.what());
    }
  }
  int group_size() const override { return size_; }
  bool bounded() const override { return false; }  // a Python callable may block for ever

 private:
  py::function fn_;
  int size_;
};

}  // namespace

void BindAggregator(py::module_& m) {
  py::class_<ArrayHandle>(m, "ArrayHandle")
      .def("wait", [](ArrayHandle& h, py::object timeout) { return h.wait(WaitTimeout(timeout)); },
           py::arg("timeout") = py::none(),
           "The reduced array (a view of the request's own storage); rethrows the packet's failure. Waiting again "
           "returns the same array.")
      .def("done", &ArrayHandle::done);
  py::class_<BatchHandle>(m, "BatchHandle")
      .def("wait", [](BatchHandle& h, py::object timeout) { return h.wait(WaitTimeout(timeout)); },
           py::arg("timeout") = py::none(),
           "The reduced arrays in submission order (views of the batch's storage block); rethrows the first failure.")
      .def("done", &BatchHandle::done)
      .def("__len__", &BatchHandle::size);

  py::class_<Aggregator, std::shared_ptr<Aggregator>>(m, "Aggregator")
      .def("submit", [](Aggregator& a, py::object x, const std::string& op) {
        return SubmitOne(a, x, OpFromName(op), "all_reduce_async: x");
      }, py::arg("x"), py::arg("op"), "Copies x (any array-like of a supported dtype) and queues its all-reduce.")
      .def("submit_many", [](Aggregator& a, py::sequence xs, const std::string& op) {
        return BatchHandle(SubmitArrays(a, xs, OpFromName(op), "all_reduce_async_many: arrays", true));
      }, py::arg("arrays"), py::arg("op"), "Copies the arrays into one block and queues them in order; one handle.")
      .def("flush", [](Aggregator& a, py::object timeout) {
        const double t = WaitTimeout(timeout);
        py::gil_scoped_release rel;
        a.Flush(t);
      }, py::arg("timeout") = py::none(),
         "Sends everything queued and waits; CommTimeout after `timeout` s (None: the aggregator's flush timeout) "
         "without a finished request.")
      .def("close", &Aggregator::Close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("packet_bytes", &Aggregator::packet_bytes)
      .def_property_readonly("max_delay", &Aggregator::max_delay)
      .def("stats", [](Aggregator& a) { return AggregatorStatsDict(a.stats()); });
  m.def("python_aggregator", [](py::function fn, int size, size_t packet_bytes, double max_delay, double flush_timeout) {
    return GilFreeDelete(
        new Aggregator(std::make_shared<PyBackend>(std::move(fn), size), packet_bytes, max_delay, flush_timeout));
  }, py::arg("allreduce_fn"), py::arg("group_size"), py::arg("packet_bytes"), py::arg("max_delay"),
     py::arg("flush_timeout") = 300.0);
}

}  // namespace mshyper::bind
