// Python bindings of the prefetch scheduler and of the background-thread helpers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bind/arg_helpers.h"
#include "bind/bindings.h"
#include "prefetch/background_thread.h"
#include "prefetch/prefetch_scheduler.h"

namespace py = pybind11;

namespace mshyper::bind {
namespace {

using prefetch::PrefetchScheduler;
using prefetch::PrefetchStats;
using store::BlockStore;

py::dict PrefetchStatsDict(const PrefetchStats& s) {
  py::dict d;
  d["hits"] = s.hits;
  d["late"] = s.late;
  d["misses"] = s.misses;
  d["stall_ns"] = s.stall_ns;
  d["issued"] = s.issued;
  d["completed"] = s.completed;
  d["cancelled"] = s.cancelled;
  d["dropped"] = s.dropped;
  d["trace_invalidations"] = s.trace_invalidations;
  d["written_back"] = s.written_back;
  d["steps"] = s.steps;
  d["trace_length"] = s.trace_length;
  d["trace_valid"] = s.trace_valid;
  d["last_error"] = s.last_error;
  return d;
}

}  // namespace

void BindPrefetch(py::module_& m) {
  m.def("make_background_thread", &prefetch::MakeBackgroundThread, py::arg("name"), py::arg("nice"),
        "Names the calling thread and raises its nice value (0..19) so it yields the cores to the compute.");
  m.def("current_thread_nice", &prefetch::CurrentThreadNice, "The calling thread's nice value.");
  py::class_<PrefetchScheduler, std::shared_ptr<PrefetchScheduler>>(m, "PrefetchScheduler",
      "Trace-driven prefetcher with its own I/O worker threads.")
      .def(py::init([](std::shared_ptr<BlockStore> s, int depth, int workers, const std::string& target,
                       int max_batch, bool write_behind, int host_depth, int worker_nice) {
             return std::make_shared<PrefetchScheduler>(std::move(s), depth, workers, ParseTier(target),
                                                        max_batch, write_behind, host_depth, worker_nice);
           }),
           py::arg("store"), py::arg("depth"), py::arg("workers") = 2, py::arg("target") = "device",
           py::arg("max_batch") = 4, py::arg("write_behind") = true, py::arg("host_depth") = -1,
           py::arg("worker_nice") = 0)
      .def_property("depth", &PrefetchScheduler::depth, &PrefetchScheduler::SetDepth)
      .def_property("host_depth", &PrefetchScheduler::host_depth, &PrefetchScheduler::SetHostDepth)
      .def("begin_step", &PrefetchScheduler::BeginStep, py::call_guard<py::gil_scoped_release>())
      .def("acquire", &PrefetchScheduler::Acquire, py::arg("ids"), py::arg("record") = true,
           py::call_guard<py::gil_scoped_release>())
      .def("release", &PrefetchScheduler::Release, py::call_guard<py::gil_scoped_release>())
      .def("touch", &PrefetchScheduler::Touch, py::call_guard<py::gil_scoped_release>())
      .def("predict", &PrefetchScheduler::Predict)
      .def("trace", &PrefetchScheduler::Trace)
      .def("position", &PrefetchScheduler::Position)
      .def("drain", &PrefetchScheduler::Drain, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](PrefetchScheduler& p) { return PrefetchStatsDict(p.Stats()); })
      .def("reset_stats", &PrefetchScheduler::ResetStats);
}

}  // namespace mshyper::bind
