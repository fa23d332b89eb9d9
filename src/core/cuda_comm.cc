#include "core/cuda_comm.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string_view>

#include "base/random.h"
#include "core/cuda_probe.h"
#include "plan/model.h"

#if BRAID_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "coll/device_executor.h"
#include "coll/device_kernels.cuh"
#include "transport/cuda_check.h"
#include "transport/p2p.h"
#endif

namespace braid {

#if BRAID_HAVE_CUDA
// A launch carries a block per channel.
static_assert(plan::kMaxDeviceChannels <= kMaxLaunchBlocks);
static_assert(kMaxWindowRanks <= kMaxLaunchBlocks, "a window call's buffers go in one launch");

namespace {

// FIFO sizes of a CUDA communicator. Simple: 8 slots of 128 KiB per channel (a ring step moves a
// slot; NCCL's is 512 KiB, tune on a GPU). Low-latency: 8 slots of 16 KiB lines, 8 KiB of data
// each. Segmented: 8 slots of 16 warp segments (2 KiB each, 32 KiB of data a slot: two per warp
// of a 256-thread block). Which protocol a call uses is the cost model's choice (core/comm.cc).
constexpr size_t kSimpleSlotBytes = 128 << 10;
constexpr uint32_t kSimpleSlots = 8;
constexpr size_t kLlSlotBytes = 16 << 10;
constexpr uint32_t kLlSlots = 8;
constexpr uint32_t kSegmentsPerSlot = 16;
constexpr uint32_t kSegmentSlots = 8;
constexpr int kThreadsPerBlock = 256;
static_assert(kThreadsPerBlock <= kMaxThreadsPerBlock, "the kernels are built for at most this");
static_assert(kThreadsPerBlock % 32 == 0, "the segmented protocol's blocks are whole warps");

// CUDA communicators alive in this process: device memory handed to a CPU communicator is looked
// for only where there are some (the question needs a CUDA context, which a CPU-only process on a
// GPU machine should not pay for).
std::atomic<int> liveCudaComms{0};

// Tells processes apart where pids may repeat (containers in separate pid namespaces share the
// host's network namespace): drawn once per process.
uint64_t processNonce() {
  static const uint64_t nonce = [] {
    uint64_t n = 0;
    fillRandom(&n, sizeof n);
    return n;
  }();
  return nonce;
}

const char* memoryKind(const cudaPointerAttributes& attributes) {
  switch (attributes.type) {
    case cudaMemoryTypeUnregistered: return "pageable host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "memory of unknown kind";
}

cudaPointerAttributes attributesOf(const void* p) {
  cudaPointerAttributes attributes{};
  checkCuda(cudaPointerGetAttributes(&attributes, p), "cudaPointerGetAttributes");
  return attributes;
}

// The communicator's device made current for a launch (a thread may drive ranks of several
// GPUs), the caller's restored after.
class OnDevice {
 public:
  OnDevice(int device, int rank) {
    checkCuda(cudaGetDevice(&previous_), fmt::format("rank {}: cudaGetDevice", rank));
    if (previous_ == device) return;
    checkCuda(cudaSetDevice(device), fmt::format("rank {}: cudaSetDevice({})", rank, device));
    switched_ = true;
  }
  ~OnDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

class CudaCommImpl final : public CudaComm {
 public:
  // Init may run on another thread than the caller's (groups, non-blocking init), so the device
  // comes in the setup, taken on the caller's thread; this thread's current device is restored.
  explicit CudaCommImpl(const CudaCommSetup& setup) : rank_(setup.rank), device_(setup.device) {
    const OnDevice on(device_, rank_);
    try {
      for (cudaEvent_t* event : {&lastCall_, &join_})
        checkCuda(cudaEventCreateWithFlags(event, cudaEventDisableTiming),
                  fmt::format("rank {}: cudaEventCreateWithFlags", rank_));
      // The words a block sets when its wait gives up: mapped host memory, so the host reads them
      // at any time without a copy or a wait.
      checkCuda(cudaHostAlloc(reinterpret_cast<void**>(&failed_), sizeof(int) * kMaxLaunchBlocks,
                              cudaHostAllocMapped),
                fmt::format("rank {}: cudaHostAlloc", rank_));
      std::fill(failed_, failed_ + kMaxLaunchBlocks, 0);
      int* failedOnDevice = nullptr;
      checkCuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&failedOnDevice), failed_, 0),
                fmt::format("rank {}: cudaHostGetDevicePointer", rank_));
      loadDeviceKernels(device_);  // before the FIFOs' exchange: no peer has launched yet
      DeviceFifoGeometry geometry{setup.channels,   kSimpleSlotBytes, kSimpleSlots,
                                  kLlSlotBytes,     kLlSlots,         kWarpSegmentBytes,
                                  kSegmentsPerSlot, kSegmentSlots};
      const DeviceConnect connect{{.processNonce = processNonce(),
                                   .pid = static_cast<int32_t>(getpid()),
                                   .device = device_},
                                  geometry,
                                  setup.ringOrders};
      links_ = setup.connectLinks(connect);
      p2p_ = links_.device.get();
      if (p2p_ == nullptr)
        fail(braidInternalError, "rank {}: no transport laid out the device FIFOs", rank_);
      ctx_.links = p2p_;
      ctx_.timeoutNs = static_cast<uint64_t>(setup.timeoutMs) * 1'000'000;
      ctx_.failed = failedOnDevice;
      ctx_.threads = kThreadsPerBlock;
      timeoutMs_ = setup.timeoutMs;
    } catch (...) {
      release();  // an init that failed (a peer that never connected, say) leaks nothing
      throw;
    }
    ++liveCudaComms;
  }
  // This rank's kernels end (each bounded by its deadline, at once after abort()) before the
  // FIFOs and the words they write are freed.
  ~CudaCommImpl() override {
    const OnDevice on(device_, rank_);
    cudaEventSynchronize(lastCall_);
    // What the last kernels posted to other hosts is on its way before the proxy stops; after a
    // failure or an abort nobody may be reading it.
    const bool failed = aborted_ || failure().has_value();
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(failed ? 0 : timeoutMs_);
    for (const auto& service : links_.services) service->finish(deadline);
    release();
    --liveCudaComms;
  }

