#include "transport/net/proxy.h"

#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <map>
#include <mutex>

#include "base/error.h"
#include "base/log.h"
#include "transport/fifo_view.h"
#include "transport/local.h"

namespace braid::net {
namespace {

// Rounds with nothing to move that the thread yields through before it sleeps.
constexpr int kYieldRounds = 64;
// Sleep slices. During an operation the rank's FIFO moves cannot wake the thread, so it looks
// again soon; between operations only a socket or the next operation can give it work.
constexpr long kActiveSliceNs = 100 * 1000;
constexpr long kIdleSliceNs = 100 * 1000 * 1000;
// How long the thread stays off the core while a rank drives its links. A rank that stops
// driving says so (its wait sleeps, or its operation ends with sends in flight), so this only
// bounds how long data that arrives between operations waits to be read. Each look is a context
// switch onto a core the ranks use: 256 KiB - 4 MiB all-reduces between 2 namespace hosts took
// 15-25% less time with 1 ms slices than with 100 us ones (2 interleaved runs).
constexpr long kDrivenSliceNs = 1000 * 1000;
// Messages a waiting rank reads itself without waking the progress thread, where ranks drive:
// 4-8 KiB all-reduces between 2 namespace hosts took 11.7-12.3 us with, 12.5-17.5 without (3
// interleaved runs against the same Open MPI; 8 B - 2 KiB and 16 KiB unchanged). Larger arrivals
// still wake it, so a peer's stream never waits for this rank's next operation.
constexpr size_t kRankReadsBelowBytes = 16 << 10;

// How long a failed rank tries to reach a peer it never connected to, to tell it why.
constexpr auto kAbandonConnectTimeout = std::chrono::seconds(2);

}  // namespace

struct Proxy::Link {
  int peer = -1;
  FifoGeometry geometry;
  std::shared_ptr<void> memory;  // both FIFOs
  // Where the slots of flagged lines are received before they are copied in (LinkFormat).
  std::vector<uint64_t> recvAside;
  uint8_t* recvInto(uint32_t slot) {
    uint8_t* slots =
        recvAside.empty() ? recvFifo.slots : reinterpret_cast<uint8_t*>(recvAside.data());
    return slots + slot * geometry.slotBytes;
  }
  size_t slotsBytes() const { return geometry.slotBytes * static_cast<size_t>(geometry.nSlots); }
  FifoDesc sendFifo;
  FifoDesc recvFifo;
  // Slots the rank posted that the network has not taken yet (handed over and sent), read
  // without the driver lock: the FIFO's words.
  bool hasUntakenSends() const {
    return sendFifo.control->tail().load() != sendFifo.control->head().load();
  }
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  std::unique_ptr<MemoryRegion> sendRegion;
  std::unique_ptr<MemoryRegion> recvRegion;
  // Requests by FIFO slot, and the slots handed to the plug-in and finished, as FIFO counters.
  std::array<Request*, kMaxFifoSlots> sendRequests{};
  std::array<Request*, kMaxFifoSlots> recvRequests{};
  // The send FIFO's payloads named where they lie (SendConnector::postFrom), by slot; an entry is
  // cleared when its slot goes to isendGather.
  std::array<const void*, kMaxFifoSlots> sendPayloadAt{};
  uint32_t sendPosted = 0;
  uint32_t sendDone = 0;
  uint32_t recvPosted = 0;
  uint32_t recvDone = 0;
  std::atomic<bool> failed{false};  // moves no more: it broke (`failure` says how), or abandon()
  std::string failure;              // guarded by failureMutex_
  // Held by whoever moves the link (the proxy thread or a waiting rank): guards the counters,
  // requests and comms above.
  std::mutex driver;
  // `recv` is final: accepted from the peer, or the other direction of this rank's connection
  // once the peer's first message came over it; read unlocked by drive().
  std::atomic<bool> accepted{false};
  // `recv` is the other direction of the connection this rank made (Net::receiveBack), over
  // which nothing has come yet: a peer that connected at the same time sends over its own
  // connection instead, which then replaces it.
  bool recvTentative = false;
  // Before connecting to a lower rank (deferConnect): until when it waits for the peer's own
  // connection, and whether it does now (read unlocked by drive()).
  Clock::time_point connectAfter{};
  std::atomic<bool> awaitingPeer{false};
};

std::shared_ptr<ProgressThread> ProgressThread::forDevice(const std::string& device) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<ProgressThread>> threads;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<ProgressThread> thread = threads[device].lock();
  if (thread == nullptr) {
    thread = std::make_shared<ProgressThread>(device);
    threads[device] = thread;
  }
  return thread;
}

