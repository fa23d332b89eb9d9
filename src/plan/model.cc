#include "plan/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "base/binary_trees.h"
#include "base/error.h"
#include "base/params.h"
#include "base/recursive_pairing.h"

namespace braid::plan {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Device latencies per hop and protocol, in µs: the magnitudes of NCCL's tuning tables
// (src/graph/tuning.cc: hwLat for rings, baseLat per protocol; the segmented protocol takes
// LL128's, the protocol it stands for, until a GPU run fits its own). LL moves 4 bytes of data per
// 8-byte store (the other 4 are the flag), so it gets half the link bandwidth; a segment is 2 KiB
// of data and a 4-byte flag. Across hosts none is braid's own: no GPU run has crossed hosts, and
// braid's LL hop there takes the Simple hop's proxy handoffs (the sender's fenced tail, the proxy's
// poll, a copy at the receiver; NCCL's proxy polls the lines instead), saving only the receiver's
// tail round trip, so its 2.7 us is the optimistic end (docs/plan.md).
DeviceLatency deviceHopLatency(HopKind kind) {
  switch (kind) {
    case HopKind::NvLink: return {3.4, 0.6, 1.9};
    case HopKind::PcieP2p: return {5.7, 1.0, 2.5};
    case HopKind::HostMemory: return {5.7, 1.0, 2.5};
    case HopKind::Network: return {14.0, 2.7, 4.0};
  }
  return {14.0, 2.7, 4.0};
}
constexpr double kProtocolEfficiency[] = {1.0, 0.5, 2048.0 / 2052.0};
// Device figures fitted to one H200 (bench/results/gpu-check/run3-4baa0c9-h200: the kernel sweep,
// 2 ranks x 1-32 channels at 256 MiB, and braid-perf all-reduce 8 B - 256 MiB at 2 and 8 ranks):
// - what one thread block moves alone, as bus bandwidth: a Simple ring channel 12.3 GB/s, an LL
//   one 1.7; a direct-engine block 16.6. A segmented channel has not run yet: Simple's figure
//   stands in (its warps move with the same packs in flight). With c blocks the blocks' rate and
//   the memory's combine as 1/G = 1/(c x block) + 1/memory (within 4% for the ring at 1-32
//   channels; the direct engine within 15% at 1-16 channels per rank, and 8 ranks x 4 within 10%);
// - a kernel's own fixed time, 2 us, then its steps' hop latencies (deviceHopLatency);
// - what the host takes to issue a call, 11 us, and 1.2 us more per rank when one thread issues
//   every rank's launch: back-to-back calls overlap it with the previous kernels, so a call takes
//   the longer of the two (the small sizes' flat 12 us at 2 ranks, 20.5 us at 8 in one launch).
constexpr double kDeviceChannelGBs[] = {12.3, 1.7, 12.3};  // indexed by Protocol
constexpr double kDirectBlockGBs = 16.6;
constexpr double kDeviceKernelUs = 2.0;
constexpr double kDeviceIssueUs = 11.0;
constexpr double kDeviceIssuePerRankUs = 1.2;

// Blocks' rate and the memory's: each alone would bound the call; together both take time.
double combinedGBs(double blocksGBs, double memoryGBs) {
  return 1 / (1 / blocksGBs + 1 / memoryGBs);
}

double microseconds(double bytes, double gbs) {
  return gbs > 0 ? bytes / gbs / 1e3 : kInfinity;
}

// How many ring steps a call takes: the pipeline fill its latency pays once.
int ringSteps(Operation op, int n) {
  switch (op) {
    case Operation::AllReduce: return 2 * (n - 1);
    case Operation::SendRecv: return 1;
    default: return n - 1;
  }
}

std::vector<bool> parseChoice(const std::string& value, const char* variable,
                              const std::vector<const char*>& names) {
  std::vector<bool> allowed(names.size(), value.empty());
  std::stringstream list(value);
  std::string item;
  while (std::getline(list, item, ',')) {
    std::transform(item.begin(), item.end(), item.begin(), ::tolower);
    auto it = std::find_if(names.begin(), names.end(), [&](const char* n) { return item == n; });
    if (it == names.end())
      fail(braidInvalidArgument,
           "{}={}: unknown value '{}' (expected a comma-separated list of {})", variable, value,
           item, fmt::join(names, ", "));
    allowed[it - names.begin()] = true;
  }
  return allowed;
}

}  // namespace

const char* operationName(Operation op) {
  switch (op) {
    case Operation::AllReduce: return "allreduce";
    case Operation::ReduceScatter: return "reducescatter";
    case Operation::AllGather: return "allgather";
    case Operation::Broadcast: return "broadcast";
    case Operation::Reduce: return "reduce";
    case Operation::SendRecv: return "sendrecv";
  }
  return "?";
}

const char* algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::Ring: return "ring";
    case Algorithm::Direct: return "direct";
    case Algorithm::Doubling: return "doubling";
    case Algorithm::Halving: return "halving";
    case Algorithm::Tree: return "tree";
    case Algorithm::HierDoubling: return "hier-doubling";
    case Algorithm::HierHalving: return "hier-halving";
    case Algorithm::Bruck: return "bruck";
  }
  return "?";
}
const char* protocolName(Protocol protocol) {
  switch (protocol) {
    case Protocol::Simple: return "simple";
    case Protocol::LL: return "ll";
    case Protocol::Segmented: return "segmented";
  }
  return "?";
}

