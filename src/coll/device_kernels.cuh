// The collectives as CUDA kernels: the engines' device form (coll/ring_engine.h,
// coll/tree_engine.h, coll/direct_engine.h) with a thread block as the thread group. One launch
// covers every block the call needs: a channel of one rank per block, and may carry several ranks
// (CUDA does not promise that separately launched kernels run at the same time, and these blocks
// wait for each other; a CUDA communicator launches a kernel per rank so far: docs/cuda.md). A
// ring or tree launch may carry several calls of a group, each block running its rank's in order.
// Each block's work comes in the launch's parameters (__grid_constant__), so a call allocates
// nothing and copies nothing before it runs, and a CUDA graph can capture it.
#pragma once

#include <cuda/std/cstdint>

#include "coll/device_launch.h"
#include "coll/direct_engine.h"
#include "coll/ring_engine.h"
#include "coll/tree_engine.h"
#include "kernels/element_reduce.h"

namespace braid {

// The most blocks one launch carries in its parameters: 8 ranks x 4 channels. The parameters of
// a launch may hold up to 32764 bytes on sm_70 and later with CUDA 12.1 or newer.
constexpr int kMaxLaunchBlocks = 32;

// The most threads a block of these kernels may have: NCCL's Simple blocks have 512 (and a warp).
// The kernels are compiled for it (__launch_bounds__), so each keeps to 128 registers per thread
// (65536 / 512) and a launch of up to 512 threads always fits; tests/device/check_sass.sh holds
// them to it, and to no local memory.
constexpr int kMaxThreadsPerBlock = 512;

// What a block stores in its rank's `failed` word when it stops short.
constexpr int kGaveUp = 1;         // a wait gave up: the deadline, or the host's abort
constexpr int kCallsDiffered = 2;  // a direct call's peers arrived for another call

#if defined(__CUDACC__)
// A thread block as the engines' thread group. Waits pause briefly and give up at the deadline
// (%globaltimer, nanoseconds, counted from the block's start) or when the host aborts the FIFOs:
// no device wait is unbounded.
class BlockGroup {
 public:
  __device__ explicit BlockGroup(uint64_t timeoutNs) : deadlineNs_(now() + timeoutNs) {}
  __device__ int index() const { return static_cast<int>(threadIdx.x); }
  __device__ int size() const { return static_cast<int>(blockDim.x); }
  __device__ void sync() { __syncthreads(); }
  __device__ bool any(bool mine) { return __syncthreads_or(mine) != 0; }
  // Warps, for the segmented protocol: every launch's blocks are whole warps (launchRing checks).
  __device__ int lane() const { return static_cast<int>(threadIdx.x) % warpSize; }
  __device__ int lanes() const { return warpSize; }
  __device__ int warp() const { return static_cast<int>(threadIdx.x) / warpSize; }
  __device__ int warps() const { return static_cast<int>(blockDim.x) / warpSize; }
  __device__ void syncWarp() { __syncwarp(); }
  __device__ bool anyInWarp(bool mine) { return __any_sync(0xffffffffu, mine) != 0; }
  __device__ bool keepWaiting() {
    __nanosleep(64);
    return now() < deadlineNs_;
  }

