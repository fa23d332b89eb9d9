// The CUDA P2P transport: FIFOs in the receiving GPU's memory, written by the sending rank's
// kernel and read by the receiving rank's. Each rank allocates every FIFO it receives on in one
// device allocation: per channel a ring FIFO for each protocol (the Simple protocol's slots, the
// low-latency protocol's lines and the segmented protocol's segments never share a buffer: stale
// bytes of one could look like a flag of another), per peer a FIFO for sends and receives, per tree
// channel a Simple and a low-latency FIFO from each tree neighbour (a tree slot on the sends' FIFO
// could land between the parts of a user's message), and the direct engine's barrier words (used in
// rank 0's allocation only, so that every rank of a launch meets on the same words). Ranks of one
// process reach a peer's allocation by its pointer, ranks of another process on the same host by a
// CUDA IPC handle; where the two GPUs differ, peer access is enabled. Ranks on other hosts are
// reached through FIFOs in pinned host memory that the network transport's proxy moves: this
// transport lays out which hops it needs (ConnectState::networkHops), the net transport connects
// them. Both serve a set of LinkKind::DeviceFifos in the registry (transport/transport.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/binary_trees.h"
#include "transport/connector.h"
#include "transport/fifo_view.h"
#include "transport/transport.h"

namespace braid {

enum class DeviceProtocol : uint8_t { Simple, LowLatency, Segmented };

// How big the FIFOs of a CUDA communicator are.
struct DeviceFifoGeometry {
  int channels = 1;
  size_t simpleSlotBytes = 0;
  uint32_t simpleSlots = 0;
  size_t llSlotBytes = 0;  // half of them data (LlPorts)
  uint32_t llSlots = 0;
  size_t segmentBytes = 0;  // data of one segment (SegmentPorts), a multiple of 16
  uint32_t segmentsPerSlot = 0;
  uint32_t segmentSlots = 0;
};

// Where one rank is, as its peers need to know it.
struct DeviceRankPlace {
  uint64_t hostHash = 0;      // same host (and network namespace)
  uint64_t processNonce = 0;  // same process: pointers are valid as they are
  int32_t pid = 0;            // for messages
  int32_t device = -1;        // CUDA device ordinal in that process
};

// What a CUDA communicator's FIFOs need (LinkRequest::device): where this rank is (its host is
// the rendezvous's), how big they are, and the ring order of each channel (channels x nranks).
struct DeviceConnect {
  DeviceRankPlace self;
  DeviceFifoGeometry geometry;
  std::vector<std::vector<int>> ringOrders;
};

// The registry's P2P transport: a set of LinkKind::DeviceFifos on every rank (it holds the rank's
// own FIFOs and its exchange meets every rank); peers on this host. Its links are
// PeerLinks::device.
const Transport* p2pTransport();

class P2pSetup;

// The direct engine's barrier words are lines of their own (coll/direct_engine.h's
// DirectArrival): one writer, every rank of the channel reading.
constexpr size_t kDirectLineBytes = 64;

// One FIFO as a kernel reaches it: in a GPU's memory, or in pinned host memory that a network
// proxy drains (the sender's end: `used` set) or fills.
struct DeviceFifo {
  FifoWords* words = nullptr;
  uint8_t* slots = nullptr;
  size_t slotBytes = 0;
  uint32_t nSlots = 0;
  uint64_t* used = nullptr;  // a proxy's send FIFO: the bytes in use of each slot
  FifoSendView sendView() const { return {words, slots, slotBytes, nSlots, 0, 0, used}; }
  FifoRecvView recvView() const { return {words, slots, slotBytes, nSlots}; }
};

// A rank's FIFOs as its kernels reach them, made by the P2P transport's setup (connectPeers with
// a DeviceConnect, on the rank's device, the current one): its own allocation on its device, every
// peer's on this host opened, and the hops to other hosts in the network proxy's pinned memory.
// The ring orders are kept in device memory for the kernels (RingCall::ringOrder).
class P2pLinks {
 public:
  ~P2pLinks();
  P2pLinks(const P2pLinks&) = delete;
  P2pLinks& operator=(const P2pLinks&) = delete;

