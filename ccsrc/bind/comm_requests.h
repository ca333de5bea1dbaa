// Aggregated all-reduce requests from Python: arrays copied into an aggregator's storage, their
// handles, and the aggregator's statistics; shared by the aggregator and in-process group bindings.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/aggregator.h"

namespace mshyper::bind {

// Waits for every request (timeout < 0: no limit; else one deadline for all), the GIL released
// unless all are done already; rethrows the first failure.
void WaitAll(const std::vector<std::shared_ptr<comm::Request>>& reqs, double timeout);

// Requests just submitted and their results: numpy views of the requests' storage (the views
// keep it alive), with the inputs' shapes and dtypes.
struct Submitted {
  std::vector<std::shared_ptr<comm::Request>> reqs;
  pybind11::list results;
};

// Handle of one aggregated request.
class ArrayHandle {
 public:
  ArrayHandle(std::shared_ptr<comm::Request> req, pybind11::object result)
      : req_{std::move(req)}, result_(std::move(result)) {}
  pybind11::object wait(double timeout) {
    WaitAll(req_, timeout);
    return result_;
  }
  bool done() { return req_[0]->done(); }

 private:
  std::vector<std::shared_ptr<comm::Request>> req_;
  pybind11::object result_;
};

// Handle of one batched submission: wait() returns the results in submission order.
class BatchHandle {
 public:
  explicit BatchHandle(Submitted s) : s_(std::move(s)) {}
  pybind11::list wait(double timeout) {
    WaitAll(s_.reqs, timeout);
    return pybind11::list(s_.results);  // a new list each time; the same arrays
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
Submitted SubmitArrays(comm::Aggregator& agg, const pybind11::sequence& xs, comm::ReduceOp op, const std::string& what,
                       bool indexed);
ArrayHandle SubmitOne(comm::Aggregator& agg, const pybind11::object& x, comm::ReduceOp op, const std::string& what);
// A wait's timeout argument: None (no limit, -1) or a number of seconds (ValueError on NaN).
double WaitTimeout(const pybind11::object& timeout);
pybind11::dict AggregatorStatsDict(const comm::AggregatorStats& s);

}  // namespace mshyper::bind