  int device() const override { return device_; }
  bool ranksShareDevice() const override { return p2p_->ranksShareDevice(); }
  std::vector<int> ranksOnDevice() const override { return p2p_->ranksOnDevice(); }
  double memoryGBs() const override {
    int clockKHz = 0, busBits = 0;
    if (cudaDeviceGetAttribute(&clockKHz, cudaDevAttrMemoryClockRate, device_) != cudaSuccess ||
        cudaDeviceGetAttribute(&busBits, cudaDevAttrGlobalMemoryBusWidth, device_) != cudaSuccess) {
      cudaGetLastError();
      return 0;  // unknown: the model falls back on the plan's links
    }
    return 2.0 * clockKHz * 1e3 * (busBits / 8.0) / 1e9;  // double data rate
  }

  void checkBuffer(const char* fn, const char* name, const void* p) const override {
    const cudaPointerAttributes a = attributesOf(p);
    const bool reachable =
        a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == device_);
    if (reachable) return;
    if (a.type == cudaMemoryTypeDevice)
      fail(braidInvalidArgument,
           "{} on rank {}: {} {} is device memory of CUDA device {} (expected device memory of "
           "this communicator's CUDA device {})",
           fn, rank_, name, p, a.device, device_);
    fail(braidInvalidArgument,
         "{} on rank {}: {} {} is {} (expected device memory of CUDA device {}: this is a CUDA "
         "communicator)",
         fn, rank_, name, p, memoryKind(a), device_);
  }

