#include "transport/p2p.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "transport/cuda_check.h"

namespace braid {
namespace {

// What a rank publishes of its allocation.
struct DeviceCard {
  DeviceRankPlace place;
  uint64_t base = 0;
  cudaIpcMemHandle_t handle{};
  char handleError[96] = {};  // why there is no handle (IPC unsupported here), or ""
};

constexpr size_t kFifoAlign = 256;

size_t alignUp(size_t bytes) {
  return (bytes + kFifoAlign - 1) / kFifoAlign * kFifoAlign;
}

size_t fifoBytes(size_t slotBytes, uint32_t slots) {
  return alignUp(sizeof(FifoWords)) + alignUp(slotBytes * slots);
}

}  // namespace

size_t P2pLinks::simpleFifoBytes() const {
  return fifoBytes(geometry_.simpleSlotBytes, geometry_.simpleSlots);
}
size_t P2pLinks::llFifoBytes() const {
  return fifoBytes(geometry_.llSlotBytes, geometry_.llSlots);
}
size_t P2pLinks::segmentFifoBytes() const {
  return fifoBytes(segmentedSlotBytes(geometry_.segmentBytes, geometry_.segmentsPerSlot),
                   geometry_.segmentSlots);
}
size_t P2pLinks::ringFifosBytes() const {
  return simpleFifoBytes() + llFifoBytes() + segmentFifoBytes();
}

size_t P2pLinks::treeSimpleFifoBytes() const {
  return fifoBytes(geometry_.simpleSlotBytes, kTreeSlots);
}
size_t P2pLinks::treeFifoBytes() const {
  return treeSimpleFifoBytes() + fifoBytes(geometry_.llSlotBytes, kTreeSlots);
}

int P2pLinks::hopProtocolIndex(DeviceProtocol protocol) {
  if (protocol == DeviceProtocol::Segmented)
    fail(braidInternalError, "the segmented protocol runs on no tree and no hop to another host");
  return protocol == DeviceProtocol::Simple ? 0 : 1;
}

size_t P2pLinks::treeOffset() const {
  return static_cast<size_t>(geometry_.channels) * ringFifosBytes() +
         static_cast<size_t>(nranks_) * simpleFifoBytes();
}

size_t P2pLinks::directOffset() const {
  return treeOffset() + static_cast<size_t>(treeChannels()) * TreeNode::kEnds * treeFifoBytes();
}

// A rank's allocation: per channel its Simple, low-latency and segmented ring FIFOs, then one
// Simple FIFO per sending peer, then per tree channel and neighbour's end (parent, first child,
// second child) a Simple and a low-latency FIFO of kTreeSlots, then the direct engine's words: per
// channel a line per rank, then the abort word on a line of its own.
DeviceFifo P2pLinks::ringFifo(int receiver, int channel, DeviceProtocol protocol) const {
  const size_t offset = static_cast<size_t>(channel) * ringFifosBytes();
  switch (protocol) {
    case DeviceProtocol::Simple:
      return fifoAt(receiver, offset, geometry_.simpleSlotBytes, geometry_.simpleSlots);
    case DeviceProtocol::LowLatency:
      return fifoAt(receiver, offset + simpleFifoBytes(), geometry_.llSlotBytes, geometry_.llSlots);
    case DeviceProtocol::Segmented:
      return fifoAt(receiver, offset + simpleFifoBytes() + llFifoBytes(),
                    segmentedSlotBytes(geometry_.segmentBytes, geometry_.segmentsPerSlot),
                    geometry_.segmentSlots);
  }
  fail(braidInternalError, "rank {}: no ring FIFO for protocol {}", rank_,
       static_cast<int>(protocol));
}

DeviceFifo P2pLinks::pairFifo(int receiver, int sender) const {
  const size_t offset = static_cast<size_t>(geometry_.channels) * ringFifosBytes() +
                        static_cast<size_t>(sender) * simpleFifoBytes();
  return fifoAt(receiver, offset, geometry_.simpleSlotBytes, geometry_.simpleSlots);
}

DeviceFifo P2pLinks::treeFifo(int receiver, int channel, int sender,
                              DeviceProtocol protocol) const {
  const int end = treeNodeOf(channel, receiver).endOf(sender);
  if (end < 0)
    fail(braidInternalError, "rank {}: ranks {} and {} are not neighbours on tree channel {}",
         rank_, receiver, sender, channel);
  const size_t index = static_cast<size_t>(channel) * TreeNode::kEnds + static_cast<size_t>(end);
  const size_t offset = treeOffset() + index * treeFifoBytes();  // Simple's, then low-latency's
  return hopProtocolIndex(protocol) == 0
             ? fifoAt(receiver, offset, geometry_.simpleSlotBytes, kTreeSlots)
             : fifoAt(receiver, offset + treeSimpleFifoBytes(), geometry_.llSlotBytes, kTreeSlots);
}

int P2pLinks::ringPosition(int channel, int rank) const {
  const std::vector<int>& order = hostRingOrders_[channel];
  return static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
}

TreeNode P2pLinks::treeNodeOf(int channel, int rank) const {
  TreeNode node = treeShapes_[channel].node(channel % 2, ringPosition(channel, rank));
  const std::vector<int>& order = hostRingOrders_[channel];
  if (node.parent >= 0) node.parent = order[node.parent];
  for (int c = 0; c < node.nChildren; ++c) node.children[c] = order[node.children[c]];
  return node;
}

void P2pLinks::layOutTrees(const std::vector<bool>& remote) {
  for (int t = 0; t < treeChannels(); ++t) {
    TreeChannel& tree = trees_[t];
    for (int end = 0; end < TreeNode::kEnds; ++end) {
      const int peer = tree.node.at(end);
      if (peer < 0 || remote[peer]) continue;
      for (DeviceProtocol protocol : {DeviceProtocol::Simple, DeviceProtocol::LowLatency}) {
        tree.fromBy[hopProtocolIndex(protocol)][end] = treeFifo(rank_, t, peer, protocol);
        tree.toBy[hopProtocolIndex(protocol)][end] = treeFifo(peer, t, rank_, protocol);
      }
    }
  }
}

DeviceFifo P2pLinks::ringEnd(int channel, DeviceProtocol protocol, bool sending) const {
  // Any protocol's FIFO says whether the hop crosses the network.
  const DeviceFifo& simple = (sending ? netRingSend_ : netRingRecv_)[0][channel];
  const int peer = sending ? ringNext(channel) : ringPrev(channel);
  if (simple.words == nullptr) return ringFifo(sending ? peer : rank_, channel, protocol);
  if (protocol == DeviceProtocol::Segmented)
    fail(braidInternalError,
         "rank {}: channel {} {} rank {} on another host, where the segmented protocol does not "
         "run",
         rank_, channel, sending ? "sends to" : "receives from", peer);
  return (sending ? netRingSend_ : netRingRecv_)[hopProtocolIndex(protocol)][channel];
}

DeviceFifo P2pLinks::pairRecv(int sender) const {
  return netPairRecv_[sender].words != nullptr ? netPairRecv_[sender] : pairFifo(rank_, sender);
}

DeviceFifo P2pLinks::pairSend(int receiver) const {
  return netPairSend_[receiver].words != nullptr ? netPairSend_[receiver]
                                                 : pairFifo(receiver, rank_);
}

DeviceFifo P2pLinks::fifoAt(int receiver, size_t offset, size_t slotBytes, uint32_t slots) const {
  uint8_t* at = areas_[receiver] + offset;
  return {reinterpret_cast<FifoWords*>(at), at + alignUp(sizeof(FifoWords)), slotBytes, slots};
}

void* P2pLinks::directArrivals(int channel) const {
  return areas_[0] + directOffset() +
         static_cast<size_t>(channel) * static_cast<size_t>(nranks_) * kDirectLineBytes;
}

const uint32_t* P2pLinks::directAbort() const {
  return reinterpret_cast<const uint32_t*>(areas_[0] + directOffset() +
                                           static_cast<size_t>(geometry_.channels) *
                                               static_cast<size_t>(nranks_) * kDirectLineBytes);
}

int P2pLinks::ringNext(int channel) const {
  return hostRingOrders_[channel][(ringPosition(channel, rank_) + 1) % nranks_];
}

int P2pLinks::ringPrev(int channel) const {
  return hostRingOrders_[channel][(ringPosition(channel, rank_) + nranks_ - 1) % nranks_];
}

// A proxy's FIFO in pinned host memory as the GPU reaches it (mapped: with unified addressing
// the same address; asked of the runtime all the same).
DeviceFifo P2pLinks::onDevice(const FifoDesc& hostFifo, bool sending) const {
  auto mapped = [&](void* host) {
    void* device = nullptr;
    checkCuda(cudaHostGetDevicePointer(&device, host, 0),
              fmt::format("rank {}: cudaHostGetDevicePointer of a network FIFO", rank_));
    return device;
  };
  auto* control = static_cast<FifoControl*>(mapped(hostFifo.control));
  return {&control->words, static_cast<uint8_t*>(mapped(hostFifo.slots)), hostFifo.slotBytes,
          static_cast<uint32_t>(hostFifo.nSlots), sending ? control->bytes : nullptr};
}

// The hops to other hosts: on each channel the ring neighbours there, and every peer there for
// sends and receives, a connection each way for each (indices alike on both ends), the rings and
// trees one for each protocol (Simple, low-latency: a FIFO never serves two). Their FIFOs go in
// pinned host memory mapped into the GPU.
void P2pLinks::askNetworkHops(const std::vector<bool>& remote, NetworkHops& hops,
                              std::vector<NetworkHopUse>& uses) const {
  const int channels = geometry_.channels, trees = treeChannels();
  const FifoGeometry simple{geometry_.simpleSlotBytes, static_cast<int>(geometry_.simpleSlots)};
  const FifoGeometry lines{geometry_.llSlotBytes, static_cast<int>(geometry_.llSlots)};
  // The sends and receives' index is 0; per protocol p the ring channel c's is
  // 1 + p * (channels + trees) + c, and the tree channel t's follows the rings'.
  auto ask = [&](int peer, int index, const NetworkHopUse& use) {
    hops.hops.push_back({peer, index, use.protocol == 0 ? simple : lines, use.protocol == 1});
    uses.push_back(use);
  };
  for (int peer = 0; peer < nranks_; ++peer) {
    if (!remote[peer]) continue;
    ask(peer, 0, {});
    for (int p = 0; p < kHopProtocols; ++p) {
      const int first = 1 + p * (channels + trees);
      for (int c = 0; c < channels; ++c)
        if (ringNext(c) == peer || ringPrev(c) == peer) ask(peer, first + c, {p, c});
      for (int t = 0; t < trees; ++t)
        if (trees_[t].node.endOf(peer) >= 0) ask(peer, first + channels + t, {p, -1, t});
    }
  }
  const int rank = rank_;
  hops.allocate = [rank](size_t bytes) {
    void* memory = nullptr;
    checkCuda(cudaHostAlloc(&memory, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
              fmt::format("rank {}: cudaHostAlloc of {} bytes of network FIFOs", rank, bytes));
    std::memset(memory, 0, bytes);
    return std::shared_ptr<void>(memory, [](void* p) { cudaFreeHost(p); });
  };
}

void P2pLinks::attachNetworkHop(int peer, const NetworkHopUse& use, const FifoDesc& send,
                                const FifoDesc& recv) {
  netHostWords_.push_back(&send.control->words);
  netHostWords_.push_back(&recv.control->words);
  const int p = use.protocol;
  if (use.tree >= 0) {
    TreeChannel& tree = trees_[use.tree];
    const int end = tree.node.endOf(peer);
    tree.fromBy[p][end] = onDevice(recv, false);
    tree.toBy[p][end] = onDevice(send, true);
    tree.overNetwork[end] = true;
  } else if (use.ring >= 0) {
    if (ringNext(use.ring) == peer) netRingSend_[p][use.ring] = onDevice(send, true);
    if (ringPrev(use.ring) == peer) netRingRecv_[p][use.ring] = onDevice(recv, false);
  } else {
    netPairSend_[peer] = onDevice(send, true);
    netPairRecv_[peer] = onDevice(recv, false);
  }
}

const int* P2pLinks::ringOrder(int channel) const {
  return ringOrders_ + static_cast<size_t>(channel) * nranks_;
}

// The P2P transport's part of connecting a set of device FIFOs: this rank's allocation and the
// hops it asks of the network (construction), then the exchange of where every rank's allocation
// is and the opening of those on this host (connect).
class P2pSetup : public TransportSetup {
 public:
  P2pSetup(ConnectState& state, const std::vector<int>& peers);
  void connect(ConnectState& state) override;

 private:
  static DeviceRankPlace placeOf(const ConnectState& state) {
    if (state.device == nullptr)
      fail(braidInternalError, "rank {}: device FIFOs asked for without a DeviceConnect",
           state.rank);
    return state.device->self;
  }
  // Allocates and clears this rank's FIFOs, and its copy of the ring orders, on its device.
  void allocate(const DeviceConnect& device);
  // Opens `peer`'s allocation (on this host) as this rank's device reaches it.
  void open(int peer, const DeviceCard& card);
  void enablePeerAccess(int peer, const DeviceRankPlace& place);

  std::shared_ptr<P2pLinks> links_;
  DeviceRankPlace self_;
  std::string where_;
  std::vector<bool> remote_;  // by rank: on another host, reached through the network
  NetworkHops hops_;
  std::vector<P2pLinks::NetworkHopUse> hopUses_;
};

P2pSetup::P2pSetup(ConnectState& state, const std::vector<int>&)
    : links_(new P2pLinks), self_(placeOf(state)) {
  const int nranks = static_cast<int>(state.peers.size());
  self_.hostHash = state.peers[state.rank].hostHash;
  where_ = fmt::format("rank {} (CUDA device {})", state.rank, self_.device);
  P2pLinks& links = *links_;
  links.rank_ = state.rank;
  links.nranks_ = nranks;
  links.geometry_ = state.device->geometry;
  allocate(*state.device);
  remote_.assign(nranks, false);
  for (int peer = 0; peer < nranks; ++peer)
    remote_[peer] = state.peers[peer].hostHash != self_.hostHash;
  for (int p = 0; p < P2pLinks::kHopProtocols; ++p) {
    links.netRingSend_[p].assign(links.geometry_.channels, {});
    links.netRingRecv_[p].assign(links.geometry_.channels, {});
  }
  links.netPairSend_.assign(nranks, {});
  links.netPairRecv_.assign(nranks, {});
  links.trees_.assign(links.treeChannels(), {});
  for (int t = 0; t < links.treeChannels(); ++t) {  // of the ranks' hosts, over t's ring order
    std::vector<uint64_t> hosts;
    for (int peer : links.hostRingOrders_[t]) hosts.push_back(state.peers[peer].hostHash);
    links.treeShapes_.emplace_back(hosts);
    links.trees_[t].node = links.treeNodeOf(t, state.rank);
  }
  if (std::find(remote_.begin(), remote_.end(), true) == remote_.end()) return;
  links.askNetworkHops(remote_, hops_, hopUses_);
  hops_.attach = [this](size_t hop, const FifoDesc& send, const FifoDesc& recv) {
    links_->attachNetworkHop(hops_.hops[hop].peer, hopUses_[hop], send, recv);
  };
  state.networkHops = &hops_;
}

void P2pSetup::allocate(const DeviceConnect& device) {
  P2pLinks& links = *links_;
  const size_t nranks = static_cast<size_t>(links.nranks_);
  links.areaBytes_ =
      links.directOffset() +
      (static_cast<size_t>(device.geometry.channels) * nranks + 1) * kDirectLineBytes;
  // The stream for init's clearing and abort()'s stores: never the legacy default stream, which
  // would wait for the user's kernels.
  cudaStream_t stream = nullptr;
  checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            where_ + ": cudaStreamCreateWithFlags");
  links.abortStream_ = stream;
  checkCuda(cudaMalloc(&links.own_, links.areaBytes_),
            fmt::format("{}: cudaMalloc of {} bytes of FIFOs", where_, links.areaBytes_));
  checkCuda(cudaMemsetAsync(links.own_, 0, links.areaBytes_, stream), where_ + ": cudaMemsetAsync");
  links.hostRingOrders_ = device.ringOrders;
  std::vector<int> orders;
  for (const std::vector<int>& order : device.ringOrders)
    orders.insert(orders.end(), order.begin(), order.end());
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&links.ringOrders_), orders.size() * sizeof(int)),
            where_ + ": cudaMalloc of the ring orders");
  checkCuda(cudaMemcpyAsync(links.ringOrders_, orders.data(), orders.size() * sizeof(int),
                            cudaMemcpyHostToDevice, stream),
            where_ + ": cudaMemcpyAsync of the ring orders");
  // Cleared before any peer learns where the FIFOs are (the exchange in connect()).
  checkCuda(cudaStreamSynchronize(stream), where_ + ": cudaStreamSynchronize");
}

