// Python bindings of the communication library (mindspore_hyper._core.comm). Buffers come in as
// Python buffer objects (contiguous numpy arrays) with the dtype named by the caller; every
// blocking call releases the GIL.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "bind/bindings.h"
#include "comm/communicator.h"
#include "comm/frame.h"
#include "comm/topology.h"

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

void BindComm(py::module_& root) {
  py::module_ m = root.def_submodule("comm", "Message-aggregating communication library (C++)");
  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  static py::exception<CommTimeout> comm_timeout(m, "CommTimeout", comm_error.ptr());
  static py::exception<CommMismatch> comm_mismatch(m, "CommMismatch", comm_error.ptr());
  static py::exception<FrameError> frame_error(m, "FrameError", comm_error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CommTimeout& e) {
      py::set_error(comm_timeout, e.what());
    } catch (const CommMismatch& e) {
      py::set_error(comm_mismatch, e.what());
    } catch (const FrameError& e) {
      py::set_error(frame_error, e.what());
    } catch (const CommError& e) {
      py::set_error(comm_error, e.what());
    }
  });

  m.def("dtype_size", [](const std::string& d) { return DTypeSize(DTypeFromName(d)); });

  py::class_<Topology, std::shared_ptr<Topology>>(m, "Topology")
      .def(py::init<std::string, int, std::vector<int>>(), py::arg("name"), py::arg("num_devices"),
           py::arg("node_of") = std::vector<int>{})
      .def("add_link", &Topology::AddLink, py::arg("a"), py::arg("b"), py::arg("latency_s"), py::arg("bandwidth_Bps"))
      .def_static("preset", &Topology::Preset, py::arg("name"), py::arg("num_devices") = 0)
      .def_property_readonly("name", &Topology::name)
      .def_property_readonly("num_devices", &Topology::num_devices)
      .def_property_readonly("has_nodes", &Topology::has_nodes)
      .def("node_of", &Topology::node_of)
      .def_property_readonly("links", [](const Topology& t) {
        py::list out;
        for (const auto& l : t.links()) out.append(py::make_tuple(l.a, l.b, l.latency_s, l.bandwidth_Bps));
        return out;
      })
      .def("path", [](const Topology& t, int a, int b) {
        PathInfo p = t.Path(a, b);
        py::dict d;
        d["latency_s"] = p.latency_s;
        d["bandwidth_Bps"] = p.bandwidth_Bps;
        d["devices"] = p.devices;
        return d;
      })
      .def("latency", &Topology::Latency)
      .def("bandwidth", &Topology::Bandwidth)
      .def("ring_order", &Topology::RingOrder, py::call_guard<py::gil_scoped_release>())
      .def("is_uniform", &Topology::IsUniform, py::arg("devices"), py::arg("tolerance") = 1.5,
           py::call_guard<py::gil_scoped_release>())
      .def("clusters", &Topology::Clusters, py::call_guard<py::gil_scoped_release>());

  py::class_<TransportParams>(m, "TransportParams")
      .def(py::init([](double a, double b, double g) { return TransportParams{a, b, g}; }), py::arg("alpha_s") = 0.0,
           py::arg("beta_s_per_byte") = 0.0, py::arg("gamma_s_per_byte") = 0.0)
      .def_readwrite("alpha_s", &TransportParams::alpha_s)
      .def_readwrite("beta_s_per_byte", &TransportParams::beta_s_per_byte)
      .def_readwrite("gamma_s_per_byte", &TransportParams::gamma_s_per_byte)
      .def("__repr__", [](const TransportParams& p) {
        return "TransportParams(alpha_s=" + std::to_string(p.alpha_s) + ", beta_s_per_byte=" +
               std::to_string(p.beta_s_per_byte) + ", gamma_s_per_byte=" + std::to_string(p.gamma_s_per_byte) + ")";
      });

  py::class_<CostModel, std::shared_ptr<CostModel>>(m, "CostModel")
      .def(py::init<std::shared_ptr<const Topology>, TransportParams>(), py::arg("topology"), py::arg("params"))
      .def("algorithms", &CostModel::Algorithms)
      .def("time", &CostModel::Time, py::arg("kind"), py::arg("algorithm"), py::arg("nbytes"), py::arg("group"),
           py::call_guard<py::gil_scoped_release>())
      .def("choose", [](const CostModel& c, const std::string& kind, double n, const std::vector<int>& g) {
        Estimate e;
        {
          py::gil_scoped_release rel;
          e = c.Choose(kind, n, g);
        }
        return py::make_tuple(e.algorithm, e.seconds);
      }, py::arg("kind"), py::arg("nbytes"), py::arg("group"))
      .def("small_message_threshold", &CostModel::SmallMessageThreshold, py::call_guard<py::gil_scoped_release>())
      .def("set_threshold", &CostModel::SetThreshold)
      .def("force_algorithm", &CostModel::ForceAlgorithm)
      .def_property_readonly("thresholds", &CostModel::thresholds)
      .def_property_readonly("forced", &CostModel::forced)
      .def_property("params", &CostModel::params, &CostModel::set_params);

  BindAggregator(m);
  BindShmCommunicator(m);
  BindInProcCommunicator(m);
  BindFrame(m);
}

}  // namespace mshyper::bind
