#include "comm/algorithms.h"

#include <algorithm>
#include <cstring>

#include "comm/frame.h"

namespace mshyper::comm {

namespace {

struct Seg {
  size_t off;    // bytes
  size_t bytes;
};

// Ring steps, all streamed in one progress loop: step k sends segment send[k] to the next ring
// rank and receives segment recv[k] from the previous one (reduced into place when reduce[k]).
// send[k] == recv[k-1] for k >= 1, so step k may forward exactly the bytes already received in
// step k-1: a chunked pipeline at the granularity of the channel, no step waits for a whole segment.
void RingSteps(Group& g, char* buf, const std::vector<Seg>& send, const std::vector<Seg>& recv,
               const std::vector<char>& reduce, DType dtype, ReduceOp op, const char* what) {
  const size_t K = send.size();
  if (K == 0) return;
  Transport& t = *g.t;
  const int next = g.RingPeer(1), prev = g.RingPeer(-1);
  std::vector<Xfer> sx(K), rx(K);
  for (size_t k = 0; k < K; ++k) {
    sx[k] = Xfer(next, buf + send[k].off, send[k].bytes);
    rx[k] = Xfer(prev, buf + recv[k].off, recv[k].bytes);
    rx[k].reduce = reduce[k] != 0;
    rx[k].dtype = dtype;
    rx[k].op = op;
  }
  for (size_t k = 1; k < K; ++k) sx[k].limit = &rx[k - 1].done;
  size_t cs = 0, cr = 0;
  Transport::Waiter waiter(t, what, prev);
  while (cs < K || cr < K) {
    bool moved = false;
    while (cr < K) {
      moved |= t.StepRecv(rx[cr]);
      if (!rx[cr].complete()) break;
      ++cr;
    }
    while (cs < K) {
      moved |= t.StepSend(sx[cs]);
      if (!sx[cs].complete()) break;
      ++cs;
    }
    if (moved) {
      waiter.Progressed();
    } else {
      waiter.set_peer(cr < K ? prev : next);
      waiter.Idle();
    }
  }
}

std::vector<Seg> SplitEven(size_t count, int p, size_t esz) {
  std::vector<Seg> segs(p);
  size_t base = count / p, rem = count % p, off = 0;
  for (int i = 0; i < p; ++i) {
    size_t c = base + (static_cast<size_t>(i) < rem ? 1 : 0);
    segs[i] = {off * esz, c * esz};
    off += c;
  }
  return segs;
}

int Mod(int a, int p) { return ((a % p) + p) % p; }

// Reduce-scatter phase over ring-position segments: afterwards segment `pos` is fully reduced here.
void RingReduceScatterPhase(Group& g, const std::vector<Seg>& seg_by_pos, std::vector<Seg>* send,
                            std::vector<Seg>* recv, std::vector<char>* red) {
  const int p = g.size();
  for (int s = 0; s < p - 1; ++s) {
    send->push_back(seg_by_pos[Mod(g.pos - s - 1, p)]);
    recv->push_back(seg_by_pos[Mod(g.pos - s - 2, p)]);
    red->push_back(1);
  }
}

void RingAllGatherPhase(Group& g, const std::vector<Seg>& seg_by_pos, std::vector<Seg>* send, std::vector<Seg>* recv,
                        std::vector<char>* red) {
  const int p = g.size();
  for (int s = 0; s < p - 1; ++s) {
    send->push_back(seg_by_pos[Mod(g.pos - s, p)]);
    recv->push_back(seg_by_pos[Mod(g.pos - s - 1, p)]);
    red->push_back(0);
  }
}

ReduceOp BaseOp(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

}  // namespace

Group::Group(Transport* transport, std::vector<int> members_, std::vector<int> ring_)
    : t(transport), members(std::move(members_)), ring(std::move(ring_)) {
  if (ring.empty()) ring = members;
  me = LogicalOf(t->rank());
  pos = -1;
  for (size_t i = 0; i < ring.size(); ++i)
    if (ring[i] == t->rank()) pos = static_cast<int>(i);
  if (me < 0 || pos < 0 || ring.size() != members.size()) {
    throw CommError("rank " + std::to_string(t->rank()) + " is not a member of the group it calls a collective on");
  }
}

int Group::RingPeer(int offset) const { return ring[Mod(pos + offset, size())]; }

int Group::LogicalOf(int transport_rank) const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == transport_rank) return static_cast<int>(i);
  return -1;
}

