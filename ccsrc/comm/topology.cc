#include "comm/topology.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "comm/types.h"

namespace mshyper::comm {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

int CeilLog2(int p) {
  int r = 0;
  while ((1 << r) < p) ++r;
  return r;
}
}  // namespace

Topology::Topology(std::string name, int num_devices, std::vector<int> node_of)
    : name_(std::move(name)), n_(num_devices), node_of_(std::move(node_of)) {
  if (n_ <= 0) throw CommError("topology '" + name_ + "': devices must be positive, got " + std::to_string(n_));
  if (!node_of_.empty() && static_cast<int>(node_of_.size()) != n_) {
    throw CommError("topology '" + name_ + "': node_of has " + std::to_string(node_of_.size()) + " entries for " +
                    std::to_string(n_) + " devices");
  }
  adj_.resize(n_);
  dist_.resize(n_);
  bw_.resize(n_);
  prev_.resize(n_);
}

void Topology::AddLink(int a, int b, double latency_s, double bandwidth_Bps) {
  if (a < 0 || a >= n_ || b < 0 || b >= n_ || a == b) {
    throw CommError("topology '" + name_ + "': link " + std::to_string(a) + "-" + std::to_string(b) +
                    " names a device outside [0, " + std::to_string(n_) + ") or links a device to itself");
  }
  if (!(latency_s >= 0) || !(bandwidth_Bps > 0)) {
    throw CommError("topology '" + name_ + "': link " + std::to_string(a) + "-" + std::to_string(b) +
                    " needs latency >= 0 and bandwidth > 0");
  }
  int idx = static_cast<int>(links_.size());
  links_.push_back({a, b, latency_s, bandwidth_Bps});
  adj_[a].push_back({b, idx});
  adj_[b].push_back({a, idx});
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& d : dist_) d.clear();
  }
  std::lock_guard<std::mutex> lock(cache_mu_);
  ring_cache_.clear();
  cluster_cache_.clear();
}

std::shared_ptr<Topology> Topology::Preset(const std::string& name, int num_devices) {
  if (name == "supernode384") {
    int n = num_devices > 0 ? num_devices : 384;
    auto t = std::make_shared<Topology>(name, n);
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) t->AddLink(a, b, 200e-9, 15 * kConventionalBandwidth);
    return t;
  }
  if (name == "node8") {
    int n = num_devices > 0 ? num_devices : 16;
    std::vector<int> node_of(n);
    for (int i = 0; i < n; ++i) node_of[i] = i / 8;
    auto t = std::make_shared<Topology>(name, n, node_of);
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        if (a / 8 == b / 8) {
          t->AddLink(a, b, 1e-6, 56e9);
        } else {
          t->AddLink(a, b, 10e-6, 12.5e9);
        }
      }
    return t;
  }
  if (name == "ring") {
    int n = num_devices > 0 ? num_devices : 8;
    auto t = std::make_shared<Topology>(name, n);
    if (n == 2) {
      t->AddLink(0, 1, 1e-6, kConventionalBandwidth);
    } else {
      for (int a = 0; a < n && n > 1; ++a) t->AddLink(a, (a + 1) % n, 1e-6, kConventionalBandwidth);
    }
    return t;
  }
  throw CommError("unknown topology preset '" + name + "': expected supernode384, node8 or ring");
}

int Topology::node_of(int device) const {
  if (device < 0 || device >= n_) throw CommError("topology '" + name_ + "': no device " + std::to_string(device));
  return node_of_.empty() ? 0 : node_of_[device];
}

