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
#include "comm/aggregator.h"
#include "comm/communicator.h"
#include "comm/inproc_group.h"
#include "comm/shm_transport.h"
#include "comm/topology.h"

namespace py = pybind11;
using namespace mshyper::comm;

namespace {

// A C-contiguous Python buffer holding `count` elements of a dtype. The buffer stays exported (its
// owner cannot free or resize it) for as long as this object lives: keep it alive across the GIL
// release and until the last use of ptr().
struct Buf {
  py::buffer_info info;
  size_t bytes = 0;
  size_t count = 0;
  void* ptr() const { return info.ptr; }
};

// `what` names the call and the argument in errors ("ShmGroup.all_reduce: buf").
Buf GetBuf(const py::buffer& b, bool writable, DType dtype, const std::string& what) {
  Buf out;
  try {
    out.info = b.request(writable);
  } catch (py::error_already_set& e) {
    throw py::value_error(what + (writable ? ": needs a writable buffer (" : ": needs a buffer (") + e.what() + ")");
  }
  const py::buffer_info& info = out.info;
  ssize_t expect = info.itemsize;
  for (ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] != 1 && info.strides[i] != expect) throw py::value_error(what + ": buffer must be C-contiguous");
    expect *= info.shape[i];
  }
  const size_t esz = DTypeSize(dtype);
  if (static_cast<size_t>(info.itemsize) != esz) {
    throw py::value_error(what + ": buffer items have " + std::to_string(info.itemsize) + " bytes but dtype " +
                          DTypeName(dtype) + " has " + std::to_string(esz));
  }
  out.bytes = static_cast<size_t>(info.size * info.itemsize);
  out.count = out.bytes / esz;
  return out;
}

std::vector<Buf> Bufs(const std::vector<py::buffer>& list, bool writable, const std::vector<std::string>& dtypes,
                      const std::string& what) {
  std::vector<Buf> out;
  for (size_t r = 0; r < list.size(); ++r) {
    out.push_back(GetBuf(list[r], writable, DTypeFromName(dtypes[r]), what + "[" + std::to_string(r) + "]"));
  }
  return out;
}

// Raises ValueError unless every per-rank list argument (name, length) has one entry per rank.
void CheckPerRank(const std::string& call, std::initializer_list<std::pair<std::string, size_t>> args, int size) {
  for (const auto& [arg, got] : args) {
    if (got != static_cast<size_t>(size)) {
      throw py::value_error(call + ": " + arg + " has " + std::to_string(got) + " entries, expected " +
                            std::to_string(size) + " (one per rank)");
    }
  }
}

// Raises ValueError unless `buf` holds exactly `count` elements (the counts a collective reads or
// writes at the raw pointer).
void CheckElements(const std::string& what, const Buf& buf, uint64_t count) {
  if (buf.count != count) {
    throw py::value_error(what + ": buffer holds " + std::to_string(buf.count) + " elements but the counts need " +
                          std::to_string(count));
  }
}

uint64_t Sum(const std::vector<size_t>& counts) {
  uint64_t total = 0;
  for (size_t c : counts) total += c;
  return total;
}

py::array_t<uint8_t> ToArray(std::vector<char>&& v) {
  auto* holder = new std::vector<char>(std::move(v));
  py::capsule owner(holder, [](void* p) { delete static_cast<std::vector<char>*>(p); });
  return py::array_t<uint8_t>({static_cast<ssize_t>(holder->size())}, {1}, reinterpret_cast<uint8_t*>(holder->data()),
                              owner);
}

// A shared_ptr whose deleter releases the GIL (when this thread holds it) around `delete`: the
// destructors join threads, and a thread that needs the GIL to finish (a Python callback) must
// be able to take it.
template <class T>
std::shared_ptr<T> GilFreeDelete(T* p) {
  return std::shared_ptr<T>(p, [](T* q) {
    if (PyGILState_Check()) {
      py::gil_scoped_release rel;
      delete q;
    } else {
      delete q;
    }
  });
}

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

// Requests of a batch submission: each item as a C-contiguous numpy array (a copy only when
// needed) and its spec. TypeError naming the item (`what`, with "[i]" when `indexed`) otherwise.
void ToRequestSpecs(const py::sequence& xs, const std::string& what, bool indexed, std::vector<py::array>* arrays,
                    std::vector<RequestSpec>* specs) {
  const size_t n = py::len(xs);
  arrays->reserve(n);
  specs->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    py::object x = xs[i];
    py::array a = py::array::ensure(x, py::array::c_style);
    DType d = DType::kFloat32;
    if (!a || !NumpyDType(a, &d)) {
      const std::string item = indexed ? what + "[" + std::to_string(i) + "]" : what;
      if (!a) {
        throw py::type_error(item + ": expected an array-like of numbers, got " +
                             py::str(py::type::handle_of(x).attr("__name__")).cast<std::string>());
      }
      throw py::type_error(item + ": dtype " + py::str(a.dtype()).cast<std::string>() +
                           " is not supported by the comm library; supported: float32, float16, int32, float64, "
                           "int64, uint8");
    }
    specs->push_back({a.data(), static_cast<size_t>(a.size()), d});
    arrays->push_back(std::move(a));
  }
}

