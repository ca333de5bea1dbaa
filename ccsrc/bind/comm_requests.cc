#include "bind/comm_requests.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

namespace {

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

}  // namespace

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

}  // namespace mshyper::bind