void Topology::EnsureSource(int src) const {
  if (!dist_[src].empty()) return;
  std::vector<double> dist(n_, kInf), bw(n_, 0);
  std::vector<int> prev(n_, -1), hops(n_, 0);
  std::vector<char> done(n_, 0);
  dist[src] = 0;
  bw[src] = kInf;
  for (int it = 0; it < n_; ++it) {
    int u = -1;
    for (int v = 0; v < n_; ++v)
      if (!done[v] && dist[v] < kInf && (u < 0 || dist[v] < dist[u])) u = v;
    if (u < 0) break;
    done[u] = 1;
    for (auto [v, li] : adj_[u]) {
      const Link& l = links_[li];
      double nd = dist[u] + l.latency_s;
      double nbw = std::min(bw[u], l.bandwidth_Bps);
      bool better = nd < dist[v] - 1e-15 ||
                    (std::abs(nd - dist[v]) <= 1e-15 && (hops[u] + 1 < hops[v] || (hops[u] + 1 == hops[v] && nbw > bw[v])));
      if (!done[v] && better) {
        dist[v] = nd;
        bw[v] = nbw;
        prev[v] = u;
        hops[v] = hops[u] + 1;
      }
    }
  }
  dist_[src] = std::move(dist);
  bw_[src] = std::move(bw);
  prev_[src] = std::move(prev);
}

PathInfo Topology::Path(int a, int b) const {
  if (a < 0 || a >= n_ || b < 0 || b >= n_) {
    throw CommError("topology '" + name_ + "': path " + std::to_string(a) + "->" + std::to_string(b) +
                    " names a device outside [0, " + std::to_string(n_) + ")");
  }
  std::lock_guard<std::mutex> lock(mu_);
  EnsureSource(a);
  PathInfo info;
  if (a == b) {
    info.devices = {a};
    info.bandwidth_Bps = kInf;
    return info;
  }
  if (dist_[a][b] == kInf) {
    throw CommError("topology '" + name_ + "': devices " + std::to_string(a) + " and " + std::to_string(b) +
                    " are not connected");
  }
  info.latency_s = dist_[a][b];
  info.bandwidth_Bps = bw_[a][b];
  for (int v = b; v != -1; v = prev_[a][v]) info.devices.push_back(v);
  std::reverse(info.devices.begin(), info.devices.end());
  return info;
}

double Topology::Latency(int a, int b) const {
  if (a == b) return 0.0;
  if (a < 0 || a >= n_ || b < 0 || b >= n_) return Path(a, b).latency_s;  // throws the message
  std::lock_guard<std::mutex> lock(mu_);
  EnsureSource(a);
  if (dist_[a][b] == kInf) {
    throw CommError("topology '" + name_ + "': devices " + std::to_string(a) + " and " + std::to_string(b) +
                    " are not connected");
  }
  return dist_[a][b];
}

double Topology::Bandwidth(int a, int b) const {
  if (a == b) return kInf;
  Latency(a, b);
  std::lock_guard<std::mutex> lock(mu_);
  return bw_[a][b];
}

void Topology::Validate(const std::vector<int>& devices) const {
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= n_) {
      throw CommError("topology '" + name_ + "' has devices 0.." + std::to_string(n_ - 1) + "; the group names device " +
                      std::to_string(d));
    }
    if (!seen.insert(d).second) throw CommError("the group names device " + std::to_string(d) + " twice");
  }
}

std::vector<int> Topology::RingOrder(const std::vector<int>& devices) const {
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = ring_cache_.find(devices);
    if (it != ring_cache_.end()) return it->second;
  }
  std::vector<int> order = ComputeRingOrder(devices);
  std::lock_guard<std::mutex> lock(cache_mu_);
  ring_cache_[devices] = order;
  return order;
}

std::vector<std::vector<int>> Topology::Clusters(const std::vector<int>& devices) const {
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cluster_cache_.find(devices);
    if (it != cluster_cache_.end()) return it->second;
  }
  auto clusters = ComputeClusters(devices);
  std::lock_guard<std::mutex> lock(cache_mu_);
  cluster_cache_[devices] = clusters;
  return clusters;
}