double busBandwidthFactor(Operation op, int nranks) {
  const double n = nranks;
  switch (op) {
    case Operation::AllReduce: return 2 * (n - 1) / n;
    case Operation::ReduceScatter:
    case Operation::AllGather: return (n - 1) / n;
    default: return 1;
  }
}

int deviceChannels(bool oneHost, int ranksSharingDevice, int minChannels, int maxChannels) {
  constexpr int kAcrossHosts = 4;
  const int wanted =
      oneHost ? std::max(1, kMaxDeviceChannels / std::max(1, ranksSharingDevice)) : kAcrossHosts;
  return std::min(std::clamp(wanted, minChannels, std::max(minChannels, maxChannels)),
                  kMaxDeviceChannels);
}

size_t hostDirectMaxBytes(int hosts, size_t slotPayloadBytes, int slots) {
  return hosts > 1 ? slotPayloadBytes * static_cast<size_t>(slots) : slotPayloadBytes;
}

std::vector<bool> allowedAlgorithms(const std::string& list, const char* source) {
  std::vector<const char*> names;
  for (Algorithm algorithm : kAlgorithms) names.push_back(algorithmName(algorithm));
  names.push_back("hier");  // both hierarchical forms
  std::vector<bool> allowed = parseChoice(list, source, names);
  if (allowed.back()) {
    allowed[static_cast<int>(Algorithm::HierDoubling)] = true;
    allowed[static_cast<int>(Algorithm::HierHalving)] = true;
  }
  allowed.pop_back();
  return allowed;
}

void allowAlgorithms(ModelInput& input, const std::string& list, const char* source) {
  input.allowedAlgorithms = allowedAlgorithms(list, source);
  input.algorithmsNamed = !list.empty();
}

ModelInput modelInputFromParams() {
  ModelInput input;
  input.core = {.reduceGBs = param::ModelReduceGBs(),
                .copyGBs = param::ModelCopyGBs(),
                .cachedSpeedup = param::ModelCachedSpeedup(),
                .sharedCoreCost = param::ModelSharedCoreCost()};
  input.latency = {.callUs = param::ModelCallUs(),
                   .hopUs = param::ModelHopUs(),
                   .netHopUs = param::ModelNetHopUs(),
                   .switchUs = param::ModelSwitchUs()};
  allowAlgorithms(input, param::Algo(), "BRAID_ALGO");
  const int64_t halvingLevels = param::HalvingLevels();
  if (halvingLevels < 0 || halvingLevels > 63)
    fail(braidInvalidArgument,
         "BRAID_HALVING_LEVELS={}: expected 0 (the model picks) or how many of recursive halving's "
         "exchanges halve, 1 to 63",
         halvingLevels);
  input.halvingLevels = static_cast<int>(halvingLevels);
  const std::string protocols = param::Proto();
  std::vector<const char*> names;
  for (Protocol protocol : kProtocols) names.push_back(protocolName(protocol));
  input.allowedProtocols = parseChoice(protocols, "BRAID_PROTO", names);
  input.deviceSegmentedNamed =
      !protocols.empty() && input.allowedProtocols[static_cast<int>(Protocol::Segmented)];
  return input;
}

