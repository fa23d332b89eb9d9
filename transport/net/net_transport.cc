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

namespace {

class NetSetup : public TransportSetup {
 public:
  // Listens, then all-gathers every rank's listener handle.
  NetSetup(ConnectState& state, std::vector<int> remotePeers)
      : remotePeers_(std::move(remotePeers)) {
    const int rank = state.rank;
    const SocketOptions options{static_cast<int>(param::NSocks()),
                                static_cast<int>(param::SocketKeepaliveMs())};
    net_ = makeSocketNet(findInterfaces(param::SocketIfname()), options);
    if (net_->deviceCount() == 0)
      fail(braidSystemError,
           "rank {} has peers on other hosts but no UP network interface with an address", rank);
    const DeviceProperties device = net_->properties(0);
    BRAID_INFO(log::kNet,
               "rank {}: NET/{} on {} {} ({} Mbps, {}), {} socket(s) per connection, "
               "BRAID_SOCKET_IFNAME='{}'",
               rank, net_->name(), device.name, device.address, device.speedMbps,
               device.pciPath.empty() ? "virtual" : device.pciPath, options.socketsPerConnection,
               param::SocketIfname());
    Handle own;
    listener_ = net_->listen(0, &own);
    handles_.resize(state.peers.size());
    handles_[rank] = own;
    state.rendezvous.allGather(handles_.data(), sizeof(Handle));
  }

  // Connecting never waits for the other side to accept, so every rank connects, then accepts.
  void connect(ConnectState& state) override {
    const int rank = state.rank;
    const Clock::time_point deadline = state.rendezvous.deadline;
    std::map<int, std::unique_ptr<SendComm>> sends;
    for (int peer : remotePeers_)
      sends[peer] = net_->connect(0, handles_[peer], static_cast<uint32_t>(rank), deadline);
    std::map<int, std::unique_ptr<RecvComm>> recvs;
    while (recvs.size() < remotePeers_.size()) {
      uint32_t tag = 0;
      std::unique_ptr<RecvComm> comm;
      try {
        comm = net_->accept(*listener_, &tag, deadline);
      } catch (const Error& e) {
        std::vector<int> missing;
        for (int peer : remotePeers_)
          if (recvs.count(peer) == 0) missing.push_back(peer);
        fail(e.code(), "rank {}: ranks {} did not connect before the deadline: {}", rank,
             fmt::join(missing, ", "), e.what());
      }
      const int peer = static_cast<int>(tag);
      if (std::find(remotePeers_.begin(), remotePeers_.end(), peer) == remotePeers_.end() ||
          recvs.count(peer) != 0) {
        BRAID_WARN(log::kNet, "rank {}: dropped a connection that claims to come from rank {}",
                   rank, tag);
        continue;
      }
      recvs[peer] = std::move(comm);
    }

    auto proxy = std::make_shared<Proxy>(rank, state.geometry);
    for (int peer : remotePeers_) {
      const Proxy::Fifos fifos =
          proxy->addPeer(peer, std::move(sends[peer]), std::move(recvs[peer]));
      state.links.send[peer] = SendConnector(fifos.send, rank, peer);
      state.links.recv[peer] = RecvConnector(fifos.recv, rank, peer);
    }
    proxy->start();
    state.links.services.push_back(proxy);
  }

 private:
  std::vector<int> remotePeers_;
  std::unique_ptr<Net> net_;
  std::unique_ptr<ListenComm> listener_;
  std::vector<Handle> handles_;
};

}  // namespace

const Transport* netTransport() {
  static const TransportOf<NetSetup> transport(
      "net",
      [](const PeerInfo& self, const PeerInfo& peer) { return peer.hostHash != self.hostHash; });
  return &transport;
}

}  // namespace braid::net