ProgressThread::ProgressThread(const std::string& device) {
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0) failErrno(braidSystemError, "creating the network progress eventfd", errno);
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "braid-proxy");
  BRAID_INFO(log::kNet, "a progress thread for {}", device);
}

ProgressThread::~ProgressThread() {
  stop_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t ignored = write(wakeFd_, &one, sizeof one);
  thread_.join();
  close(wakeFd_);
}

void ProgressThread::attach(Proxy* proxy) {
  std::lock_guard<std::mutex> lock(mutex_);
  proxies_.push_back(proxy);
}

void ProgressThread::detach(Proxy* proxy) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase(proxies_, proxy);
}

void ProgressThread::driverStopped() {
  driverStops_.fetch_add(1, std::memory_order_seq_cst);
  wake();
}

void ProgressThread::wake() {
  if (sleeping_.load(std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = write(wakeFd_, &one, sizeof one);
  }
}

void ProgressThread::run() {
  int idleRounds = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    const uint64_t driverStops = driverStops_.load(std::memory_order_seq_cst);
    bool moved = false, driving = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Proxy* proxy : proxies_) {
        log::setThreadRank(proxy->rank_);
        const Proxy::Round round = proxy->round();
        moved |= round == Proxy::Round::kMoved;
        driving |= round == Proxy::Round::kRankDriving;
      }
    }
    if (moved) {
      idleRounds = 0;
    } else if (driving) {
      // A rank that drives its links is waiting for them and moves them sooner than this thread
      // could: stay out of its way (off the core, off the links' locks) until it stops driving,
      // computing or gone between operations.
      idleRounds = 0;
      sleepWhileDriven(driverStops);
    } else if (idleRounds < kYieldRounds) {
      ++idleRounds;
      sched_yield();
    } else {
      sleep();
    }
  }
}

// Waits for a wake-up (a rank stopped driving) or the end of a slice; not if a rank stopped
// driving since the round that saw it drive. Counted asleep before it looks, as in sleep().
void ProgressThread::sleepWhileDriven(uint64_t driverStops) {
  sleeping_.store(true, std::memory_order_seq_cst);
  pollfd wake{wakeFd_, POLLIN, 0};
  if (driverStops_.load(std::memory_order_seq_cst) == driverStops)
    pollSlice(&wake, 1, kDrivenSliceNs);
  else
    sleeping_.store(false, std::memory_order_relaxed);
}

// Waits for a descriptor of a connection with requests in flight, a wake-up, or the end of a
// slice.
void ProgressThread::sleep() {
  // Counted asleep before it looks: a wake() from then on writes the eventfd, which stays ready
  // until read, so work that arrives while it looks is not slept through.
  sleeping_.store(true, std::memory_order_seq_cst);
  std::vector<pollfd> fds{{wakeFd_, POLLIN, 0}};
  bool active = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Proxy* proxy : proxies_) active |= proxy->sleepDescriptors(fds);
  }
  pollSlice(fds.data(), fds.size(), active ? kActiveSliceNs : kIdleSliceNs);
}

// The sleep itself, for a thread already counted asleep: `fds` (the eventfd first) or the end of
// the slice; a wake-up is consumed.
void ProgressThread::pollSlice(pollfd* fds, nfds_t fdCount, long sliceNs) {
  const timespec slice{sliceNs / 1000000000L, sliceNs % 1000000000L};
  const int ready = ppoll(fds, fdCount, &slice, nullptr);
  sleeping_.store(false, std::memory_order_relaxed);
  if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t ignored = read(wakeFd_, &count, sizeof count);
  }
}

Proxy::Proxy(int rank, const FifoGeometry& geometry, Allocate allocate)
    : rank_(rank), geometry_(geometry), allocate_(std::move(allocate)) {
  static_assert(kMaxFifoSlots <= kMaxRequests);
}