Model::Model(const LinkGraph& graph, const Plan& plan, ModelInput input)
    : nranks_(graph.nranks()), hosts_(std::max(1, graph.hosts)), in_(std::move(input)) {
  // Device ranks on several hosts: the network proxy carries Simple slots and low-latency lines
  // (transport/p2p.cc), not the segmented protocol's segments.
  if (!in_.hostRanks && hosts_ > 1)
    in_.allowedProtocols[static_cast<int>(Protocol::Segmented)] = false;
  ringGBs_ = plan.totalBandwidthGBs();
  if (!plan.channels.empty()) {
    for (const Hop& hop : plan.channels.front().hops)
      slowestHop_.takeSlower(deviceHopLatency(hop.kind));
  }
  // One-shot exchanges need every pair joined directly: shared memory on one host, the network
  // transport between host ranks on different hosts (it connects any pair), or NVLink / NVSwitch
  // between devices, or one GPU that every rank shares.
  allPairsDirect_ = hosts_ == 1 || in_.hostRanks;
  directGBs_ = ringGBs_;
  std::vector<int> ranksOfHost(hosts_, 0);
  for (int r = 0; r < nranks_; ++r) ++ranksOfHost[std::clamp(graph.hostOfRank(r), 0, hosts_ - 1)];
  for (int ranks : ranksOfHost) {
    busiestNicMessages_ = std::max(busiestNicMessages_, ranks * (nranks_ - ranks));
    busiestHostRanks_ = std::max(busiestHostRanks_, ranks);
  }
  if (in_.hostRanks && !plan.channels.empty()) {
    const std::vector<int>& order = plan.channels.front().order;
    everyRank_ = exchangeTeam(graph, order);
    everyRank_.nicSharers = busiestHostRanks_;
    leaders_ =
        exchangeTeam(graph, hostLeaders(order, [&](int rank) { return graph.hostOfRank(rank); }));
    leaders_.busyShare = static_cast<double>(hosts_) / nranks_;
    findTreeCrossings(graph, order);
    for (int d = 1; d < nranks_; d *= 2) {
      bool crosses = false;
      for (int p = 0; p < nranks_; ++p)
        crosses |= graph.hostOfRank(order[p]) != graph.hostOfRank(order[(p + d) % nranks_]);
      bruckCrossesHosts_.push_back(crosses);
    }
  }
  if (!in_.hostRanks && in_.ranksShareDevice) {
    // Ranks on one GPU share its memory: n ranks move their bytes at once. Each reads its input
    // and writes its output (2 accesses per byte); a ring hop's FIFO slot, written and read back
    // at once, stays in the L2 cache (the GPU's 32 blocks hold 32 MiB of FIFO at most), so the
    // ring pays the direct engine's 2 (the sweep of run3 fits this within 4%, and not 4). A hop
    // stays in the GPU's memory: NVLink's latency bounds it.
    if (in_.deviceMemoryGBs > 0) {
      directGBs_ = ringGBs_ = in_.deviceMemoryGBs / (2.0 * nranks_);
    }
    slowestHop_ = deviceHopLatency(HopKind::NvLink);
  }
  if (!in_.hostRanks && !plan.channels.empty()) findDeviceTreePaths(graph, plan.channels.front());
  if (!in_.hostRanks && !in_.ranksShareDevice) {
    for (int a = 0; a < nranks_ && allPairsDirect_; ++a)
      for (int b = 0; b < nranks_ && allPairsDirect_; ++b) {
        if (a == b) continue;
        bool joined = false;
        for (const Edge& e : graph.edges) {
          const int from = graph.rankVertex[a];
          if (e.from != from || e.kind != LinkKind::NvLink) continue;
          joined = e.to == graph.rankVertex[b] || graph.vertices[e.to].kind == VertexKind::NvSwitch;
          if (joined) break;
        }
        allPairsDirect_ = joined;
      }
  }
}

double Model::oversubscription(double busyShare) const {
  const int threadsPerRank = hosts_ > 1 ? 2 : 1;  // a rank, and its network proxy
  double worst = 1;
  for (size_t h = 0; h < in_.ranksPerHost.size() && h < in_.coresPerHost.size(); ++h)
    worst = std::max(
        worst, in_.ranksPerHost[h] * busyShare * threadsPerRank / std::max(1, in_.coresPerHost[h]));
  return worst;
}

double Model::crowding(double busyShare) const {
  const double share = oversubscription(busyShare);
  return share > 1 ? std::ceil(share) * in_.core.sharedCoreCost : 1;
}

// Partners as coll/host_recursive.cc pairs them (base/recursive_pairing.h), by their order.
Model::ExchangeTeam Model::exchangeTeam(const LinkGraph& graph,
                                        const std::vector<int>& members) const {
  ExchangeTeam team;
  const RecursivePairing pairing(static_cast<int>(members.size()));
  auto host = [&](int position) { return graph.hostOfRank(members[position]); };
  team.folds = pairing.surplus > 0;
  for (int position = 0; position < 2 * pairing.surplus; position += 2)
    team.foldCrossesHosts |= host(position) != host(pairing.foldPartner(position));
  for (int mask = 1; mask < pairing.participants; mask *= 2) {
    bool crosses = false;
    for (int index = 0; index < pairing.participants; ++index)
      crosses |= host(pairing.positionOf(index)) != host(pairing.positionOf(index ^ mask));
    team.crossesHosts.push_back(crosses);
  }
  return team;
}

namespace {

// The trees over `order` as the executors lay them: of its hosts, a chain inside each.
TreesOfHosts treesOver(const LinkGraph& graph, const std::vector<int>& order) {
  std::vector<uint64_t> hosts;
  for (int rank : order) hosts.push_back(static_cast<uint64_t>(graph.hostOfRank(rank)));
  return TreesOfHosts(hosts);
}

// Calls path(edges) for every path from a position up to the top of either tree; edges(edge) then
// calls edge(crosses) for each of the path's edges, crosses saying whether it joins two hosts.
template <class Path>
void forEachPathUp(const TreesOfHosts& trees, const LinkGraph& graph, const std::vector<int>& order,
                   Path&& path) {
  for (int tree = 0; tree < 2; ++tree)
    for (int position = 0; position < trees.positions(); ++position)
      path([&](auto&& edge) {
        for (int p = position, parent = trees.node(tree, p).parent; parent >= 0;
             p = parent, parent = trees.node(tree, p).parent)
          edge(graph.hostOfRank(order[p]) != graph.hostOfRank(order[parent]));
      });
}

}  // namespace

// As coll/host_tree.cc lays the trees: over the ring order, rootless.
void Model::findTreeCrossings(const LinkGraph& graph, const std::vector<int>& order) {
  const TreesOfHosts trees = treesOver(graph, order);
  treeDepth_ = trees.depth();
  forEachPathUp(trees, graph, order, [&](auto&& edges) {
    int crossings = 0;
    edges([&](bool crosses) { crossings += crosses ? 1 : 0; });
    treePathCrossings_ = std::max(treePathCrossings_, crossings);
  });
  treeCrossesHosts_ = treePathCrossings_ > 0;
}