  // Operations of one peer and direction complete in issue order, and each pair of ranks has one
  // FIFO per direction: the k-th operation of every peer and direction goes in the k-th launch
  // (every rank cuts alike, so launch k of one rank meets launch k of its peers).
  void launchSendRecv(std::span<const CollArgs> ops, void* stream) override {
    const OnDevice on(device_, rank_);
    std::vector<std::vector<CollArgs>> waves;
    std::map<std::pair<int, bool>, size_t> seen;
    for (const CollArgs& a : ops) {
      if (a.coll != Collective::Send && a.coll != Collective::Recv) continue;  // root markers
      const size_t wave = seen[{a.root, a.coll == Collective::Send}]++;
      if (waves.size() <= wave) waves.resize(wave + 1);
      waves[wave].push_back(a);
    }
    for (const std::vector<CollArgs>& wave : waves)  // all checked before any is launched
      if (wave.size() > static_cast<size_t>(deviceLaunchBlocks()))
        fail(braidInvalidUsage,
             "rank {}: {} sends and receives with distinct peers in one group; a CUDA "
             "communicator runs at most {} at once so far (expected fewer peers per group)",
             rank_, wave.size(), deviceLaunchBlocks());
    const bool captured = afterLastCall(stream);
    for (const std::vector<CollArgs>& wave : waves) braid::launchSendRecv(ctx_, wave, stream);
    recordCall(stream, captured);
  }

  bool capturing(void* stream) const override {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    checkCuda(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture),
              fmt::format("rank {}: cudaStreamIsCapturing", rank_));
    return capture != cudaStreamCaptureStatusNone;
  }

  std::optional<Error> failure() override {
    // A lost connection to another host: the kernels waiting on its hops stop now rather than at
    // their deadline.
    for (const auto& service : links_.services)
      if (std::optional<std::string> lost = service->failure(-1)) {
        stopKernels();
        return Error(braidRemoteError, fmt::format("rank {}: {}", rank_, *lost));
      }
    for (int b = 0; b < kMaxLaunchBlocks; ++b)
      if (const int why = __atomic_load_n(&failed_[b], __ATOMIC_ACQUIRE); why != 0) {
        stopKernels();
        if (why == kCallsDiffered)
          return Error(braidInvalidUsage,
                       fmt::format("rank {}: the ranks of a direct collective on registered "
                                   "windows made different calls, and none read or wrote a "
                                   "buffer (expected the same collective, datatype, operator and "
                                   "count on every rank, its buffers at the same offsets of "
                                   "windows registered together, in place on every rank or on "
                                   "none)",
                                   rank_));
        if (aborted_)
          return Error(braidRemoteError,
                       fmt::format("rank {}: a kernel stopped waiting because the communicator "
                                   "was aborted",
                                   rank_));
        return Error(braidTimeout,
                     fmt::format("rank {}: block {} of a kernel gave up after {} ms waiting for "
                                 "a peer (its ring neighbours, the peers of its sends and "
                                 "receives, or of a direct call on registered windows, which "
                                 "every rank must make alike), or stopped at once because a "
                                 "peer's host had seen its own kernel give up",
                                 rank_, b, timeoutMs_));
      }
    return std::nullopt;
  }

  void abort() override {
    const OnDevice on(device_, rank_);
    aborted_ = true;
    p2p_->abort();
  }

  void abandon(const std::string& reason) override {
    for (const auto& service : links_.services) service->abandon(reason);
  }

  // A lost connection, or a kernel of this rank that stopped short (its FIFO counters no longer
  // match its peers'): the kernels queued behind it must move nothing, and the kernels waiting on
  // its FIFOs (its own on a lost hop, its peers') need not wait for their deadlines. Setting the
  // abort words of every FIFO it uses (and the direct engine's) does both, once; every later call
  // is refused by the communicator anyway.
  void stopKernels() {
    if (kernelsStopped_.exchange(true)) return;
    const OnDevice on(device_, rank_);  // asked from any thread (braidCommGetAsyncError)
    p2p_->abort();
  }

  void synchronize() override {
    checkCuda(cudaEventSynchronize(lastCall_),
              fmt::format("rank {}: cudaEventSynchronize of its last call", rank_));
  }

 private:
  friend void ::braid::launchCollectives(std::span<const CudaCall> calls);

  // A rank's calls share its FIFOs and take up their counters where the previous call left them,
  // so they must run one after another even on different streams: a call on another stream than
  // the last waits for the last call's event, and every call records it. A stream being captured
  // into a graph is left alone (an event from outside the capture cannot be waited on there):
  // the graph orders its own calls, and mixing captured and uncaptured streams is the user's.
  // Returns whether `stream` is being captured.
  bool afterLastCall(void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    const bool captured = capturing(stream);
    if (!captured && hasLastStream_ && lastStream_ != s)
      checkCuda(cudaStreamWaitEvent(s, lastCall_, 0),
                fmt::format("rank {}: cudaStreamWaitEvent", rank_));
    return captured;
  }
  void recordCall(void* stream, bool captured) {
    if (captured) return;
    auto s = static_cast<cudaStream_t>(stream);
    checkCuda(cudaEventRecord(lastCall_, s), fmt::format("rank {}: cudaEventRecord", rank_));
    lastStream_ = s;
    hasLastStream_ = true;
  }

  // What init made, freed by the destructor or by an init that failed part way.
  void release() noexcept {
    // The proxy stops before the device FIFOs go (it owns the pinned ones it moves).
    links_.services.clear();
    p2p_ = nullptr;
    links_.device.reset();
    if (failed_ != nullptr) cudaFreeHost(failed_);
    failed_ = nullptr;
    for (cudaEvent_t* event : {&lastCall_, &join_})
      if (*event != nullptr) cudaEventDestroy(*event);
    lastCall_ = join_ = nullptr;
  }

  cudaEvent_t lastCall_ = nullptr;
  cudaEvent_t join_ = nullptr;  // joins the streams of ranks launched together
  cudaStream_t lastStream_ = nullptr;
  bool hasLastStream_ = false;
  int rank_;
  int device_ = -1;
  int timeoutMs_ = 0;
  int* failed_ = nullptr;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> kernelsStopped_{false};
  PeerLinks links_;          // the device FIFOs (p2p_), and the proxy of their network hops
  P2pLinks* p2p_ = nullptr;  // links_.device
  DeviceCollContext ctx_;
};

}  // namespace