// A departing rank ends every stream to its peers, also over a connection a peer made to it and
// it never sent back over: that peer reads it (its tentative receive), and must see a departure,
// not a lost connection.
Proxy::~Proxy() {
  if (thread_ != nullptr) thread_->detach(this);
  if (!departing_) return;
  for (const auto& link : links_) {
    if (link->failed.load()) continue;
    if (link->send != nullptr) {
      link->send->end();
    } else if (link->recv != nullptr && connector_) {
      try {
        if (std::unique_ptr<SendComm> back = connector_->net->sendBack(*link->recv)) back->end();
      } catch (const Error& e) {
        BRAID_INFO(log::kNet, "rank {}: could not end the stream to rank {}: {}", rank_, link->peer,
                   e.what());
      }
    }
  }
}

Proxy::Link& Proxy::newLink(int peer, const LinkFormat& format) {
  auto link = std::make_unique<Link>();
  link->peer = peer;
  const FifoGeometry& g = format.geometry.nSlots > 0 ? format.geometry : geometry_;
  if (g.nSlots > kMaxFifoSlots || (format.flaggedLines && g.slotBytes % sizeof(uint64_t) != 0))
    braid::fail(braidInternalError,
                "rank {}: a network link to rank {} cannot have {} slots of {} bytes (at most {} "
                "slots; flagged lines in whole 8-byte words)",
                rank_, peer, g.nSlots, g.slotBytes, kMaxFifoSlots);
  link->geometry = g;
  const size_t fifoBytes = FifoDesc::footprint(g.slotBytes, g.nSlots);
  link->memory = allocate_(2 * fifoBytes);
  auto* base = static_cast<uint8_t*>(link->memory.get());
  link->sendFifo = FifoDesc::over(base, g.slotBytes, g.nSlots);
  link->sendFifo.payloadAt = link->sendPayloadAt.data();
  link->recvFifo = FifoDesc::over(base + fifoBytes, g.slotBytes, g.nSlots);
  if (format.flaggedLines) link->recvAside.assign(link->slotsBytes() / sizeof(uint64_t), 0);
  links_.push_back(std::move(link));
  return *links_.back();
}

Proxy::Fifos Proxy::addPeer(int peer, std::unique_ptr<SendComm> send,
                            std::unique_ptr<RecvComm> recv, const LinkFormat& format) {
  Link& link = newLink(peer, format);
  link.sendRegion = send->registerMemory(link.sendFifo.slots, link.slotsBytes());
  link.send = std::move(send);
  setRecv(link, std::move(recv));
  link.accepted = true;
  return {link.sendFifo, link.recvFifo};
}

void Proxy::connectOnFirstUse(Connector connector) {
  connector_ = std::move(connector);
}

Proxy::Fifos Proxy::addPeer(int peer) {
  Link& link = newLink(peer);
  ++unaccepted_;
  return {link.sendFifo, link.recvFifo};
}

// Under the link's lock, the first time the rank has a slot for the peer.
// One connection per pair where the plug-in allows: over the peer's, if it connected first;
// else a new one, whose other direction the peer's messages may then take.
void Proxy::connectSend(Link& link, Clock::time_point deadline) {
  const Connector& c = *connector_;
  if (link.recv != nullptr && !link.recvTentative) link.send = c.net->sendBack(*link.recv);
  if (link.send != nullptr) {
    BRAID_INFO(log::kNet, "rank {}: sends to rank {} over its connection", rank_, link.peer);
  } else {
    const uint32_t tag = static_cast<uint32_t>(c.rank) * kMaxLinksPerPeer;
    link.send = c.net->connect(0, c.handles.at(link.peer), tag, deadline);
    BRAID_INFO(log::kNet, "rank {}: connected to rank {} on first use", rank_, link.peer);
    if (link.recv == nullptr) {
      if (std::unique_ptr<RecvComm> back = c.net->receiveBack(*link.send)) {
        setRecv(link, std::move(back));
        link.recvTentative = true;
      }
    }
  }
  link.sendRegion = link.send->registerMemory(link.sendFifo.slots, link.slotsBytes());
}

// Under the link's lock. Where connections carry both ways, the pair's one connection is the lower
// rank's when both would connect at once (both send first, as in an all-reduce): the higher rank
// gives it a moment to arrive, and its drivers take arrivals meanwhile. A lower rank that never
// sends costs the pair's first message that moment.
bool Proxy::deferConnect(Link& link) {
  if (link.peer > rank_ || link.recv != nullptr || !connector_->net->connectionsCarryBothWays())
    return false;
  const Clock::time_point now = Clock::now();
  if (link.connectAfter == Clock::time_point{}) {
    link.connectAfter = now + connector_->peerConnectionGrace;
    link.awaitingPeer = true;
  }
  if (now < link.connectAfter) return true;
  link.awaitingPeer = false;
  return false;
}

