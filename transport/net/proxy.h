// The progress (proxy) thread of the network transport. A hop to a rank on another host is two
// FIFOs in this rank's memory: the rank's SendConnector fills one that the proxy drains into a
// plug-in's isend (the proxy is that FIFO's receiver), and the proxy fills the other from irecv for
// the rank's RecvConnector (the proxy is that FIFO's sender). Both keep FifoControl's protocol and
// publish through its wakeable words, so a rank asleep on a FIFO wakes when the proxy moves it, and
// the collectives cannot tell a network hop from a shared-memory one.
#pragma once

#include <poll.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/local.h"
#include "transport/net/net.h"
#include "transport/transport.h"

namespace braid::net {

class Proxy;

// The thread that moves the links of every proxy on one network device (NIC) of the process:
// communicators that share a NIC share it, instead of a thread each. It spins while links move,
// yields, then sleeps on the descriptors of all its proxies' connections and an eventfd.
class ProgressThread {
 public:
  // The device's thread, started on first use; it ends with its last proxy.
  static std::shared_ptr<ProgressThread> forDevice(const std::string& device);
  explicit ProgressThread(const std::string& device);
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  void attach(Proxy* proxy);
  // Returns once the thread no longer touches `proxy`.
  void detach(Proxy* proxy);
  // Ends a sleep now.
  void wake();
  // A rank stopped driving its links (Proxy::stopDriving): the thread moves them again.
  void driverStopped();

 private:
  void run();
  void sleep();
  void sleepWhileDriven(uint64_t driverStops);
  void pollSlice(pollfd* fds, nfds_t fdCount, long sliceNs);

  std::mutex mutex_;  // proxies_; held through a round, so that detach() waits for it
  std::vector<Proxy*> proxies_;
  int wakeFd_ = -1;  // eventfd: work for a proxy, or stop
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> driverStops_{0};  // driverStopped() calls
  std::thread thread_;
};

// How one link's FIFOs are cut (an empty geometry: the proxy's), and whether its receiver reads
// a slot's 8-byte lines as they land, each carrying its own flag (the low-latency protocol's
// LlPorts) rather than waiting for tail. Such a slot is received aside and then copied into the
// FIFO in whole 8-byte words, so that no line is seen half written; its sender publishes tail
// and the bytes in use as in the Simple protocol, and the lines cross the network as they are.
struct LinkFormat {
  FifoGeometry geometry;
  bool flaggedLines = false;
};

// The network transport's LinkService for its communicator.
class Proxy : public LinkService {
 public:
  // Where a link's two FIFOs live: `bytes` zeroed, freed with the last owner. Heap memory for a
  // CPU communicator; a CUDA communicator's is pinned host memory its GPU reads and writes.
  using Allocate = std::function<std::shared_ptr<void>(size_t bytes)>;
  Proxy(int rank, const FifoGeometry& geometry, Allocate allocate = allocateZeroed);
  // Leaves the progress thread, then closes the connections.
  ~Proxy() override;
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  struct Fifos {
    FifoDesc send;  // the rank fills it, the proxy sends it
    FifoDesc recv;  // the proxy fills it, the rank reads it
  };
  // Serves `peer` over these connections; before start(). The FIFOs live as long as the proxy.
  Fifos addPeer(int peer, std::unique_ptr<SendComm> send, std::unique_ptr<RecvComm> recv,
                const LinkFormat& format = {});

  // Where connections made on first use come from: the plug-in (one whose acceptReady works),
  // this rank's listener, and every rank's handle, by peer.
  struct Connector {
    std::unique_ptr<Net> net;
    std::unique_ptr<ListenComm> listener;
    std::vector<Handle> handles;
    int rank = 0;  // this rank's tag on the connections it opens
    // For connecting to a peer: whoever connects holds the link (and the progress thread its
    // other proxies) meanwhile, so no longer than a silent peer takes to count as unreachable.
    std::chrono::milliseconds timeout{0};
    // How long a rank about to connect to a lower rank first waits for that rank's own connection
    // (deferConnect): what connecting takes on a LAN, many times over; paid once per pair at most.
    std::chrono::milliseconds peerConnectionGrace{10};
  };
  // Serves `peer` over connections made when first needed: the one to the peer when the rank
  // first sends it a slot, the one from it when the peer first sends (accepted by whichever
  // thread moves the links). Sockets per rank then grow with the peers a rank talks to (its ring
  // neighbours), not with the ranks on other hosts. Before start().
  void connectOnFirstUse(Connector connector);
  Fifos addPeer(int peer);
  // The ranks read their small messages themselves (drive, while they wait for them), so only
  // larger arrivals wake the progress thread; before start(). Each wake-up takes a core from a
  // rank on few cores. Not for links no rank drives (a GPU's).
  void letRanksReadSmallMessages() { ranksReadSmallMessages_ = true; }
  // Hands the links to the progress thread of `device` (the NIC they use), shared with the other
  // proxies on it.
  void start(const std::string& device);

