// A CUDA communicator's device side: its GPU's links (CudaComm), the channels it launches, the
// rounds in which the ranks sharing its GPU from this process launch their collectives, the
// windows every rank reaches, and how a call becomes a launch: its PreMulSum scalar, and the
// algorithm the device model chooses for the way its ranks are launched.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/wait.h"
#include "braid/braid.h"
#include "coll/call.h"
#include "core/comm_links.h"
#include "core/cuda_comm.h"
#include "core/launch_rounds.h"
#include "core/reduction_ops.h"
#include "core/selection.h"
#include "core/window_table.h"
#include "plan/model.h"

namespace braid {

// What the device side takes from its communicator (which outlives it).
struct DeviceSideSetup {
  int rank = 0;
  int nranks = 1;
  int device = 0;  // the CUDA device
  int minChannels = 1, maxChannels = 1;
  int timeoutMs = 0;
  uint64_t cliqueId = 0;  // the same on every rank of the communicator (its bootstrap id, hashed)
  CommLinks* links = nullptr;
  Selection* selection = nullptr;  // its model is replaced by the device's at connect
  const ReductionOps* ops = nullptr;
  plan::ModelInput model;  // the settings (BRAID_MODEL_*, algorithms), completed at connect
};

// One launch of a rank's operations, as DeviceSide::launchesOf cut them: a run of sends and
// receives, or collectives each with the engine it runs and the window it reaches, decided once at
// the cut (the launch reads them; a window registered meanwhile changes nothing).
struct PlannedLaunch {
  std::span<const CollArgs> ops;
  std::vector<DeviceAlgorithm> algorithms;         // by op; empty for sends and receives
  std::vector<std::optional<WindowCall>> windows;  // by op: where the direct engine reaches
};

class DeviceSide {
 public:
  // Every rank of the communicator calls it, by `deadline`.
  static std::unique_ptr<DeviceSide> connect(const DeviceSideSetup& setup,
                                             Clock::time_point deadline);

  CudaComm& cuda() const { return *cuda_; }
  // Where other ranks of the communicator share this rank's GPU from threads of this process,
  // the rounds their collectives are queued in; nullptr otherwise.
  LaunchRounds* rounds() const { return rounds_.get(); }

  // The launches `ops` (this rank's, in order) make: each run of sends and receives together,
  // each run of collectives that one ring or tree kernel runs together (coll/device_launch.h's
  // launchSizes: NCCL's work list), every other collective (the direct engine's, Avg's) alone.
  // Ranks need not cut alike: the FIFOs carry calls, not launches, and the rounds count
  // collectives. The direct engine only where a call's buffers lie in windows. launchOne makes one
  // of them once this rank's turn has come.
  std::vector<PlannedLaunch> launchesOf(std::span<const CollArgs> ops) const;
  void launchOne(const PlannedLaunch& launch, braidStream_t stream, const char* operation);
  // Collectives of several ranks (sides[i] calls[i] on streams[i]): whether one launch can hold
  // them (ranks of one communicator on one GPU, the same collective, no sends or receives, few
  // enough channels).
  static bool canLaunchTogether(std::span<const DeviceSide* const> sides,
                                std::span<const CollArgs> calls);
  // Consecutive collectives of those ranks (calls[k][i]: side i's k-th), each k one launch could
  // hold: the launches they make, as numbers of k, each run of calls one ring or tree kernel runs
  // together (at most kMaxLaunchWorks over all the ranks), every other call alone; and one such
  // launch.
  static std::vector<size_t> launchesTogetherOf(std::span<const DeviceSide* const> sides,
                                                std::span<const std::vector<CollArgs>> calls);
  static void launchTogether(std::span<DeviceSide* const> sides,
                             std::span<const std::vector<CollArgs>> calls,
                             std::span<const braidStream_t> streams, const char* operation);

  // braidCommWindowRegister, collective: every rank's part of the window, gathered (within the
  // communicator's timeout of the links' turn); its id (the same on every rank). Fails on every
  // rank where one rank's buffer is no memory of its device or the sizes differ.
  uint64_t registerWindow(void* buff, size_t size);
  void removeWindow(uint64_t id);

  // How the direct engine can be launched for a question that names no windows.
  plan::DeviceLaunch launchForPrediction() const;

 private:
  explicit DeviceSide(const DeviceSideSetup& setup) : setup_(setup) {}
  int channelsFor(Clock::time_point deadline) const;
  void joinRounds();
  // The call as a launch takes it (PreMulSum's scalar in `scalar`), and its algorithm: the model's
  // for the way its ranks are launched.
  CudaCall callOf(const CollArgs& args, braidStream_t stream, CudaScalar& scalar) const;
  DeviceAlgorithm algorithmOf(const CollArgs& args, plan::DeviceLaunch launch) const;
  // The algorithm of a call of this rank launched without its peers, and the window its buffers
  // lie in, if any.
  DeviceAlgorithm algorithmAlone(const CollArgs& args, std::optional<WindowCall>& window) const;
  // How a launch of `sides` holding `call` (side i's call[i]) runs: the direct engine needs all.
  static plan::DeviceLaunch togetherAs(std::span<const DeviceSide* const> sides,
                                       std::span<const CollArgs> call);
  // Blocks until the rounds let each of `sides` launch on its stream; the rounds a collective is
  // to be counted in (none for a stream being captured: it queues nothing).
  static std::vector<LaunchRounds*> awaitTurns(std::span<DeviceSide* const> sides,
                                               std::span<const braidStream_t> streams,
                                               const char* operation);

  const DeviceSideSetup setup_;
  int channels_ = 0;
  std::unique_ptr<CudaComm> cuda_;
  std::unique_ptr<LaunchRounds> rounds_;
  std::unique_ptr<WindowTable> windows_;  // where every rank reaches the others' memory
  uint64_t windowsRegistered_ = 0;        // under the links' turn
};

}  // namespace braid