std::unique_ptr<CudaComm> CudaComm::connect(const CudaCommSetup& setup) {
  return std::make_unique<CudaCommImpl>(setup);
}

// The launch goes on the first rank's stream: every other rank's stream joins it before (its
// queued work precedes the call) and waits for it after (its later work follows the call), by
// events, which a graph capture turns into edges. A rank's calls are next to each other, on its
// one stream.
void launchCollectives(std::span<const CudaCall> calls) {
  auto& first = static_cast<CudaCommImpl&>(*calls.front().comm);
  const OnDevice on(first.device_, first.rank_);
  const auto firstStream = static_cast<cudaStream_t>(calls.front().stream);
  std::vector<DeviceScale> scales(calls.size());
  std::vector<DeviceRankCall> ranks;
  std::vector<bool> captured;  // by rank: the first call of each
  auto firstOfRank = [&](size_t i) { return i == 0 || calls[i].comm != calls[i - 1].comm; };
  for (size_t i = 0; i < calls.size(); ++i) {
    auto& comm = static_cast<CudaCommImpl&>(*calls[i].comm);
    if (comm.device_ != first.device_ || calls[i].algorithm != calls.front().algorithm ||
        (!firstOfRank(i) && calls[i].stream != calls[i - 1].stream))
      fail(braidInternalError,
           "rank {}: calls of one launch are on different devices, chose different algorithms, "
           "or one rank's are on different streams",
           comm.rank_);
    if (calls[i].scalar != nullptr) scales[i] = {calls[i].scalar->onDevice, calls[i].scalar->bits};
    const WindowCall* window = calls[i].window;
    ranks.push_back({&comm.ctx_, calls[i].args, calls[i].scalar != nullptr ? &scales[i] : nullptr,
                     window != nullptr ? window->signature : directSignature(calls[i].args),
                     window != nullptr ? window->inputs.data() : nullptr,
                     window != nullptr ? window->outputs.data() : nullptr});
    if (!firstOfRank(i)) continue;
    captured.push_back(comm.afterLastCall(calls[i].stream));
    const auto stream = static_cast<cudaStream_t>(calls[i].stream);
    if (stream == firstStream) continue;
    checkCuda(cudaEventRecord(comm.join_, stream),
              fmt::format("rank {}: cudaEventRecord", comm.rank_));
    checkCuda(cudaStreamWaitEvent(firstStream, comm.join_, 0),
              fmt::format("rank {}: cudaStreamWaitEvent", comm.rank_));
  }
  launchCollective(ranks, calls.front().algorithm, firstStream);
  if (captured.size() > 1)
    checkCuda(cudaEventRecord(first.join_, firstStream),
              fmt::format("rank {}: cudaEventRecord", first.rank_));
  for (size_t i = 0, rank = 0; i < calls.size(); ++i) {
    if (!firstOfRank(i)) continue;
    auto& comm = static_cast<CudaCommImpl&>(*calls[i].comm);
    const auto stream = static_cast<cudaStream_t>(calls[i].stream);
    if (stream != firstStream)
      checkCuda(cudaStreamWaitEvent(stream, first.join_, 0),
                fmt::format("rank {}: cudaStreamWaitEvent", comm.rank_));
    comm.recordCall(calls[i].stream, captured[rank++]);
  }
}

