#include "transport/p2p.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

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

size_t P2pLinks::directOffset() const {
  return static_cast<size_t>(geometry_.channels) * (simpleFifoBytes() + llFifoBytes()) +
         static_cast<size_t>(nranks_) * simpleFifoBytes();
}

// A rank's allocation: per channel its Simple then its low-latency ring FIFO, then one Simple
// FIFO per sending peer, then the direct engine's words: per channel a line per rank, then the
// abort word on a line of its own.
DeviceFifo P2pLinks::ringFifo(int receiver, int channel, DeviceProtocol protocol) const {
  const size_t offset = static_cast<size_t>(channel) * (simpleFifoBytes() + llFifoBytes());
  if (protocol == DeviceProtocol::Simple)
    return fifoAt(receiver, offset, geometry_.simpleSlotBytes, geometry_.simpleSlots);
  return fifoAt(receiver, offset + simpleFifoBytes(), geometry_.llSlotBytes, geometry_.llSlots);
}

DeviceFifo P2pLinks::pairFifo(int receiver, int sender) const {
  const size_t offset =
      static_cast<size_t>(geometry_.channels) * (simpleFifoBytes() + llFifoBytes()) +
      static_cast<size_t>(sender) * simpleFifoBytes();
  return fifoAt(receiver, offset, geometry_.simpleSlotBytes, geometry_.simpleSlots);
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
  const std::vector<int>& order = hostRingOrders_[channel];
  for (int pos = 0; pos < nranks_; ++pos)
    if (order[pos] == rank_) return order[(pos + 1) % nranks_];
  return rank_;
}

const int* P2pLinks::ringOrder(int channel) const {
  return ringOrders_ + static_cast<size_t>(channel) * nranks_;
}

std::unique_ptr<P2pLinks> P2pLinks::connect(int rank, int nranks, const DeviceRankPlace& self,
                                            const DeviceFifoGeometry& geometry,
                                            const std::vector<std::vector<int>>& ringOrders,
                                            const std::function<void(void*, size_t)>& allGather) {
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
    std::snprintf(cards[rank].handleError, sizeof cards[rank].handleError, "%s (%s)",
                  cudaGetErrorName(e), cudaGetErrorString(e));
  }
  allGather(cards.data(), sizeof(DeviceCard));

  links->areas_.assign(nranks, nullptr);
  links->opened_.assign(nranks, false);
  links->ranksShareDevice_ = true;
  for (int peer = 0; peer < nranks; ++peer) {
    const DeviceCard& card = cards[peer];
    links->ranksShareDevice_ = links->ranksShareDevice_ &&
                               card.place.processNonce == self.processNonce &&
                               card.place.device == self.device;
    if (card.place.hostHash != self.hostHash)
      fail(braidInvalidUsage,
           "{}: rank {} is on another host; a CUDA communicator reaches ranks of this host only "
           "so far (hops through the network are not implemented yet; docs/cuda.md)",
           where, peer);
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
                 cudaGetErrorString(e));
  };
  for (int c = 0; c < geometry_.channels; ++c)
    for (DeviceProtocol protocol : {DeviceProtocol::Simple, DeviceProtocol::LowLatency}) {
      set(&ringFifo(rank_, c, protocol).words->abort);
      // A block waiting for send credit reads this one.
      set(&ringFifo(ringNext(c), c, protocol).words->abort);
    }
  for (int peer = 0; peer < nranks_; ++peer) {
    set(&pairFifo(rank_, peer).words->abort);
    set(&pairFifo(peer, rank_).words->abort);
  }
  set(directAbort());
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
