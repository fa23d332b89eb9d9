#include "core/comm.h"

#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/random.h"
#include "base/socket.h"
#include "core/window_table.h"
#include "kernels/host_reduce.h"
#include "plan/host_graph.h"

using braid::Clock;
using braid::Error;
using braid::fail;

namespace {

// Host name and kernel boot id: the ranks that share this machine's cores.
std::string hostName() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// The kernel this rank runs on, whose cores it shares with every rank there: the boot id, whatever
// host name a UTS namespace shows (containers; namespace hosts named apart for Open MPI's sake).
std::string machineId() {
  std::string bootId;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> bootId;
  return bootId.empty() ? hostName() : bootId;
}

// Ranks share memory only with ranks of the same host: same machine, host name and network
// namespace (namespaces stand in for hosts in multi-host tests); others talk over the network.
uint64_t hostHash() {
  struct stat netns = {};
  stat("/proc/self/ns/net", &netns);
  return braid::fnv1a(
      fmt::format("{}|{}|{}", hostName(), machineId(), static_cast<unsigned long>(netns.st_ino)));
}

uint64_t randomNonce() {
  uint64_t nonce = 0;
  braid::fillRandom(&nonce, sizeof nonce);
  return nonce;
}

const char* collectiveName(braid::Collective c) {
  switch (c) {
    case braid::Collective::AllReduce: return "allreduce";
    case braid::Collective::ReduceScatter: return "reducescatter";
    case braid::Collective::AllGather: return "allgather";
    case braid::Collective::Broadcast: return "broadcast";
    case braid::Collective::Reduce: return "reduce";
    case braid::Collective::Send: return "send";
    case braid::Collective::Recv: return "recv";
    case braid::Collective::Gather: return "gather";
    case braid::Collective::Scatter: return "scatter";
  }
  return "?";
}

// Sends and receives, and the markers of the gathers and scatters built of them.
bool isPointToPoint(braid::Collective c) {
  return c == braid::Collective::Send || c == braid::Collective::Recv ||
         c == braid::Collective::Gather || c == braid::Collective::Scatter;
}

// Busy-poll iterations per wait when this host has more ranks than cores: none, since the
// thread a wait needs is likely off the core, and each spin over network links drives them (a
// system call). 8 ranks on 8 namespace hosts of 2 cores, recursive doubling, 8 B - 32 KiB:
// 0.42-1.0 ms with none against 0.98-1.46 ms with 64; 8 processes on one host 42-149 us
// against 56-171 (ring 106-128 against 145-187).
constexpr int64_t kOversubscribedSpins = 0;
// Yield rounds per wait (each a sched_yield and a drive of the links; 2000 bare rounds of
// sched_yield and epoll_wait take 1 ms on the 2-core build machine) where ranks drive network
// links and have a core each. A sleeping wait hands its links to the progress thread, and between
// 2 namespace hosts one such hand-off on each side fed the next: back-to-back 512 KiB all-reduces
// over UCX took 600-1000 us with 200 rounds, 136-153 with 2000 (braid-perf, 2 runs each, at
// 6ef7fbb). Since waits drive on every spin, 200 rounds give the same (256 KiB - 1 MiB over UCX
// and sockets, 3 interleaved runs each).
constexpr int64_t kNetworkYields = 2000;

// The CPUs this process may run on, as PeerInfo::cpus holds them.
void ownCpus(uint64_t (&mask)[16]) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    mask[0] = 1;
    return;
  }
  for (int c = 0; c < 1024 && c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) mask[c / 64] |= uint64_t{1} << (c % 64);
}

braid::FifoGeometry fifoGeometry() {
  const int64_t slots = braid::param::FifoSlots();
  const int64_t buffSize = braid::param::fifoBytes();
  if (slots < 2 || slots > braid::kMaxFifoSlots)
    fail(braidInvalidArgument, "BRAID_FIFO_SLOTS={} is out of range (expected 2..{})", slots,
         braid::kMaxFifoSlots);
  const int64_t slotBytes = buffSize / slots / 64 * 64;
  if (slotBytes < 4096)
    fail(braidInvalidArgument,
         "BRAID_BUFFSIZE={} is too small for {} slots (expected at least {} bytes)", buffSize,
         slots, 4096 * slots);
  // Each slot holds its header too: the payload stays a power of two, so a message splits into
  // as many chunks as before (a payload 64 bytes short made a 512 KiB all-reduce of 2 ranks run
  // 3 loops instead of 2).
  return {static_cast<size_t>(slotBytes) + sizeof(braid::SlotHeader), static_cast<int>(slots)};
}

