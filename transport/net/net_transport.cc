#include "transport/net/net_transport.h"

#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <vector>

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

// Connects every link of `keys` now (the peer's keys must name this rank alike): each rank
// connects, then accepts. Fails naming the ranks that did not connect by `deadline`.
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

// A rank's hops to other hosts. A CPU communicator's: one link per remote peer, its FIFOs in the
// proxy's memory. A CUDA communicator's: the hops another transport of the set asked for
// (ConnectState::networkHops, laid out by p2p), their FIFOs where it said. One proxy serves them.
class NetSetup : public TransportSetup {
 public:
  NetSetup(ConnectState& state, std::vector<int> remotePeers)
      : remotePeers_(std::move(remotePeers)) {}

  // Listens and all-gathers every rank's listener handle, then connects.
  void connect(ConnectState& state) override {
    Listening listening = listenAndExchange(state.rank, static_cast<int>(state.peers.size()),
                                            state.rendezvous.allGather);
    const std::string device = nicName(*listening.net);
    std::shared_ptr<Proxy> proxy =
        state.networkHops != nullptr ? connectHops(state, *state.networkHops, std::move(listening))
                                     : connectPeers(state, std::move(listening));
    proxy->start(device);
    state.links.services.push_back(proxy);
  }

 private:
  // On first use where the plug-in can accept without waiting, else every remote pair now.
  std::shared_ptr<Proxy> connectPeers(ConnectState& state, Listening listening) {
    const int rank = state.rank;
    auto proxy = std::make_shared<Proxy>(rank, state.geometry);
    proxy->letRanksReadSmallMessages();  // the host executor waits by driving its links
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
      return proxy;
    }
    std::vector<NetLinkKey> keys;
    for (int peer : remotePeers_) keys.push_back({peer, 0});
    NetLinks connected = connectAll(rank, keys, std::move(listening), state.rendezvous.deadline);
    for (int peer : remotePeers_) {
      auto& [send, recv] = connected.links[{peer, 0}];
      serve(peer, proxy->addPeer(peer, std::move(send), std::move(recv)));
    }
    return proxy;
  }

  // Every hop now: no rank thread waits on them to connect on first use (a GPU's kernels post to
  // them), and the proxy keeps polling them, since a kernel's stores cannot wake it.
  std::shared_ptr<Proxy> connectHops(ConnectState& state, const NetworkHops& asked,
                                     Listening listening) const {
    std::vector<NetLinkKey> keys;
    for (const NetworkHops::Hop& hop : asked.hops) keys.push_back({hop.peer, hop.index});
    NetLinks connected =
        connectAll(state.rank, keys, std::move(listening), state.rendezvous.deadline);
    auto proxy = std::make_shared<Proxy>(state.rank, state.geometry, asked.allocate);
    for (size_t i = 0; i < asked.hops.size(); ++i) {
      const NetworkHops::Hop& hop = asked.hops[i];
      auto& [send, recv] = connected.links[keys[i]];
      const Proxy::Fifos fifos = proxy->addPeer(hop.peer, std::move(send), std::move(recv),
                                                {hop.geometry, hop.flaggedLines});
      asked.attach(i, fifos.send, fifos.recv);
    }
    proxy->operationStarted();
    BRAID_INFO(log::kNet, "rank {}: {} network links to {} ranks on other hosts", state.rank,
               keys.size(), remotePeers_.size());
    return proxy;
  }

  std::vector<int> remotePeers_;
};

}  // namespace

const Transport* netTransport() {
  static const TransportOf<NetSetup> transport(
      "net", {LinkKind::HostFifos, LinkKind::DeviceFifos},
      [](const PeerInfo& self, const PeerInfo& peer) { return peer.hostHash != self.hostHash; });
  return &transport;
}

}  // namespace braid::net
