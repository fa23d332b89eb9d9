// The device kernels (coll/device_kernels.cu) by what they compute, for host code that launches
// them with cudaLaunchKernel: one parameter, the launch's RingLaunch<T, Ports>, TreeLaunch<T,
// Ports> or DirectLaunch<T> (coll/device_kernels.cuh), and one block per entry of its `blocks`.
// Built only where nvcc is.
#pragma once

#include <cstdint>

#include "braid/braid.h"

namespace braid {

enum class DeviceAlgorithm : uint8_t {
  Simple,      // the ring, slots published by tail (RingLaunch<T, FifoViewPorts>)
  LowLatency,  // the ring, flagged 8-byte lines (RingLaunch<T, LlPorts>)
  Segmented,   // the ring, warp segments each with its flag (RingLaunch<T, SegmentPorts>)
  Direct,      // all-pairs, every rank's buffers reached directly (DirectLaunch<T>)
  Tree,  // the all-reduce on the double binary tree, Simple slots (TreeLaunch<T, FifoViewPorts>)
  TreeLowLatency,  // the same tree, flagged 8-byte lines (TreeLaunch<T, LlPorts>)
};

// The kernel for (algorithm, datatype, op); PreMulSum when `prescaled` (op is then braidSum).
// Null for a datatype or op out of range.
const void* deviceKernel(DeviceAlgorithm algorithm, braidDataType_t type, braidRedOp_t op,
                         bool prescaled);

}  // namespace braid