// What every rank's choice of algorithm per call depends on besides the gathered facts.
std::string choiceSettings(const CommOptions& options) {
  namespace param = braid::param;
  return fmt::format(
      "algorithms '{}', protocols '{}', model {} {} {} {} {} {} {} {} {}, FIFO {} x {}",
      options.algorithms.empty() ? param::Algo() : options.algorithms, param::Proto(),
      param::ModelReduceGBs(), param::ModelCopyGBs(), param::ModelCachedSpeedup(),
      param::ModelSharedCoreCost(), param::ModelTcpGBs(), param::ModelCallUs(), param::ModelHopUs(),
      param::ModelNetHopUs(), param::ModelSwitchUs(), param::BuffSize(), param::FifoSlots());
}

// BRAID_MODEL_* and BRAID_ALGO, the config's algorithms taking BRAID_ALGO's place.
braid::plan::ModelInput modelInputFor(const CommOptions& options) {
  braid::plan::ModelInput input = braid::plan::modelInputFromParams();
  if (!options.algorithms.empty())
    braid::plan::allowAlgorithms(input, options.algorithms, "config algorithms");
  return input;
}

}  // namespace

braidComm::braidComm(int rank, int nranks, CommOptions options)
    : rank_(rank), nranks_(nranks), options_(std::move(options)) {}

braidComm::~braidComm() = default;

Clock::time_point braidComm::deadlineFromNow() const {
  return Clock::now() + std::chrono::milliseconds(options_.timeoutMs);
}

// What this rank tells its peers about itself at the rendezvous.
braid::PeerInfo braidComm::describeSelf() const {
  const braid::plan::HostRankInfo where =
      braid::plan::describeThisRank(nranks_ > 1 ? braid::bootstrapInterface().name : "");
  braid::PeerInfo self{.hostHash = hostHash(),
                       .machineHash = braid::fnv1a(machineId()),
                       .nonce = randomNonce(),
                       .pid = static_cast<int32_t>(getpid()),
                       .rank = rank_,
                       .numa = where.numa,
                       .nicNuma = where.nicNuma,
                       .nicGBs = where.nicGBs,
                       .virtualNic = where.virtualNic ? 1 : 0,
                       .llcBytes = where.llcBytes,
                       .choiceHash = braid::fnv1a(choiceSettings(options_))};
  ownCpus(self.cpus);
  return self;
}

// Busy threads on this machine: its ranks, and the transports' progress threads (network proxies
// when the job spans hosts; namespaces share the cores), counted alike on every rank. With more
// than the cores, a spinning wait would take the core its producer needs.
void braidComm::tuneWaits(uint64_t machine) {
  int threadsPerRank = 1;
  const std::vector<braid::PeerInfo>& peers = links_.peers();
  for (const auto& service : links_.links().services) threadsPerRank += service->busyThreads();
  const int busyThreads = braid::ranksOnMachine(peers, machine) * threadsPerRank;
  if (busyThreads > braid::machineCores(peers, machine))
    spins = std::min(spins, kOversubscribedSpins);
  else if (!links_.links().services.empty() && !options_.cuda && !braid::param::YieldCountIsSet())
    yields = std::max(yields, kNetworkYields);
}

