// Cluster topology (devices, bidirectional links with latency and bandwidth, optional node
// membership), path selection, ring ordering and hierarchy detection; and the alpha-beta cost
// model that chooses collective algorithms over it.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mshyper::comm {

struct Link {
  int a;
  int b;
  double latency_s;
  double bandwidth_Bps;  // bytes per second
};

struct PathInfo {
  double latency_s = 0;       // sum over hops
  double bandwidth_Bps = 0;   // narrowest hop
  std::vector<int> devices;   // a ... b
};

class Topology {
 public:
  // node_of: node id per device, or empty when the topology has no node structure.
  Topology(std::string name, int num_devices, std::vector<int> node_of = {});

  void AddLink(int a, int b, double latency_s, double bandwidth_Bps);

  // Presets. num_devices <= 0 means the preset's default (384, 16, 8).
  //  supernode384: full mesh, 200 ns per hop, 15x the conventional 25 GB/s (375 GB/s).
  //  node8: nodes of 8 devices (full mesh, 1 us, 56 GB/s) joined by 12.5 GB/s, 10 us links.
  //  ring: each device linked to its two neighbours, 1 us, 25 GB/s.
  static std::shared_ptr<Topology> Preset(const std::string& name, int num_devices);
  static constexpr double kConventionalBandwidth = 25e9;

  const std::string& name() const { return name_; }
  int num_devices() const { return n_; }
  const std::vector<Link>& links() const { return links_; }
  bool has_nodes() const { return !node_of_.empty(); }
  int node_of(int device) const;

  // Lowest-latency path (Dijkstra over latency; ties by fewer hops), bandwidth = narrowest hop.
  PathInfo Path(int a, int b) const;
  double Latency(int a, int b) const;
  double Bandwidth(int a, int b) const;

  // Ring through `devices` (the first stays first), each step to the nearest remaining device
  // (lowest latency, then highest bandwidth, then input order), then improved by 2-opt. Cached.
  std::vector<int> RingOrder(const std::vector<int>& devices) const;
  // True when every pair's latency and bandwidth are within `tolerance` x of each other.
  bool IsUniform(const std::vector<int>& devices, double tolerance = 1.5) const;
  // Devices grouped into clusters of cheap links: by node membership when known, otherwise by
  // path latency <= 2x the smallest pairwise latency (connected components). Ordered by first member.
  // Cached.
  std::vector<std::vector<int>> Clusters(const std::vector<int>& devices) const;

  void Validate(const std::vector<int>& devices) const;  // every id in range, no duplicates

 private:
  void EnsureSource(int src) const;
  std::vector<int> ComputeRingOrder(const std::vector<int>& devices) const;
  std::vector<std::vector<int>> ComputeClusters(const std::vector<int>& devices) const;
  mutable std::mutex cache_mu_;
  mutable std::map<std::vector<int>, std::vector<int>> ring_cache_;
  mutable std::map<std::vector<int>, std::vector<std::vector<int>>> cluster_cache_;
  std::string name_;
  int n_;
  std::vector<int> node_of_;
  std::vector<Link> links_;
  std::vector<std::vector<std::pair<int, int>>> adj_;  // device -> (neighbour, link index)
  mutable std::mutex mu_;
  mutable std::vector<std::vector<double>> dist_;      // per source, lazily
  mutable std::vector<std::vector<double>> bw_;
  mutable std::vector<std::vector<int>> prev_;
};

// Per-transport software costs, added to every link of the topology: alpha per message,
// beta per byte moved, gamma per byte reduced. calibrate() measures them.
struct TransportParams {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  double gamma_s_per_byte = 0;
};

struct Estimate {
  std::string algorithm;
  double seconds;
};

// Collective kinds: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, barrier,
// send_recv. nbytes: all_reduce/broadcast the buffer; all_gather the gathered output;
// reduce_scatter the input; all_to_all what one rank sends in total; send_recv the message.
class CostModel {
 public:
  CostModel(std::shared_ptr<const Topology> topology, TransportParams params);

  std::vector<std::string> Algorithms(const std::string& kind) const;
  double Time(const std::string& kind, const std::string& algorithm, double nbytes,
              const std::vector<int>& group) const;   // +inf when the algorithm does not apply
  // The algorithm to run: a forced one, else a user threshold, else the model's minimum.
  Estimate Choose(const std::string& kind, double nbytes, const std::vector<int>& group) const;
  // Largest size at which the latency-optimal algorithm still wins (model), or a user override.
  double SmallMessageThreshold(const std::string& kind, const std::vector<int>& group) const;

  // User overrides. threshold < 0 removes it; algorithm "" / "auto" removes a forced choice.
  void SetThreshold(const std::string& kind, double bytes);
  void ForceAlgorithm(const std::string& kind, const std::string& algorithm);
  const std::map<std::string, double>& thresholds() const { return thresholds_; }
  const std::map<std::string, std::string>& forced() const { return forced_; }

  const TransportParams& params() const { return params_; }
  void set_params(const TransportParams& p) { params_ = p; }
  std::shared_ptr<const Topology> topology() const { return topo_; }

 private:
  struct EdgeCost {
    double alpha;
    double beta;
  };
  // Topology-only facts of one group (latency, 1/bandwidth maxima), computed once per group;
  // the transport params are added on top.
  struct GroupCost {
    EdgeCost ring{0, 0};   // worst edge of the chosen ring
    EdgeCost pair{0, 0};   // worst pair
    bool hier = false;     // equal clusters, at least 2, not all singletons
    double L = 0, k = 0;   // cluster size, cluster count
    EdgeCost in{0, 0}, out{0, 0};
  };
  EdgeCost TopoEdge(int a, int b) const;
  EdgeCost WorstRing(const std::vector<int>& ring) const;
  const GroupCost& Group(const std::vector<int>& group) const;
  std::shared_ptr<const Topology> topo_;
  mutable std::mutex mu_;
  mutable std::map<std::vector<int>, GroupCost> groups_;
  TransportParams params_;
  std::map<std::string, double> thresholds_;
  std::map<std::string, std::string> forced_;
};

}  // namespace mshyper::comm
