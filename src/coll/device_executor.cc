#include "coll/device_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "coll/device_kernels.cuh"
#include "coll/device_launch.h"
#include "coll/ring_call.h"
#include "kernels/host_reduce.h"
#include "transport/cuda_check.h"

namespace braid {
namespace {

// Calls f with a value of the storage type of `type`.
template <class F>
void withStorage(braidDataType_t type, F&& f) {
  switch (type) {
    case braidInt8: return f(int8_t{});
    case braidUint8:
    case braidFloat8e4m3:
    case braidFloat8e5m2: return f(uint8_t{});
    case braidFloat16:
    case braidBfloat16: return f(uint16_t{});
    case braidInt32: return f(int32_t{});
    case braidUint32: return f(uint32_t{});
    case braidFloat32: return f(float{});
    case braidInt64: return f(int64_t{});
    case braidUint64: return f(uint64_t{});
    case braidFloat64: return f(double{});
    default: fail(braidInvalidArgument, "datatype {} has no device kernel", static_cast<int>(type));
  }
}

void launch(const void* kernel, int blocks, int threads, void* params, void* stream,
            const char* what, int rank) {
  void* args[] = {params};
  checkCuda(cudaLaunchKernel(kernel, dim3(blocks), dim3(threads), args, 0,
                             static_cast<cudaStream_t>(stream)),
            fmt::format("rank {}: {}: cudaLaunchKernel", rank, what));
}

// PreMulSum's scalar of a ring or tree block: where the kernel reads it, or its value.
template <class Block>
void takeScale(Block& block, const DeviceScale* scale) {
  if (scale == nullptr) return;
  block.scale = static_cast<decltype(block.scale)>(scale->onDevice);
  std::memcpy(&block.scaleValue, &scale->bits, sizeof(block.scaleValue));
}

// The segmented protocol's warps must be whole (their barriers and votes name all 32 lanes) and
// its segments whole packs.
void checkSegmentedLaunch(const DeviceRankCall& r) {
  const size_t segmentBytes = r.ctx->links->geometry().segmentBytes;
  if (r.ctx->threads % 32 != 0 || segmentBytes == 0 || segmentBytes % sizeof(Pack16) != 0)
    fail(braidInternalError,
         "rank {}: the segmented protocol needs whole warps and segments of whole 16-byte packs "
         "({} threads, {}-byte segments)",
         r.ctx->links->rank(), r.ctx->threads, segmentBytes);
}

// A launch's ranks: each one's calls, next to each other in the launch's list.
using RankCalls = std::span<const DeviceRankCall>;

// Each rank's calls are works of the launch, and each of its channels a block that runs them in
// order.
template <class T, class Ports>
void launchRing(std::span<const RankCalls> ranks, DeviceProtocol protocol, const void* kernel,
                void* stream) {
  static_assert(sizeof(RingLaunch<T, Ports>) <= 8192, "kMaxLaunchWorks's promise");
  RingLaunch<T, Ports> params{};
  params.timeoutNs = ranks.front().front().ctx->timeoutNs;
  int blocks = 0, works = 0;
  for (const RankCalls& calls : ranks) {
    const DeviceRankCall& r = calls.front();
    const P2pLinks& links = *r.ctx->links;
    const int n = links.nranks(), rank = links.rank(), channels = links.geometry().channels;
    const int firstWork = works;
    for (const DeviceRankCall& call : calls) {
      RingWork<T>& work = params.works[works++];
      work.call = ringCallOf<T>(call.args, n, rank, nullptr);
      takeScale(work, call.scale);
    }
    for (int ch = 0; ch < channels; ++ch) {
      RingBlock<Ports>& block = params.blocks[blocks++];
      block.firstWork = firstWork;
      block.nWorks = static_cast<int>(calls.size());
      block.channel = ch;
      block.nChannels = channels;
      block.ringOrder = links.ringOrder(ch);
      block.ports.in = links.ringRecv(ch, protocol).recvView();
      block.ports.out = links.ringSend(ch, protocol).sendView();
      if constexpr (std::is_same_v<Ports, SegmentPorts>) {
        if (ch == 0) checkSegmentedLaunch(r);
        block.ports.segmentBytes = links.geometry().segmentBytes;
      }
      block.failed = r.ctx->failed + ch;
    }
  }
  const DeviceCollContext& ctx = *ranks.front().front().ctx;
  launch(kernel, blocks, ctx.threads, &params, stream, "collective", ctx.links->rank());
}

// The all-reduces on the trees: each rank's calls are works of the launch, and each of its tree
// channels a block that runs its share of them in order, through the FIFOs P2pLinks laid out for
// that tree.
template <class T, class Ports>
void launchTree(std::span<const RankCalls> ranks, DeviceProtocol protocol, const void* kernel,
                void* stream) {
  static_assert(sizeof(TreeLaunch<T, Ports>) <= 12288, "kMaxLaunchWorks's promise");
  TreeLaunch<T, Ports> params{};
  params.timeoutNs = ranks.front().front().ctx->timeoutNs;
  int blocks = 0, works = 0;
  for (const RankCalls& calls : ranks) {
    const DeviceRankCall& r = calls.front();
    const P2pLinks& links = *r.ctx->links;
    const int firstWork = works;
    for (const DeviceRankCall& call : calls) {
      TreeWork<T>& work = params.works[works++];
      work = {Collective::AllReduce, static_cast<const T*>(call.args.sendbuff),
              static_cast<T*>(call.args.recvbuff), call.args.count,
              call.args.op == braidAvg ? links.nranks() : 1};
      takeScale(work, call.scale);
    }
    const int channels = links.treeChannels();
    for (int ch = 0; ch < channels; ++ch) {
      TreeBlock<Ports>& block = params.blocks[blocks++];
      const P2pLinks::TreeChannel& tree = links.tree(ch);
      const TreeNode& node = tree.node;
      block.firstWork = firstWork;
      block.nWorks = static_cast<int>(calls.size());
      block.place = {node.parent >= 0, node.nChildren, ch, channels};
      auto portsAt = [&](int end) {
        Ports ports{};
        ports.in = tree.from(protocol, end).recvView();
        ports.out = tree.to(protocol, end).sendView();
        return ports;
      };
      if (node.parent >= 0) block.ports.parent = portsAt(0);
      for (int c = 0; c < node.nChildren; ++c) block.ports.children[c] = portsAt(1 + c);
      block.failed = r.ctx->failed + ch;
    }
  }
  const DeviceCollContext& ctx = *ranks.front().front().ctx;
  launch(kernel, blocks, ctx.threads, &params, stream, "tree all-reduce", ctx.links->rank());
}

// Ranks that share the device, each reaching the others' buffers: every rank of the
// communicator in one launch (their buffers from their calls), or one rank launched on its own
// with every rank's buffers (registered windows). Each rank's blocks read and write every rank's
// buffers directly, meeting at the barrier words of rank 0's allocation.
template <class T>
void launchDirect(std::span<const DeviceRankCall> ranks, const void* kernel, void* stream) {
  static_assert(sizeof(DirectArrival) == kDirectLineBytes);
  const P2pLinks& anyLinks = *ranks.front().ctx->links;
  const int n = anyLinks.nranks(), channels = anyLinks.geometry().channels;
  const bool alone = ranks.size() == 1 && ranks.front().inputs != nullptr;
  if ((!alone && static_cast<int>(ranks.size()) != n) || !anyLinks.ranksShareDevice() ||
      n > kMaxLaunchBlocks)
    fail(braidInternalError,
         "rank {}: the direct engine needs all {} ranks on one device, in one launch or with "
         "every rank's buffers ({} in this launch)",
         anyLinks.rank(), n, ranks.size());
  DirectLaunch<T> params{};
  params.timeoutNs = ranks.front().ctx->timeoutNs;
  params.abort = anyLinks.directAbort();
  if (alone)
    for (int p = 0; p < n; ++p) {
      params.inputs[p] = static_cast<const T*>(ranks.front().inputs[p]);
      params.outputs[p] = static_cast<T*>(ranks.front().outputs[p]);
    }
  int blocks = 0;
  for (const DeviceRankCall& r : ranks) {
    const int rank = r.ctx->links->rank();
    if (r.scale != nullptr && (alone || r.scale->onDevice != nullptr))
      fail(braidInternalError,
           "rank {}: the direct engine takes PreMulSum's scalar by value, "
           "in a launch of every rank",
           rank);
    if (!alone) {
      params.inputs[rank] = static_cast<const T*>(r.args.sendbuff);
      params.outputs[rank] = static_cast<T*>(r.args.recvbuff);
    }
    if (r.scale != nullptr) std::memcpy(&params.scales[rank], &r.scale->bits, sizeof(T));
    for (int ch = 0; ch < channels; ++ch)
      params.blocks[blocks++] = {r.args.coll,
                                 n,
                                 rank,
                                 ch,
                                 channels,
                                 r.args.count,
                                 r.args.op == braidAvg ? n : 1,
                                 static_cast<DirectArrival*>(anyLinks.directArrivals(ch)),
                                 r.signature,
                                 r.ctx->failed + ch};
  }
  launch(kernel, blocks, ranks.front().ctx->threads, &params, stream, "direct collective",
         anyLinks.rank());
}

// The operator of a rank's calls' kernel: the one every call that reduces names; Sum where none
// does (a call that only moves runs under any).
braidRedOp_t kernelOp(RankCalls calls) {
  for (const DeviceRankCall& c : calls)
    if (reduces(c.args.coll)) return c.args.op;
  return braidSum;
}

// The launch's calls by rank (each rank's next to each other), checked: every rank makes the same
// calls, all of them in one kernel (the tree's all-reduces), the works and every rank's blocks
// within the launch's parameters, one call per rank for the direct engine.
std::vector<RankCalls> checkLaunch(std::span<const DeviceRankCall> calls,
                                   DeviceAlgorithm algorithm) {
  std::vector<RankCalls> ranks;
  for (size_t i = 0, begin = 0; i < calls.size(); ++i)
    if (i + 1 == calls.size() || calls[i + 1].ctx != calls[i].ctx) {
      ranks.push_back(calls.subspan(begin, i + 1 - begin));
      begin = i + 1;
    }
  const int rank = calls.front().ctx->links->rank();
  const bool tree =
      algorithm == DeviceAlgorithm::Tree || algorithm == DeviceAlgorithm::TreeLowLatency;
  if (tree && std::any_of(calls.begin(), calls.end(), [](const DeviceRankCall& c) {
        return c.args.coll != Collective::AllReduce;
      }))
    fail(braidInternalError, "rank {}: the device tree runs all-reduces only", rank);
  const RankCalls& model = ranks.front();
  std::vector<KernelCall> kernel;
  for (const DeviceRankCall& c : model) {
    const KernelCall call = kernelCallOf(c.args, c.scale != nullptr, algorithm);
    if (!kernel.empty() && !runsInKernelOf(kernel, call))
      fail(braidInternalError,
           "rank {}: calls of one launch need different kernels (only a ring or tree launch runs "
           "several calls of a rank, of one datatype and operator)",
           rank);
    kernel.push_back(call);
  }
  int blocks = 0;
  for (const RankCalls& r : ranks) {
    const P2pLinks& links = *r.front().ctx->links;
    blocks += tree ? links.treeChannels() : links.geometry().channels;
    bool same = r.size() == model.size();
    for (size_t k = 0; same && k < r.size(); ++k)
      same = sameCollective(r[k].args, model[k].args) &&
             (r[k].scale == nullptr) == (model[k].scale == nullptr);
    if (!same)
      fail(braidInternalError, "rank {}: ranks of one launch make different calls", links.rank());
  }
  if (blocks > kMaxLaunchBlocks || calls.size() > static_cast<size_t>(kMaxLaunchWorks))
    fail(braidInternalError, "rank {}: {} blocks and {} calls in one launch (at most {} and {})",
         rank, blocks, calls.size(), kMaxLaunchBlocks, kMaxLaunchWorks);
  return ranks;
}

}  // namespace

void loadDeviceKernels(int device) {
  static std::mutex mutex;
  static std::set<int> loaded;
  const std::lock_guard<std::mutex> lock(mutex);
  if (loaded.contains(device)) return;
  for (DeviceAlgorithm algorithm :
       {DeviceAlgorithm::Simple, DeviceAlgorithm::LowLatency, DeviceAlgorithm::Segmented,
        DeviceAlgorithm::Direct, DeviceAlgorithm::Tree, DeviceAlgorithm::TreeLowLatency})
    for (int type = 0; type < braidNumTypes; ++type)
      for (int op = 0; op < braidNumOps; ++op)
        for (bool prescaled : {false, true})
          if (const void* kernel = deviceKernel(algorithm, static_cast<braidDataType_t>(type),
                                                static_cast<braidRedOp_t>(op), prescaled)) {
            cudaFuncAttributes attributes{};
            checkCuda(cudaFuncGetAttributes(&attributes, kernel),
                      fmt::format("CUDA device {}: loading the device kernels "
                                  "(cudaFuncGetAttributes)",
                                  device));
          }
  loaded.insert(device);
}

int deviceLaunchBlocks() {
  return kMaxLaunchBlocks;
}

void launchCollective(std::span<const DeviceRankCall> calls, DeviceAlgorithm algorithm,
                      void* stream) {
  const std::vector<RankCalls> ranks = checkLaunch(calls, algorithm);
  const bool anyElements = std::any_of(calls.begin(), calls.end(),
                                       [](const DeviceRankCall& c) { return c.args.count > 0; });
  if (!anyElements) return;  // every rank skips it alike; the FIFOs are untouched
  const DeviceRankCall& first = calls.front();
  const braidRedOp_t op = kernelOp(ranks.front());
  const void* kernel = deviceKernel(algorithm, first.args.type, op, first.scale != nullptr);
  if (kernel == nullptr)
    fail(braidInvalidArgument, "rank {}: no device kernel for datatype {} and op {}",
         first.ctx->links->rank(), static_cast<int>(first.args.type), static_cast<int>(op));
  withStorage(first.args.type, [&](auto element) {
    using T = decltype(element);
    switch (algorithm) {
      case DeviceAlgorithm::Direct: return launchDirect<T>(calls, kernel, stream);
      case DeviceAlgorithm::Tree:
        return launchTree<T, FifoViewPorts>(ranks, DeviceProtocol::Simple, kernel, stream);
      case DeviceAlgorithm::TreeLowLatency:
        return launchTree<T, LlPorts>(ranks, DeviceProtocol::LowLatency, kernel, stream);
      case DeviceAlgorithm::LowLatency:
        return launchRing<T, LlPorts>(ranks, DeviceProtocol::LowLatency, kernel, stream);
      case DeviceAlgorithm::Segmented:
        return launchRing<T, SegmentPorts>(ranks, DeviceProtocol::Segmented, kernel, stream);
      case DeviceAlgorithm::Simple:
        return launchRing<T, FifoViewPorts>(ranks, DeviceProtocol::Simple, kernel, stream);
    }
  });
}

// Sends and receives move bytes: every one runs as a uint8_t send or receive of its bytes, each
// through the FIFO of its pair of ranks, a block each.
void launchSendRecv(const DeviceCollContext& ctx, std::span<const CollArgs> ops, void* stream) {
  const P2pLinks& links = *ctx.links;
  const int rank = links.rank(), n = links.nranks();
  if (ops.empty()) return;
  if (ops.size() > static_cast<size_t>(kMaxLaunchBlocks))
    fail(braidInternalError, "rank {}: {} sends and receives in one launch (at most {})", rank,
         ops.size(), kMaxLaunchBlocks);
  static_assert(kMaxLaunchWorks >= kMaxLaunchBlocks, "a block's send or receive is a work");
  RingLaunch<uint8_t, FifoViewPorts> params{};
  params.timeoutNs = ctx.timeoutNs;
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollArgs& a = ops[i];
    const size_t bytes = a.count * kernels::typeSize(a.type);
    params.works[i].call = {a.coll,
                            n,
                            rank,
                            a.root,
                            static_cast<const uint8_t*>(a.sendbuff),
                            static_cast<uint8_t*>(a.recvbuff),
                            bytes,
                            bytes,
                            1};
    RingBlock<FifoViewPorts>& block = params.blocks[i];
    const bool send = a.coll == Collective::Send;
    block.firstWork = static_cast<int>(i);
    block.nWorks = 1;
    block.channel = 0;
    block.nChannels = 1;
    block.failed = ctx.failed + i;
    if (send)
      block.ports.out = links.pairSend(a.root).sendView();
    else
      block.ports.in = links.pairRecv(a.root).recvView();
  }
  const void* kernel = deviceKernel(DeviceAlgorithm::Simple, braidUint8, braidSum, false);
  launch(kernel, static_cast<int>(ops.size()), ctx.threads, &params, stream, "send/recv", rank);
}

}  // namespace braid
