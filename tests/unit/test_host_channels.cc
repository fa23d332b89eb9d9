// The host executor's ring calls on a communicator's further CPU channels (sets of links of
// their own): from the threshold on, every set carries a share, and the result is the sum.
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "coll/host_executor.h"
#include "transport/transport.h"

namespace {

// Waits without bounds: the ranks are threads of this test.
struct Unbounded : braid::Watchdog {
  void poll(int, const char*) override {}
};

// 3 ranks as threads, each with 3 sets of inproc links (connectPeers' link sets 0, 1, 2). An
// all-reduce of `count` floats with the further sets lent as channels from `channelMinBytes` on:
// the sum checked, and how many slots each set posted to the next rank returned per set.
std::vector<uint32_t> allReduceOnSets(size_t count, size_t channelMinBytes) {
  constexpr int kRanks = 3, kSets = 3;
  std::vector<braid::PeerInfo> peers(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    peers[r].rank = r;
    peers[r].hostHash = peers[r].machineHash = 7;
    peers[r].pid = 100;
    peers[r].nonce = 5000 + static_cast<uint64_t>(r);
  }
  std::barrier<> meet(kRanks);
  const braid::Rendezvous rendezvous{[&] { meet.arrive_and_wait(); }, [](void*, size_t) {},
                                     braid::Clock::now() + std::chrono::seconds(10)};
  std::vector<std::vector<braid::PeerLinks>> links(kRanks);
  std::vector<std::vector<float>> data(kRanks);
  const int ring[kRanks] = {0, 1, 2};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      for (int set = 0; set < kSets; ++set)
        links[r].push_back(braid::connectPeers(peers, r, braid::FifoGeometry{4096 + 64, 4},
                                               rendezvous, {braid::LinkKind::HostFifos, set}));
      std::vector<Unbounded> dogs(kSets);
      std::vector<std::vector<braid::SendConnector*>> sendTo(kSets);
      std::vector<std::vector<braid::RecvConnector*>> recvFrom(kSets);
      std::vector<braid::HostChannel> more;
      for (int set = 0; set < kSets; ++set) {
        for (int p = 0; p < kRanks; ++p) {
          sendTo[set].push_back(&links[r][set].send[p]);
          recvFrom[set].push_back(&links[r][set].recv[p]);
        }
        if (set > 0) more.push_back({sendTo[set], recvFrom[set], &dogs[set]});
      }
      braid::CollContext ctx;
      ctx.rank = r;
      ctx.nranks = kRanks;
      ctx.ringOrder = ring;
      ctx.sendTo = sendTo[0];
      ctx.recvFrom = recvFrom[0];
      ctx.dog = &dogs[0];
      ctx.moreChannels = more;
      ctx.channelMinBytes = channelMinBytes;
      ctx.sequence = 1;
      data[r].resize(count);
      for (size_t i = 0; i < count; ++i) data[r][i] = static_cast<float>((r + 1) * (i % 1000));
      braid::CollArgs args{braid::Collective::AllReduce,
                           data[r].data(),
                           data[r].data(),
                           count,
                           braidFloat32,
                           braidSum,
                           0};
      braid::runCollective(ctx, args);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < count; ++i)
      if (data[r][i] != static_cast<float>(6 * (i % 1000))) {
        ADD_FAILURE() << "rank " << r << " element " << i << ": " << data[r][i];
        break;
      }
  std::vector<uint32_t> posted;
  for (int set = 0; set < kSets; ++set) posted.push_back(links[0][set].send[1].posted());
  return posted;
}

TEST(HostChannels, ARingCallFromTheThresholdOnCarriesAShareOnEverySet) {
  const size_t count = 100003;  // 400 KB: about a hundred 4 KiB slots per set
  for (uint32_t slots : allReduceOnSets(count, 1)) EXPECT_GT(slots, 20u);
  const std::vector<uint32_t> below = allReduceOnSets(count, count * sizeof(float) + 1);
  EXPECT_GT(below[0], 60u);
  EXPECT_EQ(below[1], 0u);  // under the threshold: one channel
  EXPECT_EQ(below[2], 0u);
}

}  // namespace