// One pass of a host tree (up or down) over `slots` slots: the deepest path's handoffs, network
// ones as many as a path crosses hosts at most, a further handoff per further slot (the slowest
// hop's), and a level's work on a slot at every level and for every further slot.
double Model::treePassUs(double slots, double coreUs, double linkUs) const {
  const double pathUs =
      treePathCrossings_ * handoffUs(true) + (treeDepth_ - treePathCrossings_) * handoffUs(false);
  return pathUs + (slots - 1) * handoffUs(treeCrossesHosts_) +
         (treeDepth_ + slots - 1) * coreAndLinkUs(coreUs, linkUs);
}

// The device trees (transport/p2p.h: tree channel c on tree c % 2 over channel c's order; priced
// over channel 0's): the slowest path from the top to a leaf, summing each edge's hop latency (a
// network hop where it crosses hosts, else the slowest of the ring's hops on a host).
void Model::findDeviceTreePaths(const LinkGraph& graph, const Channel& channel) {
  const std::vector<int>& order = channel.order;
  const TreesOfHosts trees = treesOver(graph, order);
  treeDepth_ = trees.depth();
  DeviceLatency onHost = deviceHopLatency(HopKind::NvLink);
  if (!in_.ranksShareDevice)
    for (const Hop& hop : channel.hops)
      if (hop.kind != HopKind::Network && deviceHopLatency(hop.kind).simpleUs > onHost.simpleUs)
        onHost = deviceHopLatency(hop.kind);
  const DeviceLatency network = deviceHopLatency(HopKind::Network);
  forEachPathUp(trees, graph, order, [&](auto&& edges) {
    DeviceLatency path;
    edges([&](bool crosses) {
      path += crosses ? network : onHost;
      treeCrossesHosts_ |= crosses;
    });
    treePath_.takeSlower(path);
  });
}

// The device tree all-reduce (coll/tree_engine.h in treeKernel), Simple or low-latency: each tree
// channel's block takes its share a slot at a time, every slot up and then every result down, each
// pass a pipeline: the slowest path in the protocol's hop latencies, and a block's move of a slot
// (at its own rate and its share of the links' together, as the protocol uses them) at every level
// and for every further slot.
double Model::deviceTreeTimeUs(Operation op, Protocol protocol, size_t bytes) const {
  const bool runs = protocol == Protocol::Simple || protocol == Protocol::LL;
  if (op != Operation::AllReduce || !runs || nranks_ < 2 || treeDepth_ == 0) return kInfinity;
  // As the executor runs them (two where the channel count is unknown).
  const int channels = treeChannelsOf(in_.deviceChannels <= 0 ? 2 : in_.deviceChannels);
  const double share = static_cast<double>(bytes) / channels;
  const double slotBytes =
      static_cast<double>(protocol == Protocol::LL ? in_.deviceLlSlotDataBytes : in_.slotBytes);
  const double slots = std::max(1.0, std::ceil(share / slotBytes));
  const double slot = std::min(slotBytes, share);
  const int p = static_cast<int>(protocol);
  const double moveUs = microseconds(
      slot, combinedGBs(kDeviceChannelGBs[p], ringGBs_ * kProtocolEfficiency[p] / channels));
  return kDeviceKernelUs + 2 * (treePath_.of(protocol) + (treeDepth_ + slots - 1) * moveUs);
}

// The host's trees run one after the other, each on half the bytes, a FIFO slot at a time. An
// all-reduce sends every slot up, then every result down, each pass a pipeline (treePassUs).
double Model::treeTimeUs(Operation op, Protocol protocol, size_t bytes) const {
  if (!in_.hostRanks) return deviceTreeTimeUs(op, protocol, bytes);
  const bool rooted = op == Operation::Broadcast || op == Operation::Reduce;
  if ((op != Operation::AllReduce && !rooted) || protocol != Protocol::Simple || nranks_ < 2 ||
      treeDepth_ == 0)
    return kInfinity;
  if (rooted) return rootedTreeTimeUs(op, bytes);
  const double slotBytes = static_cast<double>(in_.slotBytes);
  const double half = static_cast<double>(bytes) / 2;  // each tree's share, its slots rounded up
  const double slots = std::max(1.0, std::ceil(half / slotBytes));
  const double slot = std::min(slotBytes, half);
  // Up: two children's slots reduced; down: the result copied out and to two children.
  const double scale = crowding() / cacheSpeedup(bytes);
  const double upUs = microseconds(2 * slot, in_.core.reduceGBs) * scale;
  const double downUs = microseconds(3 * slot, in_.core.copyGBs) * scale;
  const double linkUs = treeLinkUs(slot);
  return in_.latency.callUs +
         2 * (treePassUs(slots, upUs, linkUs) + treePassUs(slots, downUs, linkUs));
}

// A host's NIC meets at most three edges of a tree of hosts (base/binary_trees.h): two slots each
// way at a level (two children's up, or two children's down).
double Model::treeLinkUs(double slot) const {
  return treeCrossesHosts_ ? microseconds(2 * slot, ringGBs_) : 0;
}

