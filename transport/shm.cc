#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "base/random.h"
#include "transport/local.h"

namespace braid {

std::string ShmSegment::label(uint64_t commNonce, int rank) {
  return fmt::format("braid-{:016x}-{}", commNonce, rank);
}

// Where the kernel's vm.memfd_noexec asks for it (6.3 and up), a memory file says it is not
// executable; older kernels refuse the flag (EINVAL).
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

std::shared_ptr<ShmSegment> ShmSegment::create(const std::string& label, size_t bytes, int rank) {
  int fd = memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
  if (fd < 0 && errno == EINVAL) fd = memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    failErrno(braidSystemError, fmt::format("rank {}: memfd_create({})", rank, label), errno);
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    close(fd);
    if (err == ENOSPC || err == ENOMEM)
      fail(braidSystemError,
           "rank {}: the shared-memory transport needs {} bytes of memory and could not reserve "
           "them (the process's memory limit?; or lower BRAID_BUFFSIZE)",
           rank, bytes);
    failErrno(braidSystemError,
              fmt::format("rank {}: reserving {} bytes for {}", rank, bytes, label), err);
  }
  // Sealed, the size a peer maps cannot change under it (a shrunk file would fault its loads).
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int e = errno;
    close(fd);
    failErrno(braidSystemError, fmt::format("rank {}: sealing {}", rank, label), e);
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    close(fd);
    failErrno(braidSystemError, fmt::format("rank {}: mmap of {}", rank, label), e);
  }
  BRAID_INFO(log::kShm, "rank {}: created {} ({} bytes)", rank, label, bytes);
  return std::shared_ptr<ShmSegment>(new ShmSegment(static_cast<uint8_t*>(base), bytes, fd));
}