std::vector<int> Topology::ComputeRingOrder(const std::vector<int>& devices) const {
  Validate(devices);
  size_t p = devices.size();
  if (p <= 2) return devices;
  std::vector<int> order{devices[0]};
  std::vector<char> used(p, 0);
  used[0] = 1;
  for (size_t step = 1; step < p; ++step) {
    int cur = order.back();
    size_t best = p;
    double best_lat = kInf, best_bw = -1;
    for (size_t i = 0; i < p; ++i) {
      if (used[i]) continue;
      double lat = Latency(cur, devices[i]), bwv = Bandwidth(cur, devices[i]);
      if (lat < best_lat - 1e-15 || (std::abs(lat - best_lat) <= 1e-15 && bwv > best_bw)) {
        best = i;
        best_lat = lat;
        best_bw = bwv;
      }
    }
    used[best] = 1;
    order.push_back(devices[best]);
  }
  if (p <= 64) {  // 2-opt on total ring latency (first element fixed)
    auto cost = [&](int a, int b) { return Latency(a, b); };
    bool improved = true;
    for (int round = 0; improved && round < 8; ++round) {
      improved = false;
      for (size_t i = 1; i + 1 < p; ++i) {
        for (size_t j = i + 1; j < p; ++j) {
          int a = order[i - 1], b = order[i], c = order[j], d = order[(j + 1) % p];
          double delta = cost(a, c) + cost(b, d) - cost(a, b) - cost(c, d);
          if (delta < -1e-12) {
            std::reverse(order.begin() + static_cast<long>(i), order.begin() + static_cast<long>(j) + 1);
            improved = true;
          }
        }
      }
    }
  }
  return order;
}

bool Topology::IsUniform(const std::vector<int>& devices, double tolerance) const {
  Validate(devices);
  double lmin = kInf, lmax = 0, bmin = kInf, bmax = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    for (size_t j = i + 1; j < devices.size(); ++j) {
      double lat = Latency(devices[i], devices[j]), bwv = Bandwidth(devices[i], devices[j]);
      lmin = std::min(lmin, lat);
      lmax = std::max(lmax, lat);
      bmin = std::min(bmin, bwv);
      bmax = std::max(bmax, bwv);
    }
  }
  if (devices.size() < 2) return true;
  bool lat_ok = lmax <= tolerance * lmin + 1e-12;
  bool bw_ok = bmax <= tolerance * bmin;
  return lat_ok && bw_ok;
}

