// The cost model: time(operation, algorithm, protocol, bytes) = latency + bytes / bandwidth, from
// a plan's channels and, for ranks whose reductions run on host cores, what a core sustains.
// It predicts the busbw braid-perf prints next to the measured one, and it chooses the algorithm
// and protocol of every call. See docs/plan.md for the formulas and where they miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace braid::plan {

// In braidCollective_t's order (include/braid/braid.h).
enum class Operation : uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, SendRecv };
// Doubling and Halving are host ranks' all-reduces in log2(n) exchanges (coll/host_recursive.h):
// recursive doubling, and recursive halving then doubling (Rabenseifner). Tree: host ranks'
// all-reduce on the double binary tree (coll/host_tree.h). HierDoubling, HierHalving: host ranks'
// hierarchical all-reduce, each host's ranks handing their inputs to its leader and only the
// leaders exchanging across hosts, by recursive doubling or halving. Bruck: host ranks' all-gather
// and reduce-scatter in ceil(log2 n) steps (coll/host_bruck.h).
enum class Algorithm : uint8_t {
  Ring,
  Direct,
  Doubling,
  Halving,
  Tree,
  HierDoubling,
  HierHalving,
  Bruck
};
// Bruck's reduce-scatter keeps partial sums of other ranks' blocks in scratch, up to its input's
// size: it takes inputs this large at most (larger ones run the ring).
inline constexpr size_t kBruckReduceScatterMaxBytes = size_t{4} << 20;
inline constexpr Algorithm kAlgorithms[] = {
    Algorithm::Ring, Algorithm::Direct,       Algorithm::Doubling,    Algorithm::Halving,
    Algorithm::Tree, Algorithm::HierDoubling, Algorithm::HierHalving, Algorithm::Bruck};
// Device protocols (coll/ring_engine.h): Simple (slots published by tail), LL (flagged 8-byte
// lines, half of them data), Segmented (warp segments, each published by its own flag: the mid
// sizes). Host ranks run Simple only.
enum class Protocol : uint8_t { Simple, LL, Segmented };
inline constexpr Protocol kProtocols[] = {Protocol::Simple, Protocol::LL, Protocol::Segmented};

const char* operationName(Operation op);
const char* algorithmName(Algorithm algorithm);
const char* protocolName(Protocol protocol);

// nccl-tests' bus bandwidth factor: all-reduce 2(n-1)/n; reduce-scatter, all-gather (n-1)/n;
// broadcast, reduce, send/recv 1.
double busBandwidthFactor(Operation op, int nranks);

// What a host's cores sustain, besides the links. Ring figures are bytes through one rank's send
// FIFO per second; they fold in the memory traffic of each step (reading the received slot and
// the input, writing the output and the next slot).
struct CoreRates {
  double reduceGBs = 0;       // reduce-scatter steps: received slot OP input -> next slot
  double copyGBs = 0;         // all-gather steps: received slot -> output and next slot
  double cachedSpeedup = 1;   // how much faster both run when the working set stays in cache
  double sharedCoreCost = 1;  // a rank's cost on a core it shares with others, per rank on it
};

struct Latencies {
  double callUs = 0;    // one call, nothing moved
  double hopUs = 0;     // one handoff between ranks of a host
  double netHopUs = 0;  // one message to another host
  double switchUs = 0;  // a rank woken after its core ran another thread (ranks > cores)
};

struct ModelInput {
  bool hostRanks = true;  // reductions on host cores (CPU communicators), else on devices
  CoreRates core;         // hostRanks only
  Latencies latency;
  std::vector<int> coresPerHost;  // usable cores of each host
  // Ranks on the machine of each host; with several hosts each has a network proxy thread too.
  std::vector<int> ranksPerHost;
  size_t fifoBytes = 1 << 20;    // per connector: a rank runs at most this far ahead
  size_t slotBytes = 128 << 10;  // of those, one slot (a tree's step)
  double cacheBytes = 0;         // last-level cache the ranks of a machine can count on; 0: unknown
  size_t directMaxBytes = 0;     // the one-shot exchange holds at most this per peer
  // Host ranks: the network between hosts is the machines' own TCP copies (virtual interfaces such
  // as veth: namespace hosts), so its bytes take the cores' time instead of a link's beside it.
  bool linkOnCores = false;
  // Device ranks only: every rank on one GPU (threads of one process), moving bytes through its
  // memory, which runs at deviceMemoryGBs (reads and writes together; 0: unknown, the plan's
  // links then stand in).
  bool ranksShareDevice = false;
  double deviceMemoryGBs = 0;
  // Device ranks only: channels per rank, a thread block each; 0: unknown (links and memory alone
  // then bound the rate). A block moves a few GB/s however fast the links are.
  int deviceChannels = 0;
  // Indexed by Algorithm (BRAID_ALGO).
  std::vector<bool> allowedAlgorithms = std::vector<bool>(std::size(kAlgorithms), true);
  // Whether the algorithms were named (BRAID_ALGO or a config's: a non-empty list). Some run only
  // where named (`named`):
  //  - device ranks on one host, the tree: it has not run on a GPU yet (docs/engine.md), and there
  //    the ring's steps are NVLink's. Across hosts the default takes it where it wins: the
  //    alternative is a ring of 2(n-1) network steps (NCCL's choice too);
  //  - host ranks on one host, Bruck's all-gather and reduce-scatter: there the ring measured
  //    faster at mid and large sizes than the model prices it.
  bool algorithmsNamed = false;
  bool named(Algorithm algorithm) const {
    return algorithmsNamed && allowedAlgorithms[static_cast<int>(algorithm)];
  }
  // BRAID_HALVING_LEVELS: where positive, how many of recursive halving's exchanges halve at every
  // size (at most log2 of its participants); 0: the model picks per size.
  int halvingLevels = 0;
  // Device ranks: the data of one low-latency slot (core/cuda_comm.cc's kLlSlotBytes, half of it
  // data), a device tree's step in that protocol.
  size_t deviceLlSlotDataBytes = 8 << 10;
  // Indexed by Protocol (BRAID_PROTO).
  std::vector<bool> allowedProtocols = std::vector<bool>(std::size(kProtocols), true);
  // Likewise the segmented protocol, until a GPU run has fitted its constants: devices choose it
  // only where BRAID_PROTO names it.
  bool deviceSegmentedNamed = false;
};

