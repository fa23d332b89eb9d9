// Connecting a rank to its peers on other hosts.
#pragma once

#include <memory>
#include <string>

#include "transport/net/net.h"
#include "transport/transport.h"

namespace braid::net {

// The plug-in that carries this process's traffic between hosts, as the environment chooses:
// BRAID_NET_PLUGIN, else BRAID_NET (socket, ucx), else UCX where an RDMA device is present and
// sockets elsewhere.
std::unique_ptr<Net> makeConfiguredNet();

// What names the NIC a plug-in's first device is, for the progress thread its proxies share.
std::string nicName(Net& net);

// The network transport for the registry: ranks on other hosts, over the plug-in
// makeConfiguredNet() chooses, on the interface BRAID_SOCKET_IFNAME chooses (the bootstrap's),
// and one proxy that serves them: for host FIFOs a link per peer, for device FIFOs the hops the
// set's P2P transport asks for (ConnectState::networkHops). Its setup all-gathers the listeners'
// addresses, so it is chosen on every rank or none: with more than one host every rank has peers
// elsewhere.
const Transport* netTransport();

}  // namespace braid::net