namespace {
std::mutex deviceAllocationsMutex;
std::set<void*> deviceAllocations;  // what allocateDeviceMemory gave
}  // namespace

void* allocateDeviceMemory(size_t bytes) {
  if (const std::string why = cudaUnavailableReason(); !why.empty())
    fail(braidInvalidUsage, "braidMemAlloc: {}", why);
  const int device = currentCudaDevice();
  void* p = nullptr;
  checkCuda(cudaMalloc(&p, bytes),
            fmt::format("braidMemAlloc: cudaMalloc of {} bytes on CUDA device {}", bytes, device));
  const std::lock_guard<std::mutex> lock(deviceAllocationsMutex);
  deviceAllocations.insert(p);
  return p;
}

bool releaseDeviceMemory(void* p) {
  {
    const std::lock_guard<std::mutex> lock(deviceAllocationsMutex);
    if (deviceAllocations.erase(p) == 0) return false;
  }
  checkCuda(cudaFree(p), "braidMemFree: cudaFree");
  return true;
}

int currentCudaDevice() {
  int device = 0;
  checkCuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

uint64_t cudaDeviceKey(int device) {
  char busId[32] = {};
  checkCuda(cudaDeviceGetPCIBusId(busId, sizeof busId, device),
            fmt::format("cudaDeviceGetPCIBusId({})", device));
  return std::hash<std::string_view>{}(busId);
}

// Never throws for the question itself: a runtime that cannot answer (a child forked after its
// parent used CUDA) means the buffer is taken for host memory.
void checkHostBuffer(const char* fn, int rank, const char* name, const void* p) {
  if (liveCudaComms.load(std::memory_order_relaxed) == 0 || p == nullptr) return;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (a.type == cudaMemoryTypeDevice)
    fail(braidInvalidArgument,
         "{} on rank {}: {} {} is device memory of CUDA device {} (expected host memory: this is "
         "a CPU communicator)",
         fn, rank, name, p, a.device);
}

#else

std::unique_ptr<CudaComm> CudaComm::connect(const CudaCommSetup& setup) {
  fail(braidInvalidUsage, "rank {}: {}", setup.rank, cudaUnavailableReason());
}

void launchCollectives(std::span<const CudaCall>) {}

void checkHostBuffer(const char*, int, const char*, const void*) {}

void* allocateDeviceMemory(size_t) {
  fail(braidInvalidUsage, "braidMemAlloc: {}", cudaUnavailableReason());
}

bool releaseDeviceMemory(void*) {
  return false;
}

int currentCudaDevice() {
  return -1;
}

uint64_t cudaDeviceKey(int device) {
  return static_cast<uint64_t>(device);
}

#endif

}  // namespace braid
