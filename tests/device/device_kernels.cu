// The device form of the ring engine as CUDA kernels: one block per channel, the block's threads
// as the group, every collective x datatype x op instantiated. Built by the device_ptx ctest
// (tests/device/check_ptx.sh) for sm_90 plus PTX, warnings as errors, and its PTX read for what
// the engine promises: 16-byte global loads and stores in the copy and reduce loops,
// acquire/release at system scope on the FIFO's control words, no local-memory spills.
#include <cuda/std/cstdint>

#include "coll/ring_engine.h"
#include "kernels/element_reduce.h"

namespace braid {

// A thread block as the engine's thread group. Waits sleep briefly and give up when the host
// aborts the FIFOs or at the deadline (%globaltimer, nanoseconds): CUDA does not promise that the
// kernels of the ranks run at the same time, so no wait may be unbounded.
class BlockGroup {
 public:
  __device__ explicit BlockGroup(uint64_t deadlineNs) : deadlineNs_(deadlineNs) {}
  __device__ int index() const { return static_cast<int>(threadIdx.x); }
  __device__ int size() const { return static_cast<int>(blockDim.x); }
  __device__ void sync() { __syncthreads(); }
  __device__ bool any(bool mine) { return __syncthreads_or(mine) != 0; }
  __device__ bool keepWaiting() {
    __nanosleep(64);
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now < deadlineNs_;
  }

 private:
  uint64_t deadlineNs_;
};

// One collective, block b running channel b of gridDim.x; failed[b] is set when a wait gave up.
template <braidDataType_t kType, braidRedOp_t kOp>
__global__ void ringKernel(RingCall<typename kernels::ElementOf<kType>::Storage> call,
                           const FifoRecvView* ins, const FifoSendView* outs, uint64_t deadlineNs,
                           int* failed) {
  using R = kernels::ElementReduce<kType, kOp>;
  BlockGroup group(deadlineNs);
  const int channel = static_cast<int>(blockIdx.x);
  if (!runChannelOnViews<R>(group, call, channel, static_cast<int>(gridDim.x), ins[channel],
                     outs[channel]) &&
      threadIdx.x == 0)
    failed[channel] = 1;
}

#define BRAID_RING_KERNEL(type, op)                                                          \
  template __global__ void ringKernel<type, op>(RingCall<kernels::ElementOf<type>::Storage>, \
                                                const FifoRecvView*, const FifoSendView*,    \
                                                uint64_t, int*);
#define BRAID_RING_KERNELS(type)     \
  BRAID_RING_KERNEL(type, braidSum)  \
  BRAID_RING_KERNEL(type, braidProd) \
  BRAID_RING_KERNEL(type, braidMax)  \
  BRAID_RING_KERNEL(type, braidMin)  \
  BRAID_RING_KERNEL(type, braidAvg)

BRAID_RING_KERNELS(braidInt8)
BRAID_RING_KERNELS(braidUint8)
BRAID_RING_KERNELS(braidInt32)
BRAID_RING_KERNELS(braidUint32)
BRAID_RING_KERNELS(braidInt64)
BRAID_RING_KERNELS(braidUint64)
BRAID_RING_KERNELS(braidFloat16)
BRAID_RING_KERNELS(braidFloat32)
BRAID_RING_KERNELS(braidFloat64)
BRAID_RING_KERNELS(braidBfloat16)
BRAID_RING_KERNELS(braidFloat8e4m3)
BRAID_RING_KERNELS(braidFloat8e5m2)

}  // namespace braid
