// A communicator's links to its peers: every rank's facts from the rendezvous, the bootstrap ring
// it keeps for exchanges out of band, and the transports' connectors to every peer, shared with
// the communicators split or shrunk from it with splitShare/shrinkShare, which then take turns:
// one operation at a time across all of them, numbered together. When the last sharer lets go,
// the rank departs: what it sent to other hosts leaves before the connections close, unless it
// failed (its peers then see it as lost), and peers watching this process learn that its exit is
// no crash.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/wait.h"
#include "core/bootstrap.h"
#include "transport/transport.h"

namespace braid {

class CommLinks {
 public:
  CommLinks(int rank, int nranks) : rank_(rank), nranks_(nranks) {}

  // The rendezvous: publishes `self` and gathers every rank's facts. Fails (braidInvalidUsage)
  // where a rank chooses algorithms from other settings (PeerInfo::choiceHash), quoting this
  // rank's `settings`.
  void meet(const BootstrapId& id, const PeerInfo& self, const std::string& settings,
            Clock::time_point deadline);
  // Connects to every peer by `deadline`, or takes `parent`'s links, where rank r of this
  // communicator is rank parentRanks[r]. `timeout`: how long the network may take to deliver
  // when the last sharer lets go.
  // `sets` sets of them: the first, and one more for each further CPU channel (hostChannels),
  // each with FIFOs of its own; a child takes its parent's, unless it needs host FIFOs they lack.
  // LinkKind::HostFifos for a CPU communicator, LinkKind::HostPresence for a CUDA one.
  void connect(const CommLinks* parent, const std::vector<int>& parentRanks,
               const FifoGeometry& geometry, std::chrono::milliseconds timeout,
               Clock::time_point deadline, int sets = 1, LinkKind kind = LinkKind::HostFifos);
  // A CUDA communicator's device FIFOs, through the same registry, by `deadline` (every rank calls
  // it, on its device): its own, never shared, since its kernels keep their counters.
  PeerLinks connectDevice(const DeviceConnect& device, Clock::time_point deadline) const;
  bool connected() const { return share_ != nullptr; }
  // Whether `other` uses the same links (they take turns).
  bool sharedWith(const CommLinks& other) const {
    return this != &other && share_ != nullptr && share_ == other.share_;
  }

  Bootstrap& bootstrap() const { return *bootstrap_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  // The connectors by rank of this communicator, of the first set of links or of set `linkSet`.
  const std::vector<SendConnector*>& sendTo(int linkSet = 0) const { return sendTo_[linkSet]; }
  const std::vector<RecvConnector*>& recvFrom(int linkSet = 0) const { return recvFrom_[linkSet]; }
  int linkSets() const { return static_cast<int>(sendTo_.size()); }
  // Rank r's control block (ranks on this host), and its index in the shared links (what the
  // link services name peers by).
  RankControl* control(int r) const { return share_->links.control[linkIndex_[r]]; }
  bool hasControls() const { return share_ != nullptr && !share_->links.control.empty(); }
  int linkIndex(int r) const { return linkIndex_[r]; }
  // Rank r's process as a pidfd (readable once it exits), -1 where none.
  int pidfd(int r) const;
  const PeerLinks& links(int linkSet = 0) const {
    return linkSet == 0 ? share_->links : share_->moreSets[linkSet - 1];
  }
  // f(service) for the services of every set.
  template <class F>
  void forEachService(F f) const {
    for (int set = 0; set < linkSets(); ++set)
      for (const auto& service : links(set).services) f(*service);
  }

  // The sharers' turn: held for an operation, or an exchange over the bootstrap ring.
  std::mutex& turn() const { return share_->opMutex; }
  // The next operation's number across the sharers (the caller holds turn()).
  uint64_t nextOperation() { return ++share_->opSeq; }

  // Exchanges out of band, over the bootstrap ring in the sharers' turn (communicator
  // management), within `timeout` of the turn's coming. Every rank all-gathers `bytes` per rank:
  // data holds nranks slices, this rank's filled.
  void allGatherOutOfBand(void* data, size_t bytes, std::chrono::milliseconds timeout);
  // The id of the communicator of `survivors` (braidCommShrink; see Bootstrap::shrunkId), counted
  // per survivor set: only its members call, so every one of them counts alike.
  BootstrapId shrunkId(const std::vector<int>& survivors);

 private:
  struct LinkShare {
    LinkKind kind = LinkKind::HostFifos;
    PeerLinks links;
    std::vector<PeerLinks> moreSets;      // the further CPU channels' links
    int rank = 0;                         // this rank's index in links
    std::chrono::milliseconds timeout{};  // how long the network may take to deliver at the end
    std::mutex opMutex;
    uint64_t opSeq = 0;  // under opMutex
    ~LinkShare();
  };

  const int rank_;
  const int nranks_;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<PeerInfo> peers_;
  std::shared_ptr<LinkShare> share_;
  std::vector<int> linkIndex_;  // this communicator's rank -> index into share_->links
  std::vector<std::vector<SendConnector*>> sendTo_;  // per set of links
  std::vector<std::vector<RecvConnector*>> recvFrom_;
  std::map<std::vector<int>, uint64_t> shrinks_;  // per survivor set, in the sharers' turn

  Rendezvous rendezvousBy(Clock::time_point deadline) const;
};

}  // namespace braid