struct Prediction {
  Algorithm algorithm = Algorithm::Ring;
  Protocol protocol = Protocol::Simple;
  double us = 0;
  double busBwGBs = 0;
};

// Device latencies of one hop, in µs, per protocol.
struct DeviceLatency {
  double simpleUs = 0, llUs = 0, segmentedUs = 0;
  double of(Protocol protocol) const {
    return protocol == Protocol::LL          ? llUs
           : protocol == Protocol::Segmented ? segmentedUs
                                             : simpleUs;
  }
  DeviceLatency& operator+=(const DeviceLatency& hop) {
    simpleUs += hop.simpleUs;
    llUs += hop.llUs;
    segmentedUs += hop.segmentedUs;
    return *this;
  }
  // Each protocol's larger latency (the slowest hop or path may differ by protocol).
  void takeSlower(const DeviceLatency& other) {
    simpleUs = simpleUs > other.simpleUs ? simpleUs : other.simpleUs;
    llUs = llUs > other.llUs ? llUs : other.llUs;
    segmentedUs = segmentedUs > other.segmentedUs ? segmentedUs : other.segmentedUs;
  }
};

// How a CUDA communicator's ranks launch a call, as far as the direct engine goes.
enum class DeviceLaunch : uint8_t {
  Apart,     // each rank on its own thread, its buffers unknown to the peers: the ring only
  Windowed,  // each on its own, its buffers in registered windows the peers reach: direct too
  Together,  // every rank in one launch (one thread drives them, rank after rank): direct too
};

class Model {
 public:
  Model(const LinkGraph& graph, const Plan& plan, ModelInput input);

  // Microseconds for one call moving `bytes` (nccl-tests' size: the all-reduce buffer, the
  // all-gather output, ...); infinity where the algorithm or protocol cannot run it.
  double timeUs(Operation op, Algorithm algorithm, Protocol protocol, size_t bytes) const;
  // The fastest allowed algorithm and protocol, its time at least what the host takes to issue a
  // device call (timeUs is the device's part alone). Deterministic: every rank chooses the same.
  // `launch`: how a device call's ranks are launched (host ranks: Together, which changes nothing).
  Prediction best(Operation op, size_t bytes, DeviceLaunch launch = DeviceLaunch::Together) const;
  // The fastest allowed algorithm other than best's (why best won, for braid-topo --plan); its
  // time infinite where no other runs.
  Prediction runnerUp(Operation op, size_t bytes,
                      DeviceLaunch launch = DeviceLaunch::Together) const;
  // Halving and HierHalving: how many of the recursive exchanges halve at this size (at least
  // one; the rest double on the part held, coll/host_recursive.h), as priced; 0 for the others.
  int halvingLevels(Algorithm algorithm, size_t bytes) const;
  // One line per term, for braid-topo --plan and docs.
  std::string describe() const;

