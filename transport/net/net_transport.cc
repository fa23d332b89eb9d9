#include "transport/net/net_transport.h"

#include <algorithm>
#include <map>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/socket.h"
#include "transport/net/nccl_plugin_net.h"
#include "transport/net/proxy.h"
#include "transport/net/socket_net.h"
#include "transport/net/ucx_net.h"

namespace braid::net {

std::unique_ptr<Net> makeConfiguredNet() {
  if (!param::NetPlugin().empty()) return loadNcclNetPlugin(param::NetPlugin());
#ifdef BRAID_HAVE_UCX
  const std::string fallback = rdmaDevicePresent() ? "ucx" : "socket";
#else
  const std::string fallback = "socket";
#endif
  const std::string choice = param::Net().empty() ? fallback : param::Net();
  const int keepaliveMs = static_cast<int>(param::SocketKeepaliveMs());
  if (choice == "ucx") {
#ifdef BRAID_HAVE_UCX
    return makeUcxNet(findInterfaces(param::SocketIfname()), keepaliveMs);
#else
    fail(braidInvalidArgument,
         "BRAID_NET=ucx, but this braid was built without UCX (install libucx-dev and rebuild)");
#endif
  }
  if (choice != "socket")
    fail(braidInvalidArgument, "BRAID_NET='{}' names no network (expected socket or ucx)", choice);
  return makeSocketNet(findInterfaces(param::SocketIfname()),
                       {static_cast<int>(param::NSocks()), keepaliveMs});
}

std::string nicName(Net& net) {
  return fmt::format("NET/{} {}", net.name(), net.properties(0).name);
}

namespace {

// A rank's plug-in, its listener, and every rank's listener handle.
struct Listening {
  std::unique_ptr<Net> net;
  std::unique_ptr<ListenComm> listener;
  std::vector<Handle> handles;
};

Listening listenAndExchange(int rank, int nranks,
                            const std::function<void(void*, size_t)>& allGather) {
  Listening l;
  l.net = makeConfiguredNet();
  Net& net = *l.net;
  if (net.deviceCount() == 0)
    fail(braidSystemError,
         "rank {} has peers on other hosts but no UP network interface with an address", rank);
  const DeviceProperties device = net.properties(0);
  BRAID_INFO(log::kNet, "rank {}: NET/{} on {} {} ({} Mbps, {}), BRAID_SOCKET_IFNAME='{}'", rank,
             net.name(), device.name, device.address, device.speedMbps,
             device.pciPath.empty() ? "virtual" : device.pciPath, param::SocketIfname());
  l.handles.resize(nranks);
  l.listener = net.listen(0, &l.handles[rank]);
  allGather(l.handles.data(), sizeof(Handle));
  return l;
}

// Connects every link of `keys` now: each rank connects, then accepts.
NetLinks connectAll(int rank, const std::vector<NetLinkKey>& keys, Listening l,
                    Clock::time_point deadline) {
  Net& net = *l.net;
  const std::vector<Handle>& handles = l.handles;
  ListenComm* listener = l.listener.get();

  // Connecting never waits for the other side to accept, so every rank connects, then accepts.
  // A connection's tag says who opened it and which of its links it is.
  std::map<NetLinkKey, std::unique_ptr<SendComm>> sends;
  for (const NetLinkKey& key : keys)
    sends[key] = net.connect(
        0, handles[key.peer],
        static_cast<uint32_t>(rank) * kMaxLinksPerPeer + static_cast<uint32_t>(key.index),
        deadline);
  std::map<NetLinkKey, std::unique_ptr<RecvComm>> recvs;
  while (recvs.size() < keys.size()) {
    uint32_t tag = 0;
    std::unique_ptr<RecvComm> comm;
    try {
      comm = net.accept(*listener, &tag, deadline);
    } catch (const Error& e) {
      std::vector<int> missing;
      for (const NetLinkKey& key : keys)
        if (recvs.count(key) == 0) missing.push_back(key.peer);
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
      fail(e.code(), "rank {}: ranks {} did not connect before the deadline: {}", rank,
           fmt::join(missing, ", "), e.what());
    }
    const NetLinkKey key{static_cast<int>(tag / kMaxLinksPerPeer),
                         static_cast<int>(tag % kMaxLinksPerPeer)};
    if (sends.count(key) == 0 || recvs.count(key) != 0) {
      BRAID_WARN(log::kNet,
                 "rank {}: dropped a connection that claims to come from rank {} (link {})", rank,
                 key.peer, key.index);
      continue;
    }
    recvs[key] = std::move(comm);
  }
  NetLinks result;
  for (const NetLinkKey& key : keys)
    result.links[key] = {std::move(sends[key]), std::move(recvs[key])};
  result.net = std::move(l.net);
  return result;
}

}  // namespace

NetLinks connectNetLinks(int rank, int nranks, const std::vector<NetLinkKey>& keys,
                         const std::function<void(void*, size_t)>& allGather,
                         Clock::time_point deadline) {
  return connectAll(rank, keys, listenAndExchange(rank, nranks, allGather), deadline);
}

namespace {

// The CPU communicator's hops to other hosts: one link per remote peer, its FIFOs in the proxy's
// memory.
class NetSetup : public TransportSetup {
 public:
  // Listens and all-gathers every rank's listener handle, then connects: on first use where the
  // plug-in can accept without waiting, else every remote pair now.
  NetSetup(ConnectState& state, std::vector<int> remotePeers)
      : remotePeers_(std::move(remotePeers)) {}

  void connect(ConnectState& state) override {
    const int rank = state.rank;
    Listening listening =
        listenAndExchange(rank, static_cast<int>(state.peers.size()), state.rendezvous.allGather);
    auto proxy = std::make_shared<Proxy>(rank, state.geometry);
    proxy->letRanksReadSmallMessages();  // the host executor waits by driving its links
    const std::string device = nicName(*listening.net);
    auto serve = [&](int peer, const Proxy::Fifos& fifos) {
      state.links.send[peer] = SendConnector(fifos.send, rank, peer);
      state.links.recv[peer] = RecvConnector(fifos.recv, rank, peer);
    };
    if (listening.net->acceptsWithoutWaiting()) {
      proxy->connectOnFirstUse(
          {std::move(listening.net), std::move(listening.listener), std::move(listening.handles),
           rank,
           std::chrono::milliseconds(std::min(param::TimeoutMs(), param::SocketKeepaliveMs()))});
      for (int peer : remotePeers_) serve(peer, proxy->addPeer(peer));
    } else {
      std::vector<NetLinkKey> keys;
      for (int peer : remotePeers_) keys.push_back({peer, 0});
      NetLinks connected = connectAll(rank, keys, std::move(listening), state.rendezvous.deadline);
      for (int peer : remotePeers_) {
        auto& [send, recv] = connected.links[{peer, 0}];
        serve(peer, proxy->addPeer(peer, std::move(send), std::move(recv)));
      }
    }
    proxy->start(device);
    state.links.services.push_back(proxy);
  }

 private:
  std::vector<int> remotePeers_;
};

}  // namespace

const Transport* netTransport() {
  static const TransportOf<NetSetup> transport(
      "net",
      [](const PeerInfo& self, const PeerInfo& peer) { return peer.hostHash != self.hostHash; });
  return &transport;
}

}  // namespace braid::net
