// The transport registry: its priority order, which transport each kind of peer gets, and the
// error when none can reach a peer; then real links built through it for ranks as threads of one
// process (inproc) and the FIFOs they get carrying a slot each way.
#include <gtest/gtest.h>

#include <barrier>
#include <cstdlib>
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

// The transport the registry picks for `peer`, as connectPeers does: the first that can.
std::string chosen(const PeerInfo& self, const PeerInfo& peer) {
  for (const Transport* t : transports())
    if (t->canConnect(self, peer)) return t->name();
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

TEST(TransportRegistry, ListsTransportsInPriorityOrder) {
  EXPECT_EQ(names(), (std::vector<std::string>{"inproc", "shm", "net"}));
}

TEST(TransportRegistry, EachPeerGetsTheFirstTransportThatReachesIt) {
  const PeerInfo self = info(0, 7, 100);
  EXPECT_EQ(chosen(self, info(1, 7, 100)), "inproc");  // a thread of this process
  EXPECT_EQ(chosen(self, info(1, 7, 101)), "shm");     // another process on this host
  EXPECT_EQ(chosen(self, info(1, 8, 100)), "net");     // another host (same pid number)
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

// Two ranks as threads: the links come from the inproc transport, and a slot posted by one
// arrives at the other, each way.
TEST(TransportRegistry, InprocLinksCarryASlotEachWay) {
  const std::vector<PeerInfo> peers = {info(0, 7, 100), info(1, 7, 100)};
  std::barrier<> meet(2);
  Rendezvous rendezvous{[&] { meet.arrive_and_wait(); }, [](void*, size_t) {},
                        Clock::now() + std::chrono::seconds(5)};
  std::vector<PeerLinks> links(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      links[r] = connectPeers(peers, r, FifoGeometry{4096, 2}, rendezvous);
    });
  for (auto& t : threads) t.join();
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

}  // namespace
}  // namespace braid
