// Python bindings of the communication library (mindspore_hyper._core.comm). Buffers come in as
// Python buffer objects (contiguous numpy arrays) with the dtype named by the caller; every
// blocking call releases the GIL.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>

#include "bind/bindings.h"
#include "comm/aggregator.h"
#include "comm/communicator.h"
#include "comm/inproc_group.h"
#include "comm/shm_transport.h"
#include "comm/topology.h"

namespace py = pybind11;
using namespace mshyper::comm;

namespace {

struct Buf {
  void* ptr;
  size_t bytes;
};

Buf GetBuf(const py::buffer& b, bool writable) {
  py::buffer_info info = b.request(writable);
  ssize_t expect = info.itemsize;
  for (ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] != 1 && info.strides[i] != expect) throw CommError("buffer must be C-contiguous");
    expect *= info.shape[i];
  }
  return {info.ptr, static_cast<size_t>(info.size * info.itemsize)};
}

size_t Count(const Buf& b, DType d, const char* what) {
  size_t esz = DTypeSize(d);
  if (b.bytes % esz != 0) throw CommError(std::string(what) + ": buffer size is not a multiple of the dtype size");
  return b.bytes / esz;
}

py::array_t<uint8_t> ToArray(std::vector<char>&& v) {
  auto* holder = new std::vector<char>(std::move(v));
  py::capsule owner(holder, [](void* p) { delete static_cast<std::vector<char>*>(p); });
  return py::array_t<uint8_t>({static_cast<ssize_t>(holder->size())}, {1}, reinterpret_cast<uint8_t*>(holder->data()),
                              owner);
}

// Packets through a Python callable fn(memoryview, dtype_name, op_name) that all-reduces in place
// (the MindSpore transport: mint.distributed under msrun).
class PyBackend : public PacketBackend {
 public:
  PyBackend(py::function fn, int size) : fn_(std::move(fn)), size_(size) {}
  ~PyBackend() override {
    py::gil_scoped_acquire gil;
    fn_ = py::function();
  }
  void AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    py::gil_scoped_acquire gil;
    py::memoryview mv = py::memoryview::from_memory(buf, static_cast<ssize_t>(count * DTypeSize(dtype)));
    try {
      fn_(mv, DTypeName(dtype), OpName(op));
    } catch (py::error_already_set& e) {
      throw CommError(std::string("MindSpore transport: ") + e.what());
    }
  }
  int group_size() const override { return size_; }

 private:
  py::function fn_;
  int size_;
};


// dtype of a numpy array in the library's terms, or false when unsupported.
bool NumpyDType(const py::array& a, DType* out) {
  const char kind = a.dtype().kind();
  const ssize_t size = a.itemsize();
  if (kind == 'f' && size == 4) *out = DType::kFloat32;
  else if (kind == 'f' && size == 2) *out = DType::kFloat16;
  else if (kind == 'f' && size == 8) *out = DType::kFloat64;
  else if (kind == 'i' && size == 4) *out = DType::kInt32;
  else if (kind == 'i' && size == 8) *out = DType::kInt64;
  else if (kind == 'u' && size == 1) *out = DType::kUInt8;
  else return false;
  return true;
}

// Handle of an aggregated request whose result array was allocated here (fast submit path).
class ArrayHandle {
 public:
  ArrayHandle(std::shared_ptr<Request> req, py::array result) : req_(std::move(req)), result_(std::move(result)) {}
  py::array wait(double timeout) {
    if (!req_->done()) {
      py::gil_scoped_release rel;
      req_->Wait(timeout);
    } else {
      req_->Wait(timeout);  // done: returns at once or rethrows the packet's error
    }
    return result_;
  }
  bool done() { return req_->done(); }

 private:
  std::shared_ptr<Request> req_;
  py::array result_;
};

// One process's member of a shared-memory group.
class ShmGroup {
 public:
  ShmGroup(const std::string& name, int rank, int size, size_t channel_bytes, double timeout)
      : transport_(std::make_shared<ShmTransport>(name, rank, size, channel_bytes, timeout)),
        comm_(std::make_shared<Communicator>(transport_, std::vector<int>{}, nullptr, std::vector<int>{},
                                             TransportParams{2e-6, 2e-10, 2.5e-10})) {}
  std::shared_ptr<ShmTransport> transport_;
  std::shared_ptr<Communicator> comm_;
};

