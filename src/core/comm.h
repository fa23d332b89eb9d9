// The communicator: one rank's view of a group of ranks, its links to the peers, and the watchdog
// that turns a dead or silent peer into an error instead of a hang.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/params.h"
#include "base/wait.h"
#include "braid/braid.h"
#include "coll/group_plan.h"
#include "coll/host_executor.h"
#include "core/bootstrap.h"
#include "core/comm_links.h"
#include "core/comm_status.h"
#include "core/device_side.h"
#include "core/host_workspace.h"
#include "core/reduction_ops.h"
#include "core/registrations.h"
#include "core/selection.h"
#include "plan/model.h"
#include "plan/plan.h"
#include "transport/transport.h"

struct CommOptions {
  int timeoutMs = 0;
  std::string name;
  int minChannels = 1;  // bounds of the planner's channel count
  int maxChannels = 1;
  bool splitShare = false;   // children of braidCommSplit share this communicator's links
  bool shrinkShare = false;  // children of braidCommShrink (without BRAID_SHRINK_ABORT) too
  std::string algorithms;    // the config's choice of algorithms (as BRAID_ALGO); empty: BRAID_ALGO
  bool cuda = false;         // a CUDA communicator, on cudaDevice
  int cudaDevice = -1;
  bool blocking = true;  // init and finalize block; else they return braidInProgress and run on
                         // (braidCommGetAsyncError says when they end)
};

struct braidComm : public braid::Watchdog {
 public:
  braidComm(int rank, int nranks, CommOptions options);
  ~braidComm() override;

  // Rendezvous and connect; blocking. Records the outcome for waitReady()/asyncError(). With
  // `shareFrom` (braidCommSplit/Shrink with splitShare/shrinkShare), the links are the parent's:
  // `parentRanks` gives each rank of this communicator's rank in the parent.
  void initialize(const braid::BootstrapId& id, const braidComm* shareFrom = nullptr,
                  const std::vector<int>& parentRanks = {});
  // For non-blocking init: blocks until initialize() has finished, then fails like it did.
  void waitReady() { status_.waitReady(); }

  int rank() const { return rank_; }
  // Whether this communicator and `other` share their links (splitShare): they take turns.
  bool sharesLinksWith(const braidComm& other) const { return links_.sharedWith(other.links_); }
  int nranks() const { return nranks_; }
  const std::string& name() const { return options_.name; }
  const CommOptions& options() const { return options_; }

  // All-gathers `bytes` per rank over the bootstrap ring (out of band, for communicator
  // management such as braidCommSplit); every rank calls it. data holds nranks slices, this
  // rank's filled.
  void allGatherOutOfBand(void* data, size_t bytes);
  // The id of the communicator of `survivors` (braidCommShrink; see Bootstrap::shrunkId).
  braid::BootstrapId shrunkId(const std::vector<int>& survivors);

  // Runs one collective or one batch of send/recv to completion on the calling thread.
  void run(const braid::CollArgs& args);
  void runSendRecv(std::span<const braid::CollArgs> ops);
  // A group's fused pass (coll/group_plan.h): its calls' inputs copied into the staging buffer,
  // one call over it, its outputs copied out, all in one turn of the links.
  void runFused(std::span<const braid::CollArgs> members);
  // How a group of this communicator's calls fuses (coll/group_plan.h): the settings' limits and
  // the model's prices (every rank's alike). Waits until ready.
  braid::GroupFuseLimits groupFusing();
  // The tag of a send from `peer` to this rank that has begun to arrive and that no receive has
  // taken (braidProbe), or nothing; between operations (it takes the links' turn).
  std::optional<braid::CallTag> sendWaitingFrom(int peer);

  // A CUDA communicator: its device, and its calls queued on a CUDA stream (consecutive sends
  // and receives as one group), returning at once.
  bool onDevice() const { return options_.cuda; }
  int cudaDevice();
  void launch(std::span<const braid::CollArgs> ops, braidStream_t stream);
  // The launches `ops` make, in order (braid::DeviceSide::launchesOf: runs of sends and receives,
  // runs of collectives one ring or tree kernel runs, other collectives alone). launchOne makes one
  // of them once this rank's turn has come (launchRounds).
  std::vector<braid::PlannedLaunch> launchesOf(std::span<const braid::CollArgs> ops);
  void launchOne(const braid::PlannedLaunch& launch, braidStream_t stream);
  // Where other ranks of this communicator share this rank's GPU from threads of this process,
  // the rounds their collectives are queued in (core/launch_rounds.h); nullptr otherwise. Known
  // once ready.
  const braid::LaunchRounds* launchRounds() const {
    return device_ != nullptr ? device_->rounds() : nullptr;
  }
  // Collectives of several ranks of one CUDA communicator driven by one thread (a group), call i
  // of comms[i] on streams[i]: whether they can go in one launch (same communicator and GPU, the
  // same collective, few enough channels); of consecutive such calls (calls[k][i]: comms[i]'s
  // k-th), the launches they make (braid::DeviceSide::launchesTogetherOf), and one of them.
  static bool canLaunchTogether(std::span<braidComm* const> comms,
                                std::span<const braid::CollArgs> calls);
  static std::vector<size_t> launchesTogetherOf(
      std::span<braidComm* const> comms, std::span<const std::vector<braid::CollArgs>> calls);
  static void launchTogether(std::span<braidComm* const> comms,
                             std::span<const std::vector<braid::CollArgs>> calls,
                             std::span<const braidStream_t> streams);
  // Fails unless `p` is memory of this communicator's kind (device memory of its GPU on a CUDA
  // communicator, host memory on a CPU one).
  void checkBuffer(const char* fn, const char* name, const void* p) const;

