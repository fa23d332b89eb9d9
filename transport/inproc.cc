#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "base/error.h"
#include "transport/local.h"

namespace braid {

// Fresh anonymous pages read as zero and take memory only once written: a FIFO costs what its
// traffic touches (a network peer's FIFOs exist from init, and most are never used).
std::shared_ptr<void> allocateZeroed(size_t bytes) {
  constexpr size_t kPage = 4096;
  const size_t rounded = std::max(kPage, (bytes + kPage - 1) / kPage * kPage);
  void* memory = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED)
    failErrno(braidSystemError, "allocating " + std::to_string(bytes) + " bytes (mmap)", errno);
  return std::shared_ptr<void>(memory, [rounded](void* p) { munmap(p, rounded); });
}

struct InprocClique::Impl {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::shared_ptr<void>> fifos;
  std::map<int, RankControl*> controls;
  std::vector<std::shared_ptr<void>> controlMemory;  // held until the clique's last rank is gone
};

namespace {
std::mutex gRegistryMutex;
std::map<uint64_t, std::weak_ptr<InprocClique::Impl>> gRegistry;
}  // namespace

std::shared_ptr<InprocClique> InprocClique::join(uint64_t key) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  for (auto it = gRegistry.begin(); it != gRegistry.end();)
    it = it->second.expired() ? gRegistry.erase(it) : std::next(it);
  auto clique = std::make_shared<InprocClique>();
  std::shared_ptr<Impl> impl = gRegistry[key].lock();
  if (!impl) {
    impl = std::make_shared<Impl>();
    gRegistry[key] = impl;
  }
  clique->impl_ = impl;
  return clique;
}

void* InprocClique::fifo(int sender, int receiver, size_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& memory = impl_->fifos[{sender, receiver}];
  if (!memory) memory = allocateZeroed(bytes);
  return memory.get();
}

void InprocClique::publishControl(int rank, RankControl* control, std::shared_ptr<void> memory) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->controls[rank] = control;
  impl_->controlMemory.push_back(std::move(memory));
}

RankControl* InprocClique::control(int rank) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->controls.find(rank);
  if (it == impl_->controls.end())
    fail(braidInternalError, "rank {} did not publish its control block to its process peers",
         rank);
  return it->second;
}

namespace {

// Threads of one process: FIFOs on the heap, shared through the process's clique.
class InprocSetup : public TransportSetup {
 public:
  InprocSetup(ConnectState& state, std::vector<int> peers) : peers_(std::move(peers)) {
    const int lowestLocal = std::min(state.rank, peers_.front());
    clique_ = InprocClique::join(state.peers[lowestLocal].nonce ^ state.setSalt);
    state.links.keepAlive.push_back(std::shared_ptr<void>(clique_, clique_.get()));
  }
  void publish(ConnectState& state) override {
    clique_->publishControl(state.rank, state.control, state.controlMemory);
  }
  void connect(ConnectState& state) override {
    const int rank = state.rank;
    const FifoGeometry& g = state.geometry;
    for (int peer : peers_) {
      state.links.control[peer] = clique_->control(peer);
      if (!state.hostFifos()) continue;
      state.links.send[peer] = SendConnector(
          FifoDesc::over(clique_->fifo(rank, peer, state.fifoBytes()), g.slotBytes, g.nSlots), rank,
          peer);
      state.links.recv[peer] = RecvConnector(
          FifoDesc::over(clique_->fifo(peer, rank, state.fifoBytes()), g.slotBytes, g.nSlots), rank,
          peer);
    }
  }

 private:
  std::vector<int> peers_;
  std::shared_ptr<InprocClique> clique_;
};

}  // namespace

const Transport* inprocTransport() {
  static const TransportOf<InprocSetup> transport(
      "inproc", {LinkKind::HostFifos, LinkKind::HostPresence},
      [](const PeerInfo& self, const PeerInfo& peer) {
        return peer.hostHash == self.hostHash && peer.pid == self.pid;
      });
  return &transport;
}

}  // namespace braid
