// Python bindings of the message aggregator (comm submodule): request handles and the Aggregator
// (made by a communicator's make_aggregator; the MindSpore transport aggregates on the caller's
// thread in Python instead, comm/caller_thread_aggregator.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bind/bindings.h"
#include "bind/comm_buffers.h"
#include "bind/comm_requests.h"
#include "comm/aggregator.h"

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

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
}

}  // namespace mshyper::bind
