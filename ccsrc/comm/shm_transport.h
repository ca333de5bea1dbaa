// Shared-memory transport between processes on one host: one POSIX shared-memory segment per
// group holding a header (pids, attach count, abort flag) and size*size SPSC channels
// (layout and checks: shm_segment.h).
//
// Lifetime: rank 0 creates the segment (removing one of the same name only when its creator
// process is gone; a live one is another group's: CommError naming the segment); the others
// open it; the LAST rank to attach unlinks the name. From then on nothing is left in /dev/shm
// whatever happens to any rank (the kernel frees the memory when the last mapping goes). A rank
// that gives up while waiting for the others to attach unlinks the name too.
//
// Trust: a rank attaches only to a segment that is a regular file of its own user with mode
// 0600 (checked before mapping), validates the header and every channel header against its
// own layout once, and from then on uses its own copies of the geometry and of the peers' pids.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "comm/shm_segment.h"

#include "comm/transport.h"

namespace mshyper::comm {

class ShmTransport : public Transport {
 public:
  // Blocks until every rank attached (or `timeout` seconds passed -> CommTimeout).
  ShmTransport(const std::string& name, int rank, int size, size_t channel_bytes, double timeout);
  ~ShmTransport() override;
  std::string name() const override { return "shm"; }
  const std::string& segment_name() const { return seg_name_; }
  size_t segment_bytes() const { return total_; }
  int peer_pid(int peer) const;
  bool DirectCapable() override;
  void DirectRead(int peer, uint64_t remote, void* local, size_t n, const char* what) override;

  // Removes segments named `prefix*` in /dev/shm whose creating process is gone; returns the count.
  static int CleanupStale(const std::string& prefix);

 protected:
  Channel& Out(int peer) override { return channels_[static_cast<size_t>(rank_) * size_ + peer]; }
  Channel& In(int peer) override { return channels_[static_cast<size_t>(peer) * size_ + rank_]; }
  bool PeerDead(int peer, std::string* detail) override;
  bool IsAborted(std::string* why) override;
  void SetAborted(const std::string& why) override;

 private:
  // Rank 0 initialises, the others validate; every rank counts itself in and waits for the rest.
  void Attach(std::chrono::steady_clock::time_point deadline);

  std::string seg_name_;
  SegmentLayout layout_;
  std::vector<int32_t> pids_;  // every rank's pid, copied once the group formed
  char* base_ = nullptr;
  size_t total_ = 0;
  std::vector<Channel> channels_;
  int direct_ = -1;  // -1 not probed, 0 no, 1 yes
};

}  // namespace mshyper::comm