void Proxy::setRecv(Link& link, std::unique_ptr<RecvComm> comm) {
  link.recvRegion = comm->registerMemory(link.recvInto(0), link.slotsBytes());
  if (ranksReadSmallMessages_) comm->setPollThreshold(kRankReadsBelowBytes);
  link.recv = std::move(comm);
}

// Under the link's lock: the peer's first message came over this rank's connection.
void Proxy::settleRecv(Link& link) {
  link.recvTentative = false;
  link.accepted = true;
  --unaccepted_;
}

bool Proxy::acceptArrivals() {
  if (!connector_ || unaccepted_.load(std::memory_order_relaxed) == 0) return false;
  std::unique_lock<std::mutex> accepting(acceptMutex_, std::try_to_lock);
  if (!accepting.owns_lock()) return false;
  bool any = false;
  uint32_t tag = 0;
  while (std::unique_ptr<RecvComm> comm =
             connector_->net->acceptReady(*connector_->listener, &tag)) {
    const int peer = static_cast<int>(tag / kMaxLinksPerPeer);
    Link* link = nullptr;
    for (const auto& candidate : links_)
      if (candidate->peer == peer && tag % kMaxLinksPerPeer == 0) link = candidate.get();
    std::unique_lock<std::mutex> lock;
    if (link != nullptr) lock = std::unique_lock<std::mutex>(link->driver);
    // The peer connected while this rank did: its messages come over its own connection.
    if (link != nullptr && link->recvTentative && link->recvDone == 0) {
      link->recvRegion.reset();
      link->recv.reset();
      link->recvPosted = 0;
      link->recvTentative = false;
    }
    if (link == nullptr || link->recv != nullptr) {
      BRAID_WARN(log::kNet, "rank {}: dropped a second or unexpected connection from rank {}",
                 rank_, peer);
      continue;
    }
    setRecv(*link, std::move(comm));
    link->accepted = true;
    link->awaitingPeer = false;
    --unaccepted_;
    any = true;
  }
  return any;
}

void Proxy::start(const std::string& device) {
  thread_ = ProgressThread::forDevice(device);
  thread_->attach(this);
}

