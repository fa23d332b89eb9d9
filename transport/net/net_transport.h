// Connecting a rank to its peers on other hosts: the socket plug-in on the interface
// BRAID_SOCKET_IFNAME chooses (the bootstrap's), one connection per peer and direction, and the
// proxy thread that serves them.
#pragma once

#include <memory>
#include <vector>

#include "transport/transport.h"

namespace braid::net {

class Proxy;

// Connects `rank` with `remotePeers` (ranks on other hosts) and sets links.send/recv for them.
// Collective: all-gathers the listeners' handles, so every rank calls it once when any two ranks
// are on different hosts (then every rank has a remote peer).
std::shared_ptr<Proxy> connectRemotePeers(const std::vector<PeerInfo>& peers, int rank,
                                          const std::vector<int>& remotePeers,
                                          const FifoGeometry& geometry,
                                          const Rendezvous& rendezvous, PeerLinks& links);

}  // namespace braid::net