std::vector<std::vector<int>> Topology::ComputeClusters(const std::vector<int>& devices) const {
  Validate(devices);
  size_t p = devices.size();
  std::vector<int> parent(p);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  if (has_nodes()) {
    for (size_t i = 0; i < p; ++i)
      for (size_t j = i + 1; j < p; ++j)
        if (node_of_[devices[i]] == node_of_[devices[j]]) parent[find(static_cast<int>(i))] = find(static_cast<int>(j));
  } else {
    double lmin = kInf;
    for (size_t i = 0; i < p; ++i)
      for (size_t j = i + 1; j < p; ++j) lmin = std::min(lmin, Latency(devices[i], devices[j]));
    for (size_t i = 0; i < p; ++i)
      for (size_t j = i + 1; j < p; ++j)
        if (Latency(devices[i], devices[j]) <= 2 * lmin + 1e-15) parent[find(static_cast<int>(i))] = find(static_cast<int>(j));
  }
  std::vector<std::vector<int>> out;
  std::map<int, size_t> index;
  for (size_t i = 0; i < p; ++i) {
    int r = find(static_cast<int>(i));
    auto it = index.find(r);
    if (it == index.end()) {
      index[r] = out.size();
      out.push_back({devices[i]});
    } else {
      out[it->second].push_back(devices[i]);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
CostModel::CostModel(std::shared_ptr<const Topology> topology, TransportParams params)
    : topo_(std::move(topology)), params_(params) {}

CostModel::EdgeCost CostModel::TopoEdge(int a, int b) const {
  if (!topo_ || a == b) return {0, 0};
  return {topo_->Latency(a, b), 1.0 / topo_->Bandwidth(a, b)};
}

CostModel::EdgeCost CostModel::WorstRing(const std::vector<int>& ring) const {
  EdgeCost w{0, 0};
  for (size_t i = 0; i < ring.size(); ++i) {
    EdgeCost e = TopoEdge(ring[i], ring[(i + 1) % ring.size()]);
    w.alpha = std::max(w.alpha, e.alpha);
    w.beta = std::max(w.beta, e.beta);
  }
  return w;
}

const CostModel::GroupCost& CostModel::Group(const std::vector<int>& group) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = groups_.find(group);
    if (it != groups_.end()) return it->second;
  }
  GroupCost gc;
  if (topo_) {
    topo_->Validate(group);
    gc.ring = WorstRing(topo_->RingOrder(group));
    for (size_t i = 0; i < group.size(); ++i)
      for (size_t j = i + 1; j < group.size(); ++j) {
        EdgeCost e = TopoEdge(group[i], group[j]);
        gc.pair.alpha = std::max(gc.pair.alpha, e.alpha);
        gc.pair.beta = std::max(gc.pair.beta, e.beta);
      }
    auto clusters = topo_->Clusters(group);
    bool equal = clusters.size() >= 2 && clusters.size() < group.size();
    for (auto& c : clusters)
      if (c.size() != clusters[0].size()) equal = false;
    if (equal) {
      gc.hier = true;
      gc.L = static_cast<double>(clusters[0].size());
      gc.k = static_cast<double>(clusters.size());
      for (auto& c : clusters) {
        EdgeCost e = WorstRing(topo_->RingOrder(c));
        gc.in.alpha = std::max(gc.in.alpha, e.alpha);
        gc.in.beta = std::max(gc.in.beta, e.beta);
      }
      for (size_t li = 0; li < clusters[0].size(); ++li) {
        std::vector<int> peers;
        for (auto& c : clusters) peers.push_back(c[li]);
        EdgeCost e = WorstRing(topo_->RingOrder(peers));
        gc.out.alpha = std::max(gc.out.alpha, e.alpha);
        gc.out.beta = std::max(gc.out.beta, e.beta);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  return groups_.emplace(group, gc).first->second;
}

std::vector<std::string> CostModel::Algorithms(const std::string& kind) const {
  if (kind == "all_reduce") return {"recursive_doubling", "ring", "hierarchical"};
  if (kind == "all_gather" || kind == "reduce_scatter") return {"ring"};
  if (kind == "all_to_all") return {"pairwise"};
  if (kind == "broadcast") return {"binomial", "pipelined_chain"};
  if (kind == "barrier") return {"dissemination"};
  if (kind == "send_recv") return {"direct"};
  throw CommError("unknown collective kind '" + kind +
                  "': expected all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, barrier or send_recv");
}

double CostModel::Time(const std::string& kind, const std::string& algorithm, double n,
                       const std::vector<int>& group) const {
  const auto algos = Algorithms(kind);
  if (std::find(algos.begin(), algos.end(), algorithm) == algos.end()) {
    throw CommError("unknown algorithm '" + algorithm + "' for " + kind);
  }
  const int p = static_cast<int>(group.size());
  if (kind == "send_recv") {
    if (p != 2) throw CommError("send_recv: the group must be [src, dst], got " + std::to_string(p) + " devices");
    if (topo_) topo_->Validate(group);
    EdgeCost e = TopoEdge(group[0], group[1]);
    return params_.alpha_s + e.alpha + n * (params_.beta_s_per_byte + e.beta);
  }
  const GroupCost& gc = Group(group);
  if (p <= 1) return 0.0;
  const double g = params_.gamma_s_per_byte;
  const EdgeCost r{params_.alpha_s + gc.ring.alpha, params_.beta_s_per_byte + gc.ring.beta};
  const EdgeCost a{params_.alpha_s + gc.pair.alpha, params_.beta_s_per_byte + gc.pair.beta};
  if (kind == "all_reduce") {
    if (algorithm == "ring") {
      return 2.0 * (p - 1) * r.alpha + 2.0 * (p - 1) / p * n * r.beta + double(p - 1) / p * n * g;
    }
    if (algorithm == "recursive_doubling") {
      int p2 = 1 << (CeilLog2(p + 1) - 1);
      double t = CeilLog2(p2) * (a.alpha + n * a.beta + n * g);
      if (p2 != p) t += 2 * (a.alpha + n * a.beta) + n * g;
      return t;
    }
    // hierarchical: intra reduce-scatter, inter all-reduce of 1/L, intra all-gather
    if (!gc.hier) return kInf;
    const EdgeCost in{params_.alpha_s + gc.in.alpha, params_.beta_s_per_byte + gc.in.beta};
    const EdgeCost out{params_.alpha_s + gc.out.alpha, params_.beta_s_per_byte + gc.out.beta};
    const double L = gc.L, k = gc.k;
    double intra = L > 1 ? 2.0 * (L - 1) * in.alpha + 2.0 * (L - 1) / L * n * in.beta + (L - 1) / L * n * g : 0.0;
    double m = n / L;
    double inter = 2.0 * (k - 1) * out.alpha + 2.0 * (k - 1) / k * m * out.beta + (k - 1) / k * m * g;
    return intra + inter;
  }
  if (kind == "all_gather" || kind == "reduce_scatter") {
    double t = (p - 1) * (r.alpha + n / p * r.beta);
    if (kind == "reduce_scatter") t += (p - 1) * n / p * g;
    return t;
  }
  if (kind == "all_to_all") return (p - 1) * (a.alpha + n / p * a.beta);
  if (kind == "broadcast") {
    if (algorithm == "binomial") return CeilLog2(p) * (a.alpha + n * a.beta);
    double chunks = std::max(1.0, std::sqrt(std::max(0.0, (p - 2) * n * r.beta / std::max(r.alpha, 1e-12))));
    return (p - 2 + chunks) * (r.alpha + n / chunks * r.beta);
  }
  // barrier
  return CeilLog2(p) * a.alpha;
}

void CostModel::SetThreshold(const std::string& kind, double bytes) {
  Algorithms(kind);
  if (bytes < 0) {
    thresholds_.erase(kind);
  } else {
    thresholds_[kind] = bytes;
  }
}

void CostModel::ForceAlgorithm(const std::string& kind, const std::string& algorithm) {
  auto algos = Algorithms(kind);
  if (algorithm.empty() || algorithm == "auto") {
    forced_.erase(kind);
    return;
  }
  if (std::find(algos.begin(), algos.end(), algorithm) == algos.end()) {
    throw CommError("unknown algorithm '" + algorithm + "' for " + kind);
  }
  forced_[kind] = algorithm;
}

Estimate CostModel::Choose(const std::string& kind, double nbytes, const std::vector<int>& group) const {
  auto algos = Algorithms(kind);
  auto f = forced_.find(kind);
  if (f != forced_.end()) return {f->second, Time(kind, f->second, nbytes, group)};
  auto th = thresholds_.find(kind);
  if (th != thresholds_.end() && algos.size() > 1) {
    if (nbytes <= th->second) return {algos[0], Time(kind, algos[0], nbytes, group)};
    Estimate best{"", kInf};
    for (size_t i = 1; i < algos.size(); ++i) {
      double t = Time(kind, algos[i], nbytes, group);
      if (t < best.seconds) best = {algos[i], t};
    }
    return best;
  }
  Estimate best{algos[0], kInf};
  for (const auto& a : algos) {
    double t = Time(kind, a, nbytes, group);
    if (t < best.seconds) best = {a, t};
  }
  return best;
}

double CostModel::SmallMessageThreshold(const std::string& kind, const std::vector<int>& group) const {
  auto th = thresholds_.find(kind);
  if (th != thresholds_.end()) return th->second;
  auto algos = Algorithms(kind);
  if (algos.size() < 2) return 0;
  auto small_wins = [&](double n) {
    double t0 = Time(kind, algos[0], n, group);
    for (size_t i = 1; i < algos.size(); ++i)
      if (Time(kind, algos[i], n, group) < t0) return false;
    return true;
  };
  if (!small_wins(1)) return 0;
  double lo = 1, hi = 1;
  while (hi < 1e12 && small_wins(hi)) hi *= 2;
  if (hi >= 1e12) return hi;
  for (int it = 0; it < 60 && hi - lo > 1; ++it) {
    double mid = std::floor((lo + hi) / 2);
    if (small_wins(mid)) lo = mid; else hi = mid;
  }
  return lo;
}

}  // namespace mshyper::comm
