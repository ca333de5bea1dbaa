// Shared-memory transport between processes on one host: one POSIX shared-memory segment per
// group holding a header (pids, attach count, abort flag) and size*size SPSC channels
// (layout and checks: shm_segment.h).
//
// Lifetime: rank 0 builds the segment under a private creation temporary named for its pid
// (`<name>.<pid>.<n>.init`), sizes it, writes the header and publishes it under `name` with link(),
// so the name never shows a segment without a header; an existing segment of that name is removed
// only when stale (its creator is gone, or it is blank -- an older version's creator died before
// writing the header -- for longer than the group timeout); a live one is another group's:
// CommError naming the segment and why. The others open it; the LAST rank to attach unlinks the name. From then on nothing is left in /dev/shm
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
  // Blocks until every rank attached (or `timeout` seconds passed -> CommTimeout). CommError when
  // `name` ends like a creation temporary, or (rank 0) a segment of that name exists and is not stale.
  ShmTransport(const std::string& name, int rank, int size, size_t channel_bytes, double timeout);
  ~ShmTransport() override;
  std::string name() const override { return "shm"; }
  const std::string& segment_name() const { return seg_name_; }
  size_t segment_bytes() const { return total_; }
  int peer_pid(int peer) const;
  bool DirectCapable() override;
  void DirectRead(int peer, uint64_t remote, void* local, size_t n, const char* what) override;

  // Removes from /dev/shm, among this user's names starting with `prefix`: segments whose creating
  // process is gone, creation temporaries whose pid (in the name, and in the header where written)
  // is gone, and blank segments (no header) unchanged for more than `blank_age_s` seconds.
  // Never one of a live process. Returns the count removed.
  static int CleanupStale(const std::string& prefix, double blank_age_s);

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