 private:
  Prediction fastest(Operation op, size_t bytes, DeviceLaunch launch,
                     std::optional<Algorithm> skip) const;
  Prediction asIssued(Prediction p, Operation op, size_t bytes, DeviceLaunch launch) const;
  double ringTimeUs(Operation op, Protocol protocol, size_t bytes) const;
  double directTimeUs(Operation op, Protocol protocol, size_t bytes) const;
  // The recursive exchanges of `team` (every rank, or the hosts' leaders).
  struct ExchangeTeam {
    // Whether the exchange with the partner at distance 2^k (among the power of two that take
    // part) crosses hosts for some pair, and whether folding the surplus members in does.
    std::vector<bool> crossesHosts;
    bool folds = false;
    bool foldCrossesHosts = false;
    int nicSharers = 1;    // members that exchange through one host's NIC at once
    double busyShare = 1;  // of the ranks, those busy during the exchanges (the members)
  };
  double recursiveTimeUs(Operation op, Protocol protocol, size_t bytes, bool halving) const;
  // One exchange of `stepBytes` each way by every member of `team` at once, in a call of
  // `callBytes`.
  double exchangeUs(const ExchangeTeam& team, bool crosses, double stepBytes, bool reduces,
                    size_t callBytes) const;
  double exchangesUs(const ExchangeTeam& team, size_t bytes, int halvingLevels) const;
  double bruckTimeUs(Operation op, Protocol protocol, size_t bytes) const;
  int bestHalvingLevels(const ExchangeTeam& team, size_t bytes) const;
  double handoffUs(bool crossesHosts, double busyShare = 1) const;
  double coreAndLinkUs(double coreUs, double linkUs) const;
  double hierarchicalTimeUs(Operation op, Protocol protocol, size_t bytes, bool halving) const;
  double treeTimeUs(Operation op, Protocol protocol, size_t bytes) const;
  double rootedTreeTimeUs(Operation op, size_t bytes) const;
  double treePassUs(double slots, double coreUs, double linkUs) const;
  double treeLinkUs(double slot) const;
  double deviceTreeTimeUs(Operation op, Protocol protocol, size_t bytes) const;
  double stepLatencyUs(Protocol protocol) const;
  // Busy threads per core on the most loaded machine, >= 1, where `busyShare` of the ranks work.
  double oversubscription(double busyShare = 1) const;
  // How much slower a rank's core work runs for sharing its core.
  double crowding(double busyShare = 1) const;
  ExchangeTeam exchangeTeam(const LinkGraph& graph, const std::vector<int>& members) const;
  void findTreeCrossings(const LinkGraph& graph, const std::vector<int>& order);
  void findDeviceTreePaths(const LinkGraph& graph, const Channel& channel);
  double cacheSpeedup(size_t bytes) const;

  int nranks_ = 1;
  int hosts_ = 1;
  // Bus bandwidth of a device ring per protocol, or of the direct engine: the links' and memory's
  // share, capped by what the blocks move.
  double deviceRingGBs(Protocol protocol) const;
  double deviceDirectGBs() const;

  double ringGBs_ = 0;        // the plan's channels together
  double directGBs_ = 0;      // device ranks: what one rank's direct reads and writes reach
  DeviceLatency slowestHop_;  // device rings: the slowest hop of channel 0
  bool allPairsDirect_ = false;
  int busiestNicMessages_ = 0;  // host ranks: one-shot messages through the busiest host's NIC
  int busiestHostRanks_ = 0;    // ranks of the host with the most
  // Host ranks, recursive exchanges: of every rank in ring order, and of the hosts' leaders (the
  // first rank of each in ring order).
  ExchangeTeam everyRank_, leaders_;
  // Host ranks, Bruck's steps (distance 2^k in ring order): whether some rank's partner at that
  // distance is on another host.
  std::vector<bool> bruckCrossesHosts_;
  // Trees (base/binary_trees.h over the ring order): their depth, the most hosts a path from the
  // top crosses, and whether an edge of either crosses hosts.
  int treeDepth_ = 0;
  int treePathCrossings_ = 0;
  bool treeCrossesHosts_ = false;
  DeviceLatency treePath_;  // device ranks: the trees' slowest path from the top to a leaf
  ModelInput in_;
};

// The host figures and latencies of BRAID_MODEL_*, and the algorithms and protocols BRAID_ALGO and
// BRAID_PROTO allow ("ring", "direct", "doubling", "halving", "tree", "hier-doubling",
// "hier-halving", "hier" for both, "bruck", "ring,direct"; "simple", "ll", "segmented"; empty =
// all). Fails naming the variable and the accepted values. The caller fills in the machine: cores,
// threads, FIFOs.
ModelInput modelInputFromParams();
// The algorithms a list names ("ring,doubling"; empty: all), indexed by Algorithm; fails naming
// `source` and the accepted names.
std::vector<bool> allowedAlgorithms(const std::string& list, const char* source);
// The algorithms `list` names, into `input`: allowedAlgorithms, and algorithmsNamed where the list
// is not empty.
void allowAlgorithms(ModelInput& input, const std::string& list, const char* source);

// The channels a CUDA communicator's rank runs, a thread block each (core/device_side.cc): a
// block moves a few GB/s (bench/results/gpu-check), so on one host the ranks that share a GPU take
// kMaxDeviceChannels blocks between them, as many as one launch of them all holds (2 ranks: 16
// channels each, 3.7x the bandwidth of 4 on an H100); across hosts every channel is a network link
// each way, so four. The channel bounds (BRAID_MIN/MAX_NCHANNELS, a config's) have the last word,
// within kMaxDeviceChannels.
constexpr int kMaxDeviceChannels = 32;
int deviceChannels(bool oneHost, int ranksSharingDevice, int minChannels, int maxChannels);

// The largest all-reduce the host one-shot exchange can take (ModelInput::directMaxBytes): one
// FIFO slot on one host, where a larger one goes round the ring, whose copies are fewer; across
// hosts a whole FIFO, posted in slot-sized pieces whose transfers overlap the reductions.
size_t hostDirectMaxBytes(int hosts, size_t slotPayloadBytes, int slots);

}  // namespace braid::plan