// Waits for every request (timeout < 0: no limit; else one deadline for all), the GIL released
// unless all are done already; rethrows the first failure.
void WaitAll(const std::vector<std::shared_ptr<Request>>& reqs, double timeout) {
  auto wait = [&] {
    const auto deadline = std::chrono::steady_clock::now() + WaitDuration(timeout);
    for (const auto& r : reqs) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      r->Wait(timeout < 0 ? -1.0 : std::max(0.0, left));
    }
  };
  bool done = true;
  for (const auto& r : reqs) done = done && r->done();
  if (done) {
    wait();  // returns at once or rethrows a packet's error
  } else {
    py::gil_scoped_release rel;
    wait();
  }
}

// Requests just submitted and their results: numpy views of the requests' storage (the views
// keep it alive), with the inputs' shapes and dtypes.
struct Submitted {
  std::vector<std::shared_ptr<Request>> reqs;
  py::list results;
};

// Handle of one aggregated request.
class ArrayHandle {
 public:
  ArrayHandle(std::shared_ptr<Request> req, py::object result) : req_{std::move(req)}, result_(std::move(result)) {}
  py::object wait(double timeout) {
    WaitAll(req_, timeout);
    return result_;
  }
  bool done() { return req_[0]->done(); }

 private:
  std::vector<std::shared_ptr<Request>> req_;
  py::object result_;
};

// Handle of one batched submission: wait() returns the results in submission order.
class BatchHandle {
 public:
  explicit BatchHandle(Submitted s) : s_(std::move(s)) {}
  py::list wait(double timeout) {
    WaitAll(s_.reqs, timeout);
    return py::list(s_.results);  // a new list each time; the same arrays
  }
  bool done() {
    for (const auto& r : s_.reqs)
      if (!r->done()) return false;
    return true;
  }
  size_t size() const { return s_.reqs.size(); }

 private:
  Submitted s_;
};

// Copies every array into one storage block of the aggregator and queues them in order.
// `what`/`indexed` name the items in errors.
Submitted SubmitArrays(Aggregator& agg, const py::sequence& xs, ReduceOp op, const std::string& what, bool indexed) {
  std::vector<py::array> arrays;
  std::vector<RequestSpec> specs;
  ToRequestSpecs(xs, what, indexed, &arrays, &specs);
  Submitted out{agg.SubmitMany(specs, op), py::list(specs.size())};
  if (out.reqs.empty()) return out;
  py::capsule owner(new std::shared_ptr<char[]>(out.reqs[0]->storage()),
                    [](void* p) { delete static_cast<std::shared_ptr<char[]>*>(p); });
  for (size_t i = 0; i < out.reqs.size(); ++i) {
    const py::array& a = arrays[i];
    std::vector<ssize_t> shape(a.shape(), a.shape() + a.ndim());
    out.results[i] = py::array(a.dtype(), shape, out.reqs[i]->data(), owner);
  }
  return out;
}

ArrayHandle SubmitOne(Aggregator& agg, const py::object& x, ReduceOp op, const std::string& what) {
  Submitted s = SubmitArrays(agg, py::make_tuple(x), op, what, false);
  return ArrayHandle(s.reqs[0], s.results[0]);
}