 private:
  __device__ static uint64_t now() {
    uint64_t ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
  }
  uint64_t deadlineNs_;
};
#endif

// One block of a ring launch: a rank's calls (works [firstWork, firstWork + nWorks) of the launch)
// on one channel, through its FIFO ends.
template <class Ports>
struct RingBlock {
  int firstWork, nWorks;
  int channel, nChannels;
  const int* ringOrder;  // the channel's, in device memory
  Ports ports;
  int* failed;  // set when a wait of this block gave up (abort or timeout): its rank's word
};

template <class T, class Ports>
struct RingLaunch {
  uint64_t timeoutNs;
  RingWork<T> works[kMaxLaunchWorks];
  RingBlock<Ports> blocks[kMaxLaunchBlocks];
};

// One block of a tree launch: a rank's all-reduces (works [firstWork, firstWork + nWorks) of the
// launch) on one tree channel, each its share of the elements, through the FIFOs to and from its
// tree neighbours (Ports: FifoViewPorts or LlPorts).
template <class Ports>
struct TreeBlock {
  int firstWork, nWorks;
  TreePlace place;
  TreePorts<Ports> ports;
  int* failed;
};

template <class T, class Ports>
struct TreeLaunch {
  uint64_t timeoutNs;
  TreeWork<T> works[kMaxLaunchWorks];
  TreeBlock<Ports> blocks[kMaxLaunchBlocks];
};

// One block of a direct launch: a rank's call on one channel, the barrier words of that channel.
struct DirectBlock {
  Collective collective;
  int nranks, rank, channel, nChannels;
  size_t count;
  int divisor;
  DirectArrival* arrivals;  // the channel's, one per rank
  uint64_t signature;       // the call as every rank's host describes it (DirectBarrier)
  int* failed;              // set when a wait of this block gave up: kGaveUp or kCallsDiffered
};

template <class T>
struct DirectLaunch {
  uint64_t timeoutNs;
  const uint32_t* abort;  // the host sets it to stop every wait
  const T* inputs[kMaxLaunchBlocks];
  T* outputs[kMaxLaunchBlocks];
  T scales[kMaxLaunchBlocks];  // PreMulSum: every rank's scalar, by rank
  DirectBlock blocks[kMaxLaunchBlocks];
};

#if defined(__CUDACC__)
// The ring collectives and sends/receives: element reduction R (PreMulSum: Sum with each input
// element first multiplied by the rank's scalar), Ports FifoViewPorts (Simple), LlPorts or
// SegmentPorts.
template <class R, bool kPrescaled, class Ports>
__global__ void __launch_bounds__(kMaxThreadsPerBlock, 1)
    ringKernel(const __grid_constant__ RingLaunch<typename R::Storage, Ports> launch) {
  const auto& block = launch.blocks[blockIdx.x];
  BlockGroup group(launch.timeoutNs);
  if (!runWorksOnViews<R, kPrescaled>(group, launch.works + block.firstWork, block.nWorks,
                                      block.ringOrder, block.channel, block.nChannels,
                                      block.ports) &&
      threadIdx.x == 0)
    *block.failed = kGaveUp;
}

// The all-reduces on the double binary tree, Ports FifoViewPorts (Simple) or LlPorts.
template <class R, bool kPrescaled, class Ports>
__global__ void __launch_bounds__(kMaxThreadsPerBlock, 1)
    treeKernel(const __grid_constant__ TreeLaunch<typename R::Storage, Ports> launch) {
  const auto& block = launch.blocks[blockIdx.x];
  BlockGroup group(launch.timeoutNs);
  if (!runTreeWorksOnViews<R, kPrescaled>(group, launch.works + block.firstWork, block.nWorks,
                                          block.place, block.ports) &&
      threadIdx.x == 0)
    *block.failed = kGaveUp;
}

// The direct all-pairs all-reduce, reduce-scatter and all-gather.
template <class R, bool kPrescaled>
__global__ void __launch_bounds__(kMaxThreadsPerBlock, 1)
    directKernel(const __grid_constant__ DirectLaunch<typename R::Storage> launch) {
  using T = typename R::Storage;
  const DirectBlock& block = launch.blocks[blockIdx.x];
  BlockGroup group(launch.timeoutNs);
  const DirectCall<T> call{block.collective, block.nranks,  block.rank,  launch.inputs,
                           launch.outputs,   launch.scales, block.count, block.divisor};
  DirectBarrier barrier{block.arrivals, launch.abort, block.signature};
  if (!runDirect<R, kPrescaled>(group, call, block.channel, block.nChannels, barrier) &&
      threadIdx.x == 0)
    *block.failed = barrier.differs ? kCallsDiffered : kGaveUp;
}
#endif

}  // namespace braid
