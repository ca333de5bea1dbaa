// Python bindings of a shared-memory group member (comm submodule): one member per process;
// every blocking call releases the GIL.
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
#include "comm/communicator.h"
#include "comm/shm_transport.h"

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

namespace {

// One process's member of a shared-memory group.
class ShmCommunicator {
 public:
  ShmCommunicator(const std::string& name, int rank, int size, size_t channel_bytes, double timeout)
      : transport_(std::make_shared<ShmTransport>(name, rank, size, channel_bytes, timeout)),
        comm_(std::make_shared<Communicator>(transport_, std::vector<int>{}, nullptr, std::vector<int>{},
                                             TransportParams{2e-6, 2e-10, 2.5e-10})) {}
  std::shared_ptr<ShmTransport> transport_;
  std::shared_ptr<Communicator> comm_;
};

}  // namespace

void BindShmCommunicator(py::module_& m) {
  py::class_<ShmCommunicator, std::shared_ptr<ShmCommunicator>>(m, "ShmCommunicator")
      .def(py::init<const std::string&, int, int, size_t, double>(), py::arg("name"), py::arg("rank"), py::arg("size"),
           py::arg("channel_bytes"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", [](ShmCommunicator& g) { return g.comm_->rank(); })
      .def_property_readonly("size", [](ShmCommunicator& g) { return g.comm_->size(); })
      .def_property_readonly("segment_name", [](ShmCommunicator& g) { return g.transport_->segment_name(); })
      .def_property_readonly("segment_bytes", [](ShmCommunicator& g) { return g.transport_->segment_bytes(); })
      .def_property("timeout", [](ShmCommunicator& g) { return g.transport_->timeout(); },
                    [](ShmCommunicator& g, double t) { g.transport_->set_timeout(t); })
      .def_property("validate", [](ShmCommunicator& g) { return g.comm_->validate; },
                    [](ShmCommunicator& g, bool v) { g.comm_->validate = v; })
      .def_property_readonly("last_algorithm", [](ShmCommunicator& g) { return g.comm_->last_algorithm(); })
      .def_property("direct_min_bytes", [](ShmCommunicator& g) { return g.comm_->direct_min_bytes; },
                    [](ShmCommunicator& g, double v) { g.comm_->direct_min_bytes = v; })
      .def_property("max_message_bytes", [](ShmCommunicator& g) { return g.comm_->max_message_bytes; },
                    [](ShmCommunicator& g, uint64_t v) {
                      if (v == 0) throw py::value_error("ShmCommunicator.max_message_bytes must be > 0");
                      g.comm_->max_message_bytes = v;
                    })
      .def("abort", [](ShmCommunicator& g, const std::string& why) { g.transport_->Abort(why); }, py::arg("why"),
           "Marks the group broken: every rank's next wait fails fast with CommTimeout naming `why`.")
      .def_property_readonly("model", [](ShmCommunicator& g) { return &g.comm_->model(); }, py::return_value_policy::reference_internal)
      .def("all_reduce", [](ShmCommunicator& g, py::buffer b, const std::string& dtype, const std::string& op,
                            const std::string& algo) {
        const DType d = DTypeFromName(dtype);
        const ReduceOp o = OpFromName(op);
        Buf buf = GetBuf(b, true, d, "ShmCommunicator.all_reduce: buf");
        py::gil_scoped_release rel;
        g.comm_->AllReduce(buf.ptr(), buf.count, d, o, algo);
      })
      .def("all_gather_v", [](ShmCommunicator& g, py::buffer in, py::buffer out, const std::vector<size_t>& counts,
                              const std::string& dtype) {
        const DType d = DTypeFromName(dtype);
        CheckPerRank("ShmCommunicator.all_gather_v", {{"counts", counts.size()}}, g.comm_->size());
        Buf i = GetBuf(in, false, d, "ShmCommunicator.all_gather_v: in"), o = GetBuf(out, true, d, "ShmCommunicator.all_gather_v: out");
        CheckElements("ShmCommunicator.all_gather_v: in", i, counts[g.comm_->rank()]);
        CheckElements("ShmCommunicator.all_gather_v: out", o, Sum("ShmCommunicator.all_gather_v: counts", counts));
        py::gil_scoped_release rel;
        g.comm_->AllGatherV(i.ptr(), o.ptr(), counts, d);
      })
      .def("all_gather", [](ShmCommunicator& g, py::buffer in, py::buffer out, const std::string& dtype) {
        const DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false, d, "ShmCommunicator.all_gather: in"), o = GetBuf(out, true, d, "ShmCommunicator.all_gather: out");
        CheckElements("ShmCommunicator.all_gather: out", o, i.count * static_cast<uint64_t>(g.comm_->size()));
        py::gil_scoped_release rel;
        g.comm_->AllGather(i.ptr(), o.ptr(), i.count, d);
      })
      .def("reduce_scatter", [](ShmCommunicator& g, py::buffer in, py::buffer out, const std::vector<size_t>& counts,
                                const std::string& dtype, const std::string& op) {
        const DType d = DTypeFromName(dtype);
        const ReduceOp o = OpFromName(op);
        CheckPerRank("ShmCommunicator.reduce_scatter", {{"counts", counts.size()}}, g.comm_->size());
        Buf i = GetBuf(in, false, d, "ShmCommunicator.reduce_scatter: in");
        Buf ob = GetBuf(out, true, d, "ShmCommunicator.reduce_scatter: out");
        CheckElements("ShmCommunicator.reduce_scatter: in", i, Sum("ShmCommunicator.reduce_scatter: counts", counts));
        CheckElements("ShmCommunicator.reduce_scatter: out", ob, counts[g.comm_->rank()]);
        py::gil_scoped_release rel;
        g.comm_->ReduceScatter(i.ptr(), ob.ptr(), counts, d, o);
      })
      .def("all_to_all_v", [](ShmCommunicator& g, py::buffer in, const std::vector<size_t>& send_counts, const std::string& dtype,
                              uint64_t shape_key) {
        const DType d = DTypeFromName(dtype);
        CheckPerRank("ShmCommunicator.all_to_all_v", {{"send_counts", send_counts.size()}}, g.comm_->size());
        Buf i = GetBuf(in, false, d, "ShmCommunicator.all_to_all_v: in");
        CheckElements("ShmCommunicator.all_to_all_v: in", i, Sum("ShmCommunicator.all_to_all_v: send_counts", send_counts));
        std::vector<size_t> rc;
        std::vector<char> out;
        {
          py::gil_scoped_release rel;
          out = g.comm_->AllToAllV(i.ptr(), send_counts, d, &rc, shape_key);
        }
        return py::make_tuple(ToArray(std::move(out)), rc);
      }, py::arg("in"), py::arg("send_counts"), py::arg("dtype"), py::arg("shape_key") = 0)
      .def("broadcast", [](ShmCommunicator& g, py::buffer b, const std::string& dtype, int root, const std::string& algo) {
        const DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, true, d, "ShmCommunicator.broadcast: buf");
        py::gil_scoped_release rel;
        g.comm_->Broadcast(buf.ptr(), buf.count, d, root, algo);
      })
      .def("send", [](ShmCommunicator& g, py::buffer b, const std::string& dtype, int peer) {
        const DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, false, d, "ShmCommunicator.send: buf");
        py::gil_scoped_release rel;
        g.comm_->Send(buf.ptr(), buf.count, d, peer);
      })
      .def("recv", [](ShmCommunicator& g, py::buffer b, const std::string& dtype, int peer) {
        const DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, true, d, "ShmCommunicator.recv: buf");
        py::gil_scoped_release rel;
        g.comm_->Recv(buf.ptr(), buf.count, d, peer);
      })
      .def("barrier", [](ShmCommunicator& g) { g.comm_->Barrier(); }, py::call_guard<py::gil_scoped_release>())
      .def("calibrate", [](ShmCommunicator& g, int repeats) { return g.comm_->Calibrate(repeats); }, py::arg("repeats") = 20,
           py::call_guard<py::gil_scoped_release>())
      .def("make_aggregator", [](ShmCommunicator& g, size_t packet_bytes, double max_delay) {
        return GilFreeDelete(new Aggregator(std::make_shared<CommunicatorBackend>(g.comm_), packet_bytes, max_delay,
                                            g.transport_->timeout()));
      }, py::arg("packet_bytes"), py::arg("max_delay"));
  m.def("cleanup_stale_segments", &ShmTransport::CleanupStale, py::arg("prefix"), py::arg("blank_age_s"));
}

}  // namespace mshyper::bind