void P2pSetup::connect(ConnectState& state) {
  P2pLinks& links = *links_;
  const int nranks = links.nranks_;
  std::vector<DeviceCard> cards(nranks);
  DeviceCard& own = cards[links.rank_];
  own.place = self_;
  own.base = reinterpret_cast<uintptr_t>(links.own_);
  // Only peers in other processes need the handle: where IPC is unsupported, they fail saying so.
  if (const cudaError_t e = cudaIpcGetMemHandle(&own.handle, links.own_); e != cudaSuccess) {
    cudaGetLastError();
    std::snprintf(own.handleError, sizeof own.handleError, "%s", cudaErrorText(e).c_str());
  }
  state.rendezvous.allGather(cards.data(), sizeof(DeviceCard));
  links.areas_.assign(nranks, nullptr);
  links.opened_.assign(nranks, false);
  for (int peer = 0; peer < nranks; ++peer) {
    const DeviceRankPlace& place = cards[peer].place;
    if (place.processNonce == self_.processNonce && place.device == self_.device)
      links.ranksOnDevice_.push_back(peer);
    if (!remote_[peer]) open(peer, cards[peer]);  // the others: through the network
  }
  links.layOutTrees(remote_);
  state.links.device = links_;
  // No rank returns before every rank has made its allocations and mappings (connectPeers'
  // barrier after connect): one made while a peer's first kernel runs may keep that kernel apart
  // from this rank's (CUDA's implicit synchronization), and the kernel waits for this rank's.
  BRAID_INFO(log::kInit, "{}: {} bytes of device FIFOs, {} channels", where_, links.areaBytes_,
             links.geometry_.channels);
}

