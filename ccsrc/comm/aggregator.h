// Message aggregation: all-reduce requests are queued and packed into super-packets of at most
// `packet_bytes` per (dtype, op) of one group; a packet goes when the queue holds a full packet,
// on Flush(), or `max_delay` seconds after its oldest request. Requests larger than a packet
// bypass packing (reduced in place, in queue order). Each request has a handle with Wait().
//
// A request owns the storage it is reduced in (a copy of the caller's data, made on submission):
// the caller's buffer may go away at once, and a request whose handle was dropped still
// completes safely. Requests submitted together share one storage block; consecutive requests
// of a packet that lie back to back in it are reduced in place, without packing copies.
//
// Ranks must agree on which requests form a packet although their timers fire at different
// moments: before each batch the ranks exchange the digests of their queues (PacketBackend::
// Negotiate: lengths, hashes of the requests' sizes, dtypes and ops, bytes); every rank packs
// exactly the first m = MIN(length) requests, and the batch fails with CommMismatch unless the
// hashes of those m agree. When every rank queued the same number (the usual case of a flush)
// the one exchange settles both; otherwise the hashes of the first m go in a second one.
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

// One all-reduce of the aggregator, in place at `buf`. `owner` keeps `buf` alive: a backend that
// hands the memory to other code (Python) passes it along, so that code may keep a view beyond
// the call. `agreed`: every rank is known to be in the same step of the same batch (after the
// batch's first negotiation), so the transport's cross-rank check of the call may be skipped.
struct Packet {
  void* buf;
  size_t count;
  DType dtype;
  ReduceOp op;
  std::shared_ptr<void> owner;
  bool agreed;
};

// What the ranks' queue digests say: the shortest and longest queue, whether every rank's hash
// equals this rank's, and the range of bytes (for the error message).
struct Agreement {
  int64_t min_length;
  int64_t max_length;
  bool same_hash;
  int64_t min_bytes;
  int64_t max_bytes;
};

// What the aggregator sends packets through: an all-reduce over the group.
class PacketBackend {
 public:
  virtual ~PacketBackend() = default;
  virtual void AllReduce(const Packet& p) = 0;
  // The batch negotiation: one exchange of the ranks' queue digests.
  virtual Agreement Negotiate(const QueueDigest& mine) = 0;
  virtual int group_size() const = 0;
  // Makes a pending AllReduce (here and on the peers) fail fast: the aggregator closes with
  // requests unfinished, and the peers must not wait for this rank until their timeout.
  virtual void Abort(const std::string& why) { (void)why; }
};

class CommunicatorBackend : public PacketBackend {
 public:
  explicit CommunicatorBackend(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  void AllReduce(const Packet& p) override {
    comm_->AllReduce(p.buf, p.count, p.dtype, p.op, "auto", /*check=*/!p.agreed);
  }
  // The descriptor exchange of the cross-rank check carries the digests: one round trip, and a
  // rank in another collective is a CommMismatch.
  Agreement Negotiate(const QueueDigest& mine) override;
  int group_size() const override { return comm_->size(); }
  void Abort(const std::string& why) override { comm_->transport().Abort(why); }

 private:
  std::shared_ptr<Communicator> comm_;
};

class Request {
 public:
  // `data` points into `storage`, which the request keeps alive: `count` elements of `dtype`, the
  // request's input on submission and its result once done.
  Request(std::shared_ptr<char[]> storage, char* data, size_t count, DType dtype, ReduceOp op)
      : storage_(std::move(storage)), data_(data), count_(count), dtype_(dtype), op_(op) {}
  // Blocks until the result is in data(); rethrows the failure of its packet.
  // timeout < 0: no limit of its own (the transport's timeouts still apply).
  void Wait(double timeout_s = -1);
  bool done();
  size_t bytes() const { return count_ * DTypeSize(dtype_); }
  void* data() const { return data_; }
  size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  ReduceOp op() const { return op_; }
  const std::shared_ptr<char[]>& storage() const { return storage_; }

