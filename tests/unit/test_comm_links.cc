// A communicator's links (core/comm_links.h), ranks as threads of this process over a real
// bootstrap root and the in-process transport: the rendezvous's facts, the connectors, a child
// sharing its parent's links with its ranks reordered, the turn numbers the sharers share, a
// rank whose settings differ refused by name, and the exchanges out of band (all-gathers, shrunk
// communicators' ids).
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "core/comm_links.h"

namespace {

using braid::Clock;
using braid::CommLinks;
using braid::PeerInfo;

Clock::time_point in30s() {
  return Clock::now() + std::chrono::seconds(30);
}

PeerInfo factsOf(int rank, uint64_t choiceHash = 7) {
  PeerInfo p;
  p.hostHash = p.machineHash = 42;
  p.nonce = 1000 + rank;
  p.pid = static_cast<int32_t>(getpid());
  p.rank = rank;
  p.cpus[0] = 0x3;
  p.choiceHash = choiceHash;
  return p;
}

// body(rank) on a thread per rank; the errors each rank ended with ("" where none).
std::vector<std::string> onRanks(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const braid::Error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

const braid::FifoGeometry kGeometry{64 << 10, 4};

TEST(CommLinks, RanksMeetConnectAndAChildSharesTheLinks) {
  const braid::BootstrapId id = braid::startRootInThisProcess();
  std::vector<CommLinks> parents, children;
  for (int r = 0; r < 2; ++r) {
    parents.emplace_back(r, 2);
    children.emplace_back(r, 2);
  }
  const std::vector<int> reversed = {1, 0};  // the child's rank r is the parent's 1 - r
  const std::vector<std::string> errors = onRanks(2, [&](int r) {
    parents[r].meet(id, factsOf(r), "settings", in30s());
    parents[r].connect(nullptr, {}, kGeometry, std::chrono::seconds(5), in30s());
    children[r].connect(&parents[r], reversed, kGeometry, std::chrono::seconds(5), in30s());
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  for (int r = 0; r < 2; ++r) {
    const CommLinks& parent = parents[r];
    ASSERT_EQ(parent.peers().size(), 2u);
    EXPECT_EQ(parent.peers()[1 - r].nonce, 1000u + (1 - r));  // the peer's facts, as published
    ASSERT_EQ(parent.sendTo().size(), 2u);
    EXPECT_NE(parent.sendTo()[1 - r], nullptr);
    EXPECT_NE(parent.recvFrom()[1 - r], nullptr);
    EXPECT_TRUE(parent.hasControls());  // one host: every rank's control block
    EXPECT_EQ(parent.linkIndex(1 - r), 1 - r);
    const CommLinks& child = children[r];
    EXPECT_TRUE(child.sharedWith(parent));
    EXPECT_FALSE(parent.sharedWith(parent));
    EXPECT_FALSE(parent.sharedWith(parents[1 - r]));  // another rank's links
    for (int c = 0; c < 2; ++c) {
      EXPECT_EQ(child.linkIndex(c), reversed[c]);
      EXPECT_EQ(child.sendTo()[c], parent.sendTo()[reversed[c]]);
      EXPECT_EQ(child.control(c), parent.control(reversed[c]));
    }
    EXPECT_EQ(&child.turn(), &parent.turn());
  }
  // The sharers number their operations together.
  EXPECT_EQ(parents[0].nextOperation(), 1u);
  EXPECT_EQ(children[0].nextOperation(), 2u);
  EXPECT_EQ(parents[0].nextOperation(), 3u);
  EXPECT_EQ(parents[1].nextOperation(), 1u);  // rank 1's own links
}

TEST(CommLinks, ARankChoosingFromOtherSettingsIsRefusedByName) {
  const braid::BootstrapId id = braid::startRootInThisProcess();
  std::vector<CommLinks> links;
  for (int r = 0; r < 2; ++r) links.emplace_back(r, 2);
  const std::vector<std::string> errors = onRanks(2, [&](int r) {
    links[r].meet(id, factsOf(r, r == 1 ? 8 : 7), "algorithms 'ring'", in30s());
  });
  EXPECT_NE(errors[0].find("rank 0: rank 1 chooses algorithms from other settings than this "
                           "rank's (algorithms 'ring')"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 1: rank 0 chooses algorithms from other settings"),
            std::string::npos)
      << errors[1];
}

TEST(CommLinks, OutOfBandAllGatherGivesEveryRankEverySlice) {
  constexpr int kRanks = 3;
  const braid::BootstrapId id = braid::startRootInThisProcess();
  std::vector<CommLinks> links;
  for (int r = 0; r < kRanks; ++r) links.emplace_back(r, kRanks);
  std::vector<std::vector<uint64_t>> gathered(kRanks, std::vector<uint64_t>(kRanks, ~0ull));
  const std::vector<std::string> errors = onRanks(kRanks, [&](int r) {
    links[r].meet(id, factsOf(r), "settings", in30s());
    links[r].connect(nullptr, {}, kGeometry, std::chrono::seconds(5), in30s());
    gathered[r][r] = 100 + r * r;
    links[r].allGatherOutOfBand(gathered[r].data(), sizeof(uint64_t), std::chrono::seconds(30));
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(gathered[r], (std::vector<uint64_t>{100, 101, 104})) << "rank " << r;
}

// Each shrink of one survivor set is a new communicator, numbered alike on every rank that asks,
// whatever other sets it shrank to between. Asked of ranks that root none of these sets (a set's
// first survivor would start a root); rank 0 is no member of {1, 2}, and only members call in a
// real shrink, but the id it derives is what a member that had shrunk alike would.
TEST(CommLinks, ShrunkIdsAreCountedPerSurvivorSet) {
  constexpr int kRanks = 3;
  const braid::BootstrapId id = braid::startRootInThisProcess();
  std::vector<CommLinks> links;
  for (int r = 0; r < kRanks; ++r) links.emplace_back(r, kRanks);
  const std::vector<std::string> errors = onRanks(kRanks, [&](int r) {
    links[r].meet(id, factsOf(r), "settings", in30s());
    links[r].connect(nullptr, {}, kGeometry, std::chrono::seconds(5), in30s());
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  const std::vector<int> a = {1, 2}, b = {0, 2};
  const braid::BootstrapId a1 = links[2].shrunkId(a);
  const braid::BootstrapId b1 = links[2].shrunkId(b);
  const braid::BootstrapId a2 = links[2].shrunkId(a);
  EXPECT_NE(a1.key, a2.key);
  EXPECT_NE(a1.key, b1.key);
  EXPECT_NE(a1.key, id.key);
  EXPECT_EQ(links[0].shrunkId(a).key, a1.key);
  EXPECT_EQ(links[0].shrunkId(a).key, a2.key);  // b's shrink on rank 2 did not count for a
}

}  // namespace