void AllReduceRing(Group& g, void* buf, size_t count, DType dtype, ReduceOp op) {
  const int p = g.size();
  if (p > 1) {
    auto segs = SplitEven(count, p, DTypeSize(dtype));
    std::vector<Seg> send, recv;
    std::vector<char> red;
    RingReduceScatterPhase(g, segs, &send, &recv, &red);
    RingAllGatherPhase(g, segs, &send, &recv, &red);
    RingSteps(g, static_cast<char*>(buf), send, recv, red, dtype, BaseOp(op), "all_reduce (ring)");
  }
  if (op == ReduceOp::kAvg) ScaleAvg(buf, count, dtype, p);
}

void AllReduceRingDirect(Group& g, void* buf, size_t count, DType dtype, ReduceOp op) {
  // Step k pulls segment (pos - k - 2) mod p of the predecessor, as it stands after the
  // predecessor's step k-1 (a token says so); reduce-scatter steps reduce it into place,
  // all-gather steps copy it. No rank overwrites a segment its successor may still read: that
  // needs a token that the successor sends only after reading (see docs/comm.md).
  const int p = g.size();
  Transport& t = *g.t;
  if (p > 1) {
    const size_t esz = DTypeSize(dtype);
    const ReduceOp base = BaseOp(op);
    auto segs = SplitEven(count, p, esz);
    const int next = g.RingPeer(1), prev = g.RingPeer(-1);
    char* b = static_cast<char*>(buf);
    uint64_t mine = reinterpret_cast<uint64_t>(buf), theirs = 0;
    t.SendRecv(next, &mine, sizeof(mine), prev, &theirs, sizeof(theirs), "all_reduce (direct ring, addresses)");
    constexpr size_t kChunk = 128 << 10;  // stays in cache between the read and the reduction
    std::vector<char> chunk(kChunk);
    const int steps = 2 * (p - 1);
    for (int k = 0; k < steps; ++k) {
      uint64_t token = 0;
      if (k > 0) t.Recv(prev, &token, sizeof(token), "all_reduce (direct ring, step token)");
      const Seg& s = segs[Mod(g.pos - k - 2, p)];
      const bool reduce = k < p - 1;
      for (size_t off = 0; off < s.bytes; off += kChunk) {
        const size_t n = std::min(kChunk, s.bytes - off);
        if (reduce) {
          t.DirectRead(prev, theirs + s.off + off, chunk.data(), n, "all_reduce (direct ring)");
          ReduceInto(b + s.off + off, chunk.data(), n / esz, dtype, base);
        } else {
          t.DirectRead(prev, theirs + s.off + off, b + s.off + off, n, "all_reduce (direct ring)");
        }
      }
      if (k < steps - 1) {
        token = static_cast<uint64_t>(k);
        t.Send(next, &token, sizeof(token), "all_reduce (direct ring, step token)");
      }
    }
    // My successor may still be reading my buffer: return only when it is done with it.
    uint64_t fin = 1, got = 0;
    t.SendRecv(prev, &fin, sizeof(fin), next, &got, sizeof(got), "all_reduce (direct ring, finish)");
  }
  if (op == ReduceOp::kAvg) ScaleAvg(buf, count, dtype, p);
}

