// The CUDA part of a communicator's device side (core/device_side.h): its CUDA device, the P2P
// transport's FIFOs, the words its kernels set when a wait gives up, and the launches of its calls
// on the caller's stream. Holds no CUDA type in its interface, so the communicator compiles
// without the toolkit; where the build has no CUDA, connect() fails saying so (and no communicator
// gets that far: the device "cuda" is refused first).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/wait.h"
#include "coll/call.h"
#include "coll/device_launch.h"
#include "core/window_table.h"
#include "transport/transport.h"

namespace braid {

struct CudaCommSetup {
  int rank = 0;
  int device = 0;  // the CUDA device (the caller's current one: currentCudaDevice())
  int channels = 1;
  std::vector<std::vector<int>> ringOrders;  // per channel
  int timeoutMs = 0;
  // Connects the communicator's device FIFOs through the transport registry (every rank calls it
  // once, on its device): CommLinks::connectDevice.
  std::function<PeerLinks(const DeviceConnect&)> connectLinks;
};

// PreMulSum's scalar as a call of a CUDA communicator reads it.
struct CudaScalar {
  const void* onDevice = nullptr;  // braidScalarDevice: read by the kernel
  uint64_t bits = 0;               // braidScalarHostImmediate: its bytes
};

class CudaComm {
 public:
  // Every rank of the communicator calls it, on its current CUDA device.
  static std::unique_ptr<CudaComm> connect(const CudaCommSetup& setup);
  virtual ~CudaComm() = default;

  virtual int device() const = 0;
  // Every rank in this process on this device: one launch can then run the direct engine.
  virtual bool ranksShareDevice() const = 0;
  // The ranks in this process on this device, this one among them, in rank order.
  virtual std::vector<int> ranksOnDevice() const = 0;
  // The device memory's peak bandwidth, reads and writes together, in GB/s (from its clock and
  // bus width): the cost model's figure for ranks that share the device.
  virtual double memoryGBs() const = 0;
  // Fails (braidInvalidArgument) unless `p` is memory this communicator's device can use:
  // "sendbuff 0x... is pageable host memory (expected device memory of CUDA device 0)".
  virtual void checkBuffer(const char* fn, const char* name, const void* p) const = 0;
  // Whether `stream` is being captured into a CUDA graph (what is launched on it then queues
  // nothing).
  virtual bool capturing(void* stream) const = 0;
  // Queues a group's sends and receives on `stream`; returns without waiting for the device.
  virtual void launchSendRecv(std::span<const CollArgs> ops, void* stream) = 0;
  // A device wait of this rank that gave up (timeout, or the FIFOs aborted), or a failed network
  // connection (whose hops it then aborts), as an error.
  virtual std::optional<Error> failure() = 0;
  // Stops every device wait on this rank's FIFOs (braidCommAbort), without waiting.
  virtual void abort() = 0;
  // The rank failed: tells its peers on other hosts why, through the network proxy of its hops
  // (LinkService::abandon), as the control block tells the ranks on its host.
  virtual void abandon(const std::string& reason) = 0;
  // Waits for this rank's last call (finalize), its kernels bounded by their deadline.
  virtual void synchronize() = 0;
};

// One rank's collective: args.op a built-in operator, or braidSum with `scalar` for PreMulSum;
// the algorithm and protocol the cost model chose (every rank of a launch the same); for the
// direct engine launched for this rank alone, every rank's buffers in its windows.
struct CudaCall {
  CudaComm* comm = nullptr;
  CollArgs args;
  const CudaScalar* scalar = nullptr;
  void* stream = nullptr;  // cudaStream_t
  DeviceAlgorithm algorithm = DeviceAlgorithm::Simple;
  const WindowCall* window = nullptr;
};

// Queues the same collectives of one rank, or of several ranks of one communicator in this
// process on one GPU, in one launch (their blocks wait for each other, and CUDA does not promise
// that kernels launched apart run together); each rank stays ordered on its own stream. A rank's
// calls are next to each other, on one stream; several of them share a ring or tree kernel
// (coll/device_executor.h's launchCollective). The direct engine needs every rank of the
// communicator in the launch, or one rank's call with its `window`. Returns without waiting for
// the device.
void launchCollectives(std::span<const CudaCall> calls);

// The calling thread's current CUDA device (where a communicator made now goes, as in NCCL).
int currentCudaDevice();

// Names a CUDA device on its host, whatever index a process sees it under: its PCI bus id, hashed.
uint64_t cudaDeviceKey(int device);

// Device memory of the calling thread's current CUDA device (braidMemAlloc), and its release:
// false where `p` did not come from it. Without a usable device, allocating fails
// (braidInvalidUsage) with the runtime's reason.
void* allocateDeviceMemory(size_t bytes);
bool releaseDeviceMemory(void* p);

// On a CPU communicator: fails (braidInvalidArgument) if `p` is CUDA device memory, asked where
// this process has CUDA communicators (and so CUDA contexts) of its own.
void checkHostBuffer(const char* fn, int rank, const char* name, const void* p);

}  // namespace braid
