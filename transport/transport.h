// Connecting a rank to its peers: every pair of ranks gets a FIFO in each direction, through the
// best transport that reaches the peer (inproc > shm > net).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/wait.h"
#include "transport/connector.h"

namespace braid {

namespace net {
class Proxy;
}

enum class TransportKind { Self, Inproc, Shm, Net };
const char* transportName(TransportKind kind);

// What the rendezvous tells every rank about every other.
struct PeerInfo {
  uint64_t hostHash = 0;     // host name, boot id and network namespace
  uint64_t machineHash = 0;  // host name and boot id: the ranks that share this machine's cores
  uint64_t nonce = 0;        // random per rank and communicator: names shared resources
  int32_t pid = 0;
  int32_t rank = 0;
  uint64_t cpus[16] = {};  // CPUs the rank may run on: bit c of word c / 64, c < 1024
  int32_t numa = -1;       // NUMA node the rank runs on; -1 when not known
  int32_t nicNuma = -1;    // NUMA node of the host's network interface; -1 when not known
  double nicGBs = 0;       // that interface's GB/s per direction (plan/host_graph.h)
  int32_t virtualNic = 0;  // 1: a veth, bridge or loopback (plan/host_graph.h)
  double llcBytes = 0;     // last-level cache of the rank's CPU; 0: unknown
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
  std::shared_ptr<net::Proxy> netProxy;          // serves the peers on other hosts, if any

  PeerLinks() = default;
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;
  PeerLinks(PeerLinks&&) = default;
  PeerLinks& operator=(PeerLinks&&) = default;
  ~PeerLinks();
};

// What the bootstrap lends the transports while they connect. Every rank calls each function the
// same number of times.
struct Rendezvous {
  std::function<void()> barrier;
  // `data` holds one slice of `bytesPerRank` per rank, this rank's filled; on return all are.
  std::function<void(void* data, size_t bytesPerRank)> allGather;
  Clock::time_point deadline;
};

// Builds the links of `rank`.
PeerLinks connectPeers(const std::vector<PeerInfo>& peers, int rank, const FifoGeometry& geometry,
                       const Rendezvous& rendezvous);

}  // namespace braid