void AllReduceRecursiveDoubling(Group& g, void* buf, size_t count, DType dtype, ReduceOp op) {
  const int p = g.size();
  const size_t bytes = count * DTypeSize(dtype);
  const ReduceOp base = BaseOp(op);
  Transport& t = *g.t;
  if (p > 1) {
    int p2 = 1;
    while (p2 * 2 <= p) p2 *= 2;
    const int rem = p - p2;
    const int idx = g.pos;
    std::vector<char> tmp(bytes);
    int nidx;  // index among the power-of-two participants, -1 if folded away
    if (idx < 2 * rem) {
      if (idx % 2 == 0) {
        t.Send(g.ring[idx + 1], buf, bytes, "all_reduce (recursive doubling, fold)");
        nidx = -1;
      } else {
        Xfer r(g.ring[idx - 1], buf, bytes);
        r.reduce = true;
        r.dtype = dtype;
        r.op = base;
        t.Run({}, {&r}, "all_reduce (recursive doubling, fold)");
        nidx = idx / 2;
      }
    } else {
      nidx = idx - rem;
    }
    if (nidx >= 0) {
      for (int mask = 1; mask < p2; mask <<= 1) {
        int pn = nidx ^ mask;
        int peer = g.ring[pn < rem ? pn * 2 + 1 : pn + rem];
        std::memcpy(tmp.data(), buf, bytes);
        Xfer s(peer, tmp.data(), bytes), r(peer, buf, bytes);
        r.reduce = true;
        r.dtype = dtype;
        r.op = base;
        t.Run({&s}, {&r}, "all_reduce (recursive doubling)");
      }
    }
    if (idx < 2 * rem) {
      if (idx % 2 == 0) {
        t.Recv(g.ring[idx + 1], buf, bytes, "all_reduce (recursive doubling, unfold)");
      } else {
        t.Send(g.ring[idx - 1], buf, bytes, "all_reduce (recursive doubling, unfold)");
      }
    }
  }
  if (op == ReduceOp::kAvg) ScaleAvg(buf, count, dtype, p);
}

void AllReduceHierarchical(Group& g, const std::vector<std::vector<int>>& clusters, void* buf, size_t count,
                           DType dtype, ReduceOp op) {
  const int p = g.size();
  const ReduceOp base = BaseOp(op);
  int my_cluster = -1, li = -1;
  bool equal = true;
  for (size_t c = 0; c < clusters.size(); ++c) {
    if (clusters[c].size() != clusters[0].size()) equal = false;
    for (size_t i = 0; i < clusters[c].size(); ++i)
      if (clusters[c][i] == g.t->rank()) {
        my_cluster = static_cast<int>(c);
        li = static_cast<int>(i);
      }
  }
  if (my_cluster < 0) throw CommError("hierarchical all_reduce: rank " + std::to_string(g.t->rank()) + " is in no cluster");
  const auto& mine = clusters[my_cluster];
  Group intra(g.t, mine, mine);
  if (equal) {
    // 1) reduce-scatter inside the cluster, 2) all-reduce my shard across clusters, 3) all-gather inside.
    const size_t esz = DTypeSize(dtype);
    const int L = intra.size();
    auto segs = SplitEven(count, L, esz);
    char* b = static_cast<char*>(buf);
    if (L > 1) {
      std::vector<Seg> send, recv;
      std::vector<char> red;
      RingReduceScatterPhase(intra, segs, &send, &recv, &red);
      RingSteps(intra, b, send, recv, red, dtype, base, "all_reduce (hierarchical, intra reduce-scatter)");
    }
    std::vector<int> peers;
    for (const auto& c : clusters) peers.push_back(c[li]);
    Group inter(g.t, peers, peers);
    const Seg& s = segs[intra.pos];
    if (s.bytes < 64 * 1024) {
      AllReduceRecursiveDoubling(inter, b + s.off, s.bytes / esz, dtype, base);
    } else {
      AllReduceRing(inter, b + s.off, s.bytes / esz, dtype, base);
    }
    if (L > 1) {
      std::vector<Seg> send, recv;
      std::vector<char> red;
      RingAllGatherPhase(intra, segs, &send, &recv, &red);
      RingSteps(intra, b, send, recv, red, dtype, base, "all_reduce (hierarchical, intra all-gather)");
    }
  } else {
    // Unequal clusters: all-reduce inside, leaders all-reduce, leaders broadcast inside.
    AllReduceRing(intra, buf, count, dtype, base);
    if (li == 0) {
      std::vector<int> leaders;
      for (const auto& c : clusters) leaders.push_back(c[0]);
      Group lead(g.t, leaders, leaders);
      AllReduceRing(lead, buf, count, dtype, base);
    }
    BroadcastBinomial(intra, buf, count, dtype, 0);
  }
  if (op == ReduceOp::kAvg) ScaleAvg(buf, count, dtype, p);
}