void braidComm::initialize(const braid::BootstrapId& id, const braidComm* shareFrom,
                           const std::vector<int>& parentRanks) {
  std::optional<Error> initError;
  try {
    braid::log::setThreadRank(rank_);
    const Clock::time_point deadline = deadlineFromNow();
    const braid::PeerInfo self = describeSelf();
    links_.meet(id, self, choiceSettings(options_), deadline);
    const braidUniqueId encoded = id.encode();
    cliqueId_ = braid::fnv1a(std::string_view(encoded.internal, sizeof encoded.internal));
    const braid::FifoGeometry geometry = fifoGeometry();
    links_.connect(shareFrom != nullptr ? &shareFrom->links_ : nullptr, parentRanks, geometry,
                   std::chrono::milliseconds(options_.timeoutMs), deadline);
    tuneWaits(self.machineHash);
    braid::plan::SearchOptions search;
    search.minChannels = options_.minChannels;
    search.maxChannels = options_.maxChannels;
    selection_ = std::make_unique<braid::Selection>(rank_, links_.peers(), geometry, search,
                                                    modelInputFor(options_));
    scratch_.resize(selection_->directMaxBytes());
    if (options_.cuda) connectDevice(deadline);
    // Chooses the host kernels now, so a bad BRAID_SIMD fails init rather than a collective.
    const char* isa = braid::kernels::isaName();
    BRAID_INFO(braid::log::kInit, "rank {}/{} ready{}{}, host kernels {}", rank_, nranks_,
               options_.name.empty() ? "" : " comm ", options_.name, isa);
  } catch (...) {
    initError = braid::currentError(fmt::format("rank {}: init", rank_));
  }
  status_.markReady(initError);
}

// A CUDA communicator's channels, a thread block each: the planner's rings, repeated where it made
// fewer. A block moves a few GB/s (bench/results/gpu-check), so on one host the ranks that share
// a GPU take kMaxDeviceChannels (32) blocks between them, as many as one launch of them all holds
// (2 ranks: 16 channels each, 3.7x the bandwidth of 4 on an H100); across hosts every channel is
// a network link each way, so four. The channel bounds (BRAID_MIN/MAX_NCHANNELS) have the last
// word.
constexpr int kDeviceChannelsAcrossHosts = 4;

int braidComm::deviceChannelsFor(const Clock::time_point& deadline) {
  struct DevicePlace {
    uint64_t host = 0, device = 0;
  };
  std::vector<DevicePlace> places(nranks_);
  places[rank_] = {links_.peers()[rank_].hostHash, braid::cudaDeviceKey(options_.cudaDevice)};
  links_.bootstrap().allGather(places.data(), sizeof(DevicePlace), deadline);
  bool oneHost = true;
  int sharingDevice = 0;
  for (const DevicePlace& p : places) {
    oneHost = oneHost && p.host == places[rank_].host;
    sharingDevice += p.host == places[rank_].host && p.device == places[rank_].device;
  }
  const int wanted =
      oneHost ? std::max(1, braid::kMaxDeviceChannels / sharingDevice) : kDeviceChannelsAcrossHosts;
  return std::min(std::clamp(wanted, options_.minChannels, options_.maxChannels),
                  braid::kMaxDeviceChannels);
}

void braidComm::connectDevice(const Clock::time_point& deadline) {
  const int channels = deviceChannelsFor(deadline);
  deviceChannels_ = channels;
  braid::CudaCommSetup setup;
  setup.rank = rank_;
  setup.nranks = nranks_;
  setup.hostHash = links_.peers()[rank_].hostHash;
  setup.device = options_.cudaDevice;
  setup.channels = channels;
  for (int ch = 0; ch < channels; ++ch)
    setup.ringOrders.push_back(
        selection_->plan().channels[ch % selection_->plan().channels.size()].order);
  setup.timeoutMs = options_.timeoutMs;
  setup.allGather = [&](void* data, size_t bytes) {
    links_.bootstrap().allGather(data, bytes, deadline);
  };
  setup.deadline = deadline;
  cuda_ = braid::CudaComm::connect(setup);
  if (cuda_->ranksShareDevice()) windows_ = std::make_unique<braid::WindowTable>(rank_, nranks_);
  // One key per communicator (its id and rank 0's nonce, drawn at this init) and GPU.
  if (const std::vector<int> sharing = cuda_->ranksOnDevice();
      sharing.size() > 1 && braid::param::LaunchInRounds() != 0)
    rounds_ = braid::LaunchRounds::join(
        braid::fnv1a(
            fmt::format("{}|{}|{}", cliqueId_, links_.peers()[0].nonce, options_.cudaDevice)),
        rank_, sharing);

  // The device's cost model replaces the host's: it chooses every call's algorithm and protocol
  // (deviceCall) and answers braidCommPredict.
  namespace plan = braid::plan;
  plan::ModelInput input = modelInputFor(options_);
  input.hostRanks = false;
  input.ranksShareDevice = cuda_->ranksShareDevice();
  input.deviceMemoryGBs = cuda_->memoryGBs();
  input.deviceChannels = deviceChannels_;
  selection_->useDeviceModel(input);
}