void P2pSetup::open(int peer, const DeviceCard& card) {
  P2pLinks& links = *links_;
  const bool sameProcess = card.place.processNonce == self_.processNonce;
  if (sameProcess && card.place.device != self_.device) enablePeerAccess(peer, card.place);
  if (sameProcess) {
    links.areas_[peer] = reinterpret_cast<uint8_t*>(card.base);
    return;
  }
  if (card.handleError[0] != '\0')
    fail(braidUnhandledCudaError,
         "{}: rank {} (pid {}) is in another process, but its FIFOs have no CUDA IPC handle: "
         "cudaIpcGetMemHandle failed with {}",
         where_, peer, card.place.pid, card.handleError);
  void* opened = nullptr;
  checkCuda(cudaIpcOpenMemHandle(&opened, card.handle, cudaIpcMemLazyEnablePeerAccess),
            fmt::format("{}: cudaIpcOpenMemHandle of rank {}'s FIFOs (pid {})", where_, peer,
                        card.place.pid));
  links.areas_[peer] = static_cast<uint8_t*>(opened);
  links.opened_[peer] = true;
}

void P2pSetup::enablePeerAccess(int peer, const DeviceRankPlace& place) {
  int canAccess = 0;
  checkCuda(cudaDeviceCanAccessPeer(&canAccess, self_.device, place.device),
            where_ + ": cudaDeviceCanAccessPeer");
  if (!canAccess)
    fail(braidInvalidUsage,
         "{}: CUDA device {} cannot reach device {} of rank {} (no peer access); hops through "
         "host memory are not implemented yet",
         where_, self_.device, place.device, peer);
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(place.device, 0);
  if (enabled == cudaErrorPeerAccessAlreadyEnabled)
    cudaGetLastError();  // not an error: an earlier communicator enabled it
  else
    checkCuda(enabled, fmt::format("{}: cudaDeviceEnablePeerAccess({})", where_, place.device));
}

