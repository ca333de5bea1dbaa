#include "comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>

#include "comm/frame.h"

namespace mshyper::comm {

namespace {

enum Kind { kAllReduce = 1, kAllGather, kAllGatherV, kReduceScatter, kAllToAll, kBroadcast, kBarrier, kAggregate };

const char* KindName(int kind) {
  switch (kind) {
    case kAllReduce: return "all_reduce";
    case kAllGather: return "all_gather";
    case kAllGatherV: return "all_gather_v";
    case kReduceScatter: return "reduce_scatter";
    case kAllToAll: return "all_to_all";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
    case kAggregate: return "an aggregated all_reduce batch";
  }
  return "unknown";
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Communicator::Communicator(std::shared_ptr<Transport> transport, std::vector<int> members,
                           std::shared_ptr<const Topology> topology, std::vector<int> devices, TransportParams params)
    : transport_(std::move(transport)), devices_(std::move(devices)),
      model_(devices_.empty() ? nullptr : topology, params) {
  if (members.empty()) {
    for (int r = 0; r < transport_->size(); ++r) members.push_back(r);
  }
  std::vector<int> ring = members;
  if (!devices_.empty()) {
    if (!topology) throw CommError("communicator: devices given without a topology");
    if (devices_.size() != members.size()) {
      throw CommError("communicator: " + std::to_string(devices_.size()) + " topology devices for " +
                      std::to_string(members.size()) + " members");
    }
    std::map<int, int> member_of;
    for (size_t i = 0; i < devices_.size(); ++i) member_of[devices_[i]] = members[i];
    ring.clear();
    for (int d : topology->RingOrder(devices_)) ring.push_back(member_of[d]);
    for (const auto& c : topology->Clusters(devices_)) {
      std::vector<int> ranks;
      for (int d : topology->RingOrder(c)) ranks.push_back(member_of[d]);
      clusters_.push_back(ranks);
    }
  }
  group_ = Group(transport_.get(), members, ring);
}

std::vector<int> Communicator::ModelGroup() const { return devices_.empty() ? group_.members : devices_; }

std::vector<Communicator::Desc> Communicator::GatherDescs(const Desc& mine) {
  const int p = size();
  std::vector<Desc> all(p);
  std::vector<size_t> counts(p, sizeof(Desc));
  AllGatherRing(group_, &mine, all.data(), counts, DType::kUInt8);
  return all;
}

namespace {

std::string Describe(int kind, int32_t dtype, int32_t op, int32_t root, uint64_t count, uint64_t extra) {
  std::ostringstream os;
  os << KindName(kind);
  if (kind == kAggregate) return os.str();
  os << "(" << DTypeName(static_cast<DType>(dtype));
  if (kind == kAllGatherV || (kind == kAllToAll && extra == 0)) {
    os << ")";
    return os.str();
  }
  if (kind != kBarrier) os << ", " << count << " elements";
  if (kind == kAllReduce || kind == kReduceScatter) os << ", op " << OpName(static_cast<ReduceOp>(op));
  if (kind == kBroadcast) os << ", root " << root;
  os << ")";
  return os.str();
}

}  // namespace

void Communicator::Check(int kind, DType dtype, ReduceOp op, int root, uint64_t count, uint64_t extra) {
  if (!validate || size() == 1) return;
  std::vector<Desc> all = GatherDescs({kind, static_cast<int32_t>(dtype), static_cast<int32_t>(op), root, count, extra});
  auto describe = [](const Desc& d) { return Describe(d.kind, d.dtype, d.op, d.root, d.count, d.extra); };
  for (int j = 1; j < size(); ++j) {
    const Desc& a = all[0];
    const Desc& b = all[j];
    bool same = a.kind == b.kind && a.dtype == b.dtype;
    if (same && a.kind != kAllGatherV) {  // all_to_all_v: count and extra are 0 everywhere
      same = a.count == b.count && a.op == b.op && a.root == b.root && a.extra == b.extra;
    }
    if (!same) {
      const std::string da = describe(a), db = describe(b);
      throw CommMismatch("mismatched collective across ranks: rank 0 calls " + da + " but rank " + std::to_string(j) +
                         " calls " + db + (da == db ? " (with different array shapes or dims)" : ""));
    }
  }
}

std::vector<QueueDigest> Communicator::GatherQueueDigests(const QueueDigest& mine) {
  if (size() == 1) return {mine};
  // bytes travel in the dtype (low) and op (high) words of the descriptor
  const auto bytes = static_cast<uint64_t>(mine.bytes);
  std::vector<Desc> all = GatherDescs({kAggregate, static_cast<int32_t>(bytes & 0xffffffffu),
                                       static_cast<int32_t>(bytes >> 32), 0, static_cast<uint64_t>(mine.length),
                                       static_cast<uint64_t>(mine.hash)});
  std::vector<QueueDigest> out;
  for (int j = 0; j < size(); ++j) {
    const Desc& d = all[j];
    if (d.kind != kAggregate) {
      throw CommMismatch("mismatched collective across ranks: rank " + std::to_string(rank()) + " calls " +
                         KindName(kAggregate) + " but rank " + std::to_string(j) + " calls " +
                         Describe(d.kind, d.dtype, d.op, d.root, d.count, d.extra));
    }
    const uint64_t b = (static_cast<uint64_t>(static_cast<uint32_t>(d.op)) << 32) | static_cast<uint32_t>(d.dtype);
    out.push_back({static_cast<int64_t>(d.count), static_cast<int64_t>(d.extra), static_cast<int64_t>(b)});
  }
  return out;
}

void Communicator::AllReduce(void* buf, size_t count, DType dtype, ReduceOp op, const std::string& algorithm,
                             bool check) {
  const double bytes = static_cast<double>(ByteCount(count, dtype, "all_reduce: count"));
  if (check) Check(kAllReduce, dtype, op, 0, count, 0);
  std::string algo = algorithm;
  if (algo.empty() || algo == "auto") {
    algo = model_.Choose("all_reduce", bytes, ModelGroup()).algorithm;
  }
  if (algo == "hierarchical" && clusters_.size() < 2) algo = "ring";
  last_algorithm_ = algo;
  if (algo == "ring" && direct_min_bytes >= 0 && bytes >= direct_min_bytes &&
      size() > 1 && direct_enabled()) {
    last_algorithm_ = "ring_direct";
    AllReduceRingDirect(group_, buf, count, dtype, op);
  } else if (algo == "ring_direct") {
    if (!direct_enabled()) throw CommError("all_reduce: ring_direct needs a transport with direct reads on every rank");
    AllReduceRingDirect(group_, buf, count, dtype, op);
  } else if (algo == "ring") {
    AllReduceRing(group_, buf, count, dtype, op);
  } else if (algo == "recursive_doubling") {
    AllReduceRecursiveDoubling(group_, buf, count, dtype, op);
  } else if (algo == "hierarchical") {
    AllReduceHierarchical(group_, clusters_, buf, count, dtype, op);
  } else {
    throw CommError("unknown all_reduce algorithm '" + algo +
                    "': expected ring, ring_direct, recursive_doubling or hierarchical");
  }
}

bool Communicator::direct_enabled() {
  if (direct_ < 0) {
    int32_t ok = transport_->DirectCapable() ? 1 : 0;
    if (size() > 1) AllReduceRing(group_, &ok, 1, DType::kInt32, ReduceOp::kMin);
    direct_ = ok;
  }
  return direct_ == 1;
}

void Communicator::AllGather(const void* in, void* out, size_t count, DType dtype) {
  ByteCount(CheckedMul(count, static_cast<uint64_t>(size()), "all_gather: count x group size"), dtype,
            "all_gather: count x group size");
  Check(kAllGather, dtype, ReduceOp::kSum, 0, count, 0);
  last_algorithm_ = "ring";
  AllGatherRing(group_, in, out, std::vector<size_t>(size(), count), dtype);
}

void Communicator::AllGatherV(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) {
  if (static_cast<int>(counts.size()) != size()) {
    throw CommError("all_gather_v: " + std::to_string(counts.size()) + " counts for a group of " + std::to_string(size()));
  }
  ByteCount(CheckedSum(counts, "all_gather_v: counts"), dtype, "all_gather_v: counts");
  Check(kAllGatherV, dtype, ReduceOp::kSum, 0, counts[rank()], 0);
  last_algorithm_ = "ring";
  AllGatherRing(group_, in, out, counts, dtype);
}

void Communicator::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                                 ReduceOp op) {
  if (static_cast<int>(counts.size()) != size()) {
    throw CommError("reduce_scatter: " + std::to_string(counts.size()) + " counts for a group of " +
                    std::to_string(size()));
  }
  const uint64_t total = CheckedSum(counts, "reduce_scatter: counts");
  ByteCount(total, dtype, "reduce_scatter: counts");
  uint64_t h = 1469598103934665603ULL;
  for (size_t c : counts) h = (h ^ c) * 1099511628211ULL;
  Check(kReduceScatter, dtype, op, 0, total, h);
  last_algorithm_ = "ring";
  ReduceScatterRing(group_, in, out, counts, dtype, op);
}

std::vector<char> Communicator::AllToAllV(const void* in, const std::vector<size_t>& send_counts, DType dtype,
                                          std::vector<size_t>* recv_counts, uint64_t shape_key) {
  if (static_cast<int>(send_counts.size()) != size()) {
    throw CommError("all_to_all: " + std::to_string(send_counts.size()) + " send counts for a group of " +
                    std::to_string(size()));
  }
  const uint64_t sum = CheckedSum(send_counts, "all_to_all: send_counts");
  ByteCount(sum, dtype, "all_to_all: send_counts");
  Check(kAllToAll, dtype, ReduceOp::kSum, 0, shape_key != 0 ? sum : 0, shape_key);
  last_algorithm_ = "pairwise";
  return AllToAllPairwise(group_, in, send_counts, dtype, recv_counts, max_message_bytes);
}

void Communicator::Broadcast(void* buf, size_t count, DType dtype, int root, const std::string& algorithm) {
  if (root < 0 || root >= size()) {
    throw CommError("broadcast: root " + std::to_string(root) + " outside [0, " + std::to_string(size()) + ")");
  }
  const double bytes = static_cast<double>(ByteCount(count, dtype, "broadcast: count"));
  Check(kBroadcast, dtype, ReduceOp::kSum, root, count, 0);
  std::string algo = algorithm;
  if (algo.empty() || algo == "auto") {
    algo = model_.Choose("broadcast", bytes, ModelGroup()).algorithm;
  }
  last_algorithm_ = algo;
  if (algo == "binomial") {
    BroadcastBinomial(group_, buf, count, dtype, root);
  } else if (algo == "pipelined_chain") {
    BroadcastPipelinedChain(group_, buf, count, dtype, root);
  } else {
    throw CommError("unknown broadcast algorithm '" + algo + "': expected binomial or pipelined_chain");
  }
}

void Communicator::Send(const void* buf, size_t count, DType dtype, int peer) {
  if (peer < 0 || peer >= size() || peer == rank()) {
    throw CommError("send: peer " + std::to_string(peer) + " is not another rank of the group of " + std::to_string(size()));
  }
  const uint64_t bytes = ByteCount(count, dtype, "send: count");
  if (bytes > max_message_bytes) {
    throw CommError("send: " + std::to_string(bytes) + " bytes to rank " + std::to_string(peer) +
                    " exceed max_message_bytes = " + std::to_string(max_message_bytes) +
                    " (raise it on both ranks to send more in one message)");
  }
  uint64_t header[2] = {count, static_cast<uint64_t>(dtype)};
  int to = group_.members[peer];
  transport_->Send(to, header, sizeof(header), "send (header)");
  transport_->Send(to, buf, bytes, "send");
}

void Communicator::Recv(void* buf, size_t count, DType dtype, int peer) {
  if (peer < 0 || peer >= size() || peer == rank()) {
    throw CommError("recv: peer " + std::to_string(peer) + " is not another rank of the group of " + std::to_string(size()));
  }
  const uint64_t bytes = ByteCount(count, dtype, "recv: count");
  uint64_t header[2] = {0, 0};
  int from = group_.members[peer];
  transport_->Recv(from, header, sizeof(header), "recv (header)");
  DType sent_dtype = DType::kUInt8;
  uint64_t sent_bytes = 0;
  try {
    sent_bytes = CheckMessageHeader(header, peer, &sent_dtype);
    CheckPeerCount(header[0], DTypeSize(sent_dtype), max_message_bytes, peer, "recv (header)");
  } catch (const FrameError& e) {  // nothing to skip or drain by: the stream from the peer is lost
    transport_->Abort(e.what());
    throw;
  }
  if (header[0] != count || sent_dtype != dtype) {
    // Drain the message so the stream stays usable (in chunks: nothing of the announced size is
    // allocated; the padding of the sender's one message is that of the last chunk), then report both sides.
    constexpr uint64_t kChunk = 64 << 10;
    std::vector<char> sink(static_cast<size_t>(std::min(kChunk, sent_bytes)));
    for (uint64_t done = 0; done < sent_bytes;) {
      const uint64_t n = std::min(kChunk, sent_bytes - done);
      transport_->Recv(from, sink.data(), static_cast<size_t>(n), "recv (drain)");
      done += n;
    }
    throw CommMismatch("send/recv mismatch: rank " + std::to_string(peer) + " sends " + std::to_string(header[0]) +
                       " x " + DTypeName(sent_dtype) + " but rank " + std::to_string(rank()) + " expects " +
                       std::to_string(count) + " x " + DTypeName(dtype));
  }
  transport_->Recv(from, buf, bytes, "recv");
}

void Communicator::Barrier() {
  Check(kBarrier, DType::kUInt8, ReduceOp::kSum, 0, 0, 0);
  last_algorithm_ = "dissemination";
  BarrierDissemination(group_);
}

TransportParams Communicator::Calibrate(int repeats) {
  TransportParams tp;
  {  // gamma: local reduction speed
    const size_t n = 1 << 20;
    std::vector<float> a(n, 1.0f), b(n, 2.0f);
    ReduceInto(a.data(), b.data(), n, DType::kFloat32, ReduceOp::kSum);
    double t0 = Now();
    for (int i = 0; i < 3; ++i) ReduceInto(a.data(), b.data(), n, DType::kFloat32, ReduceOp::kSum);
    tp.gamma_s_per_byte = (Now() - t0) / (3.0 * n * 4);
  }
  const int p = size();
  if (p > 1) {
    bool saved = validate;
    validate = false;
    float one = 1.0f;
    BarrierDissemination(group_);
    double t0 = Now();
    for (int i = 0; i < repeats; ++i) AllReduceRing(group_, &one, 1, DType::kFloat32, ReduceOp::kSum);
    double t_small = (Now() - t0) / repeats;
    tp.alpha_s = t_small / (2.0 * (p - 1));
    const size_t per = (4u << 20) / p;
    std::vector<char> in(per, 1), out(per * p);
    std::vector<size_t> counts(p, per);
    BarrierDissemination(group_);
    const int big_repeats = std::max(2, repeats / 5);
    t0 = Now();
    for (int i = 0; i < big_repeats; ++i) AllGatherRing(group_, in.data(), out.data(), counts, DType::kUInt8);
    double t_big = (Now() - t0) / big_repeats;
    tp.beta_s_per_byte = std::max(1e-13, (t_big / (p - 1) - tp.alpha_s) / static_cast<double>(per));
    double v[3] = {tp.alpha_s, tp.beta_s_per_byte, tp.gamma_s_per_byte};
    AllReduceRing(group_, v, 3, DType::kFloat64, ReduceOp::kMax);
    tp = {v[0], v[1], v[2]};
    validate = saved;
  }
  model_.set_params(tp);
  return tp;
}

}  // namespace mshyper::comm