 private:
  friend class Aggregator;
  void Finish(int error_kind, const std::string& error);
  std::shared_ptr<char[]> storage_;
  char* data_;
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

// One request of a batch submission: `count` elements of `dtype` at `data` (copied on submission).
struct RequestSpec {
  const void* data;
  size_t count;
  DType dtype;
};

struct AggregatorStats {
  uint64_t requests = 0;
  uint64_t packets = 0;      // super-packets sent
  uint64_t in_place = 0;     // of which reduced in place (requests back to back in one block)
  uint64_t bypassed = 0;     // requests sent alone (larger than a packet)
  uint64_t batches = 0;      // negotiated batches
  uint64_t bytes = 0;        // request bytes reduced
};

class Aggregator {
 public:
  // flush_timeout_s: Flush / WaitFlushed fail after this many seconds without a finished request.
  Aggregator(std::shared_ptr<PacketBackend> backend, size_t packet_bytes, double max_delay_s, double flush_timeout_s);
  ~Aggregator();
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // Copies the data into storage the request owns and queues it.
  std::shared_ptr<Request> Submit(const void* data, size_t count, DType dtype, ReduceOp op);
  // Copies every spec into one storage block (each request 8-byte aligned) and queues them in
  // order, atomically with respect to the executor.
  std::vector<std::shared_ptr<Request>> SubmitMany(const std::vector<RequestSpec>& specs, ReduceOp op);
  // Sends everything queued now and waits until it is done (errors stay with the handles). Runs
  // the batches on the calling thread while the executor is idle (a backend's AllReduce ends by
  // itself: its transport has a timeout), so one thread must not flush the aggregators of several
  // ranks of a group this way (use RequestFlush + WaitFlushed). CommTimeout when no request finished for `timeout_s` seconds (< 0: the
  // aggregator's flush_timeout); the requests stay queued or in flight.
  void Flush(double timeout_s = -1);
  void RequestFlush();  // non-blocking: mark everything queued now for the executor to send
  void WaitFlushed(double timeout_s = -1);  // wait for everything marked by RequestFlush (deadline as Flush)
  // Stops the executor; queued requests fail. With requests unfinished, the backend is aborted
  // first (the group is then broken: the peers fail fast instead of waiting for this rank).
  void Close();
  AggregatorStats stats();
  size_t packet_bytes() const { return packet_bytes_; }
  double max_delay() const { return max_delay_s_; }

 private:
  void Loop();
  // Negotiates, checks and sends one batch; `lock` (on mu_) is held on entry and on return, and
  // released meanwhile. Only one thread at a time (running_).
  void RunBatch(std::unique_lock<std::mutex>& lock);
  void SendPackets(std::vector<std::shared_ptr<Request>>& batch);
  void Fail(std::vector<std::shared_ptr<Request>>& reqs, int kind, const std::string& why);
  // Waits (lock held) until `target` requests finished or the aggregator stopped; runs batches
  // itself when `run_inline`. CommTimeout after `timeout_s` without a finished request.
  void WaitFinished(std::unique_lock<std::mutex>& lock, uint64_t target, double timeout_s, bool run_inline,
                    const char* what);

  std::shared_ptr<PacketBackend> backend_;
  size_t packet_bytes_;
  double max_delay_s_;
  double flush_timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;       // executor wake-up
  std::condition_variable done_cv_;  // Flush() wake-up
  std::deque<std::shared_ptr<Request>> queue_;
  size_t queued_bytes_ = 0;
  uint64_t submitted_ = 0;
  uint64_t finished_ = 0;
  uint64_t flush_target_ = 0;
  bool stop_ = false;
  bool running_ = false;  // a thread (the executor or a flusher) is running a batch
  int broken_kind_ = 0;
  std::string broken_;
  AggregatorStats stats_;
  // Packing space; replaced instead of reused while a backend's caller still holds the last one.
  char* PacketSpace(size_t bytes);
  std::shared_ptr<char[]> packet_;
  size_t packet_capacity_ = 0;
  std::thread thread_;
};

}  // namespace mshyper::comm