int braidComm::cudaDevice() {
  waitReady();
  return cuda_ != nullptr ? cuda_->device() : -1;
}

void braidComm::checkBuffer(const char* fn, const char* name, const void* p) const {
  if (options_.cuda) {
    if (cuda_ != nullptr) cuda_->checkBuffer(fn, name, p);
    return;
  }
  braid::checkHostBuffer(fn, rank_, name, p);
}

// The status turns braidSuccess only after init has set cuda_, so reading it first is safe while
// a non-blocking init still runs.
braidResult_t braidComm::asyncError() {
  if (status_.code() == braidSuccess && cuda_ != nullptr)
    if (std::optional<Error> failure = cuda_->failure()) {
      status_.record(*failure);
      markFailed(failure->what());
      status_.fail(failure->code());
    }
  return status_.code();
}

void braidComm::failIfDeviceFailed(const char* opName) {
  const braidResult_t earlier = asyncError();
  if (earlier != braidSuccess)
    fail(earlier, "rank {}: the communicator failed earlier and cannot run {}; the first error: {}",
         rank_, opName, lastError());
}

// Calls are queued on the stream and not waited for: the kernels' failures surface through
// braidCommGetAsyncError and the next call.
void braidComm::launch(std::span<const braid::CollArgs> ops, braidStream_t stream) {
  for (std::span<const braid::CollArgs> one : launchesOf(ops)) launchOne(one, stream);
}

std::vector<std::span<const braid::CollArgs>> braidComm::launchesOf(
    std::span<const braid::CollArgs> ops) {
  std::vector<std::span<const braid::CollArgs>> launches;
  for (size_t i = 0; i < ops.size();) {
    size_t end = i + 1;
    if (isPointToPoint(ops[i].coll))
      while (end < ops.size() && isPointToPoint(ops[end].coll)) ++end;
    launches.push_back(ops.subspan(i, end - i));
    i = end;
  }
  return launches;
}

namespace {

// Counts a launch in its ranks' rounds once it was made, or failed after their turn came: a
// failure must not hold the other ranks of the GPU back.
struct CountedInRounds {
  std::vector<braid::LaunchRounds*> rounds;
  ~CountedInRounds() {
    for (braid::LaunchRounds* r : rounds) r->markQueued();
  }
};

// A launch in progress on each of `comms`: abort and destroy wait for it, since it may wait for
// its turn.
class LaunchInFlight {
 public:
  explicit LaunchInFlight(std::span<braidComm* const> comms) : comms_(comms) {
    for (braidComm* comm : comms_) comm->pending().begin();
  }
  ~LaunchInFlight() {
    for (braidComm* comm : comms_) comm->pending().end();
  }
  LaunchInFlight(const LaunchInFlight&) = delete;
  LaunchInFlight& operator=(const LaunchInFlight&) = delete;

 private:
  std::span<braidComm* const> comms_;
};

}  // namespace

std::vector<braid::LaunchRounds*> braidComm::awaitLaunchTurns(
    std::span<braidComm* const> comms, std::span<const braidStream_t> streams,
    const char* operation) {
  std::vector<braid::LaunchRounds*> rounds;
  for (size_t i = 0; i < comms.size(); ++i) {
    braidComm& c = *comms[i];
    if (c.rounds_ == nullptr || c.cuda_->capturing(streams[i])) continue;
    c.rounds_->awaitTurn(std::chrono::milliseconds(c.options_.timeoutMs), operation);
    rounds.push_back(c.rounds_.get());
  }
  return rounds;
}