void AllGatherRing(Group& g, const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
  const int p = g.size();
  const size_t esz = DTypeSize(dtype);
  std::vector<Seg> logical(p);
  size_t off = 0;
  for (int j = 0; j < p; ++j) {
    logical[j] = {off * esz, counts[j] * esz};
    off += counts[j];
  }
  char* o = static_cast<char*>(out);
  if (logical[g.me].bytes) std::memmove(o + logical[g.me].off, in, logical[g.me].bytes);
  if (p == 1) return;
  std::vector<Seg> by_pos(p);
  for (int q = 0; q < p; ++q) by_pos[q] = logical[g.LogicalOf(g.ring[q])];
  std::vector<Seg> send, recv;
  std::vector<char> red;
  RingAllGatherPhase(g, by_pos, &send, &recv, &red);
  RingSteps(g, o, send, recv, red, dtype, ReduceOp::kSum, "all_gather (ring)");
}

void ReduceScatterRing(Group& g, const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) {
  const int p = g.size();
  const size_t esz = DTypeSize(dtype);
  std::vector<Seg> logical(p);
  size_t total = 0;
  for (int j = 0; j < p; ++j) {
    logical[j] = {total * esz, counts[j] * esz};
    total += counts[j];
  }
  std::vector<char> work(static_cast<const char*>(in), static_cast<const char*>(in) + total * esz);
  if (p > 1) {
    std::vector<Seg> by_pos(p);
    for (int q = 0; q < p; ++q) by_pos[q] = logical[g.LogicalOf(g.ring[q])];
    std::vector<Seg> send, recv;
    std::vector<char> red;
    RingReduceScatterPhase(g, by_pos, &send, &recv, &red);
    RingSteps(g, work.data(), send, recv, red, dtype, BaseOp(op), "reduce_scatter (ring)");
  }
  const Seg& mine = logical[g.me];
  if (mine.bytes) std::memcpy(out, work.data() + mine.off, mine.bytes);
  if (op == ReduceOp::kAvg) ScaleAvg(out, counts[g.me], dtype, p);
}

