// Connecting a rank to its peers: every pair of ranks gets a FIFO in each direction, through the
// best transport that reaches the peer (inproc > shm; the network transport plugs in here).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/connector.h"

namespace braid {

enum class TransportKind { Self, Inproc, Shm };
const char* transportName(TransportKind kind);

// What the rendezvous tells every rank about every other.
struct PeerInfo {
  uint64_t hostHash = 0;  // host name and boot id
  uint64_t nonce = 0;     // random per rank and communicator: names shared resources
  int32_t pid = 0;
  int32_t rank = 0;
};

// State a rank exports to the peers on its host, so that a waiting peer can tell "slow" from
// "gone": which operation it is in, and whether it has failed or been aborted.
struct RankControl {
  alignas(64) std::atomic<uint64_t> opSeq{0};
  alignas(64) std::atomic<uint32_t> failed{0};
  std::atomic<uint32_t> departed{0};  // destroyed its communicator: its exit is no failure
  char reason[240] = {};  // why it failed, NUL-terminated, written before `failed` is set
};

struct FifoGeometry {
  size_t slotBytes = 0;
  int nSlots = 0;
};

// Everything a rank holds to talk to its peers; indexed by peer rank.
struct PeerLinks {
  std::vector<SendConnector> send;
  std::vector<RecvConnector> recv;
  std::vector<TransportKind> kind;
  std::vector<RankControl*> control;  // every peer on this host (and self)
  std::vector<int> pidfd;             // process peers on this host: readable once it exits; else -1
  std::vector<std::shared_ptr<void>> keepAlive;  // mappings and heap blocks peers may still touch

  PeerLinks() = default;
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;
  PeerLinks(PeerLinks&&) = default;
  PeerLinks& operator=(PeerLinks&&) = default;
  ~PeerLinks();
};

// Builds the links of `rank`. `barrier` synchronises all ranks of the communicator; it is called
// the same number of times on every rank.
PeerLinks connectPeers(const std::vector<PeerInfo>& peers, int rank, const FifoGeometry& geometry,
                       const std::function<void()>& barrier);

}  // namespace braid
