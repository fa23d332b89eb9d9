// Connecting a rank to its peers: every pair of ranks gets links of the kind asked for (a FIFO in
// each direction, or for ranks of one host their control blocks alone), through the first
// transport of the registry (priority order: inproc > p2p > shm > net) that carries that kind and
// can connect them. Transports plug in by joining the registry (transport.cc); the communicator
// sees only PeerLinks and the LinkServices they hold.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/wait.h"
#include "transport/connector.h"

namespace braid {

// What the rendezvous tells every rank about every other.
struct PeerInfo {
  uint64_t hostHash = 0;     // host name, boot id and network namespace
  uint64_t machineHash = 0;  // the boot id: the ranks that share this kernel's cores
  uint64_t nonce = 0;        // random per rank and communicator: names shared resources
  int32_t pid = 0;
  int32_t rank = 0;
  uint64_t cpus[16] = {};  // CPUs the rank may run on: bit c of word c / 64, c < 1024
  int32_t numa = -1;       // NUMA node the rank runs on; -1 when not known
  int32_t nicNuma = -1;    // NUMA node of the host's network interface; -1 when not known
  double nicGBs = 0;       // that interface's GB/s per direction (plan/host_graph.h)
  int32_t virtualNic = 0;  // 1: a veth, bridge or loopback (plan/host_graph.h)
  double llcBytes = 0;     // last-level cache of the rank's CPU; 0: unknown
  // The settings from which every rank chooses each call's algorithm on its own (algorithms,
  // protocols, model constants, FIFO sizes): they must agree, so each rank publishes their hash.
  uint64_t choiceHash = 0;
};

// State a rank exports to the peers on its host, so that a waiting peer can tell "slow" from
// "gone": which operation it is in, and whether it has failed or been aborted.
struct RankControl {
  alignas(64) std::atomic<uint64_t> opSeq{0};
  alignas(64) std::atomic<uint32_t> failed{0};
  std::atomic<uint32_t> departed{0};  // destroyed its communicator: its exit is no failure
  // Why it failed, NUL-terminated, written before `failed` is set. Room for a chain: a rank that
  // fails because a peer did quotes that peer's reason, which may quote another's.
  char reason[1024] = {};
  // The collective it runs (or ran last) on the host executor, so that a waiting peer can tell a
  // call that differs from its own where no slot of it may ever come (publishCall): a sequence
  // lock, `callVersion` odd while the tag is written.
  alignas(64) std::atomic<uint64_t> callVersion{0};
  std::atomic<uint64_t> callTag[4] = {};
};

// The rank's collective call in its control block, written by the rank's own thread only.
inline void publishCall(RankControl& self, const CallTag& tag) {
  static_assert(sizeof(CallTag) == sizeof self.callTag);
  uint64_t words[4];
  std::memcpy(words, &tag, sizeof words);
  const uint64_t version = self.callVersion.load(std::memory_order_relaxed);
  self.callVersion.store(version + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (int i = 0; i < 4; ++i) self.callTag[i].store(words[i], std::memory_order_relaxed);
  self.callVersion.store(version + 2, std::memory_order_release);
}

// The call a rank published; nothing if it has published none or was rewriting it meanwhile.
inline std::optional<CallTag> publishedCall(const RankControl& rank) {
  const uint64_t before = rank.callVersion.load(std::memory_order_acquire);
  if (before == 0 || before % 2 != 0) return std::nullopt;
  uint64_t words[4];
  for (int i = 0; i < 4; ++i) words[i] = rank.callTag[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (rank.callVersion.load(std::memory_order_relaxed) != before) return std::nullopt;
  CallTag tag;
  std::memcpy(&tag, words, sizeof words);
  return tag;
}

struct FifoGeometry {
  size_t slotBytes = 0;
  int nSlots = 0;
};

// What a set of links carries. A CPU communicator's FIFOs are in host memory (inproc, shm, net); a
// CUDA communicator's in memory its kernels reach (p2p, net), and its host links carry no FIFOs,
// only what ranks on one host share of each other: control blocks and pidfds (inproc, shm).
enum class LinkKind : uint8_t { HostFifos, DeviceFifos, HostPresence };

struct DeviceConnect;  // transport/p2p.h: what a CUDA communicator's FIFOs need
class P2pLinks;        // transport/p2p.h: those FIFOs, as its kernels reach them

// What a transport keeps running for a communicator once it is connected: a progress thread
// that moves its FIFOs (the network proxy), say. The communicator tells it when operations run
// and asks it about failures, without knowing which transport it serves.
class LinkService {
 public:
  virtual ~LinkService() = default;
  // Threads it keeps busy while an operation runs (the communicator's spin budget counts them).
  virtual int busyThreads() const = 0;
  // An operation of the rank starts or ends.
  virtual void operationStarted() {}
  virtual void operationFinished() {}
  // The communicator ends in good order: deliver what the rank posted, until `deadline`.
  virtual void finish(Clock::time_point deadline) {}
  // Moves, on the calling (waiting) thread, what it can of the links with `peer` (-1: all);
  // true if anything moved.
  virtual bool drive(int peer) { return false; }
  // The thread that called drive() stops calling it (its wait sleeps): whoever else moves the
  // links must take them back.
  virtual void stopDriving() {}
  // The story of a failed link, preferring one with `peer`; nothing while all are well.
  virtual std::optional<std::string> failure(int peer) const { return std::nullopt; }
  // The rank failed: tell the peers it serves why, best effort and without waiting for them, as
  // the rank's RankControl tells the ranks on its host. Its links carry nothing more.
  virtual void abandon(const std::string& reason) {}
};

// Everything a rank holds to talk to its peers; indexed by peer rank.
struct PeerLinks {
  std::vector<SendConnector> send;
  std::vector<RecvConnector> recv;
  std::vector<RankControl*> control;  // every peer on this host (and self)
  std::vector<int> pidfd;             // process peers on this host: readable once it exits; else -1
  std::vector<std::shared_ptr<void>> keepAlive;  // mappings and heap blocks peers may still touch
  std::vector<std::shared_ptr<LinkService>> services;  // what the transports keep running
  std::shared_ptr<P2pLinks> device;                    // a set of LinkKind::DeviceFifos

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

// Links to other hosts that a transport of the set asks the network transport for, beside or
// instead of one per peer (the device FIFOs' hops: per channel, protocol and tree), and where it
// takes their FIFOs once made.
struct NetworkHops {
  struct Hop {
    int peer = 0;
    int index = 0;  // distinct for each of the peer's hops, alike on both ends (< kMaxLinksPerPeer)
    FifoGeometry geometry;
    bool flaggedLines = false;  // the receiver reads 8-byte lines as they land (LlPorts)
  };
  std::vector<Hop> hops;
  // The FIFOs' memory, `bytes` zeroed, freed with the last owner.
  std::function<std::shared_ptr<void>(size_t bytes)> allocate;
  // hops[hop]'s FIFOs: the one the rank fills and the proxy sends, and the one it reads.
  std::function<void(size_t hop, const FifoDesc& send, const FifoDesc& recv)> attach;
};

// One rank's connecting, as the transports see it.
struct ConnectState {
  const std::vector<PeerInfo>& peers;
  int rank;
  LinkKind kind;
  FifoGeometry geometry;        // of host FIFOs
  const DeviceConnect* device;  // LinkKind::DeviceFifos: what the FIFOs need
  const Rendezvous& rendezvous;
  PeerLinks& links;
  // Names the communicator's shared resources: rank 0's nonce, salted for a further set of links.
  uint64_t commNonce;
  uint64_t setSalt;  // 0 for a communicator's first set of links; distinct for each further one
  // This rank's control block: a transport whose peers read it from another process places it in
  // memory they map (setup); otherwise it is allocated on the heap before publish.
  RankControl* control = nullptr;
  // The memory holding `control`: peers in this process keep it until they are gone too, since
  // a rank that fails and is destroyed first must not take with it the block they read.
  std::shared_ptr<void> controlMemory;
  // Hops asked of the network transport by a transport set up before it (p2p), or nothing.
  NetworkHops* networkHops = nullptr;

  bool hostFifos() const { return kind == LinkKind::HostFifos; }
  size_t fifoBytes() const { return FifoDesc::footprint(geometry.slotBytes, geometry.nSlots); }
};

// A transport's part of one rank's connecting, in the phases every rank runs together:
// setup (Transport::setup) -> publish -> barrier -> connect -> barrier -> connected.
class TransportSetup {
 public:
  virtual ~TransportSetup() = default;
  // The control block is final: make it known to the peers that read it through this transport.
  virtual void publish(ConnectState& state) {}
  // Every rank has published: attach to the peers, setting links.send/recv (and control, pidfd).
  virtual void connect(ConnectState& state) = 0;
  // Every rank has connected (names of shared resources may go).
  virtual void connected(ConnectState& state) {}
};

// A way for two ranks to move bytes (NCCL's canConnect/setup/connect shape).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Whether it makes links of this kind at all.
  virtual bool carries(LinkKind kind) const = 0;
  // Whether it can carry the links between these two ranks (never asked for a rank and itself).
  virtual bool canConnect(const PeerInfo& self, const PeerInfo& peer) const = 0;
  // Whether a set of `kind` sets it up on every rank, peers or none (what it makes serves the rank
  // itself too, and its setup all-gathers).
  virtual bool setsUpEveryRank(LinkKind kind) const { return false; }
  // Begins connecting this rank with `peers`, the ones it was chosen for (none only where
  // setsUpEveryRank): makes what they will attach to. A transport whose setup must meet every rank
  // (an all-gather of addresses) must be chosen on every rank or on none.
  virtual std::unique_ptr<TransportSetup> setup(ConnectState& state,
                                                const std::vector<int>& peers) const = 0;
};

// A transport made of its name, the kinds of links it carries, its canConnect rule and the setup
// it starts (a TransportSetup constructed from the ConnectState and the chosen peers).
template <class Setup>
class TransportOf final : public Transport {
 public:
  using Rule = bool (*)(const PeerInfo& self, const PeerInfo& peer);
  TransportOf(const char* name, std::initializer_list<LinkKind> kinds, Rule canConnect,
              std::optional<LinkKind> everyRankOf = std::nullopt)
      : name_(name), canConnect_(canConnect), everyRankOf_(everyRankOf) {
    for (LinkKind kind : kinds) kinds_ |= bit(kind);
  }
  const char* name() const override { return name_; }
  bool carries(LinkKind kind) const override { return (kinds_ & bit(kind)) != 0; }
  bool canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    return canConnect_(self, peer);
  }
  bool setsUpEveryRank(LinkKind kind) const override { return everyRankOf_ == kind; }
  std::unique_ptr<TransportSetup> setup(ConnectState& state,
                                        const std::vector<int>& peers) const override {
    return std::make_unique<Setup>(state, peers);
  }

 private:
  static unsigned bit(LinkKind kind) { return 1u << static_cast<unsigned>(kind); }
  const char* name_;
  unsigned kinds_ = 0;
  Rule canConnect_;
  std::optional<LinkKind> everyRankOf_;
};

// The registry, in priority order: a peer is connected by the first that carries the kind of
// links asked for and can connect it.
const std::vector<const Transport*>& transports();

// Which links connectPeers builds: their kind, and which set of the communicator they are: its
// first (0), or a further one (a CPU channel), whose FIFOs and shared resources are its own.
struct LinkRequest {
  LinkKind kind = LinkKind::HostFifos;
  int linkSet = 0;
  const DeviceConnect* device = nullptr;  // LinkKind::DeviceFifos
};

// Builds the links of `rank` (`geometry`: of host FIFOs). Every rank builds the same sets in the
// same order. Ranks on other hosts get no links of LinkKind::HostPresence.
PeerLinks connectPeers(const std::vector<PeerInfo>& peers, int rank, const FifoGeometry& geometry,
                       const Rendezvous& rendezvous, const LinkRequest& request = {});

}  // namespace braid
