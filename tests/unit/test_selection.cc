// What a communicator runs each call with (core/selection.h), from ranks' facts as the rendezvous
// gathers them: the plan's ring order, the hosts' leaders, the all-reduce size classes and the
// one-shot exchange's bound, Bruck's classes and the scratch, and the device model replacing the
// host's.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/selection.h"

namespace {

using braid::HostAllReduce;
using braid::PeerInfo;
using braid::Selection;
namespace plan = braid::plan;

// `hosts` hosts (each its own machine of 4 cores) of `perHost` ranks, rank r on host r / perHost.
std::vector<PeerInfo> peersOn(int hosts, int perHost) {
  std::vector<PeerInfo> peers(hosts * perHost);
  for (int r = 0; r < hosts * perHost; ++r) {
    peers[r].rank = r;
    peers[r].hostHash = peers[r].machineHash = 100 + r / perHost;
    peers[r].cpus[0] = 0xF;
    peers[r].numa = 0;
    peers[r].nicGBs = 1.0;
    peers[r].llcBytes = 32 << 20;
  }
  return peers;
}

const braid::FifoGeometry kGeometry{(128 << 10) + sizeof(braid::SlotHeader), 8};

plan::ModelInput allowing(const char* algorithms) {
  plan::ModelInput input = plan::modelInputFromParams();
  input.allowedAlgorithms = plan::allowedAlgorithms(algorithms, "test");
  return input;
}

TEST(Selection, HostsStayContiguousAndEachLeadsWithItsFirstRank) {
  const std::vector<PeerInfo> peers = peersOn(3, 2);
  const Selection s(2, peers, kGeometry, {}, allowing(""));
  const std::vector<int>& order = s.ringOrder();
  ASSERT_EQ(order.size(), 6u);
  EXPECT_EQ(std::set<int>(order.begin(), order.end()).size(), 6u);
  for (size_t i = 0; i + 1 < order.size(); i += 2)
    EXPECT_EQ(order[i] / 2, order[i + 1] / 2) << "a host's ranks apart in the ring";
  ASSERT_EQ(s.hostLeaders().size(), 3u);
  for (size_t h = 0; h < 3; ++h) EXPECT_EQ(s.hostLeaders()[h], order[2 * h]);
  // Rank 2's host holds ranks 2 and 3, in ring order.
  ASSERT_EQ(s.hostRanks().size(), 2u);
  EXPECT_EQ(std::set<int>(s.hostRanks().begin(), s.hostRanks().end()), (std::set<int>{2, 3}));
  EXPECT_NE(s.description().find("model:"), std::string::npos) << s.description();
}

TEST(Selection, OnlyTheRingAllowedPutsEveryClassOnTheRing) {
  const Selection s(0, peersOn(1, 2), kGeometry, {}, allowing("ring"));
  for (braid::HostAllReduceChoice c : s.allReduceTable())
    EXPECT_EQ(c.algorithm, HostAllReduce::Ring);
  EXPECT_EQ(s.directMaxBytes(), 0u);
}

// The table a group's fusing prices calls with: the model's own time at every power of two, and
// between two powers a time between theirs.
TEST(Selection, HostCallTimesAreTheModelsAtPowersOfTwoAndBetweenThem) {
  const Selection s(0, peersOn(2, 2), kGeometry, {}, allowing(""));
  for (plan::Operation op :
       {plan::Operation::AllReduce, plan::Operation::AllGather, plan::Operation::ReduceScatter,
        plan::Operation::Broadcast, plan::Operation::Reduce})
    for (size_t bytes = 1; bytes <= (16u << 20); bytes *= 2) {
      const double at = s.best(op, bytes, plan::DeviceLaunch::Together).us;
      EXPECT_DOUBLE_EQ(s.hostCallUs(op, bytes), at) << static_cast<int>(op) << " " << bytes;
      if (bytes < 4) continue;
      const double below = s.best(op, bytes / 2, plan::DeviceLaunch::Together).us;
      const double between = s.hostCallUs(op, bytes / 4 * 3);
      EXPECT_GE(between, std::min(below, at));
      EXPECT_LE(between, std::max(below, at));
    }
}

// Two ranks on one host: the one-shot exchange wins the small classes, up to one FIFO slot's
// payload at most, and its scratch is the largest class it takes.
TEST(Selection, OneShotClassesBoundTheScratch) {
  const Selection s(0, peersOn(1, 2), kGeometry, {}, allowing("ring,direct"));
  ASSERT_GT(s.directMaxBytes(), 0u);
  EXPECT_LE(s.directMaxBytes(), size_t{128} << 10);
  const braid::HostAllReduceTable& table = s.allReduceTable();
  EXPECT_EQ(table[0].algorithm, HostAllReduce::OneShot);
  for (size_t k = 0; k < table.size(); ++k) {
    const size_t bytes = size_t{1} << std::min<size_t>(k, 47);
    if (table[k].algorithm == HostAllReduce::OneShot) {
      EXPECT_LE(bytes, s.directMaxBytes()) << k;
    }
    if (bytes > (size_t{128} << 10)) {
      EXPECT_EQ(table[k].algorithm, HostAllReduce::Ring) << k;
    }
  }
}

// Bruck's algorithm named: every all-gather class runs it, and every reduce-scatter class whose
// partial sums the scratch can hold (larger ones the ring), which sizes the scratch.
TEST(Selection, BruckReduceScattersSizeTheScratch) {
  plan::ModelInput bruck = allowing("bruck");
  bruck.algorithmsNamed = true;
  const Selection s(0, peersOn(3, 1), kGeometry, {}, bruck);
  for (size_t k = 0; k < s.allGatherBruck().size(); ++k) {
    const size_t bytes = size_t{1} << std::min<size_t>(k, 47);
    EXPECT_TRUE(s.allGatherBruck()[k]) << k;
    EXPECT_EQ(s.reduceScatterBruck()[k], bytes <= plan::kBruckReduceScatterMaxBytes) << k;
  }
  EXPECT_EQ(s.scratchBytes(), plan::kBruckReduceScatterMaxBytes);
  const Selection ring(0, peersOn(3, 1), kGeometry, {}, allowing("ring"));
  EXPECT_EQ(ring.scratchBytes(), 0u);
}

TEST(Selection, TheDeviceModelReplacesTheHostOne) {
  Selection s(0, peersOn(1, 2), kGeometry, {}, allowing(""));
  EXPECT_EQ(s.description().find("device protocols"), std::string::npos);
  plan::ModelInput device = allowing("");
  device.hostRanks = false;
  s.useDeviceModel(device);
  EXPECT_NE(s.description().find("device protocols"), std::string::npos) << s.description();
  // Device ranks on one host run LL for small all-reduces, which host ranks never do.
  EXPECT_EQ(s.best(plan::Operation::AllReduce, 8, plan::DeviceLaunch::Apart).protocol,
            plan::Protocol::LL);
}

}  // namespace