void braidComm::launchOne(std::span<const braid::CollArgs> launch, braidStream_t stream) {
  waitReady();
  braidComm* self = this;
  const LaunchInFlight inFlight(std::span(&self, 1));
  const braid::CollArgs& a = launch.front();
  failIfDeviceFailed(collectiveName(a.coll));
  std::vector<braid::LaunchRounds*> rounds =
      awaitLaunchTurns(std::span(&self, 1), std::span(&stream, 1), collectiveName(a.coll));
  if (isPointToPoint(a.coll)) return cuda_->launchSendRecv(launch, stream);  // not counted
  const CountedInRounds counted{std::move(rounds)};
  // The other ranks launch apart: the direct engine reaches their buffers through windows only
  // (PreMulSum's scalars, one per rank, would not reach the peers).
  braid::CudaScalar scalar;
  braid::CudaCall call = deviceCall(a, stream, scalar);
  const std::optional<braid::WindowCall> window =
      windows_ != nullptr && a.op < braidNumOps ? windows_->locate(a) : std::nullopt;
  call.algorithm = deviceAlgorithm(
      a, window ? braid::plan::DeviceLaunch::Windowed : braid::plan::DeviceLaunch::Apart);
  if (call.algorithm == braid::DeviceAlgorithm::Direct) call.window = &*window;
  braid::launchCollectives(std::span(&call, 1));
}

braid::CudaCall braidComm::deviceCall(const braid::CollArgs& a, braidStream_t stream,
                                      braid::CudaScalar& scalar) {
  braid::CudaCall call{cuda_.get(), a, nullptr, stream};
  if (a.op >= braidNumOps) {
    const braid::ReductionOps::PreMulSum op = ops_.get(a.op);
    if (op.isImmediate)
      std::memcpy(&scalar.bits, op.immediate, braid::kernels::typeSize(op.type));
    else
      scalar.onDevice = op.scalar;
    call.args.op = braidSum;
    call.scalar = &scalar;
  }
  return call;
}

braid::DeviceAlgorithm braidComm::deviceAlgorithm(const braid::CollArgs& a,
                                                  braid::plan::DeviceLaunch launch) {
  const braid::ModelCall m = braid::modelCallOf(a, nranks_);
  const braid::plan::Prediction choice = selection_->best(m.operation, m.bytes, launch);
  switch (choice.algorithm) {
    case braid::plan::Algorithm::Direct: return braid::DeviceAlgorithm::Direct;
    case braid::plan::Algorithm::Tree:  // all-reduces only: one rank prices every algorithm alike
      if (a.coll == braid::Collective::AllReduce) return braid::DeviceAlgorithm::Tree;
      return braid::DeviceAlgorithm::Simple;
    default:
      return choice.protocol == braid::plan::Protocol::LL ? braid::DeviceAlgorithm::LowLatency
                                                          : braid::DeviceAlgorithm::Simple;
  }
}

bool braidComm::canLaunchTogether(std::span<braidComm* const> comms,
                                  std::span<const braid::CollArgs> calls) {
  int blocks = 0;
  for (braidComm* c : comms) c->waitReady();  // their channels and ids are known once ready
  for (size_t i = 0; i < comms.size(); ++i) {
    const braidComm& c = *comms[i];
    const braid::CollArgs &a = calls[i], &b = calls[0];
    if (!c.onDevice() || c.cliqueId_ != comms[0]->cliqueId_ ||
        c.options_.cudaDevice != comms[0]->options_.cudaDevice || isPointToPoint(a.coll) ||
        !braid::sameCollective(a, b))
      return false;
    blocks += c.deviceChannels_;
  }
  return blocks <= braid::kMaxDeviceChannels;
}