// A broadcast's or reduce's slots follow each other down (up) the levels of each tree in turn:
// a pass per tree (treePassUs), each level's work on a slot (a broadcast copies it to the output
// and two children, a reduce sums two children's into it), after the ranks agree
// on the root (a pass of tags round the ring: one handoff, every rank sending before it waits).
// A call that fits in a slot runs on one tree.
double Model::rootedTreeTimeUs(Operation op, size_t bytes) const {
  const double slotBytes = static_cast<double>(in_.slotBytes);
  const int trees = static_cast<double>(bytes) <= slotBytes ? 1 : 2;
  const double share = static_cast<double>(bytes) / trees;
  const double slots = std::max(1.0, std::ceil(share / slotBytes));
  const double slot = std::min(slotBytes, share);
  const double coreUs = (op == Operation::Broadcast ? microseconds(3 * slot, in_.core.copyGBs)
                                                    : microseconds(2 * slot, in_.core.reduceGBs)) *
                        crowding() / cacheSpeedup(bytes);
  return in_.latency.callUs + handoffUs(treeCrossesHosts_) +
         trees * treePassUs(slots, coreUs, treeLinkUs(slot));
}

double Model::recursiveTimeUs(Operation op, Protocol protocol, size_t bytes, bool halving) const {
  // Two ranks make one exchange: the one-shot all-reduce's, which posts its pieces ahead.
  if (!in_.hostRanks || op != Operation::AllReduce || protocol != Protocol::Simple || nranks_ < 3 ||
      everyRank_.crossesHosts.empty())
    return kInfinity;
  return in_.latency.callUs +
         exchangesUs(everyRank_, bytes, halving ? bestHalvingLevels(everyRank_, bytes) : 0);
}

// A handoff between two ranks: the network's where it crosses hosts, a core switch where busy
// threads outnumber cores.
double Model::handoffUs(bool crossesHosts, double busyShare) const {
  const double hop = crossesHosts ? in_.latency.netHopUs : in_.latency.hopUs;
  // A message to another host still takes the network's time where the receiver must first get
  // a core; between ranks of a host the switch is the whole wait.
  if (oversubscription(busyShare) > 1) return in_.latency.switchUs + (crossesHosts ? hop : 0);
  return hop;
}

// A NIC moves bytes while the cores reduce others: the longer of the two. Where the network is the
// cores' own copies, both take the cores' time.
double Model::coreAndLinkUs(double coreUs, double linkUs) const {
  return in_.linkOnCores ? coreUs + linkUs : std::max(coreUs, linkUs);
}

// Each exchange costs a handoff and the longer of the core's work and the link's, whose NIC the
// team's members of one host share at once. The core rates are the ring's, whose steps do the
// same memory traffic: a piece copied into a slot, the partner's reduced with this rank's values
// (or copied out). Only the team's members are busy meanwhile (the other ranks of the
// hierarchical form wait asleep for their leader), so the cores are that much less crowded. The
// first `halvingLevels` exchanges halve the part held and gather it back at the end; the rest
// double on it (coll/host_recursive.h).
double Model::exchangeUs(const ExchangeTeam& team, bool crosses, double stepBytes, bool reduces,
                         size_t callBytes) const {
  double coreUs = microseconds(stepBytes, reduces ? in_.core.reduceGBs : in_.core.copyGBs) *
                  crowding(team.busyShare) / cacheSpeedup(callBytes);
  if (oversubscription(team.busyShare) > 1)
    coreUs += stepBytes / static_cast<double>(in_.fifoBytes) * in_.latency.switchUs;
  const double linkUs = crosses ? microseconds(stepBytes * team.nicSharers, ringGBs_) : 0;
  return handoffUs(crosses, team.busyShare) + coreAndLinkUs(coreUs, linkUs);
}

double Model::exchangesUs(const ExchangeTeam& team, size_t bytes, int halvingLevels) const {
  auto exchangeUs = [&](bool crosses, double stepBytes, bool reduces) {
    return this->exchangeUs(team, crosses, stepBytes, reduces, bytes);
  };
  const double whole = static_cast<double>(bytes);
  double us = 0;
  if (team.folds)
    us += exchangeUs(team.foldCrossesHosts, whole, true) +
          exchangeUs(team.foldCrossesHosts, whole, false);
  const size_t levels = team.crossesHosts.size();
  const size_t halving = std::min(static_cast<size_t>(halvingLevels), levels);
  double piece = whole;
  for (size_t level = 0; level < levels; ++level) {
    if (level < halving) piece /= 2;
    us += exchangeUs(team.crossesHosts[level], piece, true);
  }
  for (size_t level = halving; level-- > 0;) {
    us += exchangeUs(team.crossesHosts[level], piece, false);
    piece *= 2;
  }
  return us;
}