const Transport* p2pTransport() {
  static const TransportOf<P2pSetup> transport(
      "p2p", {LinkKind::DeviceFifos},
      [](const PeerInfo& self, const PeerInfo& peer) { return peer.hostHash == self.hostHash; },
      LinkKind::DeviceFifos);
  return &transport;
}

void P2pLinks::abort() {
  auto stream = static_cast<cudaStream_t>(abortStream_);
  auto set = [&](const uint32_t* word) {
    // Any non-zero word aborts: every byte set to 1.
    const cudaError_t e = cudaMemsetAsync(const_cast<uint32_t*>(word), 1, sizeof(uint32_t), stream);
    if (e != cudaSuccess)
      BRAID_WARN(log::kInit, "rank {}: abort could not reach a device FIFO: {}", rank_,
                 cudaErrorText(e));
  };
  // The FIFOs on this host, in GPU memory (a block waiting for send credit reads the one it
  // sends on).
  for (int c = 0; c < geometry_.channels; ++c)
    for (DeviceProtocol protocol :
         {DeviceProtocol::Simple, DeviceProtocol::LowLatency, DeviceProtocol::Segmented}) {
      if (netRingRecv_[0][c].words == nullptr) set(&ringFifo(rank_, c, protocol).words->abort);
      if (netRingSend_[0][c].words == nullptr)
        set(&ringFifo(ringNext(c), c, protocol).words->abort);
    }
  for (int peer = 0; peer < nranks_; ++peer) {
    if (netPairRecv_[peer].words == nullptr) set(&pairFifo(rank_, peer).words->abort);
    if (netPairSend_[peer].words == nullptr) set(&pairFifo(peer, rank_).words->abort);
  }
  for (const TreeChannel& tree : trees_)
    for (int end = 0; end < TreeNode::kEnds; ++end) {
      if (tree.node.at(end) < 0 || tree.overNetwork[end]) continue;
      for (int p = 0; p < kHopProtocols; ++p) {
        set(&tree.fromBy[p][end].words->abort);
        set(&tree.toBy[p][end].words->abort);
      }
    }
  if (areas_[0] != nullptr) set(directAbort());  // rank 0's allocation, on this host
  // The network's, in pinned host memory: the host's own stores.
  for (FifoWords* words : netHostWords_) storeRelease(words->abort, 1u);
}

P2pLinks::~P2pLinks() {
  // Nothing here may throw or wait long: cudaFree waits for the kernels that use the FIFOs, and
  // those give up at their deadline.
  for (size_t peer = 0; peer < opened_.size(); ++peer)
    if (opened_[peer]) cudaIpcCloseMemHandle(areas_[peer]);
  if (ringOrders_ != nullptr) cudaFree(ringOrders_);
  if (own_ != nullptr) cudaFree(own_);
  if (abortStream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(abortStream_));
}

}  // namespace braid