  const DeviceFifoGeometry& geometry() const { return geometry_; }
  // The ring FIFOs of `channel` this rank receives on (its predecessor writes it) and sends on.
  // Fails for the segmented protocol on a hop to another host (the network proxy carries Simple
  // slots and low-latency lines).
  DeviceFifo ringRecv(int channel, DeviceProtocol protocol) const {
    return ringEnd(channel, protocol, false);
  }
  DeviceFifo ringSend(int channel, DeviceProtocol protocol) const {
    return ringEnd(channel, protocol, true);
  }
  // The FIFOs of sends and receives: from `sender` to this rank, from this rank to `receiver`.
  DeviceFifo pairRecv(int sender) const;
  DeviceFifo pairSend(int receiver) const;
  // Tree channels, for the all-reduce on the double binary tree (treeChannelsOf the channels):
  // channel c runs tree c % 2 of base/binary_trees.h's TreesOfHosts over channel c's ring order
  // (so the trees leave a host through the NICs the rings do).
  int treeChannels() const { return treeChannelsOf(geometry_.channels); }
  // Slots of a tree FIFO on this host: two, so that a pass of the tree (coll/tree_engine.h: every
  // slot up, then every result down) fills one while its neighbour reads the other.
  static constexpr uint32_t kTreeSlots = 2;
  // The protocols of a tree and of a hop to another host: Simple 0, low-latency 1; the index
  // fails for the segmented protocol, which neither runs.
  static constexpr int kHopProtocols = 2;
  static int hopProtocolIndex(DeviceProtocol protocol);
  // This rank on tree channel `channel`, laid out at connect: its neighbours as ranks, and by
  // protocol (Simple or low-latency) and each one's end (TreeNode::at) the FIFO it writes and this
  // rank reads (`from`) and the one this rank writes and it reads (`to`), in GPU memory or, for a
  // neighbour on another host, in the network proxy's pinned memory (`overNetwork`).
  struct TreeChannel {
    TreeNode node;
    DeviceFifo fromBy[kHopProtocols][TreeNode::kEnds], toBy[kHopProtocols][TreeNode::kEnds];
    bool overNetwork[TreeNode::kEnds] = {};
    const DeviceFifo& from(DeviceProtocol protocol, int end) const {
      return fromBy[hopProtocolIndex(protocol)][end];
    }
    const DeviceFifo& to(DeviceProtocol protocol, int end) const {
      return toBy[hopProtocolIndex(protocol)][end];
    }
  };
  const TreeChannel& tree(int channel) const { return trees_[channel]; }
  // The ring order of `channel` in device memory (nranks ints), and who follows this rank on it.
  const int* ringOrder(int channel) const;
  int ringNext(int channel) const;
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Every rank in this process on this rank's device: a kernel launched here can reach every
  // rank's buffers, which the direct engine needs.
  bool ranksShareDevice() const { return static_cast<int>(ranksOnDevice_.size()) == nranks_; }
  // The ranks in this process on this rank's device, this one among them, in rank order.
  const std::vector<int>& ranksOnDevice() const { return ranksOnDevice_; }
  // The direct engine's barrier of `channel`: nranks lines of kDirectLineBytes, one per rank, and
  // the word that stops its waits; in rank 0's allocation, the same words for every rank.
  void* directArrivals(int channel) const;
  const uint32_t* directAbort() const;
  // Sets the abort word of every FIFO this rank receives or sends on, and the direct engine's,
  // from the host and without waiting for the device: every kernel waiting on them gives up.
  // Best effort: a failure is logged.
  void abort();

 private:
  friend class P2pSetup;
  // What a hop to another host serves (NetworkHops::Hop of the same index): the sends and
  // receives with its peer, or in one protocol (hopProtocolIndex) a ring or tree channel.
  struct NetworkHopUse {
    int protocol = 0;
    int ring = -1, tree = -1;
  };

  P2pLinks() = default;
  // The FIFOs in `receiver`'s device allocation.
  DeviceFifo ringFifo(int receiver, int channel, DeviceProtocol protocol) const;
  DeviceFifo pairFifo(int receiver, int sender) const;
  // The FIFO of `receiver` that its tree neighbour `sender` writes on tree channel `channel`.
  DeviceFifo treeFifo(int receiver, int channel, int sender, DeviceProtocol protocol) const;
  // `rank`'s neighbours on tree channel `channel`, as ranks.
  TreeNode treeNodeOf(int channel, int rank) const;
  // trees_ with every neighbour's FIFOs on this host (those on `remote` hosts: attachNetworkHop).
  void layOutTrees(const std::vector<bool>& remote);
  int ringPosition(int channel, int rank) const;
  DeviceFifo fifoAt(int receiver, size_t offset, size_t slotBytes, uint32_t slots) const;
  DeviceFifo ringEnd(int channel, DeviceProtocol protocol, bool sending) const;
  int ringPrev(int channel) const;
  // The hops to the peers on `remote` hosts, and what each serves.
  void askNetworkHops(const std::vector<bool>& remote, NetworkHops& hops,
                      std::vector<NetworkHopUse>& uses) const;
  // A hop's FIFOs, made by the network transport, where its kernels find them.
  void attachNetworkHop(int peer, const NetworkHopUse& use, const FifoDesc& send,
                        const FifoDesc& recv);
  DeviceFifo onDevice(const FifoDesc& hostFifo, bool sending) const;
  size_t simpleFifoBytes() const;
  size_t llFifoBytes() const;
  size_t segmentFifoBytes() const;
  size_t ringFifosBytes() const;  // a channel's, every protocol's
  size_t treeSimpleFifoBytes() const;
  size_t treeFifoBytes() const;  // a tree end's, both protocols
  size_t treeOffset() const;     // where the tree FIFOs start in an allocation
  size_t directOffset() const;   // where the direct engine's words start in an allocation

  int rank_ = 0;
  int nranks_ = 0;
  std::vector<int> ranksOnDevice_;
  DeviceFifoGeometry geometry_;
  size_t areaBytes_ = 0;
  void* own_ = nullptr;          // this rank's allocation
  std::vector<uint8_t*> areas_;  // every rank's allocation, as this process reaches it
  std::vector<bool> opened_;     // ... through an IPC handle this rank must close
  std::vector<std::vector<int>> hostRingOrders_;
  int* ringOrders_ = nullptr;    // channels x nranks, device memory
  void* abortStream_ = nullptr;  // cudaStream_t for abort()'s stores
  // Hops to other hosts (their pinned FIFOs belong to the network transport's proxy, which
  // PeerLinks::services holds): by channel and protocol (the trees' index: rings), peer (sends and
  // receives) or tree channel and this rank's end (trees) the FIFOs this rank's kernels write and
  // read; a FIFO without words is a hop on this host.
  std::vector<DeviceFifo> netRingSend_[kHopProtocols], netRingRecv_[kHopProtocols];
  std::vector<DeviceFifo> netPairSend_, netPairRecv_;
  std::vector<TreesOfHosts> treeShapes_;  // by tree channel: its tree is tree c % 2 of them
  std::vector<TreeChannel> trees_;        // by tree channel
  std::vector<FifoWords*> netHostWords_;  // their words as the host reaches them (abort)
};

}  // namespace braid
