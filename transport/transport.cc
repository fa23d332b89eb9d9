#include "transport/transport.h"

#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "transport/local.h"
#include "transport/net/net_transport.h"

namespace braid {

PeerLinks::~PeerLinks() {
  for (int fd : pidfd)
    if (fd >= 0) close(fd);
}

const std::vector<const Transport*>& transports() {
  static const std::vector<const Transport*> registry = {inprocTransport(), shmTransport(),
                                                         net::netTransport()};
  return registry;
}

PeerLinks connectPeers(const std::vector<PeerInfo>& peers, int rank, const FifoGeometry& geometry,
                       const Rendezvous& rendezvous, int linkSet) {
  const int nranks = static_cast<int>(peers.size());
  const PeerInfo& self = peers[rank];
  PeerLinks links;
  links.send.resize(nranks);
  links.recv.resize(nranks);
  links.control.assign(nranks, nullptr);
  links.pidfd.assign(nranks, -1);
  // Segments are named after rank 0's nonce: unique per communicator, known to every rank; a
  // further set of links salts it.
  const uint64_t salt = static_cast<uint64_t>(linkSet) * 0x9e3779b97f4a7c15ULL;
  ConnectState state{peers, rank,    geometry, rendezvous, links, peers[0].nonce ^ salt,
                     salt,  nullptr, {}};

  // Each peer goes to the first transport that can connect it.
  const std::vector<const Transport*>& registry = transports();
  std::vector<std::vector<int>> chosen(registry.size());
  for (int p = 0; p < nranks; ++p) {
    if (p == rank) continue;
    size_t t = 0;
    while (t < registry.size() && !registry[t]->canConnect(self, peers[p])) ++t;
    if (t == registry.size())
      fail(braidInvalidUsage,
           "rank {} cannot reach rank {} (pid {}{}): no transport can connect them (inproc: same "
           "process; shm: same host, unless BRAID_SHM_DISABLE=1; net: another host)",
           rank, p, peers[p].pid, peers[p].hostHash == self.hostHash ? ", this host" : "");
    chosen[t].push_back(p);
  }

  std::vector<std::unique_ptr<TransportSetup>> setups;
  for (size_t t = 0; t < registry.size(); ++t)
    if (!chosen[t].empty()) setups.push_back(registry[t]->setup(state, chosen[t]));
  if (state.control == nullptr) {
    auto block = allocateZeroed(kControlBytes);
    links.keepAlive.push_back(block);
    state.control = new (block.get()) RankControl();
    state.controlMemory = block;
  }
  links.control[rank] = state.control;
  for (auto& setup : setups) setup->publish(state);
  rendezvous.barrier();  // every rank's resources exist and every control block is published
  for (auto& setup : setups) setup->connect(state);
  rendezvous.barrier();  // every peer has attached
  for (auto& setup : setups) setup->connected(state);

  std::string counts;
  for (size_t t = 0; t < registry.size(); ++t)
    counts +=
        fmt::format("{}{} {}", counts.empty() ? "" : ", ", chosen[t].size(), registry[t]->name());
  BRAID_INFO(log::kInit, "rank {}: peers by transport: {}; FIFO {} x {} bytes", rank, counts,
             geometry.nSlots, geometry.slotBytes);
  return links;
}

}  // namespace braid
