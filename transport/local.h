// Transports between ranks of one host: inproc (threads of one process, FIFOs on the heap) and
// shm (processes, FIFOs in shared memory files that the receiver creates).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace braid {

// The transports of this file, for the registry (transport.cc).
const Transport* inprocTransport();
const Transport* shmTransport();

// Zeroed, page-aligned heap memory.
std::shared_ptr<void> allocateZeroed(size_t bytes);

// The ranks of one communicator that live in this process share a clique: the FIFOs between
// them and their control blocks. Peers hold it until the last of them is destroyed.
class InprocClique {
 public:
  // The clique named `key` (the nonce of its lowest rank), created by the first to ask.
  static std::shared_ptr<InprocClique> join(uint64_t key);

  // The FIFO memory from `sender` to `receiver`, created zeroed on first request.
  void* fifo(int sender, int receiver, size_t bytes);
  // `memory` holds `control`; the clique keeps it until its last rank is destroyed.
  void publishControl(int rank, RankControl* control, std::shared_ptr<void> memory);
  RankControl* control(int rank);

  struct Impl;  // shared by the clique's ranks; the registry holds it weakly

 private:
  std::shared_ptr<Impl> impl_;
};

// One rank's shared-memory segment: its control block, then one receive FIFO per process peer
// on this host, in the order the creator was given. A memory file without a name (memfd), whose
// descriptor the peers receive from its creator (shm.cc), so no rank's death leaves it behind.
class ShmSegment {
 public:
  // What the segment and its rank's socket are called: unique per communicator's link set.
  static std::string label(uint64_t commNonce, int rank);
  // Creates the segment, reserving its memory so that too little fails here, loudly; keeps its
  // descriptor for the peers until closeDescriptor().
  static std::shared_ptr<ShmSegment> create(const std::string& label, size_t bytes, int rank);
  // Maps a peer's segment from the descriptor it sent (closed here).
  static std::shared_ptr<ShmSegment> adopt(int fd, int selfRank, int ownerRank);
  ~ShmSegment();

  int descriptor() const { return fd_; }
  void closeDescriptor();
  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  ShmSegment(uint8_t* base, size_t size, int fd) : base_(base), size_(size), fd_(fd) {}
  uint8_t* base_;
  size_t size_;
  int fd_;
};

// Layout of a segment: control block first (its own page), then the FIFOs.
constexpr size_t kControlBytes = 4096;
static_assert(sizeof(RankControl) <= kControlBytes);

}  // namespace braid