  // For a communicator that ends in good order: waits until the network has taken every slot the
  // rank posted (a rank may destroy its communicator right after a send), a connection fails, or
  // the deadline passes; then the connections end as a departure, not as a lost peer.
  void finish(Clock::time_point deadline) override;

  // The first failed connection's story, preferring one with `peer`; nothing while all are well.
  std::optional<std::string> failure(int peer) const override;

  // Sends `reason` on every connection to a peer that is still well (SendComm::abort), then stops
  // moving them all. Waits for the links' driver locks, never for a peer.
  void abandon(const std::string& reason) override;

  // An operation of the rank starts or ends. Meanwhile the thread sleeps in short slices, since the
  // rank's FIFO moves cannot wake it; in between it sleeps until a socket stirs. The rank moves
  // its links itself while it waits (drive), so an operation's start does not wake the thread;
  // its end does, if it leaves slots the network has not taken.
  void operationStarted() override;
  void operationFinished() override;
  // None: while a rank waits it moves its links itself and the thread stays off the core.
  int busyThreads() const override { return 0; }

  // The waiting rank moves its links itself: a small message then crosses no thread handoff
  // (rank -> proxy -> socket), which on few cores costs more than the network. The links with
  // `peer` (-1: all), and every link with slots to send.
  bool drive(int peer) override;
  // The waiting rank stops driving (its wait goes to sleep): the thread takes the links back now,
  // rather than when it next looks.
  void stopDriving() override;

 private:
  struct Link;

  friend class ProgressThread;
  enum class Round { kMoved, kIdle, kRankDriving };
  // One pass of the progress thread over the links; kRankDriving, touching nothing, while the rank
  // drives them itself.
  Round round();
  // Adds what the progress thread sleeps on for these links; true if it must look again soon (an
  // operation runs, or a send waits on a comm with nothing to poll).
  bool sleepDescriptors(std::vector<pollfd>& fds);
  // Both take the link's driver lock, held by the proxy or a waiting rank, whichever comes first;
  // false (nothing moved) if the other holds it.
  bool progressSend(Link& link);
  bool progressRecv(Link& link);
  static void copyLinesIn(Link& link, uint32_t slot, size_t bytes);
  bool progress(Link& link, bool send, bool recv);
  std::string sendFailure(Link& link);
  Link& newLink(int peer, const LinkFormat& format = {});
  void connectSend(Link& link, Clock::time_point deadline);
  bool deferConnect(Link& link);
  void settleRecv(Link& link);
  // Takes the connections that arrived, each to its link; true if any did.
  bool acceptArrivals();
  void wake();
  void fail(Link& link, const std::string& why);
  // Gives the link its receiving comm.
  void setRecv(Link& link, std::unique_ptr<RecvComm> comm);

  const int rank_;
  const FifoGeometry geometry_;
  const Allocate allocate_;
  std::vector<std::unique_ptr<Link>> links_;
  std::optional<Connector> connector_;
  std::atomic<int> unaccepted_{0};  // links still without their connection from the peer
  std::mutex acceptMutex_;          // one thread takes arrivals at a time
  std::shared_ptr<ProgressThread> thread_;
  std::atomic<int> activeOperations_{0};
  std::atomic<uint64_t> drives_{0};         // drive() calls: a rank is waiting on its links
  uint64_t drivesSeen_ = 0;                 // by the progress thread
  std::atomic<bool> driverStopped_{false};  // stopDriving() since the thread last looked
  bool departing_ = false;                  // finish() ran: end the streams on purpose
  bool ranksReadSmallMessages_ = false;

  std::atomic<bool> anyFailure_{false};
  mutable std::mutex failureMutex_;
};

}  // namespace braid::net