py::dict AggregatorStatsDict(const AggregatorStats& s) {
  py::dict d;
  d["requests"] = s.requests;
  d["packets"] = s.packets;
  d["bypassed"] = s.bypassed;
  d["batches"] = s.batches;
  d["bytes"] = s.bytes;
  return d;
}

std::vector<Buf> Bufs(const std::vector<py::buffer>& list, bool writable) {
  std::vector<Buf> out;
  for (const auto& b : list) out.push_back(GetBuf(b, writable));
  return out;
}

}  // namespace

namespace mshyper::bind {

void BindComm(py::module_& root) {
  py::module_ m = root.def_submodule("comm", "Message-aggregating communication library (C++)");
  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  static py::exception<CommTimeout> comm_timeout(m, "CommTimeout", comm_error.ptr());
  static py::exception<CommMismatch> comm_mismatch(m, "CommMismatch", comm_error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CommTimeout& e) {
      py::set_error(comm_timeout, e.what());
    } catch (const CommMismatch& e) {
      py::set_error(comm_mismatch, e.what());
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

  py::class_<Request, std::shared_ptr<Request>>(m, "Request")
      .def("wait", &Request::Wait, py::arg("timeout") = -1.0, py::call_guard<py::gil_scoped_release>())
      .def("done", &Request::done);

  py::class_<Aggregator, std::shared_ptr<Aggregator>>(m, "Aggregator")
      .def("submit", [](Aggregator& a, py::buffer b, const std::string& dtype, const std::string& op) {
        DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, true);
        return a.Submit(buf.ptr, Count(buf, d, "submit"), d, OpFromName(op));
      })
      .def("flush", &Aggregator::Flush, py::call_guard<py::gil_scoped_release>())
      .def("close", &Aggregator::Close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("packet_bytes", &Aggregator::packet_bytes)
      .def_property_readonly("max_delay", &Aggregator::max_delay)
      .def("stats", [](Aggregator& a) {
        return AggregatorStatsDict(a.stats());
      });
  py::class_<ArrayHandle>(m, "ArrayHandle")
      .def("wait", [](ArrayHandle& h, py::object timeout) {
        return h.wait(timeout.is_none() ? -1.0 : timeout.cast<double>());
      }, py::arg("timeout") = py::none())
      .def("done", &ArrayHandle::done);
  m.def("submit_copy", [](Aggregator& a, const py::array& x, const std::string& op) -> py::object {
    // Fast path of all_reduce_async: copy a C-contiguous array into a fresh result array and queue it.
    DType d;
    if (!NumpyDType(x, &d) || !(x.flags() & py::array::c_style)) return py::none();
    ReduceOp o = OpFromName(op);
    std::vector<ssize_t> shape(x.shape(), x.shape() + x.ndim());
    py::array result(x.dtype(), shape);
    const size_t bytes = static_cast<size_t>(x.nbytes());
    std::memcpy(result.mutable_data(), x.data(), bytes);
    auto req = a.Submit(result.mutable_data(), bytes / DTypeSize(d), d, o);
    return py::cast(ArrayHandle(std::move(req), std::move(result)));
  }, py::arg("aggregator"), py::arg("x"), py::arg("op"));
  m.def("python_aggregator", [](py::function fn, int size, size_t packet_bytes, double max_delay) {
    return std::make_shared<Aggregator>(std::make_shared<PyBackend>(std::move(fn), size), packet_bytes, max_delay);
  }, py::arg("allreduce_fn"), py::arg("group_size"), py::arg("packet_bytes"), py::arg("max_delay"));

  // ----- shared memory: one member per process ---------------------------------------------
  py::class_<ShmGroup, std::shared_ptr<ShmGroup>>(m, "ShmGroup")
      .def(py::init<const std::string&, int, int, size_t, double>(), py::arg("name"), py::arg("rank"), py::arg("size"),
           py::arg("channel_bytes"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", [](ShmGroup& g) { return g.comm_->rank(); })
      .def_property_readonly("size", [](ShmGroup& g) { return g.comm_->size(); })
      .def_property_readonly("segment_name", [](ShmGroup& g) { return g.transport_->segment_name(); })
      .def_property_readonly("segment_bytes", [](ShmGroup& g) { return g.transport_->segment_bytes(); })
      .def_property("timeout", [](ShmGroup& g) { return g.transport_->timeout(); },
                    [](ShmGroup& g, double t) { g.transport_->set_timeout(t); })
      .def_property("validate", [](ShmGroup& g) { return g.comm_->validate; },
                    [](ShmGroup& g, bool v) { g.comm_->validate = v; })
      .def_property_readonly("last_algorithm", [](ShmGroup& g) { return g.comm_->last_algorithm(); })
      .def_property("direct_min_bytes", [](ShmGroup& g) { return g.comm_->direct_min_bytes; },
                    [](ShmGroup& g, double v) { g.comm_->direct_min_bytes = v; })
      .def_property_readonly("model", [](ShmGroup& g) { return &g.comm_->model(); }, py::return_value_policy::reference_internal)
      .def("all_reduce", [](ShmGroup& g, py::buffer b, const std::string& dtype, const std::string& op,
                            const std::string& algo) {
        DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, true);
        py::gil_scoped_release rel;
        g.comm_->AllReduce(buf.ptr, Count(buf, d, "all_reduce"), d, OpFromName(op), algo);
      })
      .def("all_gather_v", [](ShmGroup& g, py::buffer in, py::buffer out, const std::vector<size_t>& counts,
                              const std::string& dtype) {
        DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false), o = GetBuf(out, true);
        py::gil_scoped_release rel;
        g.comm_->AllGatherV(i.ptr, o.ptr, counts, d);
      })
      .def("all_gather", [](ShmGroup& g, py::buffer in, py::buffer out, const std::string& dtype) {
        DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false), o = GetBuf(out, true);
        size_t c = Count(i, d, "all_gather");
        if (o.bytes != i.bytes * static_cast<size_t>(g.comm_->size())) throw CommError("all_gather: output size must be size x input");
        py::gil_scoped_release rel;
        g.comm_->AllGather(i.ptr, o.ptr, c, d);
      })
      .def("reduce_scatter", [](ShmGroup& g, py::buffer in, py::buffer out, const std::vector<size_t>& counts,
                                const std::string& dtype, const std::string& op) {
        DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false), o = GetBuf(out, true);
        py::gil_scoped_release rel;
        g.comm_->ReduceScatter(i.ptr, o.ptr, counts, d, OpFromName(op));
      })
      .def("all_to_all_v", [](ShmGroup& g, py::buffer in, const std::vector<size_t>& send_counts, const std::string& dtype) {
        DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false);
        std::vector<size_t> rc;
        std::vector<char> out;
        {
          py::gil_scoped_release rel;
          out = g.comm_->AllToAllV(i.ptr, send_counts, d, &rc);
        }
        return py::make_tuple(ToArray(std::move(out)), rc);
      })
      .def("broadcast", [](ShmGroup& g, py::buffer b, const std::string& dtype, int root, const std::string& algo) {
        DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, true);
        py::gil_scoped_release rel;
        g.comm_->Broadcast(buf.ptr, Count(buf, d, "broadcast"), d, root, algo);
      })
      .def("send", [](ShmGroup& g, py::buffer b, const std::string& dtype, int peer) {
        DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, false);
        py::gil_scoped_release rel;
        g.comm_->Send(buf.ptr, Count(buf, d, "send"), d, peer);
      })
      .def("recv", [](ShmGroup& g, py::buffer b, const std::string& dtype, int peer) {
        DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, true);
        py::gil_scoped_release rel;
        g.comm_->Recv(buf.ptr, Count(buf, d, "recv"), d, peer);
      })
      .def("barrier", [](ShmGroup& g) { g.comm_->Barrier(); }, py::call_guard<py::gil_scoped_release>())
      .def("calibrate", [](ShmGroup& g, int repeats) { return g.comm_->Calibrate(repeats); }, py::arg("repeats") = 20,
           py::call_guard<py::gil_scoped_release>())
      .def("make_aggregator", [](ShmGroup& g, size_t packet_bytes, double max_delay) {
        return std::make_shared<Aggregator>(std::make_shared<CommunicatorBackend>(g.comm_), packet_bytes, max_delay);
      }, py::arg("packet_bytes"), py::arg("max_delay"));
  m.def("cleanup_stale_segments", &ShmTransport::CleanupStale, py::arg("prefix"));

  // ----- in-process: all ranks in this process ----------------------------------------------
  py::class_<InProcGroup, std::shared_ptr<InProcGroup>>(m, "InProcGroup")
      .def(py::init([](int n, std::shared_ptr<Topology> topo, std::vector<int> devices, size_t channel_bytes,
                       double timeout, TransportParams params) {
             return std::make_shared<InProcGroup>(n, topo, devices, channel_bytes, timeout, params);
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
        auto b = Bufs(bufs, true);
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          DType d = DTypeFromName(dtypes[r]);
          g.comm(r).AllReduce(b[r].ptr, Count(b[r], d, "all_reduce"), d, OpFromName(ops[r]), algo);
        });
      })
      .def("all_gather_v", [](InProcGroup& g, const std::vector<py::buffer>& ins, const std::vector<py::buffer>& outs,
                              const std::vector<std::vector<size_t>>& counts, const std::vector<std::string>& dtypes) {
        auto i = Bufs(ins, false), o = Bufs(outs, true);
        py::gil_scoped_release rel;
        g.Run([&](int r) { g.comm(r).AllGatherV(i[r].ptr, o[r].ptr, counts[r], DTypeFromName(dtypes[r])); });
      })
      .def("reduce_scatter", [](InProcGroup& g, const std::vector<py::buffer>& ins, const std::vector<py::buffer>& outs,
                                const std::vector<std::vector<size_t>>& counts, const std::vector<std::string>& dtypes,
                                const std::vector<std::string>& ops) {
        auto i = Bufs(ins, false), o = Bufs(outs, true);
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          g.comm(r).ReduceScatter(i[r].ptr, o[r].ptr, counts[r], DTypeFromName(dtypes[r]), OpFromName(ops[r]));
        });
      })
      .def("all_to_all_v", [](InProcGroup& g, const std::vector<py::buffer>& ins,
                              const std::vector<std::vector<size_t>>& send_counts, const std::vector<std::string>& dtypes) {
        auto i = Bufs(ins, false);
        std::vector<std::vector<char>> outs(g.size());
        std::vector<std::vector<size_t>> rcs(g.size());
        {
          py::gil_scoped_release rel;
          g.Run([&](int r) { outs[r] = g.comm(r).AllToAllV(i[r].ptr, send_counts[r], DTypeFromName(dtypes[r]), &rcs[r]); });
        }
        py::list res;
        for (int r = 0; r < g.size(); ++r) res.append(py::make_tuple(ToArray(std::move(outs[r])), rcs[r]));
        return res;
      })
      .def("broadcast", [](InProcGroup& g, const std::vector<py::buffer>& bufs, const std::vector<std::string>& dtypes,
                           int root, const std::string& algo) {
        auto b = Bufs(bufs, true);
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          DType d = DTypeFromName(dtypes[r]);
          g.comm(r).Broadcast(b[r].ptr, Count(b[r], d, "broadcast"), d, root, algo);
        });
      })
      .def("send_recv", [](InProcGroup& g, int src, int dst, py::buffer in, py::buffer out, const std::string& dtype) {
        DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false), o = GetBuf(out, true);
        py::gil_scoped_release rel;
        g.Run([&](int r) {
          if (r == src) g.comm(r).Send(i.ptr, Count(i, d, "send"), d, dst);
          if (r == dst) g.comm(r).Recv(o.ptr, Count(o, d, "recv"), d, src);
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
      .def("submit", [](InProcGroup& g, const std::vector<py::buffer>& bufs, const std::vector<std::string>& dtypes,
                        const std::vector<std::string>& ops) {
        std::vector<std::shared_ptr<Request>> reqs;
        for (int r = 0; r < g.size(); ++r) {
          DType d = DTypeFromName(dtypes[r]);
          Buf b = GetBuf(bufs[r], true);
          reqs.push_back(g.aggregator(r).Submit(b.ptr, Count(b, d, "submit"), d, OpFromName(ops[r])));
        }
        return reqs;
      })
      .def("flush", &InProcGroup::FlushAll, py::call_guard<py::gil_scoped_release>())
      .def("aggregator_stats", [](InProcGroup& g, int r) {
        return AggregatorStatsDict(g.aggregator(r).stats());
      })
      .def("close", &InProcGroup::CloseAggregators, py::call_guard<py::gil_scoped_release>());
}

}  // namespace mshyper::bind
