#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "transport/local.h"

namespace braid {

std::string ShmSegment::name(uint64_t commNonce, int rank) {
  return fmt::format("/braid-{:016x}-{}", commNonce, rank);
}

std::shared_ptr<ShmSegment> ShmSegment::create(const std::string& name, size_t bytes, int rank) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) failErrno(braidSystemError, fmt::format("rank {}: shm_open({})", rank, name), errno);
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    struct statvfs vfs = {};
    unsigned long long freeBytes = 0;
    if (statvfs("/dev/shm", &vfs) == 0)
      freeBytes = static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize;
    if (err == ENOSPC)
      fail(braidSystemError,
           "rank {}: /dev/shm is too small: the shared-memory transport needs {} bytes, {} are "
           "free (enlarge /dev/shm, e.g. docker --shm-size, or lower BRAID_BUFFSIZE)",
           rank, bytes, freeBytes);
    failErrno(braidSystemError,
              fmt::format("rank {}: reserving {} bytes for {}", rank, bytes, name), err);
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    int e = errno;
    shm_unlink(name.c_str());
    failErrno(braidSystemError, fmt::format("rank {}: mmap of {}", rank, name), e);
  }
  BRAID_INFO(log::kShm, "rank {}: created {} ({} bytes)", rank, name, bytes);
  return std::shared_ptr<ShmSegment>(
      new ShmSegment(name, static_cast<uint8_t*>(base), bytes, true));
}

std::shared_ptr<ShmSegment> ShmSegment::open(const std::string& name, int selfRank, int ownerRank) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0)
    failErrno(braidSystemError,
              fmt::format("rank {}: opening rank {}'s shared memory {}", selfRank, ownerRank, name),
              errno);
  struct stat st = {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    failErrno(braidSystemError, fmt::format("rank {}: fstat of {}", selfRank, name), e);
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    failErrno(braidSystemError, fmt::format("rank {}: mmap of {}", selfRank, name), errno);
  return std::shared_ptr<ShmSegment>(
      new ShmSegment(name, static_cast<uint8_t*>(base), bytes, false));
}

void ShmSegment::unlink() {
  if (owner_ && !name_.empty()) {
    shm_unlink(name_.c_str());
    owner_ = false;
  }
}

ShmSegment::~ShmSegment() {
  unlink();
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

// Processes of one host: each rank's segment holds its control block, then the FIFOs its process
// peers write, in rank order (none for LinkKind::HostPresence); a peer maps it and writes into its
// own FIFO there.
class ShmSetup : public TransportSetup {
 public:
  ShmSetup(ConnectState& state, std::vector<int> peers)
      : peers_(std::move(peers)), fifoBytes_(state.hostFifos() ? state.fifoBytes() : 0) {
    ownSegment_ = ShmSegment::create(ShmSegment::name(state.commNonce, state.rank),
                                     kControlBytes + fifoBytes_ * peers_.size(), state.rank);
    state.links.keepAlive.push_back(ownSegment_);
    state.control = new (ownSegment_->base()) RankControl();
    state.controlMemory = ownSegment_;
  }
  void connect(ConnectState& state) override {
    const int rank = state.rank;
    for (size_t i = 0; i < peers_.size(); ++i) {
      const int peer = peers_[i];
      auto peerSegment = ShmSegment::open(ShmSegment::name(state.commNonce, peer), rank, peer);
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
  // Every peer has mapped this rank's segment: its name can go.
  void connected(ConnectState&) override { ownSegment_->unlink(); }

 private:
  std::vector<int> peers_;
  size_t fifoBytes_;  // of one FIFO
  std::shared_ptr<ShmSegment> ownSegment_;
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