std::vector<char> AllToAllPairwise(Group& g, const void* in, const std::vector<size_t>& send_counts, DType dtype,
                                   std::vector<size_t>* recv_counts, uint64_t max_message_bytes) {
  const int p = g.size();
  const size_t esz = DTypeSize(dtype);
  Transport& t = *g.t;
  std::vector<uint64_t> scount(p), rcount(p, 0);
  for (int j = 0; j < p; ++j) scount[j] = send_counts[j];
  rcount[g.me] = scount[g.me];
  {  // counts first: every pair at once (independent channels, no ordering deadlock)
    std::vector<Xfer> sx, rx;
    sx.reserve(p);
    rx.reserve(p);
    for (int k = 1; k < p; ++k) {
      int to = (g.me + k) % p, from = Mod(g.me - k, p);
      sx.emplace_back(g.members[to], &scount[to], sizeof(uint64_t));
      rx.emplace_back(g.members[from], &rcount[from], sizeof(uint64_t));
    }
    std::vector<Xfer*> sp, rp;
    for (auto& x : sx) sp.push_back(&x);
    for (auto& x : rx) rp.push_back(&x);
    t.Run(sp, rp, "all_to_all (counts)");
  }
  std::vector<size_t> soff(p), roff(p);
  size_t stotal = 0, rtotal = 0;
  try {  // what this rank sends and what the peers announced, before anything is allocated for it
    for (int j = 0; j < p; ++j) {
      CheckPeerCount(scount[j], esz, max_message_bytes, g.me, "all_to_all (this rank's send count)");
      CheckPeerCount(rcount[j], esz, max_message_bytes, j, "all_to_all (counts)");
      soff[j] = stotal;
      stotal += scount[j];
      roff[j] = rtotal;
      rtotal = CheckedAdd(rtotal, rcount[j], "all_to_all: received counts");
    }
    CheckedMul(rtotal, esz, "all_to_all: received counts");
  } catch (const CommError& e) {  // the peers would wait for data this rank will not exchange
    t.Abort(e.what());
    throw;
  }
  std::vector<char> out(rtotal * esz);
  const char* src = static_cast<const char*>(in);
  if (scount[g.me]) std::memcpy(out.data() + roff[g.me] * esz, src + soff[g.me] * esz, scount[g.me] * esz);
  std::vector<Xfer> sx, rx;
  sx.reserve(p);
  rx.reserve(p);
  for (int k = 1; k < p; ++k) {  // pairwise order: step k talks to me+k and me-k
    int to = (g.me + k) % p, from = Mod(g.me - k, p);
    sx.emplace_back(g.members[to], src + soff[to] * esz, scount[to] * esz);
    rx.emplace_back(g.members[from], out.data() + roff[from] * esz, rcount[from] * esz);
  }
  std::vector<Xfer*> sp, rp;
  for (auto& x : sx) sp.push_back(&x);
  for (auto& x : rx) rp.push_back(&x);
  t.Run(sp, rp, "all_to_all (pairwise)");
  if (recv_counts) recv_counts->assign(rcount.begin(), rcount.end());
  return out;
}

void BroadcastBinomial(Group& g, void* buf, size_t count, DType dtype, int root) {
  const int p = g.size();
  const size_t bytes = count * DTypeSize(dtype);
  const int vrank = Mod(g.me - root, p);
  int mask = 1;
  while (mask < p) {
    if (vrank & mask) {
      g.t->Recv(g.members[Mod(vrank - mask + root, p)], buf, bytes, "broadcast (binomial)");
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  while (mask > 0) {
    if (vrank + mask < p) g.t->Send(g.members[Mod(vrank + mask + root, p)], buf, bytes, "broadcast (binomial)");
    mask >>= 1;
  }
}

void BroadcastPipelinedChain(Group& g, void* buf, size_t count, DType dtype, int root) {
  const int p = g.size();
  if (p == 1) return;
  const size_t bytes = count * DTypeSize(dtype);
  int root_pos = 0;
  for (int q = 0; q < p; ++q)
    if (g.ring[q] == g.members[root]) root_pos = q;
  const int i = Mod(g.pos - root_pos, p);  // my place in the chain
  Xfer r(i > 0 ? g.RingPeer(-1) : -1, buf, bytes), s(i < p - 1 ? g.RingPeer(1) : -1, buf, bytes);
  std::vector<Xfer*> sends, recvs;
  if (i > 0) recvs.push_back(&r);
  if (i < p - 1) {
    if (i > 0) s.limit = &r.done;  // forward what has arrived
    sends.push_back(&s);
  }
  g.t->Run(sends, recvs, "broadcast (pipelined chain)");
}

void BarrierDissemination(Group& g) {
  const int p = g.size();
  uint64_t token = 0x5a5a, got = 0;
  for (int k = 1; k < p; k <<= 1) {
    g.t->SendRecv(g.members[(g.me + k) % p], &token, sizeof(token), g.members[Mod(g.me - k, p)], &got, sizeof(got),
                  "barrier");
  }
}

}  // namespace mshyper::comm
