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
#include "comm/inproc_group.h"
#include "comm/topology.h"

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

void BindInProcGroup(py::module_& m) {
  py::class_<InProcGroup, std::shared_ptr<InProcGroup>>(m, "InProcGroup")
      .def(py::init([](int n, std::shared_ptr<Topology> topo, std::vector<int> devices, size_t channel_bytes,
                       double timeout, TransportParams params) {
             return GilFreeDelete(new InProcGroup(n, topo, devices, channel_bytes, timeout, params));
           }),
           py::arg("size"), py::arg("topology"), py::arg("devices"), py::arg("channel_bytes"), py::arg("timeout"),
           py::arg("params"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("size", &InProcGroup::size)
      .def("last_algorithm", [](InProcGroup& g) { return g.comm(0).last_algorithm(); })
      .def("ring", [](InProcGroup& g) { return g.comm(0).ring(); })
      .def("model", [](InProcGroup& g, int r) { return &g.comm(r).model(); }, py::return_value_policy::reference_internal)
      .def("set_validate", [](InProcGroup& g, bool v) {
        for (int r = 0; r < g.size(); ++r) g.comm(r).validate = v;
      })
      .def("all_reduce", [](InProcGroup& g, const std::vector<py::buffer>& bufs, const std::vector<std::string>& dtypes,
                            const std::vector<std::string>& ops, const std::string& algo) {
        CheckPerRank("InProcGroup.all_reduce", {{"bufs", bufs.size()}, {"dtypes", dtypes.size()}, {"ops", ops.size()}},
                     g.size());
        auto b = Bufs(bufs, true, dtypes, "InProcGroup.all_reduce: bufs");
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          g.comm(r).AllReduce(b[r].ptr(), b[r].count, DTypeFromName(dtypes[r]), OpFromName(ops[r]), algo);
        });
      })
      .def("all_gather_v", [](InProcGroup& g, const std::vector<py::buffer>& ins, const std::vector<py::buffer>& outs,
                              const std::vector<std::vector<size_t>>& counts, const std::vector<std::string>& dtypes) {
        CheckPerRank("InProcGroup.all_gather_v", {{"ins", ins.size()}, {"outs", outs.size()}, {"counts", counts.size()},
                              {"dtypes", dtypes.size()}}, g.size());
        auto i = Bufs(ins, false, dtypes, "InProcGroup.all_gather_v: ins");
        auto o = Bufs(outs, true, dtypes, "InProcGroup.all_gather_v: outs");
        for (int r = 0; r < g.size(); ++r) {
          CheckPerRank("InProcGroup.all_gather_v", {{"counts[" + std::to_string(r) + "]", counts[r].size()}}, g.size());
          CheckElements("InProcGroup.all_gather_v: ins[" + std::to_string(r) + "]", i[r], counts[r][r]);
          CheckElements("InProcGroup.all_gather_v: outs[" + std::to_string(r) + "]", o[r], Sum(counts[r]));
        }
        py::gil_scoped_release rel;
        g.Run([&](int r) { g.comm(r).AllGatherV(i[r].ptr(), o[r].ptr(), counts[r], DTypeFromName(dtypes[r])); });
      })
      .def("reduce_scatter", [](InProcGroup& g, const std::vector<py::buffer>& ins, const std::vector<py::buffer>& outs,
                                const std::vector<std::vector<size_t>>& counts, const std::vector<std::string>& dtypes,
                                const std::vector<std::string>& ops) {
        CheckPerRank("InProcGroup.reduce_scatter", {{"ins", ins.size()}, {"outs", outs.size()}, {"counts", counts.size()},
                              {"dtypes", dtypes.size()}, {"ops", ops.size()}}, g.size());
        auto i = Bufs(ins, false, dtypes, "InProcGroup.reduce_scatter: ins");
        auto o = Bufs(outs, true, dtypes, "InProcGroup.reduce_scatter: outs");
        for (int r = 0; r < g.size(); ++r) {
          CheckPerRank("InProcGroup.reduce_scatter", {{"counts[" + std::to_string(r) + "]", counts[r].size()}}, g.size());
          CheckElements("InProcGroup.reduce_scatter: ins[" + std::to_string(r) + "]", i[r], Sum(counts[r]));
          CheckElements("InProcGroup.reduce_scatter: outs[" + std::to_string(r) + "]", o[r], counts[r][r]);
        }
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          g.comm(r).ReduceScatter(i[r].ptr(), o[r].ptr(), counts[r], DTypeFromName(dtypes[r]), OpFromName(ops[r]));
        });
      })
      .def("all_to_all_v", [](InProcGroup& g, const std::vector<py::buffer>& ins,
                              const std::vector<std::vector<size_t>>& send_counts, const std::vector<std::string>& dtypes) {
        CheckPerRank("InProcGroup.all_to_all_v",
                     {{"ins", ins.size()}, {"send_counts", send_counts.size()}, {"dtypes", dtypes.size()}}, g.size());
        auto i = Bufs(ins, false, dtypes, "InProcGroup.all_to_all_v: ins");
        for (int r = 0; r < g.size(); ++r) {
          CheckPerRank("InProcGroup.all_to_all_v", {{"send_counts[" + std::to_string(r) + "]", send_counts[r].size()}},
                       g.size());
          CheckElements("InProcGroup.all_to_all_v: ins[" + std::to_string(r) + "]", i[r], Sum(send_counts[r]));
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
      .def("broadcast", [](InProcGroup& g, const std::vector<py::buffer>& bufs, const std::vector<std::string>& dtypes,
                           int root, const std::string& algo) {
        CheckPerRank("InProcGroup.broadcast", {{"bufs", bufs.size()}, {"dtypes", dtypes.size()}}, g.size());
        auto b = Bufs(bufs, true, dtypes, "InProcGroup.broadcast: bufs");
        py::gil_scoped_release rel;
        g.Run([&](int r) { g.comm(r).Broadcast(b[r].ptr(), b[r].count, DTypeFromName(dtypes[r]), root, algo); });
      })
      .def("send_recv", [](InProcGroup& g, int src, int dst, py::buffer in, py::buffer out, const std::string& dtype) {
        if (src < 0 || src >= g.size() || dst < 0 || dst >= g.size() || src == dst) {
          throw py::value_error("InProcGroup.send_recv: src " + std::to_string(src) + " and dst " + std::to_string(dst) +
                                " must be two different ranks in [0, " + std::to_string(g.size()) + ")");
        }
        const DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false, d, "InProcGroup.send_recv: in"), o = GetBuf(out, true, d, "InProcGroup.send_recv: out");
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          if (r == src) g.comm(r).Send(i.ptr(), i.count, d, dst);
          if (r == dst) g.comm(r).Recv(o.ptr(), o.count, d, src);
        });
      })
      .def("barrier", [](InProcGroup& g) { g.Run([&](int r) { g.comm(r).Barrier(); }); },
           py::call_guard<py::gil_scoped_release>())
      .def("calibrate", [](InProcGroup& g, int repeats) {
        std::vector<TransportParams> res(g.size());
        g.Run([&](int r) { res[r] = g.comm(r).Calibrate(repeats); });
        return res[0];
      }, py::arg("repeats") = 10, py::call_guard<py::gil_scoped_release>())
      .def("enable_aggregation", &InProcGroup::EnableAggregation, py::call_guard<py::gil_scoped_release>())
      .def("has_aggregation", &InProcGroup::has_aggregators)
      .def("submit", [](InProcGroup& g, py::sequence arrays, const std::string& op) {
        CheckPerRank("InProcGroup.submit", {{"arrays", py::len(arrays)}}, g.size());
        const ReduceOp o = OpFromName(op);
        std::vector<ArrayHandle> handles;
        for (int r = 0; r < g.size(); ++r) {
          handles.push_back(SubmitOne(g.aggregator(r), arrays[r], o, "all_reduce_async: arrays[" + std::to_string(r) + "]"));
        }
        return handles;
      }, py::arg("arrays"), py::arg("op"), "Queues rank r's copy of arrays[r] in rank r's aggregator; a handle per rank.")
      .def("flush", &InProcGroup::FlushAll, py::call_guard<py::gil_scoped_release>())
      .def("aggregator_stats", [](InProcGroup& g, int r) { return AggregatorStatsDict(g.aggregator(r).stats()); })
      .def("close", &InProcGroup::CloseAggregators, py::call_guard<py::gil_scoped_release>());
}

}  // namespace mshyper::bind
