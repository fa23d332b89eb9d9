#include "core/device_side.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <mutex>
#include <optional>

#include "base/error.h"
#include "base/params.h"
#include "base/random.h"
#include "kernels/host_reduce.h"

namespace braid {

namespace {

// The most calls of each of `ranks` ranks one launch carries: BRAID_DEVICE_LAUNCH_WORKS, within
// kMaxLaunchWorks over them all.
size_t launchWorksPerRank(size_t ranks) {
  const auto perRank = static_cast<int64_t>(kMaxLaunchWorks / ranks);
  return static_cast<size_t>(std::clamp<int64_t>(param::DeviceLaunchWorks(), 1, perRank));
}

// Counts a launch's collectives in its ranks' rounds once it was made, or failed after their turn
// came: a failure must not hold the other ranks of the GPU back.
struct CountedInRounds {
  std::vector<LaunchRounds*> rounds;
  size_t collectives = 1;
  ~CountedInRounds() {
    for (LaunchRounds* r : rounds) r->markQueued(collectives);
  }
};

}  // namespace

std::unique_ptr<DeviceSide> DeviceSide::connect(const DeviceSideSetup& setup,
                                                Clock::time_point deadline) {
  std::unique_ptr<DeviceSide> side(new DeviceSide(setup));
  side->channels_ = side->channelsFor(deadline);
  const plan::Plan& plan = setup.selection->plan();
  CudaCommSetup cuda{.rank = setup.rank,
                     .device = setup.device,
                     .channels = side->channels_,
                     .ringOrders = {},
                     .timeoutMs = setup.timeoutMs,
                     .connectLinks = [&](const DeviceConnect& device) {
                       return setup.links->connectDevice(device, deadline);
                     }};
  for (int ch = 0; ch < side->channels_; ++ch)
    cuda.ringOrders.push_back(plan.channels[ch % plan.channels.size()].order);
  side->cuda_ = CudaComm::connect(cuda);
  if (side->cuda_->ranksShareDevice())
    side->windows_ = std::make_unique<WindowTable>(setup.rank, setup.nranks);
  side->joinRounds();
  // The device's cost model replaces the host's: it chooses every call's algorithm and protocol
  // (algorithmOf) and answers braidCommPredict.
  plan::ModelInput input = setup.model;
  input.hostRanks = false;
  input.ranksShareDevice = side->cuda_->ranksShareDevice();
  input.deviceMemoryGBs = side->cuda_->memoryGBs();
  input.deviceChannels = side->channels_;
  setup.selection->useDeviceModel(input);
  return side;
}

int DeviceSide::channelsFor(Clock::time_point deadline) const {
  struct DevicePlace {
    uint64_t host = 0, device = 0;
  };
  const int rank = setup_.rank;
  std::vector<DevicePlace> places(setup_.nranks);
  places[rank] = {setup_.links->peers()[rank].hostHash, cudaDeviceKey(setup_.device)};
  setup_.links->bootstrap().allGather(places.data(), sizeof(DevicePlace), deadline);
  bool oneHost = true;
  int sharingDevice = 0;
  for (const DevicePlace& p : places) {
    oneHost = oneHost && p.host == places[rank].host;
    sharingDevice += p.host == places[rank].host && p.device == places[rank].device;
  }
  // The planner's rings, repeated where it made fewer.
  return plan::deviceChannels(oneHost, sharingDevice, setup_.minChannels, setup_.maxChannels);
}

// One key per communicator (its id and rank 0's nonce, drawn at this init) and GPU.
void DeviceSide::joinRounds() {
  const std::vector<int> sharing = cuda_->ranksOnDevice();
  if (sharing.size() <= 1 || param::LaunchInRounds() == 0) return;
  const uint64_t key = fnv1a(
      fmt::format("{}|{}|{}", setup_.cliqueId, setup_.links->peers()[0].nonce, setup_.device));
  rounds_ = LaunchRounds::join(key, setup_.rank, sharing);
}

plan::DeviceLaunch DeviceSide::launchForPrediction() const {
  // The direct engine runs only in a launch of every rank, which ranks on one GPU can make (one
  // thread driving them), or on windows (which a prediction does not name).
  return cuda_->ranksShareDevice() ? plan::DeviceLaunch::Together : plan::DeviceLaunch::Apart;
}

std::vector<LaunchRounds*> DeviceSide::awaitTurns(std::span<DeviceSide* const> sides,
                                                  std::span<const braidStream_t> streams,
                                                  const char* operation) {
  std::vector<LaunchRounds*> rounds;
  for (size_t i = 0; i < sides.size(); ++i) {
    DeviceSide& side = *sides[i];
    if (side.rounds_ == nullptr || side.cuda_->capturing(streams[i])) continue;
    side.rounds_->awaitTurn(std::chrono::milliseconds(side.setup_.timeoutMs), operation);
    rounds.push_back(side.rounds_.get());
  }
  return rounds;
}

std::vector<PlannedLaunch> DeviceSide::launchesOf(std::span<const CollArgs> ops) const {
  std::vector<PlannedLaunch> launches;
  for (size_t i = 0; i < ops.size();) {
    size_t end = i;
    if (isPointToPoint(ops[i].coll)) {
      while (end < ops.size() && isPointToPoint(ops[end].coll)) ++end;
      launches.push_back({ops.subspan(i, end - i), {}, {}});
      i = end;
      continue;
    }
    std::vector<DeviceAlgorithm> algorithms;
    std::vector<std::optional<WindowCall>> windows;
    std::vector<KernelCall> kernels;
    for (; end < ops.size() && !isPointToPoint(ops[end].coll); ++end) {
      algorithms.push_back(algorithmAlone(ops[end], windows.emplace_back()));
      kernels.push_back(kernelCallOf(ops[end], false, algorithms.back()));
    }
    size_t first = 0;
    for (size_t size : launchSizes(kernels, launchWorksPerRank(1))) {
      const auto from = static_cast<std::ptrdiff_t>(first),
                 to = from + static_cast<std::ptrdiff_t>(size);
      launches.push_back({ops.subspan(i + first, size),
                          {algorithms.begin() + from, algorithms.begin() + to},
                          {std::make_move_iterator(windows.begin() + from),
                           std::make_move_iterator(windows.begin() + to)}});
      first += size;
    }
    i = end;
  }
  return launches;
}

void DeviceSide::launchOne(const PlannedLaunch& launch, braidStream_t stream,
                           const char* operation) {
  DeviceSide* self = this;
  std::vector<LaunchRounds*> rounds =
      awaitTurns(std::span(&self, 1), std::span(&stream, 1), operation);
  if (launch.algorithms.empty()) return cuda_->launchSendRecv(launch.ops, stream);  // not counted
  const CountedInRounds counted{std::move(rounds), launch.ops.size()};
  std::vector<CudaScalar> scalars(launch.ops.size());
  std::vector<CudaCall> calls;
  for (size_t i = 0; i < launch.ops.size(); ++i) {
    calls.push_back(callOf(launch.ops[i], stream, scalars[i]));
    calls.back().algorithm = launch.algorithms[i];
    if (calls.back().algorithm == DeviceAlgorithm::Direct)
      calls.back().window = &*launch.windows[i];
  }
  launchCollectives(calls);
}

// The other ranks launch apart: the direct engine reaches their buffers through windows only
// (PreMulSum's scalars, one per rank, would not reach the peers).
DeviceAlgorithm DeviceSide::algorithmAlone(const CollArgs& a,
                                           std::optional<WindowCall>& window) const {
  if (windows_ != nullptr && a.op < braidNumOps) window = windows_->locate(a);
  return algorithmOf(a, window ? plan::DeviceLaunch::Windowed : plan::DeviceLaunch::Apart);
}

CudaCall DeviceSide::callOf(const CollArgs& a, braidStream_t stream, CudaScalar& scalar) const {
  CudaCall call{cuda_.get(), a, nullptr, stream};
  if (a.op >= braidNumOps) {
    const ReductionOps::PreMulSum op = setup_.ops->get(a.op);
    if (op.isImmediate)
      std::memcpy(&scalar.bits, op.immediate, kernels::typeSize(op.type));
    else
      scalar.onDevice = op.scalar;
    call.args.op = braidSum;
    call.scalar = &scalar;
  }
  return call;
}

DeviceAlgorithm DeviceSide::algorithmOf(const CollArgs& a, plan::DeviceLaunch launch) const {
  const ModelCall m = modelCallOf(a, setup_.nranks);
  const plan::Prediction choice = setup_.selection->best(m.operation, m.bytes, launch);
  switch (choice.algorithm) {
    case plan::Algorithm::Direct: return DeviceAlgorithm::Direct;
    case plan::Algorithm::Tree:  // all-reduces only: one rank prices every algorithm alike
      if (a.coll != Collective::AllReduce) return DeviceAlgorithm::Simple;
      return choice.protocol == plan::Protocol::LL ? DeviceAlgorithm::TreeLowLatency
                                                   : DeviceAlgorithm::Tree;
    default:
      switch (choice.protocol) {
        case plan::Protocol::LL: return DeviceAlgorithm::LowLatency;
        case plan::Protocol::Segmented: return DeviceAlgorithm::Segmented;
        default: return DeviceAlgorithm::Simple;
      }
  }
}

bool DeviceSide::canLaunchTogether(std::span<const DeviceSide* const> sides,
                                   std::span<const CollArgs> calls) {
  if (sides.empty()) return true;
  int blocks = 0;
  const DeviceSide& first = *sides.front();
  for (size_t i = 0; i < sides.size(); ++i) {
    const DeviceSide& side = *sides[i];
    if (side.setup_.cliqueId != first.setup_.cliqueId ||
        side.setup_.device != first.setup_.device || isPointToPoint(calls[i].coll) ||
        !sameCollective(calls[i], calls[0]))
      return false;
    blocks += side.channels_;
  }
  return blocks <= plan::kMaxDeviceChannels;
}

// The direct engine needs every rank of the communicator in the launch, on one GPU, and every
// PreMulSum scalar by value (it goes in the launch's parameters); all ranks decide alike.
plan::DeviceLaunch DeviceSide::togetherAs(std::span<const DeviceSide* const> sides,
                                          std::span<const CollArgs> call) {
  bool direct = static_cast<int>(sides.size()) == sides.front()->setup_.nranks;
  for (size_t i = 0; i < sides.size(); ++i) {
    const braidRedOp_t op = call[i].op;
    direct = direct && sides[i]->cuda_->ranksShareDevice() &&
             (op < braidNumOps || sides[i]->setup_.ops->get(op).isImmediate);
  }
  return direct ? plan::DeviceLaunch::Together : plan::DeviceLaunch::Apart;
}

std::vector<size_t> DeviceSide::launchesTogetherOf(std::span<const DeviceSide* const> sides,
                                                   std::span<const std::vector<CollArgs>> calls) {
  std::vector<KernelCall> kernels;
  for (const std::vector<CollArgs>& call : calls) {
    const DeviceAlgorithm algorithm =
        sides.front()->algorithmOf(call.front(), togetherAs(sides, call));
    kernels.push_back(kernelCallOf(call.front(), false, algorithm));
  }
  return launchSizes(kernels, launchWorksPerRank(sides.size()));  // every rank's in one
}

void DeviceSide::launchTogether(std::span<DeviceSide* const> sides,
                                std::span<const std::vector<CollArgs>> calls,
                                std::span<const braidStream_t> streams, const char* operation) {
  const size_t n = sides.size(), m = calls.size();
  std::vector<CudaScalar> scalars(n * m);
  std::vector<CudaCall> launch;        // each rank's calls next to each other
  std::vector<plan::DeviceLaunch> as;  // by k
  for (const std::vector<CollArgs>& call : calls)
    as.push_back(togetherAs(std::span<const DeviceSide* const>(sides.data(), n), call));
  const CountedInRounds counted{awaitTurns(sides, streams, operation), m};
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < m; ++k) {
      launch.push_back(sides[i]->callOf(calls[k][i], streams[i], scalars[i * m + k]));
      launch.back().algorithm = sides[i]->algorithmOf(calls[k][i], as[k]);
    }
  launchCollectives(launch);
}