// Bruck's steps: at distance d = 2^k, min(d, n - d) of the n blocks each way (a reduce-scatter's
// reduced, an all-gather's copied), every rank at once, as the recursive exchanges are priced; a
// step crosses hosts where some rank's partner at that distance is on another host. On one host
// only where named: there (8 processes here, braid-perf --np 8) its reduce-scatter measured
// 1.2-1.8x the ring's time at 64 KiB - 4 MiB, and its all-gather 1.2-2.3x from 4 MiB, where this
// pricing has it faster; across 8 namespace hosts it took 0.41-0.50 of the ring's time at 64 B -
// 32 KiB, 0.94-1.20 at 256 KiB, 0.63-0.70 at 2 MiB (bench/results/trees_bruck_vs_ring.txt).
double Model::bruckTimeUs(Operation op, Protocol protocol, size_t bytes) const {
  if (!in_.hostRanks || protocol != Protocol::Simple || bruckCrossesHosts_.empty() ||
      (hosts_ < 2 && !in_.named(Algorithm::Bruck)) ||
      (op != Operation::AllGather && op != Operation::ReduceScatter) ||
      (op == Operation::ReduceScatter && bytes > kBruckReduceScatterMaxBytes))
    return kInfinity;
  const double block = static_cast<double>(bytes) / nranks_;
  double us = in_.latency.callUs;
  for (size_t k = 0; k < bruckCrossesHosts_.size(); ++k) {
    const int d = 1 << k;
    us += exchangeUs(everyRank_, bruckCrossesHosts_[k], std::min(d, nranks_ - d) * block,
                     op == Operation::ReduceScatter, bytes);
  }
  return us;
}

// The halving levels (at least one) that make the team's exchanges fastest, the fewest of equals;
// BRAID_HALVING_LEVELS's where it names them.
int Model::bestHalvingLevels(const ExchangeTeam& team, size_t bytes) const {
  const int levels = static_cast<int>(team.crossesHosts.size());
  if (in_.halvingLevels > 0) return std::min(in_.halvingLevels, std::max(levels, 1));
  int best = 1;
  double bestUs = exchangesUs(team, bytes, best);
  for (int halving = 2; halving <= levels; ++halving) {
    const double us = exchangesUs(team, bytes, halving);
    if (us < bestUs) {
      best = halving;
      bestUs = us;
    }
  }
  return best;
}

int Model::halvingLevels(Algorithm algorithm, size_t bytes) const {
  if (algorithm == Algorithm::Halving) return bestHalvingLevels(everyRank_, bytes);
  if (algorithm == Algorithm::HierHalving) return bestHalvingLevels(leaders_, bytes);
  return 0;
}

// The busiest host's leader takes each of its other ranks' inputs in turn (a handoff and a
// reduction each), the leaders exchange, and the leader hands the result to each in turn.
double Model::hierarchicalTimeUs(Operation op, Protocol protocol, size_t bytes,
                                 bool halving) const {
  // Two ranks: the one-shot all-reduce, as for the recursive exchanges.
  if (!in_.hostRanks || op != Operation::AllReduce || protocol != Protocol::Simple || nranks_ < 3 ||
      everyRank_.crossesHosts.empty())
    return kInfinity;
  const double whole = static_cast<double>(bytes);
  const double scale = crowding() / cacheSpeedup(bytes);
  // Each whole vector through a FIFO: oversubscribed, a core switch per window, as in exchanges.
  const double windowsUs = oversubscription() > 1
                               ? whole / static_cast<double>(in_.fifoBytes) * in_.latency.switchUs
                               : 0;
  const double followers = busiestHostRanks_ - 1;
  const double gatherUs =
      followers * (handoffUs(false) + microseconds(whole, in_.core.reduceGBs) * scale + windowsUs);
  const double handBackUs =
      followers * (handoffUs(false) + microseconds(whole, in_.core.copyGBs) * scale + windowsUs);
  return in_.latency.callUs + gatherUs +
         exchangesUs(leaders_, bytes, halving ? bestHalvingLevels(leaders_, bytes) : 0) +
         handBackUs;
}

double Model::stepLatencyUs(Protocol protocol) const {
  if (!in_.hostRanks) return slowestHop_.of(protocol);
  // A ring of host ranks crosses the network once per host: the average step, as handoffUs
  // prices each.
  return hosts_ > 1 ? ((nranks_ - hosts_) * handoffUs(false) + hosts_ * handoffUs(true)) / nranks_
                    : handoffUs(false);
}

double Model::ringTimeUs(Operation op, Protocol protocol, size_t bytes) const {
  const int n = nranks_;
  const double busBytes = busBandwidthFactor(op, n) * static_cast<double>(bytes);
  // Host ranks' broadcasts and reduces on the ring's chain agree on the root first: a pass of
  // tags round the ring (coll/host_executor.cc), one step, since every rank sends before it waits.
  const bool chainAgreement =
      in_.hostRanks && (op == Operation::Broadcast || op == Operation::Reduce);
  const double latency = (ringSteps(op, n) + (chainAgreement ? 1 : 0)) * stepLatencyUs(protocol);
  if (!in_.hostRanks) {
    return kDeviceKernelUs + latency + microseconds(busBytes, deviceRingGBs(protocol));
  }
  // Bytes through one rank's send FIFO, split into reduction steps and forwarding steps.
  double reduceBytes = 0, copyBytes = 0;
  switch (op) {
    case Operation::AllReduce: reduceBytes = copyBytes = busBytes / 2; break;
    case Operation::ReduceScatter:
    case Operation::Reduce: reduceBytes = busBytes; break;
    default: copyBytes = busBytes; break;
  }
  // The ring runs at the pace of its most crowded core: ceil(threads/cores) ranks take turns on
  // it, handing slots to each other through that core's own cache (sharedCoreCost < 1).
  const double share = oversubscription();
  double coreUs =
      (microseconds(reduceBytes, in_.core.reduceGBs) + microseconds(copyBytes, in_.core.copyGBs)) *
      crowding() / cacheSpeedup(bytes);
  // With more busy threads than cores, a rank runs until its FIFO window is full or empty and
  // then yields its core: one switch per window.
  if (share > 1)
    coreUs += (reduceBytes + copyBytes) / static_cast<double>(in_.fifoBytes) * in_.latency.switchUs;
  const double linkUs = microseconds(busBytes, ringGBs_);
  return in_.latency.callUs + latency + coreAndLinkUs(coreUs, linkUs);
}

