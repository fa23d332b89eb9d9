#include "core/selection.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/recursive_pairing.h"
#include "coll/group_plan.h"
#include "plan/host_graph.h"
#include "plan/plan_file.h"

namespace braid {
namespace {

std::string readPlanFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) failErrno(braidInvalidArgument, "BRAID_PLAN_FILE=" + path + ": cannot read", errno);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

HostAllReduce hostAllReduce(plan::Algorithm algorithm) {
  switch (algorithm) {
    case plan::Algorithm::Ring: return HostAllReduce::Ring;
    case plan::Algorithm::Direct: return HostAllReduce::OneShot;
    case plan::Algorithm::Doubling: return HostAllReduce::Doubling;
    case plan::Algorithm::Halving: return HostAllReduce::Halving;
    case plan::Algorithm::Tree: return HostAllReduce::Tree;
    case plan::Algorithm::HierDoubling: return HostAllReduce::HierDoubling;
    case plan::Algorithm::HierHalving: return HostAllReduce::HierHalving;
    case plan::Algorithm::Bruck: break;  // all-gather and reduce-scatter only
  }
  return HostAllReduce::Ring;
}

plan::LinkGraph graphOf(const std::vector<PeerInfo>& peers) {
  std::vector<plan::HostRankInfo> ranks;
  for (const PeerInfo& p : peers)
    ranks.push_back({.host = p.hostHash,
                     .machine = p.machineHash,
                     .numa = p.numa,
                     .nicNuma = p.nicNuma,
                     .nicGBs = p.nicGBs,
                     .virtualNic = p.virtualNic != 0});
  return plan::hostGraph(ranks);
}

}  // namespace

int ranksOnMachine(const std::vector<PeerInfo>& peers, uint64_t machine) {
  return static_cast<int>(std::count_if(
      peers.begin(), peers.end(), [&](const PeerInfo& p) { return p.machineHash == machine; }));
}

namespace {

// The CPUs a PeerInfo::cpus mask names (at least 1: a rank runs somewhere).
int cpusIn(const uint64_t (&mask)[16]) {
  int cores = 0;
  for (uint64_t word : mask) cores += __builtin_popcountll(word);
  return std::max(1, cores);
}

}  // namespace

// Cores of a machine: every CPU any of its ranks may run on (ranks bound to one core each still
// share the machine's other cores with nobody).
int machineCores(const std::vector<PeerInfo>& peers, uint64_t machine) {
  uint64_t all[16] = {};
  for (const PeerInfo& p : peers)
    if (p.machineHash == machine)
      for (int w = 0; w < 16; ++w) all[w] |= p.cpus[w];
  return cpusIn(all);
}

int hostChannels(const std::vector<PeerInfo>& peers, int forced, int minChannels, int maxChannels) {
  if (forced > kMaxForcedHostChannels)
    fail(braidInvalidArgument, "BRAID_HOST_NCHANNELS={}: at most {} CPU channels", forced,
         kMaxForcedHostChannels);
  if (forced > 0) return forced;
  struct Machine {
    uint64_t cpus[16] = {};
    int ranks = 0;
  };
  std::map<uint64_t, Machine> machines;  // one pass: jobs may have thousands of machines
  for (const PeerInfo& p : peers) {
    Machine& m = machines[p.machineHash];
    for (int w = 0; w < 16; ++w) m.cpus[w] |= p.cpus[w];
    ++m.ranks;
  }
  int channels = kMaxHostChannels;
  for (const auto& [hash, m] : machines) channels = std::min(channels, cpusIn(m.cpus) / m.ranks);
  return std::clamp(channels, minChannels, std::max(minChannels, maxChannels));
}

Selection::Selection(int rank, const std::vector<PeerInfo>& peers, const FifoGeometry& geometry,
                     const plan::SearchOptions& search, plan::ModelInput input)
    : graph_(graphOf(peers)) {
  const std::string& planFile = param::PlanFile();
  plan_ = planFile.empty() ? plan::search(graph_, search)
                           : plan::fromJson(readPlanFile(planFile), graph_, planFile);
  plan::validate(graph_, plan_);
  ringOrder_ = plan_.channels.front().order;
  auto hostOf = [&](int r) { return graph_.hostOfRank(r); };
  hostLeaders_ = braid::hostLeaders(ringOrder_, hostOf);
  for (int r : ringOrder_) {
    if (hostOf(r) == hostOf(rank)) hostRanks_.push_back(r);
    ringHosts_.push_back(static_cast<uint64_t>(hostOf(r)));
  }
  if (plan_.channels.size() > 1)
    BRAID_INFO(log::kInit, "rank {}: {} channels planned; the host executor runs one, channel 0",
               rank, plan_.channels.size());

  completeHostInput(peers, geometry, input);
  model_ = std::make_unique<plan::Model>(graph_, plan_, input);
  chooseHostAlgorithms(input.directMaxBytes);
  if (rank == 0 && !param::PlanDumpFile().empty()) {
    const std::string path = log::expandPath(param::PlanDumpFile());
    std::ofstream out(path);
    out << plan::toJson(graph_, plan_);
    if (!out) failErrno(braidSystemError, "BRAID_PLAN_DUMP_FILE=" + path + ": cannot write", errno);
  }
  text_ = plan::describe(graph_, plan_) + model_->describe() + "\n";
  BRAID_INFO(log::kInit, "rank {}: one-shot all-reduce up to {} bytes; plan:\n{}", rank,
             directMaxBytes_, std::string_view(text_).substr(0, text_.size() - 1));
}

