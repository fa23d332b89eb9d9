// The transport registry: its priority order, which transport each kind of peer gets for each kind
// of links, and the error when none can reach a peer; then real links built through it for ranks
// as threads of one process (inproc) and the FIFOs they get carrying a slot each way, and links
// that carry no FIFOs (a CUDA communicator's host links) for threads and for processes (shm).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "transport/transport.h"

namespace braid {
namespace {

std::vector<std::string> names() {
  std::vector<std::string> all;
  for (const Transport* t : transports()) all.push_back(t->name());
  return all;
}

// The transport the registry picks for `peer`, as connectPeers does: the first that carries
// `kind` and can connect it.
std::string chosen(const PeerInfo& self, const PeerInfo& peer,
                   LinkKind kind = LinkKind::HostFifos) {
  for (const Transport* t : transports())
    if (t->carries(kind) && t->canConnect(self, peer)) return t->name();
  return "none";
}

PeerInfo info(int rank, uint64_t host, int pid) {
  PeerInfo p;
  p.rank = rank;
  p.hostHash = host;
  p.machineHash = host;
  p.pid = pid;
  p.nonce = 1000 + static_cast<uint64_t>(rank);
  return p;
}

// P2P where the build has CUDA (its FIFOs need the runtime).
TEST(TransportRegistry, ListsTransportsInPriorityOrder) {
#if BRAID_TEST_HAVE_CUDA
  EXPECT_EQ(names(), (std::vector<std::string>{"inproc", "p2p", "shm", "net"}));
#else
  EXPECT_EQ(names(), (std::vector<std::string>{"inproc", "shm", "net"}));
#endif
}

TEST(TransportRegistry, EachPeerGetsTheFirstTransportThatReachesIt) {
  const PeerInfo self = info(0, 7, 100);
  EXPECT_EQ(chosen(self, info(1, 7, 100)), "inproc");  // a thread of this process
  EXPECT_EQ(chosen(self, info(1, 7, 101)), "shm");     // another process on this host
  EXPECT_EQ(chosen(self, info(1, 8, 100)), "net");     // another host (same pid number)
}

// A CUDA communicator's FIFOs: in GPU memory between ranks of a host, threads or processes alike,
// through the network proxy to other hosts. Its host links carry only what ranks of a host share
// of each other, so they reach no other host.
TEST(TransportRegistry, EachKindOfLinksHasItsTransports) {
  const PeerInfo self = info(0, 7, 100);
#if BRAID_TEST_HAVE_CUDA
  const std::string onHost = "p2p";
#else
  const std::string onHost = "none";
#endif
  EXPECT_EQ(chosen(self, info(1, 7, 100), LinkKind::DeviceFifos), onHost);
  EXPECT_EQ(chosen(self, info(1, 7, 101), LinkKind::DeviceFifos), onHost);
  EXPECT_EQ(chosen(self, info(1, 8, 100), LinkKind::DeviceFifos), "net");
  EXPECT_EQ(chosen(self, info(1, 7, 100), LinkKind::HostPresence), "inproc");
  EXPECT_EQ(chosen(self, info(1, 7, 101), LinkKind::HostPresence), "shm");
  EXPECT_EQ(chosen(self, info(1, 8, 100), LinkKind::HostPresence), "none");
  for (const Transport* t : transports())
    EXPECT_EQ(t->setsUpEveryRank(LinkKind::DeviceFifos), std::string(t->name()) == "p2p")
        << t->name();
}

TEST(TransportRegistry, NoTransportForAProcessPeerWithoutShmIsAClearError) {
  setenv("BRAID_SHM_DISABLE", "1", 1);
  const PeerInfo self = info(0, 7, 100);
  EXPECT_EQ(chosen(self, info(1, 7, 101)), "none");
  const std::vector<PeerInfo> peers = {self, info(1, 7, 101)};
  Rendezvous rendezvous{[] {}, [](void*, size_t) {}, Clock::now() + std::chrono::seconds(5)};
  try {
    connectPeers(peers, 0, FifoGeometry{4096, 2}, rendezvous);
    ADD_FAILURE() << "connectPeers reached a peer no transport can connect";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), braidInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("rank 0 cannot reach rank 1 (pid 101, this host)"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("BRAID_SHM_DISABLE"), std::string::npos) << e.what();
  }
  unsetenv("BRAID_SHM_DISABLE");
}

// The links of `kind` that ranks 0 and 1 of `peers`, threads of this process, build together.
std::vector<PeerLinks> connectTwoThreads(const std::vector<PeerInfo>& peers, LinkKind kind) {
  std::barrier<> meet(2);
  Rendezvous rendezvous{[&] { meet.arrive_and_wait(); }, [](void*, size_t) {},
                        Clock::now() + std::chrono::seconds(5)};
  std::vector<PeerLinks> links(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      links[r] = connectPeers(peers, r, FifoGeometry{4096, 2}, rendezvous, {kind});
    });
  for (auto& t : threads) t.join();
  return links;
}