// The core rates hold for data in memory. A call whose buffers and FIFOs fit in the cache runs
// faster by the cached speedup; one that partly fits, by the share that fits.
double Model::cacheSpeedup(size_t bytes) const {
  if (in_.cacheBytes <= 0 || in_.core.cachedSpeedup <= 1) return 1;
  // Every rank of the busiest machine touches its input and output and two FIFOs.
  const double ranks = *std::max_element(in_.ranksPerHost.begin(), in_.ranksPerHost.end());
  const double workingSet = ranks * (2.0 * bytes + 2.0 * in_.fifoBytes);
  const double cached = std::min(1.0, in_.cacheBytes / workingSet);
  return 1 / (cached / in_.core.cachedSpeedup + (1 - cached));
}

double Model::directTimeUs(Operation op, Protocol protocol, size_t bytes) const {
  if (!allPairsDirect_ || nranks_ < 2) return kInfinity;
  const double n = nranks_;
  if (in_.hostRanks) {
    // Posts its input to n-1 peers, then reduces n inputs: one handoff of latency.
    if (op != Operation::AllReduce || bytes > in_.directMaxBytes || protocol != Protocol::Simple)
      return kInfinity;
    const double coreUs = (microseconds((n - 1) * bytes, in_.core.copyGBs) +
                           microseconds((n - 1) * bytes, in_.core.reduceGBs)) *
                          oversubscription();
    if (hosts_ == 1) return in_.latency.callUs + stepLatencyUs(protocol) + coreUs;
    // Across hosts each of the n - 1 messages is a send of its own on the network, and the
    // busiest NIC carries one from each of its host's ranks to each rank elsewhere. The input
    // goes in slot-sized pieces, reduced as they arrive: the cores work while the link does.
    // With more busy threads than cores, each of those senders must first get a core: the
    // exchange waits for n - 1 switches (8 namespace hosts of one 2-core machine: 1.1-1.4 ms,
    // where recursive doubling's 3 exchanges took 0.4-0.6).
    const double messagesUs = oversubscription() > 1 ? (n - 1) * in_.latency.switchUs
                                                     : (n - 1) * in_.latency.netHopUs / 4;
    const double linkUs = microseconds(busiestNicMessages_ * static_cast<double>(bytes), ringGBs_);
    return in_.latency.callUs + stepLatencyUs(protocol) + messagesUs +
           coreAndLinkUs(coreUs, linkUs);
  }
  // The device engine (coll/direct_engine.h): all-reduce, reduce-scatter, all-gather, with plain
  // stores only. Each rank reads its share of every peer's input and writes its share of every
  // peer's output: the ring's bus bytes, between two barriers instead of the ring's steps.
  if (protocol != Protocol::Simple ||
      (op != Operation::AllReduce && op != Operation::ReduceScatter && op != Operation::AllGather))
    return kInfinity;
  return kDeviceKernelUs + 2 * stepLatencyUs(protocol) +
         microseconds(busBandwidthFactor(op, nranks_) * static_cast<double>(bytes),
                      deviceDirectGBs());
}

double Model::deviceRingGBs(Protocol protocol) const {
  const double links = ringGBs_ * kProtocolEfficiency[static_cast<int>(protocol)];
  if (in_.deviceChannels <= 0) return links;
  return combinedGBs(in_.deviceChannels * kDeviceChannelGBs[static_cast<int>(protocol)], links);
}

// Every rank's blocks work at once in the direct engine's one launch.
double Model::deviceDirectGBs() const {
  if (in_.deviceChannels <= 0) return directGBs_;
  return combinedGBs(nranks_ * in_.deviceChannels * kDirectBlockGBs, directGBs_);
}

double Model::timeUs(Operation op, Algorithm algorithm, Protocol protocol, size_t bytes) const {
  if (in_.hostRanks && protocol != Protocol::Simple) return kInfinity;  // host FIFOs: Simple only
  if (nranks_ == 1) return in_.hostRanks ? in_.latency.callUs : kDeviceKernelUs;
  switch (algorithm) {
    case Algorithm::Ring: return ringTimeUs(op, protocol, bytes);
    case Algorithm::Direct: return directTimeUs(op, protocol, bytes);
    case Algorithm::Doubling: return recursiveTimeUs(op, protocol, bytes, false);
    case Algorithm::Halving: return recursiveTimeUs(op, protocol, bytes, true);
    case Algorithm::Tree: return treeTimeUs(op, protocol, bytes);
    case Algorithm::HierDoubling: return hierarchicalTimeUs(op, protocol, bytes, false);
    case Algorithm::HierHalving: return hierarchicalTimeUs(op, protocol, bytes, true);
    case Algorithm::Bruck: return bruckTimeUs(op, protocol, bytes);
  }
  return kInfinity;
}

