// All N ranks of a group inside one process (the simulation's virtual devices): one thread per
// rank runs the real algorithms over heap channels. Aggregators get their own channels so that
// packets and direct collectives never share a stream.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/aggregator.h"
#include "comm/communicator.h"

namespace mshyper::comm {

class InProcCommunicator {
 public:
  InProcCommunicator(int n, std::shared_ptr<const Topology> topology, std::vector<int> devices, size_t channel_bytes,
              double timeout, TransportParams params);
  ~InProcCommunicator();
  int size() const { return static_cast<int>(comms_.size()); }
  Communicator& comm(int rank) { return *comms_.at(rank); }
  // Runs fn(rank) on one (persistent) thread per rank; rethrows the root-cause error (the other
  // ranks see an abort). Calls are serialised.
  void Run(const std::function<void(int)>& fn);
  Aggregator& aggregator(int rank);
  bool has_aggregators() const { return !aggs_.empty(); }
  void EnableAggregation(size_t packet_bytes, double max_delay_s);
  void FlushAll();
  void CloseAggregators();

 private:
  void Worker(int rank);
  void StopWorkers();

  double timeout_;      // the transports' timeout, also the aggregators' flush deadline
  std::mutex run_mu_;   // one Run at a time
  std::mutex pool_mu_;
  std::condition_variable pool_cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int remaining_ = 0;
  bool quit_ = false;
  std::shared_ptr<InProcHub> hub_, agg_hub_;
  std::vector<std::shared_ptr<Communicator>> comms_, agg_comms_;
  std::vector<std::shared_ptr<Aggregator>> aggs_;
};

}  // namespace mshyper::comm