double WaitTimeout(const py::object& timeout) {
  if (timeout.is_none()) return -1.0;
  const double t = timeout.cast<double>();
  if (std::isnan(t)) throw py::value_error("wait: timeout must be a number of seconds or None, got nan");
  return t;
}

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
  d["in_place"] = s.in_place;
  d["bypassed"] = s.bypassed;
  d["batches"] = s.batches;
  d["bytes"] = s.bytes;
  return d;
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
      .def("flush", &Aggregator::Flush, py::call_guard<py::gil_scoped_release>())
      .def("close", &Aggregator::Close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("packet_bytes", &Aggregator::packet_bytes)
      .def_property_readonly("max_delay", &Aggregator::max_delay)
      .def("stats", [](Aggregator& a) { return AggregatorStatsDict(a.stats()); });
  m.def("python_aggregator", [](py::function fn, int size, size_t packet_bytes, double max_delay) {
    return GilFreeDelete(new Aggregator(std::make_shared<PyBackend>(std::move(fn), size), packet_bytes, max_delay));
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
        const DType d = DTypeFromName(dtype);
        const ReduceOp o = OpFromName(op);
        Buf buf = GetBuf(b, true, d, "ShmGroup.all_reduce: buf");
        py::gil_scoped_release rel;
        g.comm_->AllReduce(buf.ptr(), buf.count, d, o, algo);
      })
      .def("all_gather_v", [](ShmGroup& g, py::buffer in, py::buffer out, const std::vector<size_t>& counts,
                              const std::string& dtype) {
        const DType d = DTypeFromName(dtype);
        CheckPerRank("ShmGroup.all_gather_v", {{"counts", counts.size()}}, g.comm_->size());
        Buf i = GetBuf(in, false, d, "ShmGroup.all_gather_v: in"), o = GetBuf(out, true, d, "ShmGroup.all_gather_v: out");
        CheckElements("ShmGroup.all_gather_v: in", i, counts[g.comm_->rank()]);
        CheckElements("ShmGroup.all_gather_v: out", o, Sum(counts));
        py::gil_scoped_release rel;
        g.comm_->AllGatherV(i.ptr(), o.ptr(), counts, d);
      })
      .def("all_gather", [](ShmGroup& g, py::buffer in, py::buffer out, const std::string& dtype) {
        const DType d = DTypeFromName(dtype);
        Buf i = GetBuf(in, false, d, "ShmGroup.all_gather: in"), o = GetBuf(out, true, d, "ShmGroup.all_gather: out");
        CheckElements("ShmGroup.all_gather: out", o, i.count * static_cast<uint64_t>(g.comm_->size()));
        py::gil_scoped_release rel;
        g.comm_->AllGather(i.ptr(), o.ptr(), i.count, d);
      })
      .def("reduce_scatter", [](ShmGroup& g, py::buffer in, py::buffer out, const std::vector<size_t>& counts,
                                const std::string& dtype, const std::string& op) {
        const DType d = DTypeFromName(dtype);
        const ReduceOp o = OpFromName(op);
        CheckPerRank("ShmGroup.reduce_scatter", {{"counts", counts.size()}}, g.comm_->size());
        Buf i = GetBuf(in, false, d, "ShmGroup.reduce_scatter: in");
        Buf ob = GetBuf(out, true, d, "ShmGroup.reduce_scatter: out");
        CheckElements("ShmGroup.reduce_scatter: in", i, Sum(counts));
        CheckElements("ShmGroup.reduce_scatter: out", ob, counts[g.comm_->rank()]);
        py::gil_scoped_release rel;
        g.comm_->ReduceScatter(i.ptr(), ob.ptr(), counts, d, o);
      })
      .def("all_to_all_v", [](ShmGroup& g, py::buffer in, const std::vector<size_t>& send_counts, const std::string& dtype,
                              uint64_t shape_key) {
        const DType d = DTypeFromName(dtype);
        CheckPerRank("ShmGroup.all_to_all_v", {{"send_counts", send_counts.size()}}, g.comm_->size());
        Buf i = GetBuf(in, false, d, "ShmGroup.all_to_all_v: in");
        CheckElements("ShmGroup.all_to_all_v: in", i, Sum(send_counts));
        std::vector<size_t> rc;
        std::vector<char> out;
        {
          py::gil_scoped_release rel;
          out = g.comm_->AllToAllV(i.ptr(), send_counts, d, &rc, shape_key);
        }
        return py::make_tuple(ToArray(std::move(out)), rc);
      }, py::arg("in"), py::arg("send_counts"), py::arg("dtype"), py::arg("shape_key") = 0)
      .def("broadcast", [](ShmGroup& g, py::buffer b, const std::string& dtype, int root, const std::string& algo) {
        const DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, true, d, "ShmGroup.broadcast: buf");
        py::gil_scoped_release rel;
        g.comm_->Broadcast(buf.ptr(), buf.count, d, root, algo);
      })
      .def("send", [](ShmGroup& g, py::buffer b, const std::string& dtype, int peer) {
        const DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, false, d, "ShmGroup.send: buf");
        py::gil_scoped_release rel;
        g.comm_->Send(buf.ptr(), buf.count, d, peer);
      })
      .def("recv", [](ShmGroup& g, py::buffer b, const std::string& dtype, int peer) {
        const DType d = DTypeFromName(dtype);
        Buf buf = GetBuf(b, true, d, "ShmGroup.recv: buf");
        py::gil_scoped_release rel;
        g.comm_->Recv(buf.ptr(), buf.count, d, peer);
      })
      .def("barrier", [](ShmGroup& g) { g.comm_->Barrier(); }, py::call_guard<py::gil_scoped_release>())
      .def("calibrate", [](ShmGroup& g, int repeats) { return g.comm_->Calibrate(repeats); }, py::arg("repeats") = 20,
           py::call_guard<py::gil_scoped_release>())
      .def("make_aggregator", [](ShmGroup& g, size_t packet_bytes, double max_delay) {
        return GilFreeDelete(new Aggregator(std::make_shared<CommunicatorBackend>(g.comm_), packet_bytes, max_delay));
      }, py::arg("packet_bytes"), py::arg("max_delay"));
  m.def("cleanup_stale_segments", &ShmTransport::CleanupStale, py::arg("prefix"));

  // ----- in-process: all ranks in this process ----------------------------------------------
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