// The fastest allowed algorithm and protocol, leaving out `skip`; infinite where none runs.
Prediction Model::fastest(Operation op, size_t bytes, DeviceLaunch launch,
                          std::optional<Algorithm> skip) const {
  const bool directPossible = launch != DeviceLaunch::Apart;
  Prediction best;
  best.us = kInfinity;
  for (Algorithm algorithm : kAlgorithms) {
    if (!in_.allowedAlgorithms[static_cast<int>(algorithm)] || algorithm == skip) continue;
    if (algorithm == Algorithm::Direct && !directPossible) continue;
    if (algorithm == Algorithm::Tree && !in_.hostRanks && !in_.named(Algorithm::Tree) &&
        !treeCrossesHosts_)
      continue;
    for (Protocol protocol : kProtocols) {
      if (!in_.allowedProtocols[static_cast<int>(protocol)]) continue;
      if (protocol == Protocol::Segmented && !in_.hostRanks && !in_.deviceSegmentedNamed) continue;
      const double us = timeUs(op, algorithm, protocol, bytes);
      if (us < best.us) best = {algorithm, protocol, us, 0};
    }
  }
  return best;
}

// Back to back, a device call takes at least what the host takes to issue it; one launch of
// every rank is issued by one thread, rank after rank.
Prediction Model::asIssued(Prediction p, Operation op, size_t bytes, DeviceLaunch launch) const {
  if (!in_.hostRanks)
    p.us = std::max(
        p.us,
        kDeviceIssueUs + (launch == DeviceLaunch::Together ? nranks_ * kDeviceIssuePerRankUs : 0));
  p.busBwGBs = p.us > 0 && p.us < kInfinity
                   ? busBandwidthFactor(op, nranks_) * static_cast<double>(bytes) / p.us / 1e3
                   : 0;
  return p;
}

Prediction Model::best(Operation op, size_t bytes, DeviceLaunch launch) const {
  Prediction best = fastest(op, bytes, launch, std::nullopt);
  // An override that leaves nothing runnable falls back to the ring with the Simple protocol,
  // which runs everything.
  if (best.us == kInfinity)
    best = {Algorithm::Ring, Protocol::Simple, timeUs(op, Algorithm::Ring, Protocol::Simple, bytes),
            0};
  return asIssued(best, op, bytes, launch);
}

Prediction Model::runnerUp(Operation op, size_t bytes, DeviceLaunch launch) const {
  const Prediction first = best(op, bytes, launch);
  return asIssued(fastest(op, bytes, launch, first.algorithm), op, bytes, launch);
}

std::string Model::describe() const {
  std::string out =
      fmt::format("model: {} ranks on {} host(s), {}", nranks_, hosts_,
                  ringGBs_ >= kSharedMemoryGBs ? std::string("rings bound by cores, not links")
                                               : fmt::format("rings {:.1f} GB/s", ringGBs_));
  if (in_.hostRanks) {
    out += fmt::format(
        "; host cores: reduce {:.1f} GB/s, forward {:.1f} GB/s per rank, {:.2f} busy threads per "
        "core; latency: call {:.2f} us, hop {:.2f} us, network hop {:.1f} us, core switch {:.0f} "
        "us",
        in_.core.reduceGBs, in_.core.copyGBs, oversubscription(), in_.latency.callUs,
        in_.latency.hopUs, in_.latency.netHopUs, in_.latency.switchUs);
    if (in_.linkOnCores) out += "; the network is the cores' own TCP copies (virtual interfaces)";
  } else
    out += fmt::format(
        "; device protocols simple/ll/segmented, slowest hop {:.1f}/{:.1f}/{:.1f} us, rings "
        "{:.1f}/{:.1f}/{:.1f} GB/s{}{}{}",
        slowestHop_.simpleUs, slowestHop_.llUs, slowestHop_.segmentedUs,
        deviceRingGBs(Protocol::Simple), deviceRingGBs(Protocol::LL),
        deviceRingGBs(Protocol::Segmented),
        in_.deviceChannels > 0 ? fmt::format(" over {} channels", in_.deviceChannels)
                               : std::string(),
        in_.ranksShareDevice
            ? fmt::format(", every rank on one GPU ({:.0f} GB/s of memory)", in_.deviceMemoryGBs)
            : "",
        allPairsDirect_ ? fmt::format(", all pairs direct ({:.1f} GB/s)", deviceDirectGBs())
                        : std::string());
  if (!in_.hostRanks && treeDepth_ > 0)
    out += fmt::format("; trees of depth {}, slowest path {:.1f}/{:.1f} us (simple/ll)", treeDepth_,
                       treePath_.simpleUs, treePath_.llUs);
  return out;
}

}  // namespace braid::plan
