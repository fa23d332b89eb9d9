#include "transport/net/net_transport.h"

#include <algorithm>
#include <map>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/socket.h"
#include "transport/net/proxy.h"
#include "transport/net/socket_net.h"

namespace braid::net {

std::shared_ptr<Proxy> connectRemotePeers(const std::vector<PeerInfo>& peers, int rank,
                                          const std::vector<int>& remotePeers,
                                          const FifoGeometry& geometry,
                                          const Rendezvous& rendezvous, PeerLinks& links) {
  const int nranks = static_cast<int>(peers.size());
  const SocketOptions options{static_cast<int>(param::NSocks()),
                              static_cast<int>(param::SocketKeepaliveMs())};
  std::unique_ptr<Net> net = makeSocketNet(findInterfaces(param::SocketIfname()), options);
  if (net->deviceCount() == 0)
    fail(braidSystemError,
         "rank {} has peers on other hosts but no UP network interface with an address", rank);
  const DeviceProperties device = net->properties(0);
  BRAID_INFO(log::kNet,
             "rank {}: NET/{} on {} {} ({} Mbps, {}), {} socket(s) per connection, "
             "BRAID_SOCKET_IFNAME='{}'",
             rank, net->name(), device.name, device.address, device.speedMbps,
             device.pciPath.empty() ? "virtual" : device.pciPath, options.socketsPerConnection,
             param::SocketIfname());

  Handle own;
  std::unique_ptr<ListenComm> listener = net->listen(0, &own);
  std::vector<Handle> handles(nranks);
  handles[rank] = own;
  rendezvous.allGather(handles.data(), sizeof(Handle));

  // Connecting never waits for the other side to accept, so every rank connects, then accepts.
  std::map<int, std::unique_ptr<SendComm>> sends;
  for (int peer : remotePeers)
    sends[peer] = net->connect(0, handles[peer], static_cast<uint32_t>(rank), rendezvous.deadline);
  std::map<int, std::unique_ptr<RecvComm>> recvs;
  while (recvs.size() < remotePeers.size()) {
    uint32_t tag = 0;
    std::unique_ptr<RecvComm> comm;
    try {
      comm = net->accept(*listener, &tag, rendezvous.deadline);
    } catch (const Error& e) {
      std::vector<int> missing;
      for (int peer : remotePeers)
        if (recvs.count(peer) == 0) missing.push_back(peer);
      fail(e.code(), "rank {}: ranks {} did not connect before the deadline: {}", rank,
           fmt::join(missing, ", "), e.what());
    }
    const int peer = static_cast<int>(tag);
    if (std::find(remotePeers.begin(), remotePeers.end(), peer) == remotePeers.end() ||
        recvs.count(peer) != 0) {
      BRAID_WARN(log::kNet, "rank {}: dropped a connection that claims to come from rank {}", rank,
                 tag);
      continue;
    }
    recvs[peer] = std::move(comm);
  }

  auto proxy = std::make_shared<Proxy>(rank, geometry);
  for (int peer : remotePeers) {
    const Proxy::Fifos fifos = proxy->addPeer(peer, std::move(sends[peer]), std::move(recvs[peer]));
    links.send[peer] = SendConnector(fifos.send, rank, peer);
    links.recv[peer] = RecvConnector(fifos.recv, rank, peer);
  }
  proxy->start();
  return proxy;
}

}  // namespace braid::net
