// What runs each call of a communicator: the plan of rings over every rank's gathered facts, the
// cost model that prices algorithms and protocols and chooses among them, and what the host
// executor takes from the two (channel 0's ring order, the hosts' leaders, this rank's host's
// ranks, each all-reduce size class's algorithm). Every rank builds it from the same facts and
// settings (their hash is compared at init), so every rank chooses alike without talking.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "coll/host_executor.h"
#include "plan/model.h"
#include "plan/plan.h"
#include "transport/transport.h"

namespace braid {

// Of the ranks `peers` describes, those on `machine` (PeerInfo::machineHash), and the cores they
// may run on together (at least 1).
int ranksOnMachine(const std::vector<PeerInfo>& peers, uint64_t machine);
int machineCores(const std::vector<PeerInfo>& peers, uint64_t machine);

// The CPU channels of a host communicator of `peers` (sets of links; a large ring call runs a
// share on each at once): `forced` where positive (BRAID_HOST_NCHANNELS); else as many as the
// busiest machine's cores give each of its ranks, at most kMaxHostChannels; within
// [minChannels, maxChannels]. Alike on every rank: it reads only what every rank knows.
inline constexpr int kMaxHostChannels = 4;
inline constexpr int kMaxForcedHostChannels = 32;  // a thread and a set of FIFOs each
int hostChannels(const std::vector<PeerInfo>& peers, int forced, int minChannels, int maxChannels);

// A call as the cost model sees it: its operation and nccl-tests' size of it (the all-reduce
// buffer, the all-gather output, the reduce-scatter input).
struct ModelCall {
  plan::Operation operation;
  size_t bytes;
};
ModelCall modelCallOf(const CollArgs& args, int nranks);

class Selection {
 public:
  // Host ranks: plans (BRAID_PLAN_FILE's plan, or a search within `search`'s channel bounds) and
  // prices with `input` (the settings: BRAID_MODEL_*, the algorithms and protocols allowed),
  // completed here from the peers' facts and the FIFO geometry. Rank 0 writes the plan to
  // BRAID_PLAN_DUMP_FILE where set.
  Selection(int rank, const std::vector<PeerInfo>& peers, const FifoGeometry& geometry,
            const plan::SearchOptions& search, plan::ModelInput input);

  // A CUDA communicator: the device model (`input` as the caller completed it: hostRanks false,
  // the device's figures) replaces the host's for its calls' choices and predictions.
  void useDeviceModel(const plan::ModelInput& input);

  const plan::Plan& plan() const { return plan_; }
  const std::vector<int>& ringOrder() const { return ringOrder_; }
  // The host of each ring position, as the graph numbers hosts.
  const std::vector<uint64_t>& ringHosts() const { return ringHosts_; }
  const std::vector<int>& hostLeaders() const { return hostLeaders_; }
  const std::vector<int>& hostRanks() const { return hostRanks_; }
  const HostAllReduceTable& allReduceTable() const { return allReduce_; }
  // Per size class, whether broadcasts (reduces) run on the trees, and whether all-gathers
  // (reduce-scatters) run Bruck's algorithm.
  const HostSizeClassFlags& broadcastOnTree() const { return broadcastOnTree_; }
  const HostSizeClassFlags& reduceOnTree() const { return reduceOnTree_; }
  const HostSizeClassFlags& allGatherBruck() const { return allGatherBruck_; }
  const HostSizeClassFlags& reduceScatterBruck() const { return reduceScatterBruck_; }
  // The largest all-reduce the one-shot exchange takes; 0 where none.
  size_t directMaxBytes() const { return directMaxBytes_; }
  // The scratch a call may need: the one-shot exchange's, and the partial sums of the largest
  // reduce-scatter on Bruck's algorithm (its input's size bounds them).
  size_t scratchBytes() const { return scratchBytes_; }

  plan::Prediction best(plan::Operation op, size_t bytes, plan::DeviceLaunch launch) const {
    return model_->best(op, bytes, launch);
  }
  // The model's time of a host collective of `bytes` (nccl-tests' size), from a table of every
  // power of two up to BRAID_GROUP_FUSE_MAX_BYTES kept at init (the predictions that chose each
  // size class's algorithm), linear between: what a group's fusing weighs for each call, at a
  // table's cost (best() prices every algorithm each time).
  double hostCallUs(plan::Operation op, size_t bytes) const;
  // The plan and the model, as braidCommDescribePlan gives them.
  const std::string& description() const { return text_; }

 private:
  void completeHostInput(const std::vector<PeerInfo>& peers, const FifoGeometry& geometry,
                         plan::ModelInput& input) const;
  void chooseHostAlgorithms(size_t directLimit);

  plan::LinkGraph graph_;
  plan::Plan plan_;
  std::unique_ptr<plan::Model> model_;
  std::string text_;
  std::vector<int> ringOrder_, hostLeaders_, hostRanks_;
  std::vector<uint64_t> ringHosts_;
  HostAllReduceTable allReduce_{};
  HostSizeClassFlags broadcastOnTree_{}, reduceOnTree_{}, allGatherBruck_{}, reduceScatterBruck_{};
  size_t directMaxBytes_ = 0, scratchBytes_ = 0;
  // hostCallUs's table: per collective (plan::Operation up to Reduce), the time at 2^k bytes.
  std::array<std::vector<double>, 5> callUsAtPowers_;
};

}  // namespace braid
