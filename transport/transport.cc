#include "transport/transport.h"

#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "transport/local.h"
#include "transport/net/net_transport.h"
#if BRAID_HAVE_CUDA
#include "transport/p2p.h"
#endif

namespace braid {

PeerLinks::~PeerLinks() {
  for (int fd : pidfd)
    if (fd >= 0) close(fd);
}

const std::vector<const Transport*>& transports() {
  static const std::vector<const Transport*> registry = {
    inprocTransport(),
#if BRAID_HAVE_CUDA
    p2pTransport(),
#endif
    shmTransport(),
    net::netTransport()
  };
  return registry;
}

namespace {

const char* kindName(LinkKind kind) {
  switch (kind) {
    case LinkKind::HostFifos: return "host FIFOs";
    case LinkKind::DeviceFifos: return "device FIFOs";
    case LinkKind::HostPresence: return "host links without FIFOs";
  }
  return "links";
}

// By transport of the registry, the peers it connects: each goes to the first that carries the
// kind and can connect it.
std::vector<std::vector<int>> choosePeers(const std::vector<PeerInfo>& peers, int rank,
                                          LinkKind kind) {
  const PeerInfo& self = peers[rank];
  const std::vector<const Transport*>& registry = transports();
  std::vector<std::vector<int>> chosen(registry.size());
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    const bool sameHost = peers[p].hostHash == self.hostHash;
    if (p == rank || (kind == LinkKind::HostPresence && !sameHost)) continue;
    size_t t = 0;
    while (t < registry.size() &&
           !(registry[t]->carries(kind) && registry[t]->canConnect(self, peers[p])))
      ++t;
    if (t == registry.size())
      fail(braidInvalidUsage,
           "rank {} cannot reach rank {} (pid {}{}) with {}: no transport can connect them "
           "(inproc: same process; shm: same host, unless BRAID_SHM_DISABLE=1; p2p: device "
           "FIFOs on one host, where braid was built with CUDA; net: another host)",
           rank, p, peers[p].pid, sameHost ? ", this host" : "", kindName(kind));
    chosen[t].push_back(p);
  }
  return chosen;
}

}  // namespace

PeerLinks connectPeers(const std::vector<PeerInfo>& peers, int rank, const FifoGeometry& geometry,
                       const Rendezvous& rendezvous, const LinkRequest& request) {
  const int nranks = static_cast<int>(peers.size());
  PeerLinks links;
  links.send.resize(nranks);
  links.recv.resize(nranks);
  links.control.assign(nranks, nullptr);
  links.pidfd.assign(nranks, -1);
  // Segments are named after rank 0's nonce: unique per communicator, known to every rank; a
  // further set of links, or another kind, salts it.
  const uint64_t salt =
      (static_cast<uint64_t>(request.linkSet) + (static_cast<uint64_t>(request.kind) << 32)) *
      0x9e3779b97f4a7c15ULL;
  ConnectState state{peers,      rank,  request.kind,          geometry, request.device,
                     rendezvous, links, peers[0].nonce ^ salt, salt,     nullptr,
                     {}};

  const std::vector<const Transport*>& registry = transports();
  const std::vector<std::vector<int>> chosen = choosePeers(peers, rank, request.kind);
  std::vector<std::unique_ptr<TransportSetup>> setups;
  for (size_t t = 0; t < registry.size(); ++t)
    if (!chosen[t].empty() || registry[t]->setsUpEveryRank(request.kind))
      setups.push_back(registry[t]->setup(state, chosen[t]));
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
  if (request.kind == LinkKind::HostFifos)
    BRAID_INFO(log::kInit, "rank {}: peers by transport: {}; FIFO {} x {} bytes", rank, counts,
               geometry.nSlots, geometry.slotBytes);
  else
    BRAID_INFO(log::kInit, "rank {}: peers by transport: {} ({})", rank, counts,
               kindName(request.kind));
  return links;
}

}  // namespace braid