void braidComm::launchTogether(std::span<braidComm* const> comms,
                               std::span<const braid::CollArgs> calls,
                               std::span<const braidStream_t> streams) {
  std::vector<braid::CudaScalar> scalars(comms.size());
  std::vector<braid::CudaCall> launch;
  // The direct engine needs every rank of the communicator in this launch, on one GPU, and every
  // PreMulSum scalar by value (it goes in the launch's parameters); all ranks decide alike.
  bool direct = static_cast<int>(comms.size()) == comms.front()->nranks_;
  for (braidComm* c : comms) c->waitReady();
  const LaunchInFlight inFlight(comms);
  for (size_t i = 0; i < comms.size(); ++i)
    comms[i]->failIfDeviceFailed(collectiveName(calls[i].coll));
  const CountedInRounds counted{
      awaitLaunchTurns(comms, streams, collectiveName(calls.front().coll))};
  for (size_t i = 0; i < comms.size(); ++i) {
    launch.push_back(comms[i]->deviceCall(calls[i], streams[i], scalars[i]));
    direct = direct && comms[i]->cuda_->ranksShareDevice() &&
             (launch.back().scalar == nullptr || launch.back().scalar->onDevice == nullptr);
  }
  for (size_t i = 0; i < comms.size(); ++i)
    launch[i].algorithm = comms[i]->deviceAlgorithm(
        calls[i], direct ? braid::plan::DeviceLaunch::Together : braid::plan::DeviceLaunch::Apart);
  braid::launchCollectives(launch);
}

namespace braid {
ModelCall modelCallOf(const CollArgs& a, int nranks) {
  const size_t bytes = a.count * kernels::typeSize(a.type);
  const size_t n = static_cast<size_t>(nranks);
  switch (a.coll) {
    case Collective::AllReduce: return {plan::Operation::AllReduce, bytes};
    case Collective::ReduceScatter: return {plan::Operation::ReduceScatter, bytes * n};
    case Collective::AllGather: return {plan::Operation::AllGather, bytes * n};
    case Collective::Broadcast: return {plan::Operation::Broadcast, bytes};
    case Collective::Reduce: return {plan::Operation::Reduce, bytes};
    case Collective::Gather:
    case Collective::Scatter: return {plan::Operation::SendRecv, 0};  // the root agreement
    default: return {plan::Operation::SendRecv, bytes};
  }
}
}  // namespace braid

braid::plan::Prediction braidComm::predict(braid::plan::Operation op, size_t bytes) {
  waitReady();
  // A CUDA communicator runs the direct engine only in a launch of every rank, which ranks on one
  // GPU can make (one thread driving them), or on windows (which this question does not name).
  namespace plan = braid::plan;
  return selection_->best(op, bytes,
                          cuda_ == nullptr || cuda_->ranksShareDevice()
                              ? plan::DeviceLaunch::Together
                              : plan::DeviceLaunch::Apart);
}

const std::string& braidComm::describePlan() {
  waitReady();
  return selection_->description();
}

void braidComm::markFailed(const std::string& reason) {
  // The ranks sharing its GPU may wait for collectives of this rank that will not come.
  if (status_.ready() && rounds_ != nullptr) rounds_->release(reason);
  braid::RankControl* own = links_.hasControls() ? control(rank_) : nullptr;
  if (own == nullptr || own->failed.load() != 0) return;
  std::snprintf(own->reason, sizeof own->reason, "%s", reason.c_str());
  own->failed.store(1, std::memory_order_release);
  // Ranks on other hosts do not see the control block: the transports that reach them tell them.
  // No link is being driven on this thread (a wait's poll() throws after drive() returns).
  // Communicators sharing the links share the control block too: the first failure is told.
  for (const auto& service : links_.links().services) service->abandon(reason);
}

template <typename Body>
void braidComm::runOperation(const char* opName, Body&& body) {
  waitReady();
  std::lock_guard<std::mutex> lock(links_.turn());
  const braidResult_t earlier = status_.code();
  if (earlier != braidSuccess)
    fail(earlier, "rank {}: the communicator failed earlier and cannot run {}; the first error: {}",
         rank_, opName, control(rank_)->reason);
  running_ = {links_.nextOperation(), opName, deadlineFromNow()};
  control(rank_)->opSeq.store(running_.seq, std::memory_order_relaxed);
  // The transports' progress threads poll quickly while an operation runs.
  struct Activity {
    const braid::PeerLinks& links;
    explicit Activity(const braid::PeerLinks& l) : links(l) {
      for (const auto& service : links.services) service->operationStarted();
    }
    ~Activity() {
      for (const auto& service : links.services) service->operationFinished();
    }
  } activity(links_.links());
  // Whatever ends the operation, the peers learn of it at once (they watch the failure flag)
  // instead of waiting for their timeout.
  try {
    body();
  } catch (...) {
    const Error e = braid::currentError(runningLabel());
    markFailed(e.what());
    status_.fail(e.code());
    throw e;
  }
}

