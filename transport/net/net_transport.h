// Connecting a rank to its peers on other hosts.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "transport/net/net.h"
#include "transport/transport.h"

namespace braid::net {

// A connection with a rank on another host, one of several (`index`) with that rank.
struct NetLinkKey {
  int peer = 0;
  int index = 0;  // < kMaxLinksPerPeer
  auto operator<=>(const NetLinkKey&) const = default;
};

struct NetLinks {
  std::unique_ptr<Net> net;
  std::map<NetLinkKey, std::pair<std::unique_ptr<SendComm>, std::unique_ptr<RecvComm>>> links;
};

// The plug-in that carries this process's traffic between hosts, as the environment chooses:
// BRAID_NET_PLUGIN, else BRAID_NET (socket, ucx), else UCX where an RDMA device is present and
// sockets elsewhere.
std::unique_ptr<Net> makeConfiguredNet();

// What names the NIC a plug-in's first device is, for the progress thread its proxies share.
std::string nicName(Net& net);

// Every rank of `nranks` calls it: listens on the interface BRAID_SOCKET_IFNAME chooses,
// all-gathers the listeners' handles (`allGather`: bytes per rank, this rank's slice filled), then
// opens a connection each way for each of `keys` (the peer's keys must name this rank alike) and
// accepts the peers'. Fails naming the ranks that did not connect by `deadline`.
NetLinks connectNetLinks(int rank, int nranks, const std::vector<NetLinkKey>& keys,
                         const std::function<void(void*, size_t)>& allGather,
                         Clock::time_point deadline);

// The network transport for the registry: ranks on other hosts, over the socket plug-in on the
// interface BRAID_SOCKET_IFNAME chooses (the bootstrap's), one connection per peer and direction,
// and a proxy thread that serves them. Its setup all-gathers the listeners' addresses, so it is
// chosen on every rank or none: with more than one host every rank has peers elsewhere.
const Transport* netTransport();

}  // namespace braid::net
