#include "transport/p2p.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "transport/cuda_check.h"
#include "transport/net/net_transport.h"
#include "transport/net/proxy.h"

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
  trees_.assign(treeChannels(), {});
  for (int t = 0; t < treeChannels(); ++t) {
    TreeChannel& tree = trees_[t];
    tree.node = treeNodeOf(t, rank_);
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
// sends and receives, a connection each way for each (keys alike on both ends), the rings and
// trees one for each protocol (Simple, low-latency: a FIFO never serves two). The proxy's FIFOs
// go in pinned host memory mapped into the GPU; the proxy keeps polling them, since a kernel's
// stores cannot wake it.
void P2pLinks::connectNetwork(const std::vector<bool>& remote,
                              const std::function<void(void*, size_t)>& allGather,
                              Clock::time_point deadline) {
  const int channels = geometry_.channels, trees = treeChannels();
  // What each link serves, beside its key: the sends and receives (key 0), or per protocol p
  // (hopProtocolIndex) ring channel c (key 1 + p * (channels + trees) + c) or tree channel t (the
  // rings' keys, then t).
  struct NetHop {
    net::NetLinkKey key;
    int protocol = 0;
    int ring = -1, tree = -1;
  };
  std::vector<NetHop> hops;
  for (int peer = 0; peer < nranks_; ++peer) {
    if (!remote[peer]) continue;
    hops.push_back({{peer, 0}});
    for (int p = 0; p < kHopProtocols; ++p) {
      const int first = 1 + p * (channels + trees);
      for (int c = 0; c < channels; ++c)
        if (ringNext(c) == peer || ringPrev(c) == peer) hops.push_back({{peer, first + c}, p, c});
      for (int t = 0; t < trees; ++t)
        if (trees_[t].node.endOf(peer) >= 0)
          hops.push_back({{peer, first + channels + t}, p, -1, t});
    }
  }
  std::vector<net::NetLinkKey> keys;
  for (const NetHop& hop : hops) keys.push_back(hop.key);
  net::NetLinks connected = net::connectNetLinks(rank_, nranks_, keys, allGather, deadline);
  const int rank = rank_;
  auto pinned = [rank](size_t bytes) {
    void* memory = nullptr;
    checkCuda(cudaHostAlloc(&memory, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
              fmt::format("rank {}: cudaHostAlloc of {} bytes of network FIFOs", rank, bytes));
    std::memset(memory, 0, bytes);
    return std::shared_ptr<void>(memory, [](void* p) { cudaFreeHost(p); });
  };
  proxy_ = std::make_shared<net::Proxy>(
      rank_, FifoGeometry{geometry_.simpleSlotBytes, static_cast<int>(geometry_.simpleSlots)},
      pinned);
  const net::LinkFormat lines{
      FifoGeometry{geometry_.llSlotBytes, static_cast<int>(geometry_.llSlots)}, true};
  for (const NetHop& hop : hops) {
    const int peer = hop.key.peer, p = hop.protocol;
    auto& [send, recv] = connected.links[hop.key];
    const net::Proxy::Fifos fifos =
        proxy_->addPeer(peer, std::move(send), std::move(recv), p == 1 ? lines : net::LinkFormat{});
    netHostWords_.push_back(&fifos.send.control->words);
    netHostWords_.push_back(&fifos.recv.control->words);
    if (hop.tree >= 0) {
      TreeChannel& tree = trees_[hop.tree];
      const int end = tree.node.endOf(peer);
      tree.fromBy[p][end] = onDevice(fifos.recv, false);
      tree.toBy[p][end] = onDevice(fifos.send, true);
      tree.overNetwork[end] = true;
    } else if (hop.ring >= 0) {
      if (ringNext(hop.ring) == peer) netRingSend_[p][hop.ring] = onDevice(fifos.send, true);
      if (ringPrev(hop.ring) == peer) netRingRecv_[p][hop.ring] = onDevice(fifos.recv, false);
    } else {
      netPairSend_[peer] = onDevice(fifos.send, true);
      netPairRecv_[peer] = onDevice(fifos.recv, false);
    }
  }
  proxy_->start(net::nicName(*connected.net));
  proxy_->operationStarted();
  BRAID_INFO(log::kNet,
             "rank {}: {} network links to {} ranks on other hosts, FIFOs in pinned "
             "host memory",
             rank_, keys.size(), std::count(remote.begin(), remote.end(), true));
}

std::optional<std::string> P2pLinks::networkFailure() const {
  return proxy_ != nullptr ? proxy_->failure(-1) : std::nullopt;
}

void P2pLinks::finish(Clock::time_point deadline) {
  if (proxy_ != nullptr) proxy_->finish(deadline);
}

const int* P2pLinks::ringOrder(int channel) const {
  return ringOrders_ + static_cast<size_t>(channel) * nranks_;
}

std::unique_ptr<P2pLinks> P2pLinks::connect(int rank, int nranks, const DeviceRankPlace& self,
                                            const DeviceFifoGeometry& geometry,
                                            const std::vector<std::vector<int>>& ringOrders,
                                            const std::function<void(void*, size_t)>& allGather,
                                            Clock::time_point deadline) {
  std::unique_ptr<P2pLinks> links(new P2pLinks);
  links->rank_ = rank;
  links->nranks_ = nranks;
  links->geometry_ = geometry;
  links->areaBytes_ =
      links->directOffset() +
      (static_cast<size_t>(geometry.channels) * static_cast<size_t>(nranks) + 1) * kDirectLineBytes;
  const std::string where = fmt::format("rank {} (CUDA device {})", rank, self.device);

  // The stream for init's clearing and abort()'s stores: never the legacy default stream, which
  // would wait for the user's kernels.
  cudaStream_t stream = nullptr;
  checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            where + ": cudaStreamCreateWithFlags");
  links->abortStream_ = stream;
  checkCuda(cudaMalloc(&links->own_, links->areaBytes_),
            fmt::format("{}: cudaMalloc of {} bytes of FIFOs", where, links->areaBytes_));
  checkCuda(cudaMemsetAsync(links->own_, 0, links->areaBytes_, stream),
            where + ": cudaMemsetAsync");
  links->hostRingOrders_ = ringOrders;
  std::vector<int> orders;
  for (const std::vector<int>& order : ringOrders)
    orders.insert(orders.end(), order.begin(), order.end());
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&links->ringOrders_), orders.size() * sizeof(int)),
            where + ": cudaMalloc of the ring orders");
  checkCuda(cudaMemcpyAsync(links->ringOrders_, orders.data(), orders.size() * sizeof(int),
                            cudaMemcpyHostToDevice, stream),
            where + ": cudaMemcpyAsync of the ring orders");
  // Cleared before any peer learns where the FIFOs are (the exchange below is the barrier).
  checkCuda(cudaStreamSynchronize(stream), where + ": cudaStreamSynchronize");

  std::vector<DeviceCard> cards(nranks);
  cards[rank].place = self;
  cards[rank].base = reinterpret_cast<uintptr_t>(links->own_);
  // Only peers in other processes need the handle: where IPC is unsupported, they fail saying so.
  if (const cudaError_t e = cudaIpcGetMemHandle(&cards[rank].handle, links->own_);
      e != cudaSuccess) {
    cudaGetLastError();
    std::snprintf(cards[rank].handleError, sizeof cards[rank].handleError, "%s",
                  cudaErrorText(e).c_str());
  }
  allGather(cards.data(), sizeof(DeviceCard));

  links->areas_.assign(nranks, nullptr);
  links->opened_.assign(nranks, false);
  std::vector<bool> remote(nranks, false);
  for (int peer = 0; peer < nranks; ++peer) {
    const DeviceCard& card = cards[peer];
    if (card.place.processNonce == self.processNonce && card.place.device == self.device)
      links->ranksOnDevice_.push_back(peer);
    if (card.place.hostHash != self.hostHash) {
      remote[peer] = true;  // reached through the network below; its FIFOs are not opened
      continue;
    }
    if (card.place.device != self.device || card.place.processNonce != self.processNonce) {
      int canAccess = 0;
      if (card.place.processNonce == self.processNonce) {
        checkCuda(cudaDeviceCanAccessPeer(&canAccess, self.device, card.place.device),
                  where + ": cudaDeviceCanAccessPeer");
        if (!canAccess)
          fail(braidInvalidUsage,
               "{}: CUDA device {} cannot reach device {} of rank {} (no peer access); hops "
               "through host memory are not implemented yet",
               where, self.device, card.place.device, peer);
        const cudaError_t enabled = cudaDeviceEnablePeerAccess(card.place.device, 0);
        if (enabled == cudaErrorPeerAccessAlreadyEnabled)
          cudaGetLastError();  // not an error: an earlier communicator enabled it
        else
          checkCuda(enabled,
                    fmt::format("{}: cudaDeviceEnablePeerAccess({})", where, card.place.device));
      }
    }
    if (card.place.processNonce == self.processNonce) {
      links->areas_[peer] = reinterpret_cast<uint8_t*>(card.base);
      continue;
    }
    if (card.handleError[0] != '\0')
      fail(braidUnhandledCudaError,
           "{}: rank {} (pid {}) is in another process, but its FIFOs have no CUDA IPC handle: "
           "cudaIpcGetMemHandle failed with {}",
           where, peer, card.place.pid, card.handleError);
    void* opened = nullptr;
    checkCuda(cudaIpcOpenMemHandle(&opened, card.handle, cudaIpcMemLazyEnablePeerAccess),
              fmt::format("{}: cudaIpcOpenMemHandle of rank {}'s FIFOs (pid {})", where, peer,
                          card.place.pid));
    links->areas_[peer] = static_cast<uint8_t*>(opened);
    links->opened_[peer] = true;
  }
  for (int p = 0; p < kHopProtocols; ++p) {
    links->netRingSend_[p].assign(geometry.channels, {});
    links->netRingRecv_[p].assign(geometry.channels, {});
  }
  links->netPairSend_.assign(nranks, {});
  links->netPairRecv_.assign(nranks, {});
  for (int t = 0; t < links->treeChannels(); ++t) {  // of the ranks' hosts, over t's ring order
    std::vector<uint64_t> hosts;
    for (int peer : ringOrders[t]) hosts.push_back(cards[peer].place.hostHash);
    links->treeShapes_.emplace_back(hosts);
  }
  links->layOutTrees(remote);
  if (std::find(remote.begin(), remote.end(), true) != remote.end())
    links->connectNetwork(remote, allGather, deadline);
  // No rank returns before every rank has made its allocations and mappings: one made while a
  // peer's first kernel runs may keep that kernel apart from this rank's (CUDA's implicit
  // synchronization), and the kernel waits for this rank's.
  std::vector<char> arrived(nranks);
  allGather(arrived.data(), 1);
  BRAID_INFO(log::kInit, "{}: {} bytes of device FIFOs, {} channels", where, links->areaBytes_,
             geometry.channels);
  return links;
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
  // those give up at their deadline. The proxy stops before its pinned FIFOs are freed.
  proxy_.reset();
  for (size_t peer = 0; peer < opened_.size(); ++peer)
    if (opened_[peer]) cudaIpcCloseMemHandle(areas_[peer]);
  if (ringOrders_ != nullptr) cudaFree(ringOrders_);
  if (own_ != nullptr) cudaFree(own_);
  if (abortStream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(abortStream_));
}

}  // namespace braid
