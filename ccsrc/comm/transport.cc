#include "comm/transport.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

namespace mshyper::comm {

bool Transport::StepSend(Xfer& x) {
  bool moved = false;
  Channel& ch = Out(x.peer);
  size_t limit = x.limit ? std::min(*x.limit, x.bytes) : x.bytes;
  while (x.done < limit) {
    char* p;
    size_t w = ch.Writable(&p);
    if (w == 0) return moved;
    if (w == Channel::kCorrupt) FailCorruptChannel(x.peer, true);
    size_t n = std::min(w, limit - x.done);
    std::memcpy(p, x.buf + x.done, n);
    ch.Commit(n);
    x.done += n;
    moved = true;
  }
  if (x.done == x.bytes) {
    size_t pad = RoundUp8(x.bytes) - x.bytes;
    while (x.pad_done < pad) {
      char* p;
      size_t w = ch.Writable(&p);
      if (w == 0) return moved;
      if (w == Channel::kCorrupt) FailCorruptChannel(x.peer, true);
      size_t n = std::min(w, pad - x.pad_done);
      ch.Commit(n);
      x.pad_done += n;
      moved = true;
    }
  }
  return moved;
}

bool Transport::StepRecv(Xfer& x) {
  bool moved = false;
  Channel& ch = In(x.peer);
  const size_t esz = x.reduce ? DTypeSize(x.dtype) : 1;
  while (x.done < x.bytes) {
    const char* p;
    size_t r = ch.Readable(&p);
    if (r == Channel::kCorrupt) FailCorruptChannel(x.peer, false);
    size_t n = std::min(r, x.bytes - x.done);
    n -= n % esz;
    if (n == 0) return moved;
    if (x.reduce) {
      ReduceInto(x.buf + x.done, p, n / esz, x.dtype, x.op);
    } else {
      std::memcpy(x.buf + x.done, p, n);
    }
    ch.Consume(n);
    x.done += n;
    moved = true;
  }
  size_t pad = RoundUp8(x.bytes) - x.bytes;
  while (x.pad_done < pad) {
    const char* p;
    size_t r = ch.Readable(&p);
    if (r == Channel::kCorrupt) FailCorruptChannel(x.peer, false);
    size_t n = std::min(r, pad - x.pad_done);
    if (n == 0) return moved;
    ch.Consume(n);
    x.pad_done += n;
    moved = true;
  }
  return moved;
}

void Transport::Run(const std::vector<Xfer*>& sends, const std::vector<Xfer*>& recvs, const char* what) {
  int first_peer = !recvs.empty() ? recvs[0]->peer : (!sends.empty() ? sends[0]->peer : rank_);
  Waiter waiter(*this, what, first_peer);
  while (true) {
    bool all = true, moved = false;
    for (Xfer* x : recvs) {
      if (x->complete()) continue;
      moved |= StepRecv(*x);
      if (!x->complete()) {
        all = false;
        waiter.set_peer(x->peer);
      }
    }
    for (Xfer* x : sends) {
      if (x->complete()) continue;
      moved |= StepSend(*x);
      if (!x->complete()) {
        all = false;
        waiter.set_peer(x->peer);
      }
    }
    if (all) return;
    if (moved) {
      waiter.Progressed();
    } else {
      waiter.Idle();
    }
  }
}

void Transport::Send(int peer, const void* buf, size_t n, const char* what) {
  Xfer x(peer, buf, n);
  Run({&x}, {}, what);
}

void Transport::Recv(int peer, void* buf, size_t n, const char* what) {
  Xfer x(peer, buf, n);
  Run({}, {&x}, what);
}

void Transport::SendRecv(int send_peer, const void* sbuf, size_t sbytes, int recv_peer, void* rbuf, size_t rbytes,
                         const char* what) {
  Xfer s(send_peer, sbuf, sbytes), r(recv_peer, rbuf, rbytes);
  Run({&s}, {&r}, what);
}

void Transport::CheckHealth(int peer, const char* what) {
  std::string detail;
  if (CheckAbortedAndPeer(peer, what, &detail)) FailDeadPeer(peer, what, detail);
}

bool Transport::CheckAbortedAndPeer(int peer, const char* what, std::string* detail) {
  std::string why;
  if (IsAborted(&why)) {
    // Another rank timed out, saw a peer die or failed: this rank fails fast the same way.
    throw CommTimeout(name() + " transport: rank " + std::to_string(rank_) + " stopped " + what +
                      " because the group was aborted: " + why);
  }
  return peer >= 0 && peer != rank_ && PeerDead(peer, detail);
}

void Transport::FailCorruptChannel(int peer, bool sending) {
  std::string msg = name() + " transport: rank " + std::to_string(rank_) + ": the channel " +
                    (sending ? "to" : "from") + " rank " + std::to_string(peer) +
                    " is corrupt (head - tail exceeds its capacity: its shared memory was overwritten)";
  SetAborted(msg);
  throw CommError(msg);
}

void Transport::FailDeadPeer(int peer, const char* what, const std::string& detail) {
  std::string msg = name() + " transport: rank " + std::to_string(rank_) + " timed out in " + what +
                    ": peer rank " + std::to_string(peer) + " died (" + detail + ")";
  SetAborted(msg);
  throw CommTimeout(msg);
}

Transport::Waiter::Waiter(Transport& t, const char* what, int peer) : t_(t), what_(what), peer_(peer) {
  last_ = std::chrono::steady_clock::now();
  last_health_ = last_;
}

void Transport::Waiter::Progressed() {
  if (idle_ > 64) last_ = std::chrono::steady_clock::now();
  idle_ = 0;
  peer_seen_dead_ = false;
}

void Transport::Waiter::Idle() {
  if (peer_seen_dead_) {
    // A whole round of steps since the peer was seen dead moved nothing: what it wrote is read.
    std::string detail;
    if (t_.CheckAbortedAndPeer(peer_, what_, &detail)) t_.FailDeadPeer(peer_, what_, detail);
    peer_seen_dead_ = false;
  }
  ++idle_;
  if (idle_ < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    return;
  }
  if (idle_ == 64) {  // the first real wait: the clock starts here
    last_ = std::chrono::steady_clock::now();
    last_health_ = last_;
    sleep_ = kFirstSleep;
  }
  if (std::chrono::steady_clock::now() - last_ < kYieldFor) {
    sched_yield();  // a peer about to arrive, or one computing on this core, gets it now
  } else {
    // a long wait: off the run queue, so a peer computing on this core has it to itself
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, kLongestSleep);
  }
  if ((idle_ & 15) != 0) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_health_ > std::chrono::milliseconds(20)) {
    last_health_ = now;
    std::string detail;
    // What the peer wrote before dying may still be unread: the next idle round fails.
    if (t_.CheckAbortedAndPeer(peer_, what_, &detail)) peer_seen_dead_ = true;
  }
  double waited = std::chrono::duration<double>(now - last_).count();
  if (waited > t_.timeout()) {
    std::ostringstream os;
    os << t_.name() << " transport: rank " << t_.rank() << " timed out after " << waited << " s in " << what_
       << " waiting for rank " << peer_ << " (no progress; the peer stalled or died)";
    t_.SetAborted(os.str());
    throw CommTimeout(os.str());
  }
}