// Two ranks as threads: the links come from the inproc transport, and a slot posted by one
// arrives at the other, each way.
TEST(TransportRegistry, InprocLinksCarryASlotEachWay) {
  std::vector<PeerLinks> links =
      connectTwoThreads({info(0, 7, 100), info(1, 7, 100)}, LinkKind::HostFifos);
  struct Unbounded : Watchdog {
    void poll(int, const char*) override {}
  } dog;
  for (int from = 0; from < 2; ++from) {
    const int to = 1 - from;
    EXPECT_NE(links[from].control[to], nullptr);
    auto* slot = static_cast<int*>(links[from].send[to].acquire(dog));
    *slot = 40 + from;
    links[from].send[to].post(sizeof(int), CallTag{});
    const SlotHeader& header = links[to].recv[from].wait(dog);
    EXPECT_EQ(header.payloadBytes, sizeof(int));
    EXPECT_EQ(*reinterpret_cast<const int*>(&header + 1), 40 + from);
    links[to].recv[from].release();
  }
}

// Host links of LinkKind::HostPresence for two threads and a peer on another host: control blocks
// between the threads, no FIFO anywhere, and nothing at all for the other host (no proxy).
TEST(TransportRegistry, PresenceLinksShareControlBlocksAndNoFifos) {
  const std::vector<PeerLinks> links = connectTwoThreads(
      {info(0, 7, 100), info(1, 7, 100), info(2, 8, 100)}, LinkKind::HostPresence);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(links[r].control[1 - r], links[1 - r].control[1 - r]);
    EXPECT_EQ(links[r].control[2], nullptr);
    EXPECT_TRUE(links[r].services.empty());
    for (int peer = 0; peer < 3; ++peer) {  // a connector never laid over a FIFO names no peer
      EXPECT_EQ(links[r].send[peer].peer(), -1) << r << " to " << peer;
      EXPECT_EQ(links[r].recv[peer].peer(), -1) << r << " from " << peer;
    }
  }
  links[1].control[1]->opSeq.store(5);
  EXPECT_EQ(links[0].control[1]->opSeq.load(), 5u);
}

// One process's side of the test below: `rank` of `peers`, meeting the other through a byte each
// way (`out`, `in`). Whether it saw the other's control block, pidfd and no FIFO.
bool presenceSeenBy(int rank, const std::vector<PeerInfo>& peers, int out, int in) {
  auto barrier = [&] {
    char byte = 0;
    if (write(out, &byte, 1) != 1 || read(in, &byte, 1) != 1)
      fail(braidSystemError, "rank {}: the other process is gone", rank);
  };
  Rendezvous rendezvous{barrier, [](void*, size_t) {}, Clock::now() + std::chrono::seconds(5)};
  PeerLinks links =
      connectPeers(peers, rank, FifoGeometry{4096, 2}, rendezvous, {LinkKind::HostPresence});
  links.control[rank]->opSeq.store(10 + static_cast<uint64_t>(rank));
  barrier();
  const int other = 1 - rank;
  const bool seen = links.control[other] != nullptr &&
                    links.control[other]->opSeq.load() == 10u + static_cast<uint64_t>(other) &&
                    links.pidfd[other] >= 0 && links.send[other].peer() == -1 &&
                    links.recv[other].peer() == -1;
  barrier();  // neither unmaps before the other has read
  return seen;
}

// The same between two processes: each maps the other's control block (shared memory) and gets
// its pidfd, and no FIFO. A side that fails or dies ends the other's wait (its pipe closes).
TEST(TransportRegistry, PresenceLinksBetweenProcessesMapControlBlocks) {
  int toChild[2], toParent[2];
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(pipe(toParent), 0);
  const int parentPid = static_cast<int>(getpid());
  const uint64_t nonce = (static_cast<uint64_t>(std::random_device{}()) << 32) | parentPid;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  const int childPid = child == 0 ? static_cast<int>(getpid()) : child;
  std::vector<PeerInfo> peers = {info(0, 7, parentPid), info(1, 7, childPid)};
  peers[0].nonce = nonce;  // names the shared memory: no clash with another run
  if (child == 0) {
    close(toChild[1]);
    close(toParent[0]);
    bool seen = false;
    try {
      seen = presenceSeenBy(1, peers, toParent[1], toChild[0]);
    } catch (...) {
    }
    _exit(seen ? 0 : 1);
  }
  close(toChild[0]);
  close(toParent[1]);
  EXPECT_TRUE(presenceSeenBy(0, peers, toChild[1], toParent[0]));
  close(toChild[1]);
  close(toParent[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child saw otherwise";
}

}  // namespace
}  // namespace braid