std::shared_ptr<ShmSegment> ShmSegment::adopt(int fd, int selfRank, int ownerRank) {
  struct stat st = {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    failErrno(braidSystemError,
              fmt::format("rank {}: fstat of rank {}'s shared memory", selfRank, ownerRank), e);
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    close(fd);
    fail(braidSystemError,
         "rank {}: rank {}'s shared memory is not sealed against shrinking (not a segment braid "
         "made)",
         selfRank, ownerRank);
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (base == MAP_FAILED)
    failErrno(braidSystemError,
              fmt::format("rank {}: mmap of rank {}'s shared memory", selfRank, ownerRank), e);
  return std::shared_ptr<ShmSegment>(new ShmSegment(static_cast<uint8_t*>(base), bytes, -1));
}

void ShmSegment::closeDescriptor() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

ShmSegment::~ShmSegment() {
  closeDescriptor();
  munmap(base_, size_);
}

namespace {

int openPidfd(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  return -1;
#endif
}

// The other processes' ranks on rank r's host, in rank order: the order of the receive FIFOs in
// r's segment.
std::vector<int> processPeersOnHost(const std::vector<PeerInfo>& peers, int r) {
  std::vector<int> ranks;
  for (int q = 0; q < static_cast<int>(peers.size()); ++q)
    if (peers[q].hostHash == peers[r].hostHash && peers[q].pid != peers[r].pid) ranks.push_back(q);
  return ranks;
}

// What a rank sends each process peer beside its segment's descriptor: who it is, in words only
// the bootstrap told the peers (a process of the network namespace that merely saw the socket's
// name is ignored).
struct SegmentNote {
  uint64_t commNonce;
  uint64_t senderNonce;
  int32_t rank;
};

// A rank's Unix datagram socket in the abstract namespace, bound at setup (so every peer's exists
// at connect): it hands this rank's segment descriptor to each process peer and takes theirs
// (SCM_RIGHTS). Abstract names live in the network namespace, which shm peers share (their
// PeerInfo::hostHash), and vanish with the socket. Notes are taken only from this user's
// processes (SO_PASSCRED), carrying the sender's bootstrap nonce.
class DescriptorExchange {
 public:
  explicit DescriptorExchange(const ConnectState& state) : state_(state) {
    socket_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (socket_ < 0)
      failErrno(braidSystemError, fmt::format("rank {}: socket(AF_UNIX)", state_.rank), errno);
    const int on = 1;
    const Address self = address(state_.rank);
    if (setsockopt(socket_, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0 ||
        bind(socket_, reinterpret_cast<const sockaddr*>(&self.un), self.length) != 0) {
      const int e = errno;
      close(socket_);
      failErrno(braidSystemError, fmt::format("rank {}: binding its segment socket", state_.rank),
                e);
    }
  }
  ~DescriptorExchange() { close(socket_); }

  // Sends `fd` to every one of `peers` and receives each one's, in the order of `peers`. Fails
  // within 50 ms where a peer's socket is gone before it sent (it left init), else at the
  // deadline, naming the peers not heard from.
  std::vector<int> exchange(const std::vector<int>& peers, int fd) {
    std::vector<bool> sent(peers.size(), false);
    std::vector<int> received(peers.size(), -1);
    try {
      for (auto lastCheck = Clock::now();;) {
        bool moved = false;
        for (size_t i = 0; i < peers.size(); ++i)
          if (!sent[i] && sendTo(peers[i], fd)) sent[i] = moved = true;
        moved |= receiveWaiting(peers, received);
        if (std::all_of(sent.begin(), sent.end(), [](bool b) { return b; }) &&
            std::none_of(received.begin(), received.end(), [](int f) { return f < 0; }))
          return received;
        if (Clock::now() > state_.rendezvous.deadline) failAtDeadline(peers, received);
        if (moved) continue;
        if (Clock::now() - lastCheck > std::chrono::milliseconds(50)) {
          failIfAPeerLeft(peers, received);
          lastCheck = Clock::now();
        }
        pollfd wait{socket_, POLLIN, 0};
        poll(&wait, 1, 1);
      }
    } catch (...) {
      for (int f : received)
        if (f >= 0) close(f);
      throw;
    }
  }

 private:
  struct Address {
    sockaddr_un un{};
    socklen_t length = 0;
  };

  // Named after the communicator and 32 bits of a hash of the rank's own nonce: a process that
  // sees the names (/proc/net/unix lists them to every user) can neither take a rank's name
  // before it binds nor learn the nonce a note must carry.
  Address address(int rank) const {
    Address a;
    a.un.sun_family = AF_UNIX;
    const uint64_t secret = state_.peers[rank].nonce ^ state_.commNonce;
    const uint64_t hidden =
        fnv1a(std::string_view(reinterpret_cast<const char*>(&secret), sizeof secret)) >> 32;
    const std::string name = fmt::format("braid-{:016x}-{}-{:08x}", state_.commNonce, rank, hidden);
    std::memcpy(a.un.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
    a.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    return a;
  }

  // Whether the note and descriptor went; false where the peer's queue is full (later).
  bool sendTo(int peer, int fd) {
    SegmentNote note{};  // padding included: no uninitialized byte goes out
    note.commNonce = state_.commNonce;
    note.senderNonce = state_.peers[state_.rank].nonce;
    note.rank = state_.rank;
    iovec data{&note, sizeof note};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    Address to = address(peer);
    msghdr message{};
    message.msg_name = &to.un;
    message.msg_namelen = to.length;
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    cmsghdr* rights = CMSG_FIRSTHDR(&message);
    rights->cmsg_level = SOL_SOCKET;
    rights->cmsg_type = SCM_RIGHTS;
    rights->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(rights), &fd, sizeof fd);
    if (sendmsg(socket_, &message, MSG_DONTWAIT | MSG_NOSIGNAL) ==
        static_cast<ssize_t>(sizeof note))
      return true;
    // ETOOMANYREFS: the user's descriptors in flight are at its limit until peers take theirs.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS || errno == EINTR ||
        errno == ETOOMANYREFS)
      return false;
    if (errno == ECONNREFUSED || errno == ENOENT) failPeerLeft(peer);
    failErrno(braidSystemError,
              fmt::format("rank {}: handing its shared memory to rank {}", state_.rank, peer),
              errno);
  }

  // Reads what is queued, a bounded number of messages per pass (others' junk cannot hold the
  // caller from its deadline): whether a peer's descriptor came.
  bool receiveWaiting(const std::vector<int>& peers, std::vector<int>& received) {
    bool accepted = false;
    for (size_t k = 0; k < peers.size() + 16; ++k) {
      const Received r = receiveOne(peers, received);
      if (r == Received::Nothing) break;
      accepted |= r == Received::Accepted;
    }
    return accepted;
  }

  enum class Received { Nothing, Accepted, Dropped };

  // Takes one waiting message: kept when it is a peer's first note, well formed, from this
  // user; its descriptors closed otherwise.
  Received receiveOne(const std::vector<int>& peers, std::vector<int>& received) {
    SegmentNote note{};
    iovec data{&note, sizeof note};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int)) + CMSG_SPACE(sizeof(ucred))] = {};
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    const ssize_t got = recvmsg(socket_, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) return Received::Nothing;
    std::vector<int> fds;
    bool sameUser = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS) {
        for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++k) {
          int f;
          std::memcpy(&f, CMSG_DATA(c) + k * sizeof(int), sizeof f);
          fds.push_back(f);
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS) {
        ucred sender{};
        std::memcpy(&sender, CMSG_DATA(c), sizeof sender);
        sameUser = sender.uid == getuid();
      }
    }
    const auto at = std::find(peers.begin(), peers.end(), note.rank) - peers.begin();
    const bool fromPeer = got == static_cast<ssize_t>(sizeof note) && sameUser &&
                          note.commNonce == state_.commNonce &&
                          at < static_cast<long>(peers.size()) &&
                          note.senderNonce == state_.peers[note.rank].nonce;
    if (fromPeer && (message.msg_flags & MSG_CTRUNC) != 0)
      fail(braidSystemError,
           "rank {}: rank {}'s shared-memory descriptor could not be received (this process is "
           "out of file descriptors? see ulimit -n)",
           state_.rank, note.rank);
    if (fromPeer && fds.size() == 1 && received[at] < 0) {
      received[at] = fds[0];
      return Received::Accepted;
    }
    for (int f : fds) close(f);
    return Received::Dropped;
  }

  // A peer whose socket is gone before its descriptor came has left init (its process ended,
  // or its init failed and unwound): no need to wait for the deadline. A peer closes its socket
  // only after its send to this rank was queued here, so the queue is read once more first.
  void failIfAPeerLeft(const std::vector<int>& peers, std::vector<int>& received) {
    for (size_t i = 0; i < peers.size(); ++i) {
      if (received[i] >= 0 || !socketGone(peers[i])) continue;
      receiveWaiting(peers, received);
      if (received[i] < 0) failPeerLeft(peers[i]);
    }
  }

  bool socketGone(int peer) const {
    const int probe = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return false;
    const Address to = address(peer);
    const bool gone = connect(probe, reinterpret_cast<const sockaddr*>(&to.un), to.length) != 0 &&
                      (errno == ECONNREFUSED || errno == ENOENT);
    close(probe);
    return gone;
  }

  [[noreturn]] void failPeerLeft(int peer) const {
    fail(braidRemoteError,
         "rank {}: rank {} left init (its process ended or its init failed) before handing over "
         "its shared memory",
         state_.rank, peer);
  }

  [[noreturn]] void failAtDeadline(const std::vector<int>& peers,
                                   const std::vector<int>& received) const {
    std::string missing;
    for (size_t i = 0; i < peers.size(); ++i)
      if (received[i] < 0) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", peers[i]);
    fail(braidTimeout,
         "rank {}: timed out waiting for the shared memory of rank(s) {} on this host", state_.rank,
         missing);
  }

  const ConnectState& state_;
  int socket_ = -1;
};