std::optional<std::string> Proxy::failure(int peer) const {
  if (!anyFailure_.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard<std::mutex> lock(failureMutex_);
  for (const auto& link : links_)
    if (link->peer == peer && !link->failure.empty()) return link->failure;
  for (const auto& link : links_)
    if (!link->failure.empty()) return link->failure;
  return std::nullopt;
}

static_assert(kMaxReasonBytes >= sizeof(RankControl::reason),
              "peers on other hosts learn as much of a failed rank's reason as those on its host");

void Proxy::abandon(const std::string& reason) {
  // One deadline for all: connecting to peers out of reach must not add up.
  const Clock::time_point connectDeadline = Clock::now() + kAbandonConnectTimeout;
  for (const auto& link : links_) {
    // Its holder only moves the link, without waiting for the peer.
    std::lock_guard<std::mutex> lock(link->driver);
    if (link->failed.load()) continue;
    // A link not connected yet (connections made on first use) is connected to tell: its peer
    // may be waiting for this rank's first message. Briefly: a peer may be out of reach.
    if (link->send == nullptr && connector_) {
      try {
        connectSend(*link, connectDeadline);
      } catch (const Error& e) {
        BRAID_INFO(log::kNet, "rank {}: could not tell rank {} of its failure: {}", rank_,
                   link->peer, e.what());
      }
    }
    if (link->send != nullptr) link->send->abort(reason);
    link->failed = true;
  }
}

void Proxy::finish(Clock::time_point deadline) {
  auto unsent = [&] {
    std::vector<int> peers;
    for (const auto& link : links_)
      if (!link->failed.load() && link->hasUntakenSends()) peers.push_back(link->peer);
    return peers;
  };
  operationStarted();
  wake();
  while (!unsent().empty() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  operationFinished();
  const std::vector<int> peers = unsent();
  // With data left behind the peers must see a lost connection, not a departure.
  departing_ = peers.empty();
  if (!departing_)
    BRAID_WARN(log::kNet, "rank {}: closing connections with data not yet sent to ranks {}", rank_,
               fmt::join(peers, ", "));
}

void Proxy::operationStarted() {
  activeOperations_.fetch_add(1, std::memory_order_seq_cst);
}

// An operation that ends with slots the network has not taken (a send returns once its data is in
// the FIFO; a large message may be partly written) leaves them to this thread: it must not sleep
// on them.
void Proxy::operationFinished() {
  activeOperations_.fetch_sub(1, std::memory_order_seq_cst);
  bool unsent = false;
  for (const auto& link : links_) unsent |= link->hasUntakenSends();
  if (unsent) stopDriving();
}

void Proxy::stopDriving() {
  driverStopped_.store(true, std::memory_order_seq_cst);
  if (thread_ != nullptr) thread_->driverStopped();
}

void Proxy::wake() {
  if (thread_ != nullptr) thread_->wake();
}

void Proxy::fail(Link& link, const std::string& why) {
  link.failed = true;
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    link.failure = fmt::format("the connection with rank {} failed: {}", link.peer, why);
    // The rank reports it at its next wait (braidComm::poll). Only INFO here: a peer that exits
    // after its last operation without destroying its communicator also ends here.
    BRAID_INFO(log::kNet, "rank {}: {}", rank_, link.failure);
  }
  anyFailure_.store(true, std::memory_order_release);
}

bool Proxy::progress(Link& link, bool send, bool recv) {
  std::unique_lock<std::mutex> lock(link.driver, std::try_to_lock);
  if (!lock.owns_lock() || link.failed.load(std::memory_order_relaxed)) return false;
  bool sending = true;  // connecting included: a peer that failed and exited refuses it
  try {
    if (send && link.send == nullptr && connector_ &&
        link.sendFifo.control->tail().load() != link.sendPosted && !deferConnect(link))
      connectSend(link, Clock::now() + connector_->timeout);
    const bool sent = send && link.send != nullptr && progressSend(link);
    sending = false;
    return sent | (recv && link.recv != nullptr && progressRecv(link));
  } catch (...) {
    fail(link, sending ? sendFailure(link) : std::string(currentError().what()));
    return false;
  }
}

// Called while a send's failure is handled. A peer's rank that failed says why on the stream it
// sends, then may exit, resetting the one this rank sends on: where the receiving side fails
// too, its story (the reason, already here) says more than the reset.
std::string Proxy::sendFailure(Link& link) {
  const std::string sent = currentError().what();
  if (link.recv == nullptr) return sent;
  try {
    progressRecv(link);
  } catch (...) {
    return currentError().what();
  }
  return sent;
}

bool Proxy::drive(int peer) {
  drives_.fetch_add(1, std::memory_order_relaxed);
  // The listener is asked (a system call) only while an awaited peer has not connected yet, or
  // a send waits for the peer's connection (deferConnect).
  bool moved = false;
  for (const auto& link : links_)
    if (((peer < 0 || link->peer == peer) && !link->accepted.load(std::memory_order_relaxed)) ||
        link->awaitingPeer.load(std::memory_order_relaxed)) {
      moved = acceptArrivals();
      break;
    }
  for (const auto& link : links_) {
    const bool awaited = peer < 0 || link->peer == peer;
    // Every send not finished, also one handed to the network and partly written: the peer
    // may need it before it sends what the rank waits for, and the proxy stays out of the way.
    // Without the lock these reads may be stale; the next drive, or the proxy, catches up.
    if (awaited || link->hasUntakenSends()) moved |= progress(*link, true, awaited);
  }
  return moved;
}

// Hands the slots the rank published to isend; returns the finished ones to the rank.
bool Proxy::progressSend(Link& link) {
  FifoControl& control = *link.sendFifo.control;
  const uint32_t slots = static_cast<uint32_t>(link.geometry.nSlots);
  bool moved = false;
  const uint32_t tail = control.tail().load();
  while (link.sendPosted != tail) {
    const uint32_t slot = link.sendPosted % slots;
    uint8_t* slotData = link.sendFifo.slots + slot * link.geometry.slotBytes;
    const void* payloadAt = link.sendPayloadAt[slot];
    Request* request = payloadAt == nullptr
                           ? link.send->isend(slotData, control.bytes[slot], link.sendRegion.get())
                           : link.send->isendGather(slotData, sizeof(SlotHeader), payloadAt,
                                                    control.bytes[slot] - sizeof(SlotHeader),
                                                    link.sendRegion.get());
    if (request == nullptr) break;
    link.sendPayloadAt[slot] = nullptr;
    link.sendRequests[slot] = request;
    ++link.sendPosted;
    moved = true;
  }
  while (link.sendDone != link.sendPosted) {
    size_t bytes = 0;
    if (!link.send->test(link.sendRequests[link.sendDone % slots], &bytes)) break;
    control.head().publish(++link.sendDone);
    moved = true;
  }
  return moved;
}

// A slot of flagged lines, received aside, into the FIFO the rank polls: whole 8-byte words,
// each a line's data and flag together (the rank's loads of them are 8 bytes too).
void Proxy::copyLinesIn(Link& link, uint32_t slot, size_t bytes) {
  const size_t first = slot * link.geometry.slotBytes / sizeof(uint64_t);
  auto* lines = reinterpret_cast<uint64_t*>(link.recvFifo.slots) + first;
  const size_t words = (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t);
  for (size_t w = 0; w < words; ++w) storeRelaxed(lines[w], link.recvAside[first + w]);
}

// Posts irecv into the slots the rank released; publishes the filled ones to it.
bool Proxy::progressRecv(Link& link) {
  FifoControl& control = *link.recvFifo.control;
  const uint32_t slots = static_cast<uint32_t>(link.geometry.nSlots);
  bool moved = false;
  const uint32_t head = control.head().load();
  while (link.recvPosted - head < slots) {
    const uint32_t slot = link.recvPosted % slots;
    Request* request =
        link.recv->irecv(link.recvInto(slot), link.geometry.slotBytes, link.recvRegion.get());
    if (request == nullptr) break;
    link.recvRequests[slot] = request;
    ++link.recvPosted;
    moved = true;
  }
  // One slot per call: testing the next receive would ask the network again (a system call that
  // usually finds nothing) before the rank that drives this link gets the slot it waits for. The
  // next call takes the next one.
  if (link.recvDone == link.recvPosted) link.recv->checkPeer();
  if (link.recvDone != link.recvPosted) {
    const uint32_t slot = link.recvDone % slots;
    size_t bytes = 0;
    if (link.recv->test(link.recvRequests[slot], &bytes)) {
      if (link.recvTentative) settleRecv(link);
      if (!link.recvAside.empty()) copyLinesIn(link, slot, bytes);
      control.bytes[slot] = bytes;
      control.tail().publish(++link.recvDone);
      moved = true;
    }
  }
  return moved;
}

bool Proxy::sleepDescriptors(std::vector<pollfd>& fds) {
  // A send in flight on a comm with nothing to poll (an NCCL net plug-in's) moves only when the
  // thread tests it, and a peer waits for it: the thread looks again soon, as during an
  // operation. So does a slot the plug-in has not taken yet (a UCX connection whose hello is on
  // its way, an NCCL plug-in that said "later"). A receive nobody reads needs no such care.
  bool unwatchedSends = false;
  for (const auto& link : links_) {
    std::unique_lock<std::mutex> lock(link->driver, std::try_to_lock);
    // A link a rank is driving needs no wake-up from here.
    if (!lock.owns_lock() || link->failed) continue;
    unwatchedSends |= link->sendFifo.control->tail().load() != link->sendPosted;
    if (link->sendDone != link->sendPosted) {
      const size_t watched = fds.size();
      link->send->pollDescriptors(fds);
      unwatchedSends |= fds.size() == watched;
    }
    if (link->recvDone != link->recvPosted) link->recv->pollDescriptors(fds);
  }
  if (connector_ && unaccepted_.load() > 0) {
    std::unique_lock<std::mutex> accepting(acceptMutex_, std::try_to_lock);
    if (accepting.owns_lock()) connector_->listener->pollDescriptors(fds);
  }
  return activeOperations_.load(std::memory_order_seq_cst) > 0 || unwatchedSends;
}

Proxy::Round Proxy::round() {
  // Drives before the rank stopped are no sign that it still drives.
  if (driverStopped_.exchange(false, std::memory_order_acq_rel))
    drivesSeen_ = drives_.load(std::memory_order_relaxed);
  if (const uint64_t drives = drives_.load(std::memory_order_relaxed); drives != drivesSeen_) {
    drivesSeen_ = drives;
    return Round::kRankDriving;
  }
  bool moved = acceptArrivals();
  for (const auto& link : links_) moved |= progress(*link, true, true);
  return moved ? Round::kMoved : Round::kIdle;
}

}  // namespace braid::net
