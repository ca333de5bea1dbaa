// Python bindings of an in-process group (comm submodule): all ranks in this process; every
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
#include <string>
#include <vector>

#include "bind/bindings.h"
#include "bind/comm_buffers.h"
#include "bind/comm_requests.h"
#include "comm/inproc_communicator.h"
#include "comm/topology.h"

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

void BindInProcCommunicator(py::module_& m) {
  py::class_<InProcCommunicator, std::shared_ptr<InProcCommunicator>>(m, "InProcCommunicator")
      .def(py::init([](int n, std::shared_ptr<Topology> topo, std::vector<int> devices, size_t channel_bytes,
                       double timeout, TransportParams params) {
             return GilFreeDelete(new InProcCommunicator(n, topo, devices, channel_bytes, timeout, params));
           }),
           py::arg("size"), py::arg("topology"), py::arg("devices"), py::arg("channel_bytes"), py::arg("timeout"),
           py::arg("params"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("size", &InProcCommunicator::size)
      .def("last_algorithm", [](InProcCommunicator& g) { return g.comm(0).last_algorithm(); })
      .def("ring", [](InProcCommunicator& g) { return g.comm(0).ring(); })
      .def("model", [](InProcCommunicator& g, int r) { return &g.comm(r).model(); }, py::return_value_policy::reference_internal)
      .def("set_validate", [](InProcCommunicator& g, bool v) {
        for (int r = 0; r < g.size(); ++r) g.comm(r).validate = v;
      })
      .def_property("max_message_bytes", [](InProcCommunicator& g) { return g.comm(0).max_message_bytes; },
                    [](InProcCommunicator& g, uint64_t v) {
                      if (v == 0) throw py::value_error("InProcCommunicator.max_message_bytes must be > 0");
                      for (int r = 0; r < g.size(); ++r) g.comm(r).max_message_bytes = v;
                    })
      .def("all_reduce", [](InProcCommunicator& g, const std::vector<py::buffer>& bufs, const std::vector<std::string>& dtypes,
                            const std::vector<std::string>& ops, const std::string& algo) {
        CheckPerRank("InProcCommunicator.all_reduce", {{"bufs", bufs.size()}, {"dtypes", dtypes.size()}, {"ops", ops.size()}},
                     g.size());
        auto b = Bufs(bufs, true, dtypes, "InProcCommunicator.all_reduce: bufs");
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          g.comm(r).AllReduce(b[r].ptr(), b[r].count, DTypeFromName(dtypes[r]), OpFromName(ops[r]), algo);
        });
      })
      .def("all_gather_v", [](InProcCommunicator& g, const std::vector<py::buffer>& ins, const std::vector<py::buffer>& outs,
                              const std::vector<std::vector<size_t>>& counts, const std::vector<std::string>& dtypes) {
        CheckPerRank("InProcCommunicator.all_gather_v", {{"ins", ins.size()}, {"outs", outs.size()}, {"counts", counts.size()},
                              {"dtypes", dtypes.size()}}, g.size());
        auto i = Bufs(ins, false, dtypes, "InProcCommunicator.all_gather_v: ins");
        auto o = Bufs(outs, true, dtypes, "InProcCommunicator.all_gather_v: outs");
        for (int r = 0; r < g.size(); ++r) {
          CheckPerRank("InProcCommunicator.all_gather_v", {{"counts[" + std::to_string(r) + "]", counts[r].size()}}, g.size());
          CheckElements("InProcCommunicator.all_gather_v: ins[" + std::to_string(r) + "]", i[r], counts[r][r]);
          const std::string rs = "[" + std::to_string(r) + "]";
          CheckElements("InProcCommunicator.all_gather_v: outs" + rs, o[r],
                        Sum("InProcCommunicator.all_gather_v: counts" + rs, counts[r]));
        }
        py::gil_scoped_release rel;
        g.Run([&](int r) { g.comm(r).AllGatherV(i[r].ptr(), o[r].ptr(), counts[r], DTypeFromName(dtypes[r])); });
      })
      .def("reduce_scatter", [](InProcCommunicator& g, const std::vector<py::buffer>& ins, const std::vector<py::buffer>& outs,
                                const std::vector<std::vector<size_t>>& counts, const std::vector<std::string>& dtypes,
                                const std::vector<std::string>& ops) {
        CheckPerRank("InProcCommunicator.reduce_scatter", {{"ins", ins.size()}, {"outs", outs.size()}, {"counts", counts.size()},
                              {"dtypes", dtypes.size()}, {"ops", ops.size()}}, g.size());
        auto i = Bufs(ins, false, dtypes, "InProcCommunicator.reduce_scatter: ins");
        auto o = Bufs(outs, true, dtypes, "InProcCommunicator.reduce_scatter: outs");
        for (int r = 0; r < g.size(); ++r) {
          CheckPerRank("InProcCommunicator.reduce_scatter", {{"counts[" + std::to_string(r) + "]", counts[r].size()}}, g.size());
          const std::string rs = "[" + std::to_string(r) + "]";
          CheckElements("InProcCommunicator.reduce_scatter: ins" + rs, i[r],
                        Sum("InProcCommunicator.reduce_scatter: counts" + rs, counts[r]));
          CheckElements("InProcCommunicator.reduce_scatter: outs[" + std::to_string(r) + "]", o[r], counts[r][r]);
        }
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          g.comm(r).ReduceScatter(i[r].ptr(), o[r].ptr(), counts[r], DTypeFromName(dtypes[r]), OpFromName(ops[r]));
        });
      })
      .def("all_to_all_v", [](InProcCommunicator& g, const std::vector<py::buffer>& ins,
                              const std::vector<std::vector<size_t>>& send_counts, const std::vector<std::string>& dtypes) {
        CheckPerRank("InProcCommunicator.all_to_all_v",
                     {{"ins", ins.size()}, {"send_counts", send_counts.size()}, {"dtypes", dtypes.size()}}, g.size());
        auto i = Bufs(ins, false, dtypes, "InProcCommunicator.all_to_all_v: ins");
        for (int r = 0; r < g.size(); ++r) {
          CheckPerRank("InProcCommunicator.all_to_all_v", {{"send_counts[" + std::to_string(r) + "]", send_counts[r].size()}},
                       g.size());
          const std::string rs = "[" + std::to_string(r) + "]";
          CheckElements("InProcCommunicator.all_to_all_v: ins" + rs, i[r],
                        Sum("InProcCommunicator.all_to_all_v: send_counts" + rs, send_counts[r]));
        }
        std::vector<std::vector<char>> outs(g.size());
        std::vector<std::vector<size_t>> rcs(g.size());
        {
          py::gil_scoped_release rel;
          g.Run([&](int r) {
            outs[r] = g.comm(r).AllToAllV(i[r].ptr(), send_counts[r], DTypeFromName(dtypes[r]), &rcs[r]);
          });
        }
        py::list res;
        for (int r = 0; r < g.size(); ++r) res.append(py::make_tuple(ToArray(std::move(outs[r])), rcs[r]));
        return res;
      })
      .def("broadcast", [](InProcCommunicator& g, const std::vector<py::buffer>& bufs, const std::vector<std::string>& dtypes,
                           int root, const std::string& algo) {
        CheckPerRank("InProcCommunicator.broadcast", {{"bufs", bufs.size()}, {"dtypes", dtypes.size()}}, g.size());
        auto b = Bufs(bufs, true, dtypes, "InProcCommunicator.broadcast: bufs");
        py::gil_scoped_release rel;
        g.Run([&](int r) { g.comm(r).Broadcast(b[r].ptr(), b[r].count, DTypeFromName(dtypes[r]), root, algo); });
      })
      .def("send_recv", [](InProcCommunicator& g, int src, int dst, py::buffer in, py::buffer out, const std::string& dtype) {
        if (src < 0 || src >= g.size() || dst < 0 || dst >= g.size() || src == dst) {
          throw py::value_error("InProcCommunicator.send_recv: src " + std::to_string(src) + " and dst " + std::to_string(dst) +
                                " must be two different ranks in [0, " + std::to_string(g.size()) + ")");
        }
        const DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false, d, "InProcCommunicator.send_recv: in"), o = GetBuf(out, true, d, "InProcCommunicator.send_recv: out");
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          if (r == src) g.comm(r).Send(i.ptr(), i.count, d, dst);
          if (r == dst) g.comm(r).Recv(o.ptr(), o.count, d, src);
        });
      })
      .def("barrier", [](InProcCommunicator& g) { g.Run([&](int r) { g.comm(r).Barrier(); }); },
           py::call_guard<py::gil_scoped_release>())
      .def("calibrate", [](InProcCommunicator& g, int repeats) {
        std::vector<TransportParams> res(g.size());
        g.Run([&](int r) { res[r] = g.comm(r).Calibrate(repeats); });
        return res[0];
      }, py::arg("repeats") = 10, py::call_guard<py::gil_scoped_release>())
      .def("enable_aggregation", &InProcCommunicator::EnableAggregation, py::call_guard<py::gil_scoped_release>())
      .def("has_aggregation", &InProcCommunicator::has_aggregators)
      .def("submit", [](InProcCommunicator& g, py::sequence arrays, const std::string& op) {
        CheckPerRank("InProcCommunicator.submit", {{"arrays", py::len(arrays)}}, g.size());
        const ReduceOp o = OpFromName(op);
        std::vector<ArrayHandle> handles;
        for (int r = 0; r < g.size(); ++r) {
          handles.push_back(SubmitOne(g.aggregator(r), arrays[r], o, "all_reduce_async: arrays[" + std::to_string(r) + "]"));
        }
        return handles;
      }, py::arg("arrays"), py::arg("op"), "Queues rank r's copy of arrays[r] in rank r's aggregator; a handle per rank.")
      .def("flush", &InProcCommunicator::FlushAll, py::call_guard<py::gil_scoped_release>())
      .def("aggregator_stats", [](InProcCommunicator& g, int r) { return AggregatorStatsDict(g.aggregator(r).stats()); })
      .def("close", &InProcCommunicator::CloseAggregators, py::call_guard<py::gil_scoped_release>());
}

}  // namespace mshyper::bind
