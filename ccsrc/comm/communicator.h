// One rank's handle on a group: validates that ranks agree (kind, dtype, sizes) before moving
// data, chooses the algorithm from the cost model (topology + calibrated transport costs, user
// thresholds), runs it over the transport and aborts the group on timeouts.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/algorithms.h"
#include "comm/topology.h"
#include "comm/transport.h"

namespace mshyper::comm {

// A rank's aggregator queue as its batch negotiation sees it: the number of requests, a hash of
// their (count, dtype, op) in order, and their bytes.
struct QueueDigest {
  int64_t length = 0;
  int64_t hash = 0;
  int64_t bytes = 0;
};

class Communicator {
 public:
  // members: transport ranks of the group in logical order. devices: the topology device of each
  // member (empty: no topology; the model then sees a uniform group with transport costs only).
  Communicator(std::shared_ptr<Transport> transport, std::vector<int> members, std::shared_ptr<const Topology> topology,
               std::vector<int> devices, TransportParams params);

  int rank() const { return group_.me; }
  int size() const { return group_.size(); }
  Transport& transport() { return *transport_; }
  CostModel& model() { return model_; }
  const std::vector<int>& ring() const { return group_.ring; }
  const std::string& last_algorithm() const { return last_algorithm_; }
  bool validate = true;
  // Ring all-reduces of at least this many bytes use single-copy direct reads when every rank's
  // transport supports them (shm: cross-memory attach); <0 disables.
  double direct_min_bytes = 1 << 20;
  // The most bytes of one message: a send of more is a CommError; a peer announcing more (a
  // send/recv header, the part of an all_to_all from one peer) is a FrameError and aborts the
  // group, before anything is allocated or drained for it. Same value on every rank.
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
  static constexpr uint64_t kDefaultMaxMessageBytes = 1ULL << 30;
  bool direct_enabled();  // collective on first use: probes every rank, agrees on the minimum

  // check=false skips the cross-rank check even with `validate` (the caller knows the ranks agree).
  void AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, const std::string& algorithm = "auto",
                 bool check = true);
  void AllGather(const void* in, void* out, size_t count, DType dtype);
  void AllGatherV(const void* in, void* out, const std::vector<size_t>& counts, DType dtype);
  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype, ReduceOp op);
  // shape_key != 0: an all-to-all of equal shapes; ranks must pass the same key (the check
  // compares it with the element count). 0: uneven (all_to_all_v), only the dtype is compared.
  std::vector<char> AllToAllV(const void* in, const std::vector<size_t>& send_counts, DType dtype,
                              std::vector<size_t>* recv_counts, uint64_t shape_key = 0);
  void Broadcast(void* buf, size_t count, DType dtype, int root, const std::string& algorithm = "auto");
  void Send(const void* buf, size_t count, DType dtype, int peer);
  void Recv(void* buf, size_t count, DType dtype, int peer);
  void Barrier();
  // Every rank's queue digest, in one exchange: the exchange of the cross-rank check, so a rank
  // in another collective is reported as CommMismatch (whatever `validate` says).
  std::vector<QueueDigest> GatherQueueDigests(const QueueDigest& mine);

  // Measures alpha/beta/gamma of this transport with timed collectives (every member must call),
  // takes the maximum over ranks so that all ranks choose the same algorithms, stores and returns them.
  TransportParams Calibrate(int repeats = 20);

 private:
  struct Desc {
    int32_t kind;
    int32_t dtype;
    int32_t op;
    int32_t root;
    uint64_t count;
    uint64_t extra;
  };
  void Check(int kind, DType dtype, ReduceOp op, int root, uint64_t count, uint64_t extra);
  std::vector<Desc> GatherDescs(const Desc& mine);
  std::vector<int> ModelGroup() const;

  std::shared_ptr<Transport> transport_;
  Group group_;
  std::vector<int> devices_;
  CostModel model_;
  std::vector<std::vector<int>> clusters_;  // transport ranks per topology cluster
  std::string last_algorithm_;
  int direct_ = -1;
};

}  // namespace mshyper::comm
