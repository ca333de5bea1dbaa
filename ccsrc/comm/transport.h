// Point-to-point byte transport between the ranks of one group: one Transport object per rank.
// Every directed pair (a -> b) has an SPSC Channel; messages are byte streams padded to 8 bytes
// so that every message starts 8-aligned in the ring (element-wise reduction straight out of the
// ring, no staging copy). Blocking operations wait with spin -> yield -> sleep, and fail with
// CommTimeout after `timeout` seconds without progress, or as soon as the peer is seen dead or
// another rank aborted the group.
#pragma once
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/channel.h"
#include "comm/types.h"

namespace mshyper::comm {

// One message to or from one peer, advanced step by step by Transport::StepSend/StepRecv.
struct Xfer {
  int peer = -1;
  char* buf = nullptr;   // send: source; recv: destination
  size_t bytes = 0;      // payload bytes
  size_t done = 0;       // payload bytes moved so far
  size_t pad_done = 0;   // padding bytes moved (the stream holds RoundUp8(bytes))
  bool reduce = false;   // recv: dst = op(dst, incoming) instead of a copy
  DType dtype = DType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  const size_t* limit = nullptr;  // send: never beyond *limit payload bytes (pipelining)

  Xfer() = default;
  Xfer(int p, const void* b, size_t n) : peer(p), buf(static_cast<char*>(const_cast<void*>(b))), bytes(n) {}
  bool complete() const { return done == bytes && pad_done == RoundUp8(bytes) - bytes; }
};

class Transport {
 public:
  Transport(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout() const { return timeout_s_; }
  void set_timeout(double seconds) {
    CheckTimeout("timeout", seconds);
    timeout_s_ = seconds;
  }
  virtual std::string name() const = 0;

  // Non-blocking: move what the channel allows; true when any byte moved.
  bool StepSend(Xfer& x);
  bool StepRecv(Xfer& x);

  // Blocking helpers (all with the timeout / liveness checks).
  void Send(int peer, const void* buf, size_t n, const char* what);
  void Recv(int peer, void* buf, size_t n, const char* what);
  void SendRecv(int send_peer, const void* sbuf, size_t sbytes, int recv_peer, void* rbuf, size_t rbytes,
                const char* what);
  // Progress every transfer until all complete.
  void Run(const std::vector<Xfer*>& sends, const std::vector<Xfer*>& recvs, const char* what);

  // Single-copy access to a peer's memory (shm: cross-memory attach). DirectCapable() probes
  // once whether it works; DirectRead copies n bytes at the peer's virtual address `remote`.
  virtual bool DirectCapable() { return false; }
  virtual void DirectRead(int peer, uint64_t remote, void* local, size_t n, const char* what) {
    (void)peer;
    (void)remote;
    (void)local;
    (void)n;
    throw CommError(std::string("direct read is not supported by the ") + name() + " transport (" + what + ")");
  }

  // Marks the whole group broken (peers fail fast instead of waiting for their own timeout).
  void Abort(const std::string& why) { SetAborted(why); }
  // Throws CommError/CommTimeout when the group is aborted or `peer` is dead.
  void CheckHealth(int peer, const char* what);
  // Throws CommTimeout when the group is aborted; returns whether `peer` is dead (a dead peer
  // may still have left data in the channel: the caller drains it before failing).
  bool CheckAbortedAndPeer(int peer, const char* what, std::string* detail);
  [[noreturn]] void FailDeadPeer(int peer, const char* what, const std::string& detail);
  // Aborts the group and throws CommError: the channel to (sending) or from `peer` is corrupt.
  [[noreturn]] void FailCorruptChannel(int peer, bool sending);

  class Waiter {
   public:
    Waiter(Transport& t, const char* what, int peer);
    void Progressed();
    void Idle();  // no progress this round: back off, maybe throw
    void set_peer(int peer) { peer_ = peer; }

   private:
    Transport& t_;
    const char* what_;
    int peer_;
    // Backing off: pause 64 rounds, sched_yield for kYieldFor, then sleep kFirstSleep doubling up
    // to kLongestSleep (a yielding rank stays runnable and takes half of a core it shares with a
    // computing peer; a sleeping one does not, and wakes at most kLongestSleep late).
    static constexpr std::chrono::microseconds kYieldFor{50};
    static constexpr std::chrono::microseconds kFirstSleep{20};
    static constexpr std::chrono::microseconds kLongestSleep{1000};
    uint64_t idle_ = 0;
    std::chrono::microseconds sleep_ = kFirstSleep;
    bool peer_seen_dead_ = false;  // seen dead, with no progress since: the next check fails
    std::chrono::steady_clock::time_point last_;
    std::chrono::steady_clock::time_point last_health_;
  };

 protected:
  virtual Channel& Out(int peer) = 0;
  virtual Channel& In(int peer) = 0;
  virtual bool PeerDead(int peer, std::string* detail) {
    (void)peer;
    (void)detail;
    return false;
  }
  virtual bool IsAborted(std::string* why) = 0;
  virtual void SetAborted(const std::string& why) = 0;

  int rank_;
  int size_;
  double timeout_s_ = 30.0;
};

// All ranks in one process (threads): channels on the heap, allocated on first use.
class InProcHub {
 public:
  InProcHub(int size, size_t channel_bytes);
  ~InProcHub();
  int size() const { return size_; }
  Channel& Get(int src, int dst);
  bool aborted(std::string* why);
  void set_aborted(const std::string& why);
  void reset_abort();

 private:
  int size_;
  size_t cap_;
  std::mutex mu_;
  std::vector<char*> mem_;          // size*size regions, nullptr until used
  std::vector<Channel> channels_;
  std::atomic<bool> aborted_{false};
  std::string why_;
};

class InProcTransport : public Transport {
 public:
  InProcTransport(std::shared_ptr<InProcHub> hub, int rank);
  std::string name() const override { return "inproc"; }
  // One address space: a direct read is a memcpy.
  bool DirectCapable() override { return true; }
  void DirectRead(int peer, uint64_t remote, void* local, size_t n, const char* what) override {
    CheckHealth(peer, what);
    std::memcpy(local, reinterpret_cast<const void*>(remote), n);
  }

 protected:
  Channel& Out(int peer) override;
  Channel& In(int peer) override;
  bool IsAborted(std::string* why) override { return hub_->aborted(why); }
  void SetAborted(const std::string& why) override { hub_->set_aborted(why); }

 private:
  std::shared_ptr<InProcHub> hub_;
  std::vector<Channel*> out_, in_;
};

}  // namespace mshyper::comm
