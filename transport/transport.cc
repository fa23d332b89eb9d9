#include "transport/transport.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "transport/local.h"
#include "transport/net/net_transport.h"

namespace braid {

const char* transportName(TransportKind kind) {
  switch (kind) {
    case TransportKind::Self: return "self";
    case TransportKind::Inproc: return "inproc";
    case TransportKind::Shm: return "shm";
    case TransportKind::Net: return "net";
  }
  return "?";
}

PeerLinks::~PeerLinks() {
  for (int fd : pidfd)
    if (fd >= 0) close(fd);
}

namespace {

TransportKind classify(const PeerInfo& self, const PeerInfo& peer) {
  if (peer.rank == self.rank) return TransportKind::Self;
  if (peer.hostHash != self.hostHash) return TransportKind::Net;
  if (peer.pid == self.pid) return TransportKind::Inproc;
  if (param::ShmDisable() != 0)
    fail(braidInvalidUsage,
         "rank {} cannot reach rank {} (another process on this host): BRAID_SHM_DISABLE=1 and "
         "no other transport is available",
         self.rank, peer.rank);
  return TransportKind::Shm;
}

int openPidfd(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  return -1;
#endif
}

// Ranks of `kind`, in rank order.
std::vector<int> ranksOfKind(const std::vector<TransportKind>& kinds, TransportKind kind) {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(kinds.size()); ++r)
    if (kinds[r] == kind) ranks.push_back(r);
  return ranks;
}

// The other processes' ranks on rank r's host, in rank order: the order of the receive FIFOs in
// r's segment.
std::vector<int> processPeersOnHost(const std::vector<PeerInfo>& peers, int r) {
  std::vector<int> ranks;
  for (int q = 0; q < static_cast<int>(peers.size()); ++q)
    if (peers[q].hostHash == peers[r].hostHash && peers[q].pid != peers[r].pid) ranks.push_back(q);
  return ranks;
}

}  // namespace

PeerLinks connectPeers(const std::vector<PeerInfo>& peers, int rank, const FifoGeometry& geometry,
                       const Rendezvous& rendezvous) {
  const int nranks = static_cast<int>(peers.size());
  const PeerInfo& self = peers[rank];
  PeerLinks links;
  links.send.resize(nranks);
  links.recv.resize(nranks);
  links.kind.resize(nranks);
  links.control.assign(nranks, nullptr);
  links.pidfd.assign(nranks, -1);
  for (int p = 0; p < nranks; ++p) links.kind[p] = classify(self, peers[p]);

  const size_t fifoBytes = FifoDesc::footprint(geometry.slotBytes, geometry.nSlots);
  const std::vector<int> shmPeers = ranksOfKind(links.kind, TransportKind::Shm);
  const std::vector<int> inprocPeers = ranksOfKind(links.kind, TransportKind::Inproc);
  const std::vector<int> netPeers = ranksOfKind(links.kind, TransportKind::Net);
  // Segments are named after rank 0's nonce: unique per communicator, known to every rank.
  const uint64_t commNonce = peers[0].nonce;

  // 1. This rank's exported state: its control block, and the FIFOs its shm peers write.
  std::shared_ptr<ShmSegment> ownSegment;
  if (!shmPeers.empty()) {
    ownSegment = ShmSegment::create(ShmSegment::name(commNonce, rank),
                                    kControlBytes + fifoBytes * shmPeers.size(), rank);
    links.keepAlive.push_back(ownSegment);
    links.control[rank] = new (ownSegment->base()) RankControl();
  } else {
    auto block = allocateZeroed(kControlBytes);
    links.keepAlive.push_back(block);
    links.control[rank] = new (block.get()) RankControl();
  }
  std::shared_ptr<InprocClique> clique;
  if (!inprocPeers.empty()) {
    int lowestLocal = std::min(rank, inprocPeers.front());
    clique = InprocClique::join(peers[lowestLocal].nonce);
    clique->publishControl(rank, links.control[rank]);
    links.keepAlive.push_back(std::shared_ptr<void>(clique, clique.get()));
  }
  rendezvous.barrier();  // every segment exists and every control block is published

  // 2. Attach to each peer.
  for (int i = 0; i < static_cast<int>(shmPeers.size()); ++i) {
    const int peer = shmPeers[i];
    uint8_t* recvMemory = ownSegment->base() + kControlBytes + fifoBytes * i;
    links.recv[peer] =
        RecvConnector(FifoDesc::over(recvMemory, geometry.slotBytes, geometry.nSlots), rank, peer);

    auto peerSegment = ShmSegment::open(ShmSegment::name(commNonce, peer), rank, peer);
    links.keepAlive.push_back(peerSegment);
    const std::vector<int> peersOfPeer = processPeersOnHost(peers, peer);
    const size_t myIndex =
        std::find(peersOfPeer.begin(), peersOfPeer.end(), rank) - peersOfPeer.begin();
    if (peerSegment->size() < kControlBytes + fifoBytes * peersOfPeer.size())
      fail(braidInternalError,
           "rank {}: rank {}'s shared memory is {} bytes, smaller than expected", rank, peer,
           peerSegment->size());
    uint8_t* sendMemory = peerSegment->base() + kControlBytes + fifoBytes * myIndex;
    links.send[peer] =
        SendConnector(FifoDesc::over(sendMemory, geometry.slotBytes, geometry.nSlots), rank, peer);
    links.control[peer] = reinterpret_cast<RankControl*>(peerSegment->base());
    links.pidfd[peer] = openPidfd(peers[peer].pid);
  }
  for (int peer : inprocPeers) {
    links.send[peer] = SendConnector(
        FifoDesc::over(clique->fifo(rank, peer, fifoBytes), geometry.slotBytes, geometry.nSlots),
        rank, peer);
    links.recv[peer] = RecvConnector(
        FifoDesc::over(clique->fifo(peer, rank, fifoBytes), geometry.slotBytes, geometry.nSlots),
        rank, peer);
    links.control[peer] = clique->control(peer);
  }
  rendezvous.barrier();  // every peer has mapped this rank's segment: its name can go
  if (ownSegment) ownSegment->unlink();
  // With more than one host every rank has peers elsewhere, so all ranks take part.
  if (!netPeers.empty())
    links.netProxy = net::connectRemotePeers(peers, rank, netPeers, geometry, rendezvous, links);
  BRAID_INFO(log::kInit, "rank {}: {} inproc, {} shm and {} net peers, FIFO {} x {} bytes", rank,
             inprocPeers.size(), shmPeers.size(), netPeers.size(), geometry.nSlots,
             geometry.slotBytes);
  return links;
}

}  // namespace braid