namespace {

TEST(HostChannels, AsManyAsTheBusiestMachinesCoresGiveEachRank) {
  // 4 cores a machine: one rank each gets 4 channels, two ranks 2, three 1 (4 / 3), five 1.
  EXPECT_EQ(braid::hostChannels(peersOn(2, 1), 0, 1, 32), 4);
  EXPECT_EQ(braid::hostChannels(peersOn(2, 2), 0, 1, 32), 2);
  EXPECT_EQ(braid::hostChannels(peersOn(1, 3), 0, 1, 32), 1);
  EXPECT_EQ(braid::hostChannels(peersOn(1, 5), 0, 1, 32), 1);
  // The busiest machine decides: host 0 with 4 ranks, host 1 with 1.
  std::vector<PeerInfo> uneven = peersOn(1, 4);
  uneven.push_back(peersOn(1, 1)[0]);
  uneven.back().hostHash = uneven.back().machineHash = 999;
  EXPECT_EQ(braid::hostChannels(uneven, 0, 1, 32), 1);
  // 64 cores for one rank: no more than kMaxHostChannels.
  std::vector<PeerInfo> big = peersOn(1, 1);
  big[0].cpus[0] = ~uint64_t{0};
  EXPECT_EQ(braid::hostChannels(big, 0, 1, 32), braid::kMaxHostChannels);
}

TEST(HostChannels, ForcedOrBoundedByTheChannelLimits) {
  EXPECT_EQ(braid::hostChannels(peersOn(1, 3), 3, 1, 32), 3);  // BRAID_HOST_NCHANNELS
  EXPECT_EQ(braid::hostChannels(peersOn(2, 1), 0, 1, 2), 2);   // BRAID_MAX_NCHANNELS
  EXPECT_EQ(braid::hostChannels(peersOn(1, 5), 0, 2, 32), 2);  // BRAID_MIN_NCHANNELS
  try {
    braid::hostChannels(peersOn(1, 1), braid::kMaxForcedHostChannels + 1, 1, 32);
    ADD_FAILURE() << "33 CPU channels accepted";
  } catch (const braid::Error& e) {
    EXPECT_EQ(e.code(), braidInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("BRAID_HOST_NCHANNELS=33: at most 32"), std::string::npos)
        << e.what();
  }
}

}  // namespace