// ---------------------------------------------------------------------------------------------
InProcHub::InProcHub(int size, size_t channel_bytes)
    : size_(size), cap_(std::max<size_t>(64, channel_bytes & ~static_cast<size_t>(63))),
      mem_(static_cast<size_t>(size) * size, nullptr), channels_(static_cast<size_t>(size) * size) {
  if (size <= 0) throw CommError("in-process group size must be positive, got " + std::to_string(size));
}

InProcHub::~InProcHub() {
  for (char* p : mem_) std::free(p);
}

Channel& InProcHub::Get(int src, int dst) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t idx = static_cast<size_t>(src) * size_ + dst;
  if (mem_[idx] == nullptr) {
    char* p = static_cast<char*>(std::aligned_alloc(64, sizeof(ChannelHeader) + cap_));
    if (p == nullptr) throw CommError("in-process transport: out of memory for a channel");
    auto* hdr = new (p) ChannelHeader;
    Channel::Init(hdr, cap_);
    mem_[idx] = p;
    channels_[idx] = Channel(hdr, p + sizeof(ChannelHeader), cap_);
  }
  return channels_[idx];
}

bool InProcHub::aborted(std::string* why) {
  if (!aborted_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  *why = why_;
  return true;
}

void InProcHub::set_aborted(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.load()) {
    why_ = why;
    aborted_.store(true, std::memory_order_release);
  }
}

void InProcHub::reset_abort() {
  // Only valid between collectives: drop every channel so no stale bytes survive the failure.
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < mem_.size(); ++i) {
    if (mem_[i] != nullptr) Channel::Init(reinterpret_cast<ChannelHeader*>(mem_[i]), cap_);
  }
  aborted_.store(false);
  why_.clear();
}

InProcTransport::InProcTransport(std::shared_ptr<InProcHub> hub, int rank)
    : Transport(rank, hub->size()), hub_(std::move(hub)), out_(size_, nullptr), in_(size_, nullptr) {}

Channel& InProcTransport::Out(int peer) {
  if (out_[peer] == nullptr) out_[peer] = &hub_->Get(rank_, peer);
  return *out_[peer];
}

Channel& InProcTransport::In(int peer) {
  if (in_[peer] == nullptr) in_[peer] = &hub_->Get(peer, rank_);
  return *in_[peer];
}

}  // namespace mshyper::comm