  // Operations queued on host streams but not finished, or being launched on a device (a launch
  // may wait for its turn); finalize, abort and destroy wait for them.
  braid::PendingOperations& pending() { return status_.pending(); }
  braid::CollectiveNumbers& collectiveNumbers() { return status_.collectiveNumbers(); }
  // The communicator's identity (alike on every rank), once init has succeeded.
  std::optional<uint64_t> identityOnceReady() const;
  braid::PendingOperations& callsInside() { return status_.callsInside(); }

  void finalize();
  // finalize() on a thread of its own (a non-blocking communicator's): the status says
  // braidInProgress until it has ended, then braidSuccess or its failure; destroy waits for it.
  void finalizeInBackground();
  // Marks the communicator failed (its peers see why: `call` names braidCommAbort or
  // braidCommRevoke) and waits for its operation in flight to stop.
  void abort(const char* call);
  // Before braidCommAbort between operations: what finished operations left for the network to
  // send is delivered, for at most 2 s (revoke and shrink abort at once).
  void deliverFinishedSends();

  // PreMulSum operators of this communicator (braidRedOpCreatePreMulSum).
  braid::ReductionOps& reductionOps() { return ops_; }
  const braid::ReductionOps& reductionOps() const { return ops_; }

  // Registered buffers (braidCommRegister, braidCommWindowRegister): a handle per registration,
  // valid until deregistered or the communicator is destroyed. A window of a CUDA communicator is
  // registered by every rank together: where the ranks share a GPU in this process, calls whose
  // buffers lie in windows may then run the direct engine with each rank launched on its own.
  void* registerBuffer(void* buff, size_t size, bool window);
  void deregisterBuffer(void* handle, bool window, const char* fn);
  // The buffer `handle` was registered with (fails naming `fn` where it is no registration).
  void* registeredBuffer(void* handle, bool window, const char* fn);

  braidResult_t asyncError();
  void recordError(const braid::Error& e) { status_.record(e); }
  std::string lastError() const { return status_.lastError(); }

  // What the planner expects of one call, and the plan as text (braidCommPredict/DescribePlan).
  braid::plan::Prediction predict(braid::plan::Operation op, size_t bytes);
  const std::string& describePlan();

  // Watchdog: deadline, aborts and dead peers.
  void poll(int peer, const char* waitingFor) override;
  bool drive(int peer) override { return driveSet(0, peer); }
  void stopDriving() override { stopDrivingSet(0); }
  // The same for a further CPU channel's thread (its set of links): the checks of poll() that
  // any thread may make (not the FIFO peek of failIfPeersCallDiffers, which is channel 0's).
  void checkPeers(int peer, const char* waitingFor) const;
  bool driveSet(int linkSet, int peer);
  void stopDrivingSet(int linkSet);

 private:
  template <typename Body>
  void runOperation(const char* opName, Body&& body);
  void runInTurn(const braid::CollArgs& args);
  braid::CollContext context();
  // Init's steps (initialize).
  braid::PeerInfo describeSelf() const;
  void tuneWaits(uint64_t machine);
  void markFailed(const std::string& reason);
  void failIfPeersFailed(int peer) const;
  void failIfPeerDeparted(int peer) const;
  void failIfLate(int peer, const char* waitingFor) const;
  std::string laggingPeers() const;
  braid::Clock::time_point deadlineFromNow() const;

  const int rank_;
  const int nranks_;
  const CommOptions options_;

  braid::CommLinks links_{rank_, nranks_};  // the rendezvous and the connectors, maybe shared
  braid::RankControl* control(int r) const { return links_.control(r); }
  std::unique_ptr<braid::Selection> selection_;  // the plan and the model, once ready
  braid::HostWorkspace host_{braid::param::SlotStores()};

  // Init's outcome, the error that ended the communicator, the operations it waits for.
  braid::CommStatus status_;

  // The operation running (the watchdog's errors name it): its number among the link sharers',
  // its name and its deadline.
  struct RunningOperation {
    uint64_t seq = 0;
    const char* name = "";
    braid::Clock::time_point deadline;
    uint64_t collective = 0;  // its number among the communicator's collectives; 0: none
  } running_;
  // "rank 2: braidAllReduce #7": how an error of the running operation begins.
  std::string runningLabel() const;

  braid::ReductionOps ops_{rank_};
  braid::Registrations registrations_{rank_};
  std::unique_ptr<braid::DeviceSide> device_;  // a CUDA communicator's, once ready
  braid::DeviceSideSetup deviceSetup(const braid::BootstrapId& id);
  void failIfDeviceFailed(const char* opName);
  void failIfPeersCallDiffers() const;
  // The communicator's identity in its calls' tags: rank 0's init nonce, alike on every rank.
  uint64_t identity() const { return links_.peers()[0].nonce; }
  std::thread finalizing_;  // finalizeInBackground's, joined by the destructor
};
