// Collective algorithms over a point-to-point Transport. A Group names the participating
// transport ranks in two orders: `members` (the caller's logical order: segment j of a
// reduce-scatter / all-gather / all-to-all belongs to members[j]) and `ring` (the
// topology-chosen ring, used for neighbour exchanges). Every function must be called by every
// member with agreeing arguments.
#pragma once
#include <string>
#include <vector>

#include "comm/transport.h"

namespace mshyper::comm {

struct Group {
  Transport* t = nullptr;
  std::vector<int> members;  // logical order
  std::vector<int> ring;     // same ranks, ring order
  int me = 0;                // my index in members
  int pos = 0;               // my index in ring

  Group() = default;
  Group(Transport* transport, std::vector<int> members_, std::vector<int> ring_);
  int size() const { return static_cast<int>(members.size()); }
  int RingPeer(int offset) const;  // ring[(pos + offset) mod p]
  int LogicalOf(int transport_rank) const;
};

// In place, count elements. kAvg is applied (divided) at the end.
void AllReduceRing(Group& g, void* buf, size_t count, DType dtype, ReduceOp op);
// Ring all-reduce in which each rank reads its predecessor's segments straight out of the
// predecessor's buffer (Transport::DirectRead: one copy instead of two through a channel); only
// 8-byte step tokens go through the channels. Needs a direct-capable transport on every rank.
void AllReduceRingDirect(Group& g, void* buf, size_t count, DType dtype, ReduceOp op);
void AllReduceRecursiveDoubling(Group& g, void* buf, size_t count, DType dtype, ReduceOp op);
// clusters: disjoint lists of transport ranks covering the group (e.g. one per node).
void AllReduceHierarchical(Group& g, const std::vector<std::vector<int>>& clusters, void* buf, size_t count,
                           DType dtype, ReduceOp op);
// out holds sum(counts) elements in members order; in holds counts[me].
void AllGatherRing(Group& g, const void* in, void* out, const std::vector<size_t>& counts, DType dtype);
// in holds sum(counts) elements in members order; out receives the reduced counts[me] elements.
void ReduceScatterRing(Group& g, const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op);
// send_counts[j] elements go to members[j]; returns the received elements in members order. A
// count sent or announced beyond `max_message_bytes` aborts the group (FrameError naming the peer).
std::vector<char> AllToAllPairwise(Group& g, const void* in, const std::vector<size_t>& send_counts, DType dtype,
                                   std::vector<size_t>* recv_counts, uint64_t max_message_bytes);
// root is a logical index.
void BroadcastBinomial(Group& g, void* buf, size_t count, DType dtype, int root);
void BroadcastPipelinedChain(Group& g, void* buf, size_t count, DType dtype, int root);
void BarrierDissemination(Group& g);

}  // namespace mshyper::comm
