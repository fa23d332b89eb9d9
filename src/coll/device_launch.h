// The device kernels (coll/device_kernels.cu) by what they compute, for host code that launches
// them with cudaLaunchKernel: one parameter, the launch's RingLaunch<T, Ports>, TreeLaunch<T,
// Ports> or DirectLaunch<T> (coll/device_kernels.cuh), and one block per entry of its `blocks`;
// and which calls one ring or tree launch can carry. The kernels are built only where nvcc is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "braid/braid.h"
#include "coll/call.h"

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

// The most calls one ring or tree launch carries for all its blocks (the launch's works): a
// group's collectives of one rank (or of its ranks launched together) that share a kernel, each
// block running its rank's one after another, as NCCL's work list. With the blocks, a ring
// launch's parameters stay under 8 KiB, a tree launch's under 12 KiB.
constexpr int kMaxLaunchWorks = 32;

// A collective as a launch of several calls sees it: the kernel's algorithm and datatype, and the
// operator it reduces with (PreMulSum: `prescaled`, op braidSum), or none for a call that only
// moves.
struct KernelCall {
  DeviceAlgorithm algorithm = DeviceAlgorithm::Simple;
  braidDataType_t type = braidFloat32;
  braidRedOp_t op = braidSum;
  bool reduces = false;
  bool prescaled = false;
};

// `a` as a launch sees it, `algorithm` its engine: PreMulSum (an operator past the built-in ones,
// or `scaled`: a launch's call whose operator was rewritten to Sum beside its scalar) reduces with
// Sum over prescaled inputs.
KernelCall kernelCallOf(const CollArgs& a, bool scaled, DeviceAlgorithm algorithm);

// Whether `next` runs in the kernel of `run` (calls of one kernel, at least one), so that one
// launch can carry them all: a ring algorithm or a tree one (whose calls are all-reduces), the
// same one, datatype and PreMulSum or not; where both reduce, one operator (a call that only
// moves runs under any; a PreMulSum kernel moves nothing: its calls reduce); never Avg, whose
// kernels run one call (coll/ring_engine.h's kOneWorkPerList). The direct engine runs one call.
bool runsInKernelOf(std::span<const KernelCall> run, const KernelCall& next);

// A rank's collectives in order, cut into launches: each run of consecutive calls of one kernel
// (runsInKernelOf) at most `maxCalls` long, every other call (the direct engine's, Avg's) alone.
// The number of calls of each launch, in order.
std::vector<size_t> launchSizes(std::span<const KernelCall> calls, size_t maxCalls);

}  // namespace braid