// Collective, as ncclCommWindowRegister: the k-th window of every rank is one window, of one size.
// Every rank gathers the others' parts, also where no rank can reach them (then calls keep the
// ring), and whether each rank's buffer was memory its device can use: if one was not, or the
// sizes differ, every rank fails (and counts the window, so that the next ids still agree).
uint64_t DeviceSide::registerWindow(void* buff, size_t size) {
  const int rank = setup_.rank;
  std::optional<Error> refused;
  try {
    cuda_->checkBuffer("braidCommWindowRegister", "buff", buff);
  } catch (const Error& e) {
    refused = e;
  }
  struct Part {
    uint64_t base, size, usable;
  };
  std::vector<Part> parts(setup_.nranks);
  parts[rank] = {reinterpret_cast<uintptr_t>(buff), size, !refused};
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(setup_.links->turn());  // the bootstrap ring, the ids' order
    id = ++windowsRegistered_;
    setup_.links->bootstrap().allGather(parts.data(), sizeof(Part),
                                        Clock::now() + std::chrono::milliseconds(setup_.timeoutMs));
  }
  if (refused) throw *refused;
  std::vector<uintptr_t> bases;
  for (int r = 0; r < setup_.nranks; ++r) {
    if (parts[r].usable == 0)
      fail(braidInvalidArgument,
           "braidCommWindowRegister on rank {}: rank {} registered a buffer its device cannot use "
           "(its own call says why), so no rank made this window",
           rank, r);
    if (parts[r].size != size)
      fail(braidInvalidArgument,
           "braidCommWindowRegister on rank {}: size {} here, {} on rank {} (expected one size on "
           "every rank: a window's parts are symmetric)",
           rank, size, parts[r].size, r);
    bases.push_back(parts[r].base);
  }
  if (windows_ != nullptr) windows_->add(id, size, std::move(bases));
  return id;
}

// Local: a peer's later call in the window no longer meets this rank's, and its barrier says so
// (or its deadline) before it reads or writes anything here.
void DeviceSide::removeWindow(uint64_t id) {
  if (windows_ != nullptr) windows_->remove(id);
}

}  // namespace braid
