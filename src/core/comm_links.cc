#include "core/comm_links.h"

#include <cstring>

#include "base/error.h"
#include "base/log.h"

namespace braid {

CommLinks::LinkShare::~LinkShare() {
  if (links.control.empty()) return;
  RankControl* own = links.control[rank];
  if (own->failed.load(std::memory_order_acquire) == 0) {
    const Clock::time_point deadline = Clock::now() + timeout;  // one for every set
    for (const auto& service : links.services) service->finish(deadline);
    for (const PeerLinks& set : moreSets)
      for (const auto& service : set.services) service->finish(deadline);
  }
  own->departed.store(1, std::memory_order_release);
}

void CommLinks::meet(const BootstrapId& id, const PeerInfo& self, const std::string& settings,
                     Clock::time_point deadline) {
  std::string blob(reinterpret_cast<const char*>(&self), sizeof self);
  bootstrap_ = Bootstrap::join(id, rank_, nranks_, blob, deadline);
  peers_.resize(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    const std::string& info = bootstrap_->infos()[r];
    if (info.size() != sizeof(PeerInfo))
      fail(braidInternalError, "rank {}: rank {} published {} bytes of info, expected {}", rank_, r,
           info.size(), sizeof(PeerInfo));
    std::memcpy(&peers_[r], info.data(), sizeof(PeerInfo));
  }
  for (const PeerInfo& peer : peers_)
    if (peer.choiceHash != self.choiceHash)
      fail(braidInvalidUsage,
           "rank {}: rank {} chooses algorithms from other settings than this rank's ({}): "
           "every rank must set BRAID_ALGO (or config algorithms), BRAID_PROTO, BRAID_MODEL_*, "
           "BRAID_BUFFSIZE, BRAID_FIFO_SLOTS, BRAID_HOST_NCHANNELS, BRAID_HOST_CHANNEL_MIN_BYTES "
           "and BRAID_MIN/MAX_NCHANNELS (or config min/maxChannels) alike, or ranks would run one "
           "call two ways",
           rank_, peer.rank, settings);
}

Rendezvous CommLinks::rendezvousBy(Clock::time_point deadline) const {
  Bootstrap* bootstrap = bootstrap_.get();
  return {[bootstrap, deadline] { bootstrap->barrier(deadline); },
          [bootstrap, deadline](void* data, size_t bytes) {
            bootstrap->allGather(data, bytes, deadline);
          },
          deadline};
}

void CommLinks::connect(const CommLinks* parent, const std::vector<int>& parentRanks,
                        const FifoGeometry& geometry, std::chrono::milliseconds timeout,
                        Clock::time_point deadline, int sets, LinkKind kind) {
  // A CUDA communicator's links carry no host FIFOs, which a CPU child would run on.
  if (parent != nullptr && kind == LinkKind::HostFifos &&
      parent->share_->kind != LinkKind::HostFifos) {
    BRAID_INFO(log::kInit,
               "rank {}: its parent's links carry no host FIFOs (a CUDA communicator's): it "
               "connects its own",
               rank_);
    parent = nullptr;
  }
  if (parent != nullptr) {
    share_ = parent->share_;
    for (int r = 0; r < nranks_; ++r) linkIndex_.push_back(parent->linkIndex_[parentRanks[r]]);
    BRAID_INFO(log::kInit, "rank {}: shares the links of its parent (rank {} there)", rank_,
               parentRanks[rank_]);
  } else {
    const Rendezvous rendezvous = rendezvousBy(deadline);
    share_ = std::make_shared<LinkShare>();
    share_->rank = rank_;  // first: a further set failing leaves set 0 for ~LinkShare to end
    share_->kind = kind;
    share_->timeout = timeout;
    share_->links = connectPeers(peers_, rank_, geometry, rendezvous, {kind});
    for (int set = 1; set < sets; ++set)
      share_->moreSets.push_back(connectPeers(peers_, rank_, geometry, rendezvous, {kind, set}));
    for (int r = 0; r < nranks_; ++r) linkIndex_.push_back(r);
  }
  sendTo_.resize(1 + share_->moreSets.size());
  recvFrom_.resize(sendTo_.size());
  for (int set = 0; set < linkSets(); ++set) {
    PeerLinks& links = set == 0 ? share_->links : share_->moreSets[set - 1];
    for (int r = 0; r < nranks_; ++r) {
      sendTo_[set].push_back(&links.send[linkIndex_[r]]);
      recvFrom_[set].push_back(&links.recv[linkIndex_[r]]);
    }
  }
}

PeerLinks CommLinks::connectDevice(const DeviceConnect& device, Clock::time_point deadline) const {
  return connectPeers(peers_, rank_, {}, rendezvousBy(deadline),
                      {LinkKind::DeviceFifos, 0, &device});
}

void CommLinks::allGatherOutOfBand(void* data, size_t bytes, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(turn());  // the bootstrap ring: one exchange at a time
  bootstrap_->allGather(data, bytes, Clock::now() + timeout);
}

BootstrapId CommLinks::shrunkId(const std::vector<int>& survivors) {
  std::lock_guard<std::mutex> lock(turn());
  return bootstrap_->shrunkId(survivors, ++shrinks_[survivors]);
}

int CommLinks::pidfd(int r) const {
  return share_->links.pidfd.empty() ? -1 : share_->links.pidfd[linkIndex_[r]];
}

}  // namespace braid
