#include "core/comm.h"

#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/random.h"
#include "base/socket.h"
#include "coll/call_tag.h"
#include "coll/group_plan.h"
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
      "algorithms '{}', halving levels {}, protocols '{}', model {} {} {} {} {} {} {} {} {}, FIFO "
      "{} x {}, host channels {} ({}..{}) from {} bytes, group passes of calls to {} bytes, to {} "
      "bytes together",
      options.algorithms.empty() ? param::Algo() : options.algorithms, param::HalvingLevels(),
      param::Proto(), param::ModelReduceGBs(), param::ModelCopyGBs(), param::ModelCachedSpeedup(),
      param::ModelSharedCoreCost(), param::ModelTcpGBs(), param::ModelCallUs(), param::ModelHopUs(),
      param::ModelNetHopUs(), param::ModelSwitchUs(), param::BuffSize(), param::FifoSlots(),
      param::HostNChannels(), options.minChannels, options.maxChannels,
      param::HostChannelMinBytes(), param::GroupFuseBytes(), param::GroupFuseMaxBytes());
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

braidComm::~braidComm() {
  if (finalizing_.joinable()) finalizing_.join();
}

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
  int threadsPerRank = links_.linkSets();  // a large call runs a thread per CPU channel
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
    const braid::FifoGeometry geometry = fifoGeometry();
    const int linkSets = options_.cuda
                             ? 1
                             : braid::hostChannels(links_.peers(), braid::param::HostNChannels(),
                                                   options_.minChannels, options_.maxChannels);
    links_.connect(shareFrom != nullptr ? &shareFrom->links_ : nullptr, parentRanks, geometry,
                   std::chrono::milliseconds(options_.timeoutMs), deadline, linkSets,
                   options_.cuda ? braid::LinkKind::HostPresence : braid::LinkKind::HostFifos);
    if (links_.linkSets() > 1)
      BRAID_INFO(braid::log::kInit,
                 "rank {}: {} CPU channels (sets of links): ring calls of {} bytes or more run a "
                 "share on each",
                 rank_, links_.linkSets(), braid::param::HostChannelMinBytes());
    tuneWaits(self.machineHash);
    braid::plan::SearchOptions search;
    search.minChannels = options_.minChannels;
    search.maxChannels = options_.maxChannels;
    selection_ = std::make_unique<braid::Selection>(rank_, links_.peers(), geometry, search,
                                                    modelInputFor(options_));
    host_.setLimits(selection_->directMaxBytes(), selection_->scratchBytes());
    if (options_.cuda) device_ = braid::DeviceSide::connect(deviceSetup(id), deadline);
    // Chooses the host kernels now, so a bad BRAID_SIMD fails init rather than a collective.
    const char* isa = braid::kernels::isaName();
    BRAID_INFO(braid::log::kInit, "rank {}/{} ready{}{}, host kernels {}", rank_, nranks_,
               options_.name.empty() ? "" : " comm ", options_.name, isa);
  } catch (...) {
    initError = braid::currentError(fmt::format("rank {}: init", rank_));
  }
  status_.markReady(initError);
}

braid::DeviceSideSetup braidComm::deviceSetup(const braid::BootstrapId& id) {
  const braidUniqueId encoded = id.encode();
  return {.rank = rank_,
          .nranks = nranks_,
          .device = options_.cudaDevice,
          .minChannels = options_.minChannels,
          .maxChannels = options_.maxChannels,
          .timeoutMs = options_.timeoutMs,
          .cliqueId = braid::fnv1a(std::string_view(encoded.internal, sizeof encoded.internal)),
          .links = &links_,
          .selection = selection_.get(),
          .ops = &ops_,
          .model = modelInputFor(options_)};
}

int braidComm::cudaDevice() {
  waitReady();
  return device_ != nullptr ? device_->cuda().device() : -1;
}