// Processes of one host: each rank's segment holds its control block, then the FIFOs its process
// peers write, in rank order (none for LinkKind::HostPresence); a peer maps it and writes into its
// own FIFO there. Segments are memory files without names (memfd), handed over at connect, so a
// rank killed at any point of init leaves nothing behind in /dev/shm, and its size does not matter.
class ShmSetup : public TransportSetup {
 public:
  ShmSetup(ConnectState& state, std::vector<int> peers)
      : peers_(std::move(peers)), fifoBytes_(state.hostFifos() ? state.fifoBytes() : 0) {
    ownSegment_ = ShmSegment::create(ShmSegment::label(state.commNonce, state.rank),
                                     kControlBytes + fifoBytes_ * peers_.size(), state.rank);
    state.links.keepAlive.push_back(ownSegment_);
    state.control = new (ownSegment_->base()) RankControl();
    state.controlMemory = ownSegment_;
    exchange_ = std::make_unique<DescriptorExchange>(state);
  }
  void connect(ConnectState& state) override {
    const int rank = state.rank;
    const std::vector<int> fds = exchange_->exchange(peers_, ownSegment_->descriptor());
    std::vector<std::shared_ptr<ShmSegment>> segments;
    for (size_t i = 0; i < peers_.size(); ++i) {
      try {
        segments.push_back(ShmSegment::adopt(fds[i], rank, peers_[i]));
      } catch (...) {
        for (size_t j = i + 1; j < fds.size(); ++j) close(fds[j]);
        throw;
      }
    }
    for (size_t i = 0; i < peers_.size(); ++i) {
      const int peer = peers_[i];
      const std::shared_ptr<ShmSegment>& peerSegment = segments[i];
      state.links.keepAlive.push_back(peerSegment);
      const std::vector<int> peersOfPeer = processPeersOnHost(state.peers, peer);
      if (peerSegment->size() < kControlBytes + fifoBytes_ * peersOfPeer.size())
        fail(braidInternalError,
             "rank {}: rank {}'s shared memory is {} bytes, smaller than expected", rank, peer,
             peerSegment->size());
      state.links.control[peer] = reinterpret_cast<RankControl*>(peerSegment->base());
      state.links.pidfd[peer] = openPidfd(state.peers[peer].pid);
      if (!state.hostFifos()) continue;
      const size_t myIndex =
          std::find(peersOfPeer.begin(), peersOfPeer.end(), rank) - peersOfPeer.begin();
      const FifoGeometry& g = state.geometry;
      uint8_t* recvMemory = ownSegment_->base() + kControlBytes + fifoBytes_ * i;
      uint8_t* sendMemory = peerSegment->base() + kControlBytes + fifoBytes_ * myIndex;
      state.links.recv[peer] =
          RecvConnector(FifoDesc::over(recvMemory, g.slotBytes, g.nSlots), rank, peer);
      state.links.send[peer] =
          SendConnector(FifoDesc::over(sendMemory, g.slotBytes, g.nSlots), rank, peer);
    }
  }
  // Every peer has mapped this rank's segment: its descriptor and socket can go.
  void connected(ConnectState&) override {
    ownSegment_->closeDescriptor();
    exchange_.reset();
  }

 private:
  std::vector<int> peers_;
  size_t fifoBytes_;  // of one FIFO
  std::shared_ptr<ShmSegment> ownSegment_;
  std::unique_ptr<DescriptorExchange> exchange_;
};

}  // namespace

const Transport* shmTransport() {
  static const TransportOf<ShmSetup> transport("shm", {LinkKind::HostFifos, LinkKind::HostPresence},
                                               [](const PeerInfo& self, const PeerInfo& peer) {
                                                 return peer.hostHash == self.hostHash &&
                                                        peer.pid != self.pid &&
                                                        param::ShmDisableNow() == 0;
                                               });
  return &transport;
}

}  // namespace braid
