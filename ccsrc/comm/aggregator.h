// Message aggregation: all-reduce requests are queued and packed into super-packets of at most
// `packet_bytes` per (dtype, op) of one group; a packet goes when the queue holds a full packet,
// on Flush(), or `max_delay` seconds after its oldest request. Requests larger than a packet
// bypass packing (reduced in place, in queue order). Each request has a handle with Wait().
//
// Ranks must agree on which requests form a packet although their timers fire at different
// moments: before each batch the executor all-reduces (MIN) the number of queued requests, so
// every rank packs exactly the first m requests, and then checks (MAX of +h/-h) that the sizes,
// dtypes and ops of those m requests hash equal everywhere (else every request of the batch
// fails with CommMismatch).
#pragma once
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/types.h"

namespace mshyper::comm {

// What the aggregator sends packets through: an all-reduce over the group.
class PacketBackend {
 public:
  virtual ~PacketBackend() = default;
  virtual void AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  virtual int group_size() const = 0;
};

class CommunicatorBackend : public PacketBackend {
 public:
  explicit CommunicatorBackend(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  void AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) override { comm_->AllReduce(buf, count, dtype, op); }
  int group_size() const override { return comm_->size(); }

 private:
  std::shared_ptr<Communicator> comm_;
};

class Request {
 public:
  Request(void* buf, size_t count, DType dtype, ReduceOp op) : buf_(buf), count_(count), dtype_(dtype), op_(op) {}
  // Blocks until the result is in the caller's buffer; rethrows the failure of its packet.
  // timeout < 0: no limit of its own (the transport's timeouts still apply).
  void Wait(double timeout_s = -1);
  bool done();
  size_t bytes() const { return count_ * DTypeSize(dtype_); }

 private:
  friend class Aggregator;
  void Finish(int error_kind, const std::string& error);
  void* buf_;
  size_t count_;
  DType dtype_;
  ReduceOp op_;
  double submit_time_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int error_kind_ = 0;  // 0 none, 1 CommError, 2 CommTimeout, 3 CommMismatch
  std::string error_;
};

struct AggregatorStats {
  uint64_t requests = 0;
  uint64_t packets = 0;      // packed super-packets sent
  uint64_t bypassed = 0;     // requests sent alone (larger than a packet)
  uint64_t batches = 0;      // negotiated batches
  uint64_t bytes = 0;        // request bytes reduced
};

class Aggregator {
 public:
  Aggregator(std::shared_ptr<PacketBackend> backend, size_t packet_bytes, double max_delay_s);
  ~Aggregator();
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  std::shared_ptr<Request> Submit(void* buf, size_t count, DType dtype, ReduceOp op);
  // Sends everything queued now and waits until it is done (errors stay with the handles).
  void Flush();
  void RequestFlush();  // non-blocking: mark everything queued now for sending
  void WaitFlushed();   // wait for everything marked by RequestFlush
  void Close();  // stops the executor; queued requests fail
  AggregatorStats stats();
  size_t packet_bytes() const { return packet_bytes_; }
  double max_delay() const { return max_delay_s_; }

 private:
  void Loop();
  void RunBatch(std::vector<std::shared_ptr<Request>>& batch);
  void Fail(std::vector<std::shared_ptr<Request>>& reqs, int kind, const std::string& why);

  std::shared_ptr<PacketBackend> backend_;
  size_t packet_bytes_;
  double max_delay_s_;
  std::mutex mu_;
  std::condition_variable cv_;       // executor wake-up
  std::condition_variable done_cv_;  // Flush() wake-up
  std::deque<std::shared_ptr<Request>> queue_;
  size_t queued_bytes_ = 0;
  uint64_t submitted_ = 0;
  uint64_t finished_ = 0;
  uint64_t flush_target_ = 0;
  bool stop_ = false;
  int broken_kind_ = 0;
  std::string broken_;
  AggregatorStats stats_;
  std::vector<char> packet_;
  std::thread thread_;
};

}  // namespace mshyper::comm