void braidComm::checkBuffer(const char* fn, const char* name, const void* p) const {
  if (options_.cuda) {
    if (device_ != nullptr) device_->cuda().checkBuffer(fn, name, p);
    return;
  }
  braid::checkHostBuffer(fn, rank_, name, p);
}

std::optional<uint64_t> braidComm::identityOnceReady() const {
  if (!status_.ready() || links_.peers().empty()) return std::nullopt;  // peers_: set before ready
  return identity();
}

// The status turns braidSuccess only after init has set device_, so reading it first is safe while
// a non-blocking init still runs.
braidResult_t braidComm::asyncError() {
  if (status_.code() == braidSuccess && device_ != nullptr)
    if (std::optional<Error> failure = device_->cuda().failure()) {
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
  for (const braid::PlannedLaunch& one : launchesOf(ops)) launchOne(one, stream);
}

std::vector<braid::PlannedLaunch> braidComm::launchesOf(std::span<const braid::CollArgs> ops) {
  waitReady();
  return device_->launchesOf(ops);
}

namespace {

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

void braidComm::launchOne(const braid::PlannedLaunch& launch, braidStream_t stream) {
  waitReady();
  braidComm* self = this;
  const LaunchInFlight inFlight(std::span(&self, 1));
  const char* name = collectiveName(launch.ops.front().coll);
  failIfDeviceFailed(name);
  device_->launchOne(launch, stream, name);
}

bool braidComm::canLaunchTogether(std::span<braidComm* const> comms,
                                  std::span<const braid::CollArgs> calls) {
  for (braidComm* c : comms) c->waitReady();  // their channels and ids are known once ready
  std::vector<const braid::DeviceSide*> sides;
  for (braidComm* c : comms) {
    if (!c->onDevice()) return false;
    sides.push_back(c->device_.get());
  }
  return braid::DeviceSide::canLaunchTogether(sides, calls);
}

std::vector<size_t> braidComm::launchesTogetherOf(
    std::span<braidComm* const> comms, std::span<const std::vector<braid::CollArgs>> calls) {
  std::vector<const braid::DeviceSide*> sides;
  for (braidComm* c : comms) {
    c->waitReady();
    sides.push_back(c->device_.get());
  }
  return braid::DeviceSide::launchesTogetherOf(sides, calls);
}

void braidComm::launchTogether(std::span<braidComm* const> comms,
                               std::span<const std::vector<braid::CollArgs>> calls,
                               std::span<const braidStream_t> streams) {
  for (braidComm* c : comms) c->waitReady();
  const LaunchInFlight inFlight(comms);
  const char* name = collectiveName(calls.front().front().coll);
  std::vector<braid::DeviceSide*> sides;
  for (braidComm* c : comms) {
    c->failIfDeviceFailed(name);
    sides.push_back(c->device_.get());
  }
  braid::DeviceSide::launchTogether(sides, calls, streams, name);
}

braid::plan::Prediction braidComm::predict(braid::plan::Operation op, size_t bytes) {
  waitReady();
  return selection_->best(
      op, bytes,
      device_ != nullptr ? device_->launchForPrediction() : braid::plan::DeviceLaunch::Together);
}

const std::string& braidComm::describePlan() {
  waitReady();
  return selection_->description();
}

void braidComm::markFailed(const std::string& reason) {
  // The ranks sharing its GPU may wait for collectives of this rank that will not come.
  if (status_.ready() && device_ != nullptr && device_->rounds() != nullptr)
    device_->rounds()->release(reason);
  braid::RankControl* own = links_.hasControls() ? control(rank_) : nullptr;
  if (own == nullptr || own->failed.load() != 0) return;
  std::snprintf(own->reason, sizeof own->reason, "%s", reason.c_str());
  own->failed.store(1, std::memory_order_release);
  // Ranks on other hosts do not see the control block: the transports that reach them tell them.
  // No link is being driven on this thread (a wait's poll() throws after drive() returns).
  // Communicators sharing the links share the control block too: the first failure is told.
  links_.forEachService([&](braid::LinkService& service) { service.abandon(reason); });
  if (status_.ready() && device_ != nullptr) device_->cuda().abandon(reason);
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
    const braid::CommLinks& links;
    explicit Activity(const braid::CommLinks& l) : links(l) {
      links.forEachService([](braid::LinkService& service) { service.operationStarted(); });
    }
    ~Activity() {
      links.forEachService([](braid::LinkService& service) { service.operationFinished(); });
    }
  } activity(links_);
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
  ctx.ringHosts = selection_->ringHosts();
  ctx.hostLeaders = selection_->hostLeaders();
  ctx.hostRanks = selection_->hostRanks();
  ctx.sendTo = links_.sendTo();
  ctx.recvFrom = links_.recvFrom();
  ctx.dog = this;
  ctx.allReduce = selection_->allReduceTable();
  ctx.broadcastOnTree = selection_->broadcastOnTree();
  ctx.reduceOnTree = selection_->reduceOnTree();
  ctx.allGatherBruck = selection_->allGatherBruck();
  ctx.reduceScatterBruck = selection_->reduceScatterBruck();
  ctx.streamingMinBytes =
      static_cast<size_t>(std::max<int64_t>(0, braid::param::StreamingMinBytes()));
  ctx.self = control(rank_);
  ctx.commIdentity = identity();
  return ctx;
}

namespace {

// What a further CPU channel's thread waits with: the communicator's checks any thread may make,
// driving the channel's own set of links.
class ChannelWatchdog final : public braid::Watchdog {
 public:
  ChannelWatchdog(braidComm& comm, int linkSet) : comm_(comm), linkSet_(linkSet) { pacedAs(comm); }
  void poll(int peer, const char* waitingFor) override { comm_.checkPeers(peer, waitingFor); }
  bool drive(int peer) override { return comm_.driveSet(linkSet_, peer); }
  void stopDriving() override { comm_.stopDrivingSet(linkSet_); }

 private:
  braidComm& comm_;
  int linkSet_;
};

// A collective's further CPU channels (the sets of links beyond the first), lent to its context.
struct MoreChannels {
  std::vector<ChannelWatchdog> dogs;
  std::vector<braid::HostChannel> channels;
  MoreChannels(braidComm& comm, const braid::CommLinks& links) {
    dogs.reserve(links.linkSets() - 1);  // the channels point at them (none: no allocation)
    for (int set = 1; set < links.linkSets(); ++set) {
      dogs.emplace_back(comm, set);
      channels.push_back({links.sendTo(set), links.recvFrom(set), &dogs.back()});
    }
  }
  void lendTo(braid::CollContext& ctx) const {
    ctx.moreChannels = channels;
    ctx.channelMinBytes =
        static_cast<size_t>(std::max<int64_t>(0, braid::param::HostChannelMinBytes()));
  }
};

}  // namespace

void braidComm::run(const braid::CollArgs& args) {
  runOperation(collectiveName(args.coll), [&] { runInTurn(args); });
}

// A collective, once runOperation has given this rank the links' turn.
void braidComm::runInTurn(const braid::CollArgs& args) {
  braid::CollContext ctx = context();
  const MoreChannels more(*this, links_);
  more.lendTo(ctx);
  host_.lendTo(ctx, true);
  running_.collective = ctx.sequence;
  if (args.op < braidNumOps) return braid::runCollective(ctx, args);
  // PreMulSum: this rank's input times its scalar, then a sum. An all-reduce scales straight into
  // its output and sums there in place: a scaled copy's fresh pages cost more than the call.
  braid::CollArgs sum = args;
  if (args.coll == braid::Collective::AllReduce) {
    ops_.scale(args.op, args.sendbuff, args.recvbuff, args.count);
    sum.sendbuff = args.recvbuff;
  } else {
    const size_t count = args.count * (args.coll == braid::Collective::ReduceScatter ? nranks_ : 1);
    sum.sendbuff = host_.scaled(ops_, args.op, args.sendbuff, count);
  }
  sum.op = braidSum;
  sum.namedOp = args.namedOp >= 0 ? args.namedOp : args.op;
  braid::runCollective(ctx, sum);
  host_.releaseLargeBuffers();
}

braid::GroupFuseLimits braidComm::groupFusing() {
  waitReady();  // the model prices the calls
  namespace param = braid::param;
  const double copyGBs = param::ModelCopyGBs();
  return {static_cast<size_t>(std::max<int64_t>(0, param::GroupFuseBytes())),
          static_cast<size_t>(std::max<int64_t>(0, param::GroupFuseMaxBytes())),
          [this](const braid::CollArgs& call) {
            const braid::ModelCall priced = braid::modelCallOf(call, nranks_);
            return selection_->hostCallUs(priced.operation, priced.bytes);
          },
          [copyGBs](size_t bytes) { return static_cast<double>(bytes) / (copyGBs * 1e3); }};
}

namespace {

// Once per process, where a rank's fused pass has a call read what an earlier one writes (a loop
// would say it every time); only until then is it looked for.
void warnOfReadAfterWrite(std::span<const braid::CollArgs> members, const braid::FusedPass& pass,
                          int rank) {
  static std::atomic<bool> warned{false};
  if (warned.load(std::memory_order_relaxed)) return;
  const auto pair = braid::laterReadsEarlierOutput(members, pass);
  if (!pair || warned.exchange(true)) return;
  BRAID_WARN(braid::log::kColl,
             "rank {}: in one group, a {} reads what an earlier {} of the group writes; small "
             "calls that agree run as one pass, which reads every input before it writes, so the "
             "later call sees its input as it was before the group (a group's calls have no "
             "order, as in NCCL; put them in separate groups to order them, or set "
             "BRAID_GROUP_FUSE_BYTES=0 on every rank)",
             rank, braid::apiName(members[pair->second].coll),
             braid::apiName(members[pair->first].coll));
}

}  // namespace

void braidComm::runFused(std::span<const braid::CollArgs> members) {
  runOperation(collectiveName(members.front().coll), [&] {
    const braid::FusedPass pass = braid::fusedPass(members, nranks_, rank_);
    warnOfReadAfterWrite(members, pass, rank_);
    uint8_t* staging = host_.staging(pass.stagingBytes);
    for (const braid::StagedCopy& c : pass.inputs)
      std::memcpy(staging + c.staged,
                  static_cast<const uint8_t*>(members[c.member].sendbuff) + c.own, c.bytes);
    braid::CollArgs call = pass.call;
    call.sendbuff = staging + pass.sendOffset;
    call.recvbuff = staging + pass.recvOffset;
    runInTurn(call);
    for (const braid::StagedCopy& c : pass.outputs)
      std::memcpy(static_cast<uint8_t*>(members[c.member].recvbuff) + c.own, staging + c.staged,
                  c.bytes);
    host_.releaseLargeBuffers();
  });
}

void braidComm::runSendRecv(std::span<const braid::CollArgs> ops) {
  runOperation("send/recv", [&] {
    braid::CollContext ctx = context();
    host_.lendTo(ctx, false);
    braid::runSendRecv(ctx, ops);
  });
}

std::optional<braid::CallTag> braidComm::sendWaitingFrom(int peer) {
  waitReady();
  if (peer == rank_) return std::nullopt;  // sends to self meet their receives in one group
  std::lock_guard<std::mutex> lock(links_.turn());
  const braidResult_t earlier = status_.code();
  if (earlier != braidSuccess)
    fail(earlier, "rank {}: the communicator failed earlier and cannot probe; the first error: {}",
         rank_, control(rank_)->reason);
  driveSet(0, peer);  // what the network brought (no operation drives the links now)
  stopDrivingSet(0);
  braid::RecvConnector* from = links_.recvFrom()[peer];
  const braid::SlotHeader* waiting = from->tryWait();
  // The next slot may be a collective's, or a communicator's that shares the links.
  if (waiting == nullptr || waiting->tag.comm != identity() ||
      waiting->tag.collective != static_cast<uint8_t>(braid::Collective::Send))
    return std::nullopt;
  return waiting->tag;
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

bool braidComm::driveSet(int linkSet, int peer) {
  bool moved = false;
  for (const auto& service : links_.links(linkSet).services)
    moved |= service->drive(peer >= 0 ? links_.linkIndex(peer) : -1);
  return moved;
}

void braidComm::stopDrivingSet(int linkSet) {
  for (const auto& service : links_.links(linkSet).services) service->stopDriving();
}

void braidComm::poll(int peer, const char* waitingFor) {
  failIfPeersFailed(peer);
  failIfPeersCallDiffers();
  failIfLate(peer, waitingFor);
}

void braidComm::checkPeers(int peer, const char* waitingFor) const {
  failIfPeersFailed(peer);
  failIfLate(peer, waitingFor);
}

void braidComm::failIfPeersFailed(int peer) const {
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
  links_.forEachService([&](const braid::LinkService& service) {
    if (std::optional<std::string> failure =
            service.failure(peer >= 0 ? links_.linkIndex(peer) : -1))
      fail(braidRemoteError, "{} failed: {}", runningLabel(), *failure);
  });
  for (int r = 0; r < nranks_; ++r) {
    const braid::RankControl* c = control(r);
    if (c == nullptr || c->failed.load(std::memory_order_acquire) == 0) continue;
    if (r == rank_) fail(braidRemoteError, "{} aborted: {}", runningLabel(), c->reason);
    fail(braidRemoteError, "{} failed because rank {} failed: {}", runningLabel(), r, c->reason);
  }
  failIfPeerDeparted(peer);
}

// A waited-for peer on this host that destroyed its communicator (departed) will not move again,
// and what it wrote into the host FIFOs before is visible once its departure is: any wait's
// condition, looked at after the departure was first seen (by this thread, in this operation), is
// final. So a later sighting fails (a peer gone without its part waited until the timeout). Not on
// a CUDA communicator: its host links carry no data (LinkKind::HostPresence), and what a peer's
// kernels or the network still deliver may land after its departure shows.
void braidComm::failIfPeerDeparted(int peer) const {
  if (options_.cuda) return;
  const braid::RankControl* c = peer >= 0 && peer != rank_ ? control(peer) : nullptr;
  if (c == nullptr || c->departed.load(std::memory_order_acquire) == 0) return;
  struct Sighting {
    uint64_t comm = 0, seq = 0;
    int peer = -1;
  };
  thread_local Sighting last;
  const Sighting now{identity(), running_.seq, peer};
  if (last.comm != now.comm || last.seq != now.seq || last.peer != now.peer) {
    last = now;
    return;
  }
  fail(braidRemoteError,
       "{} failed: rank {} destroyed its communicator (braidCommDestroy) without taking its part "
       "in this operation",
       runningLabel(), peer);
}

void braidComm::failIfLate(int peer, const char* waitingFor) const {
  if (Clock::now() > running_.deadline) {
    const std::string from = peer >= 0 ? fmt::format(" from rank {}", peer) : std::string();
    fail(braidTimeout, "{} timed out after {} ms waiting for {}{}{}", runningLabel(),
         options_.timeoutMs, waitingFor, from, laggingPeers());
  }
}

// A peer that made another call under this rank's collective number: the log-step and tree
// all-reduces receive from partners, not from a ring predecessor whose first slot would say so,
// and a rank in another call may send them nothing. So a rank whose wait has gone to sleep asks
// what it can see of its peers' calls: the call each peer on its host published, and the first
// slot waiting in each FIFO into it (a peer on another host that sent it anything of that call),
// and names the first that differs, with the argument, rather than waiting for the timeout.
void braidComm::failIfPeersCallDiffers() const {
  if (running_.collective == 0) return;
  const std::optional<braid::CallTag> mine = braid::publishedCall(*control(rank_));
  if (!mine || mine->comm != identity() || mine->sequence != running_.collective) return;
  auto failIfDiffers = [&](int peer, const braid::CallTag& theirs) {
    if (theirs.comm == mine->comm && theirs.sequence == mine->sequence && !(theirs == *mine))
      throw Error(braidInvalidUsage, braid::describeMismatch(*mine, theirs, rank_, peer));
  };
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    if (const braid::RankControl* c = control(r))
      if (const std::optional<braid::CallTag> published = braid::publishedCall(*c))
        failIfDiffers(r, *published);
    if (braid::RecvConnector* from = links_.recvFrom()[r])
      if (const braid::SlotHeader* waiting = from->tryWait()) failIfDiffers(r, waiting->tag);
  }
}

void braidComm::allGatherOutOfBand(void* data, size_t bytes) {
  waitReady();
  links_.allGatherOutOfBand(data, bytes, std::chrono::milliseconds(options_.timeoutMs));
}

braid::BootstrapId braidComm::shrunkId(const std::vector<int>& survivors) {
  waitReady();
  return links_.shrunkId(survivors);
}

void* braidComm::registerBuffer(void* buff, size_t size, bool window) {
  uint64_t windowId = 0;
  if (window && onDevice()) {
    waitReady();
    windowId = device_->registerWindow(buff, size);
  }
  return registrations_.add(buff, size, window, windowId);
}

void braidComm::deregisterBuffer(void* handle, bool window, const char* fn) {
  const uint64_t windowId = registrations_.remove(handle, window, fn);
  if (device_ != nullptr && windowId != 0) device_->removeWindow(windowId);
}

void* braidComm::registeredBuffer(void* handle, bool window, const char* fn) {
  return registrations_.buffer(handle, window, fn);
}

void braidComm::finalize() {
  status_.pending().waitDrained();
  waitReady();
  if (device_ != nullptr) device_->cuda().synchronize();
  links_.bootstrap().barrier(deadlineFromNow());
}

void braidComm::finalizeInBackground() {
  if (finalizing_.joinable())
    fail(braidInvalidUsage, "rank {}: braidCommFinalize called a second time", rank_);
  status_.beginFinalize();
  finalizing_ = std::thread([this] {
    try {
      finalize();
      status_.endFinalize();
    } catch (...) {
      const Error e = braid::currentError(fmt::format("rank {}: braidCommFinalize", rank_));
      status_.record(e);
      markFailed(e.what());
      status_.fail(e.code());
    }
  });
}

// How long an abort between operations spends delivering what finished operations left unsent.
constexpr auto kAbortDelivery = std::chrono::seconds(2);

// A send returns once its data is in the FIFO, so a rank's finished operations may leave data for
// the network to carry after them. braidCommAbort between operations delivers it first, briefly:
// a peer whose matching call has not yet taken it would otherwise fail a call this rank saw
// succeed. Not while an operation runs (the abort ends it), nor once the communicator failed.
void braidComm::deliverFinishedSends() {
  if (!status_.ready() || status_.code() != braidSuccess || !links_.connected()) return;
  std::unique_lock<std::mutex> idle(links_.turn(), std::try_to_lock);
  if (!idle.owns_lock()) return;
  const Clock::time_point deadline =
      Clock::now() +
      std::min<Clock::duration>(kAbortDelivery, std::chrono::milliseconds(options_.timeoutMs));
  links_.forEachService([&](braid::LinkService& service) { service.finish(deadline); });
}

void braidComm::abort(const char* call) {
  markFailed(fmt::format("rank {} called {}", rank_, call));
  status_.fail(braidRemoteError);
  if (status_.ready() && device_ != nullptr) device_->cuda().abort();
  status_.pending().waitDrained();
  // An operation running on another thread sees the failure flag at its next poll and returns;
  // the communicator must outlive it.
  if (links_.connected()) std::lock_guard<std::mutex> lock(links_.turn());
}