braid::CollContext braidComm::context() {
  braid::CollContext ctx;
  ctx.rank = rank_;
  ctx.nranks = nranks_;
  ctx.ringOrder = selection_->ringOrder();
  ctx.hostLeaders = selection_->hostLeaders();
  ctx.hostRanks = selection_->hostRanks();
  ctx.sendTo = links_.sendTo();
  ctx.recvFrom = links_.recvFrom();
  ctx.dog = this;
  ctx.allReduce = selection_->allReduceTable();
  ctx.directMaxBytes = selection_->directMaxBytes();
  ctx.streamingMinBytes =
      static_cast<size_t>(std::max<int64_t>(0, braid::param::StreamingMinBytes()));
  ctx.scratch = scratch_.data();
  ctx.slotStores = &slotStores_;
  return ctx;
}

void braidComm::run(const braid::CollArgs& args) {
  runOperation(collectiveName(args.coll), [&] {
    braid::CollContext ctx = context();
    ctx.sequence = ++collectives_;
    if (args.op < braidNumOps) return braid::runCollective(ctx, args);
    // PreMulSum: this rank's input times its scalar, then a sum.
    braid::CollArgs sum = args;
    const size_t count = args.count * (args.coll == braid::Collective::ReduceScatter ? nranks_ : 1);
    sum.sendbuff = ops_.scaled(args.op, args.sendbuff, count, preMulSumInput_);
    sum.op = braidSum;
    sum.namedOp = args.op;
    braid::runCollective(ctx, sum);
    // Sent and done: an input larger than the one-shot exchange's is not kept.
    if (preMulSumInput_.capacity() > selection_->directMaxBytes()) preMulSumInput_ = {};
  });
}

void braidComm::runSendRecv(std::span<const braid::CollArgs> ops) {
  runOperation("send/recv", [&] {
    braid::CollContext ctx = context();
    braid::runSendRecv(ctx, ops);
  });
}

std::string braidComm::runningLabel() const {
  return fmt::format("rank {}: {} #{}", rank_, running_.name, running_.seq);
}

std::string braidComm::laggingPeers() const {
  std::vector<int> lagging;
  for (int r = 0; r < nranks_; ++r) {
    const braid::RankControl* c = control(r);
    if (r != rank_ && c != nullptr && c->opSeq.load(std::memory_order_relaxed) < running_.seq)
      lagging.push_back(r);
  }
  if (lagging.empty()) return "";
  return fmt::format("; ranks that have not started this operation: {}", fmt::join(lagging, ", "));
}

bool braidComm::drive(int peer) {
  bool moved = false;
  for (const auto& service : links_.links().services)
    moved |= service->drive(peer >= 0 ? links_.linkIndex(peer) : -1);
  return moved;
}

void braidComm::stopDriving() {
  for (const auto& service : links_.links().services) service->stopDriving();
}

void braidComm::poll(int peer, const char* waitingFor) {
  // A peer process that exited: its pidfd turns readable.
  for (int r = 0; r < nranks_; ++r) {
    const int fd = links_.pidfd(r);
    if (fd < 0 || control(r)->departed.load(std::memory_order_acquire) != 0) continue;
    struct pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0)
      fail(braidRemoteError, "{} failed: rank {} (pid {}) died", runningLabel(), r,
           links_.peers()[r].pid);
  }
  // A link a transport serves that broke (a connection reset, closed, unreachable, a bad frame).
  for (const auto& service : links_.links().services)
    if (std::optional<std::string> failure =
            service->failure(peer >= 0 ? links_.linkIndex(peer) : -1))
      fail(braidRemoteError, "{} failed: {}", runningLabel(), *failure);
  for (int r = 0; r < nranks_; ++r) {
    const braid::RankControl* c = control(r);
    if (c == nullptr || c->failed.load(std::memory_order_acquire) == 0) continue;
    if (r == rank_) fail(braidRemoteError, "{} aborted: {}", runningLabel(), c->reason);
    fail(braidRemoteError, "{} failed because rank {} failed: {}", runningLabel(), r, c->reason);
  }
  if (Clock::now() > running_.deadline) {
    const std::string from = peer >= 0 ? fmt::format(" from rank {}", peer) : std::string();
    fail(braidTimeout, "{} timed out after {} ms waiting for {}{}{}", runningLabel(),
         options_.timeoutMs, waitingFor, from, laggingPeers());
  }
}

