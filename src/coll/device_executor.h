// Runs a CUDA communicator's collectives and sends/receives as kernels (coll/device_kernels.cuh)
// on the caller's stream, over the P2P transport's FIFOs: one launch per call, or per run of a
// group's ring or tree calls, a block per channel (per operation for sends and receives),
// everything the blocks need in the launch's parameters. A launch allocates nothing, copies nothing
// and never waits for the device, so the calls are stream-ordered and a CUDA graph can capture
// them; the kernels take up the FIFOs' counters where the previous call left them, so a replayed
// graph continues correctly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "coll/call.h"
#include "coll/device_launch.h"
#include "transport/p2p.h"

namespace braid {

struct DeviceCollContext {
  const P2pLinks* links = nullptr;
  uint64_t timeoutNs = 0;  // every device wait gives up after this long
  int* failed = nullptr;   // deviceLaunchBlocks() words: a block sets its own when a wait gave up
  int threads = 256;       // per block
};

// PreMulSum's scalar for this rank: read by the kernel from device memory (braidScalarDevice),
// or its bytes (braidScalarHostImmediate).
struct DeviceScale {
  const void* onDevice = nullptr;
  uint64_t bits = 0;
};

// Loads every device kernel into the current device's context, once per device and process.
// CUDA loads kernels at their first launch by default (CUDA_MODULE_LOADING=LAZY), and loading may
// wait for the kernels already running on the device; ranks sharing a GPU wait for each other
// inside kernels, so one rank's first launch of a kernel while a peer's kernel waits for it would
// stall both until the deadline. Init calls this before any rank of the communicator can launch
// (NCCL loads its kernels at init too).
void loadDeviceKernels(int device);

// The most blocks one launch carries: sends and receives (a block each), or ranks x channels.
int deviceLaunchBlocks();

// One rank's part of a collective launch: args.op is a braidRedOp_t below braidNumOps, or
// braidSum with `scale` set (PreMulSum). For the direct engine, `signature` describes the call
// alike on every rank (its barrier compares them), and a rank launched on its own reaches every
// rank's buffers through `inputs` and `outputs` (by rank: registered windows).
struct DeviceRankCall {
  const DeviceCollContext* ctx = nullptr;
  CollArgs args;
  const DeviceScale* scale = nullptr;
  uint64_t signature = 0;
  const void* const* inputs = nullptr;
  void* const* outputs = nullptr;
};

// Collectives of one rank, or of several ranks of a communicator in one launch (their blocks
// then run together: one host thread driving ranks that wait for each other); a rank's calls are
// next to each other in `calls`, in the order they run. Every rank makes the same calls (the same
// collective, datatype, operator and count each), and their channels together are at most
// deviceLaunchBlocks(). A ring launch (Simple, LowLatency, Segmented) may carry up to
// kMaxLaunchWorks calls, of any ring collective, each block running its rank's one after
// another: calls of one datatype whose reducing ones share an operator, all PreMulSum or none
// (a call that only moves runs under any built-in operator); a tree launch (Tree,
// TreeLowLatency) as many all-reduces, under the same rule. The direct engine takes one call per
// rank: all-reduce, reduce-scatter or all-gather of ranks that share the device
// (ranksShareDevice()), either every rank of the communicator in the launch, PreMulSum's scalars
// given by value, or one rank with every rank's buffers (and no PreMulSum).
void launchCollective(std::span<const DeviceRankCall> calls, DeviceAlgorithm algorithm,
                      void* stream);
// Sends and receives of one group, at most deviceLaunchBlocks(), at most one per peer and
// direction (operations of one peer and direction go in separate launches, in issue order).
void launchSendRecv(const DeviceCollContext& ctx, std::span<const CollArgs> ops, void* stream);

}  // namespace braid