// Per host of the plan: the cores and the ranks of its machine (namespaces standing in for hosts
// share one machine's cores), the FIFOs, the cache and whether the network is virtual.
void Selection::completeHostInput(const std::vector<PeerInfo>& peers, const FifoGeometry& geometry,
                                  plan::ModelInput& input) const {
  input.hostRanks = true;
  input.coresPerHost.assign(graph_.hosts, 0);
  input.ranksPerHost.assign(graph_.hosts, 0);
  for (size_t r = 0; r < peers.size(); ++r) {
    const int host = graph_.hostOfRank(static_cast<int>(r));
    input.coresPerHost[host] = machineCores(peers, peers[r].machineHash);
    input.ranksPerHost[host] = ranksOnMachine(peers, peers[r].machineHash);
  }
  input.fifoBytes = geometry.slotBytes * geometry.nSlots;
  input.slotBytes = geometry.slotBytes;
  for (const PeerInfo& p : peers) input.linkOnCores |= graph_.hosts > 1 && p.virtualNic;
  // Half the last-level cache: the rest holds what else runs (and other tenants of a VM's host).
  input.cacheBytes = peers[0].llcBytes / 2;
  for (const PeerInfo& p : peers) input.cacheBytes = std::min(input.cacheBytes, p.llcBytes / 2);
  input.directMaxBytes = plan::hostDirectMaxBytes(
      graph_.hosts, geometry.slotBytes - sizeof(SlotHeader), geometry.nSlots);
}

// Each size class of all-reduce gets the algorithm the model gives its largest size; the one-shot
// exchange's scratch holds the largest it takes, and the largest reduce-scatter on Bruck's
// algorithm. The same predictions, up to BRAID_GROUP_FUSE_MAX_BYTES, are hostCallUs's table.
void Selection::chooseHostAlgorithms(size_t directLimit) {
  directMaxBytes_ = scratchBytes_ = 0;
  for (std::vector<double>& table : callUsAtPowers_) table.clear();
  const size_t largest = static_cast<size_t>(std::max<int64_t>(1, param::GroupFuseMaxBytes()));
  const size_t priced = std::min<size_t>(sizeClass(largest), 47) + 1;  // classes hostCallUs keeps
  auto predict = [&](plan::Operation op, size_t k) {
    const plan::Prediction p = model_->best(op, size_t{1} << std::min<size_t>(k, 47));
    if (k < priced) callUsAtPowers_.at(static_cast<size_t>(op)).push_back(p.us);
    return p.algorithm;
  };
  auto runs = [&](plan::Operation op, size_t k, plan::Algorithm algorithm) {
    return predict(op, k) == algorithm;
  };
  for (size_t k = 0; k < allReduce_.size(); ++k) {
    const size_t bytes = size_t{1} << std::min<size_t>(k, 47);
    const plan::Algorithm algorithm = predict(plan::Operation::AllReduce, k);
    allReduce_[k] = {hostAllReduce(algorithm),
                     static_cast<uint8_t>(model_->halvingLevels(algorithm, bytes))};
    if (allReduce_[k].algorithm == HostAllReduce::OneShot && bytes <= directLimit)
      directMaxBytes_ = bytes;
    broadcastOnTree_[k] = runs(plan::Operation::Broadcast, k, plan::Algorithm::Tree);
    reduceOnTree_[k] = runs(plan::Operation::Reduce, k, plan::Algorithm::Tree);
    allGatherBruck_[k] = runs(plan::Operation::AllGather, k, plan::Algorithm::Bruck);
    reduceScatterBruck_[k] = runs(plan::Operation::ReduceScatter, k, plan::Algorithm::Bruck);
    if (reduceScatterBruck_[k]) scratchBytes_ = bytes;
  }
}

void Selection::useDeviceModel(const plan::ModelInput& input) {
  model_ = std::make_unique<plan::Model>(graph_, plan_, input);
  text_ = plan::describe(graph_, plan_) + model_->describe() + "\n";
}

double Selection::hostCallUs(plan::Operation op, size_t bytes) const {
  const std::vector<double>& at = callUsAtPowers_.at(static_cast<size_t>(op));
  // 2^(k-1) < bytes <= 2^k; a group never prices more than a pass holds, the table's end.
  const size_t k = std::min(sizeClass(bytes), at.size() - 1);
  if (k == 0) return at.front();
  const double low = std::ldexp(1.0, static_cast<int>(k) - 1);
  return at[k - 1] + (at[k] - at[k - 1]) * (static_cast<double>(bytes) - low) / low;
}

ModelCall modelCallOf(const CollArgs& a, int nranks) {
  const size_t bytes = callSizeBytes(a, nranks);
  switch (a.coll) {
    case Collective::AllReduce: return {plan::Operation::AllReduce, bytes};
    case Collective::ReduceScatter: return {plan::Operation::ReduceScatter, bytes};
    case Collective::AllGather: return {plan::Operation::AllGather, bytes};
    case Collective::Broadcast: return {plan::Operation::Broadcast, bytes};
    case Collective::Reduce: return {plan::Operation::Reduce, bytes};
    case Collective::Gather:
    case Collective::Scatter: return {plan::Operation::SendRecv, 0};  // the root agreement
    default: return {plan::Operation::SendRecv, bytes};
  }
}

}  // namespace braid
