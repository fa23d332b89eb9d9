// Runs collectives on host memory over connectors: the ring schedule for large messages, a
// one-shot all-pairs exchange for small all-reduces, recursive doubling and halving for
// all-reduces across many ranks (coll/host_recursive.h), the double binary tree
// (coll/host_tree.h), and concurrent progress for grouped send/recv. Knows nothing of how the
// connectors move bytes.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "base/wait.h"
#include "braid/braid.h"
#include "coll/call.h"
#include "coll/schedule.h"
#include "coll/slot_stores.h"
#include "transport/connector.h"
#include "transport/transport.h"

namespace braid {

// How a host all-reduce runs; the communicator's model chooses per size.
// HierDoubling and HierHalving: the hierarchical all-reduce (coll/host_recursive.h), its leaders
// exchanging by recursive doubling or halving.
enum class HostAllReduce : uint8_t {
  Ring,
  OneShot,
  Doubling,
  Halving,
  Tree,
  HierDoubling,
  HierHalving
};
struct HostAllReduceChoice {
  HostAllReduce algorithm = HostAllReduce::Ring;
  // Halving, HierHalving: how many of the recursive exchanges halve, the rest doubling on the part
  // held (coll/host_recursive.h).
  uint8_t halvingLevels = 0;
};
// Entry k serves all-reduces of (2^(k-1), 2^k] bytes (entry 0: up to 1 byte).
using HostAllReduceTable = std::array<HostAllReduceChoice, 64>;
// Per size class as above: whether broadcasts (reduces) of that size run on the double binary
// trees rooted at their root (coll/host_tree.h) instead of the ring's chain; whether all-gathers
// (reduce-scatters) of that size, counted as nccl-tests does (the gathered output, the scattered
// input), run Bruck's log-step algorithm (coll/host_bruck.h) instead of the ring.
using HostSizeClassFlags = std::array<bool, 64>;
size_t sizeClass(size_t bytes);

// A further CPU channel of the communicator: connectors of its own, and the watchdog its thread
// waits with.
struct HostChannel {
  std::span<SendConnector* const> sendTo;    // indexed by peer rank
  std::span<RecvConnector* const> recvFrom;  // indexed by peer rank
  Watchdog* dog = nullptr;
};

// What the executor needs of a communicator.
struct CollContext {
  int rank = 0;
  int nranks = 1;
  std::span<const int> ringOrder;       // ranks in ring order
  std::span<const uint64_t> ringHosts;  // the host of each ring position (the trees' groups)
  // The hierarchical all-reduce's: every host's leader (its first rank in ring order), and this
  // rank's host's ranks, both in ring order (base/recursive_pairing.h's hostLeaders).
  std::span<const int> hostLeaders;
  std::span<const int> hostRanks;
  std::span<SendConnector* const> sendTo;    // indexed by peer rank
  std::span<RecvConnector* const> recvFrom;  // indexed by peer rank
  Watchdog* dog = nullptr;
  // The communicator's further CPU channels: a ring call of at least channelMinBytes (its output)
  // runs a share of every block on each channel at once. Empty: the ring runs on one.
  std::span<const HostChannel> moreChannels;
  size_t channelMinBytes = SIZE_MAX;
  HostAllReduceTable allReduce{};  // all Ring unless the communicator's model says otherwise
  HostSizeClassFlags broadcastOnTree{}, reduceOnTree{};  // all false (the chain) unless it says so
  HostSizeClassFlags allGatherBruck{}, reduceScatterBruck{};  // all false (the ring) likewise
  size_t directMaxBytes = 0;  // the one-shot exchange takes at most this much (at most a FIFO)
  // At least directMaxBytes, and the input of the largest reduce-scatter Bruck's algorithm runs.
  void* scratch = nullptr;
  size_t streamingMinBytes = SIZE_MAX;     // outputs this large bypass the cache
  SlotStoreChooser* slotStores = nullptr;  // how ring calls write FIFO slots; null: cached
  uint64_t sequence = 0;  // this collective's number on the communicator (coll/call_tag.h)
  // The communicator's identity, in every call's tag, and where the rank publishes its call for
  // the peers on its host (transport.h's publishCall; none: not published).
  uint64_t commIdentity = 0;
  RankControl* self = nullptr;
};

void runCollective(CollContext& ctx, const CollArgs& args);

// Sends and receives of one group, progressed together so that no ordering among them can
// deadlock. Operations with the same peer and direction complete in issue order.
void runSendRecv(CollContext& ctx, std::span<const CollArgs> ops);

}  // namespace braid