void braidComm::allGatherOutOfBand(void* data, size_t bytes) {
  waitReady();
  std::lock_guard<std::mutex> lock(links_.turn());  // the bootstrap ring: one exchange at a time
  links_.bootstrap().allGather(data, bytes, deadlineFromNow());
}

braid::BootstrapId braidComm::shrunkId(const std::vector<int>& survivors) {
  waitReady();
  std::lock_guard<std::mutex> lock(links_.turn());
  // Counted per survivor set: only its members call, so every one of them counts alike.
  return links_.bootstrap().shrunkId(survivors, ++shrinks_[survivors]);
}

void* braidComm::registerBuffer(void* buff, size_t size, bool window) {
  const uint64_t windowId = window && onDevice() ? registerWindow(buff, size) : 0;
  return registrations_.add(buff, size, window, windowId);
}

// Collective, as ncclCommWindowRegister: the k-th window of every rank is one window, of one size.
// Every rank gathers the others' parts, also where no rank can reach them (then calls keep the
// ring), and whether each rank's buffer was memory its device can use: if one was not, or the
// sizes differ, every rank fails (and counts the window, so that the next ids still agree).
uint64_t braidComm::registerWindow(void* buff, size_t size) {
  waitReady();
  std::optional<braid::Error> refused;
  try {
    checkBuffer("braidCommWindowRegister", "buff", buff);
  } catch (const braid::Error& e) {
    refused = e;
  }
  struct Part {
    uint64_t base, size, usable;
  };
  std::vector<Part> parts(nranks_);
  parts[rank_] = {reinterpret_cast<uintptr_t>(buff), size, !refused};
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(links_.turn());  // the bootstrap ring, and the ids' order
    id = ++windowsRegistered_;
    links_.bootstrap().allGather(parts.data(), sizeof(Part), deadlineFromNow());
  }
  if (refused) throw *refused;
  std::vector<uintptr_t> bases;
  for (int r = 0; r < nranks_; ++r) {
    if (parts[r].usable == 0)
      fail(braidInvalidArgument,
           "braidCommWindowRegister on rank {}: rank {} registered a buffer its device cannot use "
           "(its own call says why), so no rank made this window",
           rank_, r);
    if (parts[r].size != size)
      fail(braidInvalidArgument,
           "braidCommWindowRegister on rank {}: size {} here, {} on rank {} (expected one size on "
           "every rank: a window's parts are symmetric)",
           rank_, size, parts[r].size, r);
    bases.push_back(parts[r].base);
  }
  if (windows_ != nullptr) windows_->add(id, size, std::move(bases));
  return id;
}

// Local: a peer's later call in the window no longer meets this rank's, and its barrier says so
// (or its deadline) before it reads or writes anything here.
void braidComm::deregisterBuffer(void* handle, bool window, const char* fn) {
  const uint64_t windowId = registrations_.remove(handle, window, fn);
  if (windows_ != nullptr && windowId != 0) windows_->remove(windowId);
}

void* braidComm::registeredBuffer(void* handle, bool window, const char* fn) {
  return registrations_.buffer(handle, window, fn);
}

void braidComm::finalize() {
  pending_.waitDrained();
  waitReady();
  if (cuda_ != nullptr) cuda_->synchronize();
  links_.bootstrap().barrier(deadlineFromNow());
}

void braidComm::abort(const char* call) {
  markFailed(fmt::format("rank {} called {}", rank_, call));
  status_.fail(braidRemoteError);
  if (status_.ready() && cuda_ != nullptr) cuda_->abort();
  pending_.waitDrained();
  // An operation running on another thread sees the failure flag at its next poll and returns;
  // the communicator must outlive it.
  if (links_.connected()) std::lock_guard<std::mutex> lock(links_.turn());
}
