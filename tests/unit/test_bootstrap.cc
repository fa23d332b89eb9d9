// The TCP bootstrap: unique ids, rendezvous of ranks as threads, the ring all-gather and barrier,
// and what strangers, wrong secrets, missing or departed ranks do to it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/socket.h"
#include "core/bootstrap.h"

namespace braid {
namespace {

Clock::time_point in(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Outcome {
  braidResult_t code = braidSuccess;
  std::string message;
};

// Runs body(rank) on one thread per rank; returns how each ended.
std::vector<Outcome> runRanks(int nranks, const std::function<void(int)>& body) {
  std::vector<Outcome> outcomes(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const Error& e) {
        outcomes[r] = {e.code(), e.what()};
      } catch (const std::exception& e) {
        outcomes[r] = {braidInternalError, e.what()};
      }
    });
  for (std::thread& t : threads) t.join();
  return outcomes;
}

void expectAllSucceeded(const std::vector<Outcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r)
    EXPECT_EQ(outcomes[r].code, braidSuccess) << "rank " << r << ": " << outcomes[r].message;
}

// A port nothing listens on, below the kernel's ephemeral range (32768 and up by default) so
// that no other socket is handed it before the test uses it.
uint16_t freePort() {
  std::mt19937 pick(std::random_device{}());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    auto port = static_cast<uint16_t>(20000 + pick() % 12000);
    try {
      Socket::listen(SocketAddress::fromNumeric("127.0.0.1", port, "test"), false);
      return port;
    } catch (const Error&) {
    }
  }
  throw std::runtime_error("no free port in 20000..31999");
}

Outcome outcomeOf(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {};
}

bool sameBytes(const braidUniqueId& a, const braidUniqueId& b) {
  return std::memcmp(a.internal, b.internal, sizeof a.internal) == 0;
}

// ---- ids ----

TEST(BootstrapId, RoundTripsIpv4AndIpv6) {
  for (const char* host : {"192.0.2.7", "fd00::2"}) {
    BootstrapId id;
    id.host = host;
    id.port = 40123;
    for (int i = 0; i < 32; ++i) id.secret[i] = static_cast<uint8_t>(i * 7 + 3);
    id.rootHostedByRank0 = std::string(host) == "fd00::2";
    BootstrapId back = BootstrapId::decode(id.encode());
    EXPECT_EQ(back.host, host);
    EXPECT_EQ(back.port, 40123);
    EXPECT_EQ(std::memcmp(back.secret, id.secret, 32), 0);
    EXPECT_EQ(back.rootHostedByRank0, id.rootHostedByRank0);
  }
}

TEST(BootstrapId, RejectsWhatIsNotOurs) {
  braidUniqueId zeros{};
  Outcome o = outcomeOf([&] { BootstrapId::decode(zeros); });
  EXPECT_EQ(o.code, braidInvalidArgument);
  EXPECT_TRUE(contains(o.message, "not a braid unique id (bad magic")) << o.message;

  braidUniqueId text{};
  std::snprintf(text.internal, sizeof text.internal, "%s", "127.0.0.1:29500");
  EXPECT_EQ(outcomeOf([&] { BootstrapId::decode(text); }).code, braidInvalidArgument);

  BootstrapId id;
  id.host = "10.1.2.3";
  id.port = 5000;
  braidUniqueId newer = id.encode();
  newer.internal[4] = 99;  // format version
  o = outcomeOf([&] { BootstrapId::decode(newer); });
  EXPECT_EQ(o.code, braidInvalidArgument);
  EXPECT_TRUE(contains(o.message, "format version 99")) << o.message;

  braidUniqueId badFamily = id.encode();
  badFamily.internal[6] = 9;  // address family, after magic, version and flags
  o = outcomeOf([&] { BootstrapId::decode(badFamily); });
  EXPECT_EQ(o.code, braidInvalidArgument);
  EXPECT_TRUE(contains(o.message, "address family 9")) << o.message;
}

TEST(BootstrapId, EncodeNeedsANumericHostAndAPort) {
  BootstrapId id;
  id.host = "example.org";
  id.port = 1;
  EXPECT_EQ(outcomeOf([&] { id.encode(); }).code, braidInvalidArgument);
  id.host = "10.0.0.1";
  id.port = 0;
  EXPECT_EQ(outcomeOf([&] { id.encode(); }).code, braidInvalidArgument);
}

TEST(RendezvousId, IsDeterministicAndResolvesTheHost) {
  BootstrapId a = rendezvousId("127.0.0.1:29501", "job-7", "BRAID_COMM_ID");
  BootstrapId b = rendezvousId("127.0.0.1:29501", "job-7", "BRAID_COMM_ID");
  EXPECT_TRUE(sameBytes(a.encode(), b.encode()));
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 29501);
  EXPECT_TRUE(a.rootHostedByRank0);

  BootstrapId other = rendezvousId("127.0.0.1:29501", "job-8", "BRAID_COMM_ID");
  EXPECT_NE(std::memcmp(a.secret, other.secret, 32), 0);

  EXPECT_EQ(rendezvousId("[::1]:7000", "s", "BRAID_COMM_ID").host, "::1");
  BootstrapId named = rendezvousId("localhost:7000", "s", "BRAID_COMM_ID");
  EXPECT_NO_THROW(SocketAddress::fromNumeric(named.host, 7000, "test")) << named.host;
}

TEST(RendezvousId, RejectsMalformedAddresses) {
  for (const char* bad : {"nohost", "h:0", "h:65536", "h:x", ":5", "::1:5", "[::1]5", "[::1"}) {
    Outcome o = outcomeOf([&] { rendezvousId(bad, "s", "BRAID_COMM_ID"); });
    EXPECT_EQ(o.code, braidInvalidArgument) << bad;
    EXPECT_TRUE(contains(o.message, "BRAID_COMM_ID")) << o.message;
  }
}

// makeUniqueId reads parameters cached on first use, so each case runs in a fresh child process.
int checkIdsFromTorchrunVariables() {
  uint16_t port = freePort();
  for (const char* name : {"BRAID_COMM_ID", "BRAID_SECRET", "MASTER_ADDR", "MASTER_PORT"})
    unsetenv(name);
  if (worldIdFromEnv(1)) return std::fprintf(stderr, "an id from an empty environment\n"), 1;
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port - 1).c_str(), 1);
  setenv("TORCHELASTIC_RUN_ID", "run-1", 1);
  BootstrapId a = worldIdFromEnv(1).value();
  BootstrapId b = worldIdFromEnv(1).value();
  BootstrapId second = worldIdFromEnv(2).value();
  setenv("TORCHELASTIC_RUN_ID", "run-2", 1);
  BootstrapId otherJob = worldIdFromEnv(1).value();
  if (!sameBytes(a.encode(), b.encode())) return std::fprintf(stderr, "ids differ\n"), 1;
  if (a.port != port || a.host != "127.0.0.1" || !a.rootHostedByRank0)
    return std::fprintf(stderr, "id %s:%d, hosted %d\n", a.host.c_str(), a.port,
                        a.rootHostedByRank0),
           1;
  if (std::memcmp(a.secret, otherJob.secret, 32) == 0)
    return std::fprintf(stderr, "the job id does not reach the secret\n"), 1;
  if (a.key == second.key || std::memcmp(a.secret, second.secret, 32) != 0)
    return std::fprintf(stderr, "world communicators 1 and 2 are not two of one job\n"), 1;
  // braidGetUniqueId ignores torchrun's variables (NCCL does too): its root is this process's.
  BootstrapId own = makeUniqueId();
  if (own.rootHostedByRank0 || own.port == port)
    return std::fprintf(stderr, "makeUniqueId used MASTER_ADDR/MASTER_PORT\n"), 1;
  std::vector<Outcome> outcomes = runRanks(3, [&](int rank) {
    auto b = Bootstrap::join(a, rank, 3, std::to_string(rank), in(60));
    b->barrier(in(60));
  });
  for (const Outcome& o : outcomes)
    if (o.code != braidSuccess) return std::fprintf(stderr, "%s\n", o.message.c_str()), 1;
  return 0;
}

int checkCommIdAndSecretWin() {
  uint16_t port = freePort();
  setenv("BRAID_COMM_ID", fmt::format("127.0.0.1:{}", port).c_str(), 1);
  setenv("BRAID_SECRET", "shared", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1000", 1);
  setenv("SLURM_JOB_ID", "11", 1);
  BootstrapId a = makeUniqueId();
  setenv("SLURM_JOB_ID", "12", 1);
  BootstrapId b = makeUniqueId();
  BootstrapId world = worldIdFromEnv(1).value();
  if (a.port != port || world.port != port)
    return std::fprintf(stderr, "port %d/%d, expected %d\n", a.port, world.port, port), 1;
  if (std::memcmp(a.secret, b.secret, 32) != 0 || std::memcmp(a.secret, world.secret, 32) != 0)
    return std::fprintf(stderr, "BRAID_SECRET did not replace the job id\n"), 1;
  if (a.key == b.key || a.key == world.key)
    return std::fprintf(stderr, "two unique ids name one communicator\n"), 1;
  return 0;
}

TEST(MakeUniqueIdDeathTest, TorchrunVariablesGiveOneIdPerWorldCommunicator) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(checkIdsFromTorchrunVariables()), ::testing::ExitedWithCode(0), "");
}

TEST(MakeUniqueIdDeathTest, CommIdAndSecretTakePrecedenceAndEveryIdIsANewCommunicator) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(checkCommIdAndSecretWin()), ::testing::ExitedWithCode(0), "");
}

// ---- interfaces ----

TEST(Interfaces, FilterSyntaxFollowsNccl) {
  EXPECT_TRUE(interfaceMatches("eth0", "eth"));
  EXPECT_TRUE(interfaceMatches("docker0", "eth,docker"));
  EXPECT_FALSE(interfaceMatches("ib0", "eth,docker"));
  EXPECT_FALSE(interfaceMatches("eth0", "^eth"));
  EXPECT_TRUE(interfaceMatches("ib0", "^eth"));
  EXPECT_FALSE(interfaceMatches("eth0", "=eth"));
  EXPECT_TRUE(interfaceMatches("eth", "=eth"));
  EXPECT_FALSE(interfaceMatches("eth1", "^=eth0,eth1"));
  EXPECT_TRUE(interfaceMatches("eth10", "^=eth0,eth1"));
}

TEST(Interfaces, FindsLoopbackByNameAndRefusesUnknownNames) {
  std::vector<NetInterface> lo = findInterfaces("=lo");
  ASSERT_FALSE(lo.empty());
  EXPECT_EQ(lo.front().name, "lo");
  EXPECT_EQ(lo.front().address.host(), "127.0.0.1");

  Outcome o = outcomeOf([] { findInterfaces("nosuchinterface"); });
  EXPECT_EQ(o.code, braidInvalidArgument);
  EXPECT_TRUE(contains(o.message, "BRAID_SOCKET_IFNAME='nosuchinterface'")) << o.message;

  for (const NetInterface& i : findInterfaces("")) {
    EXPECT_FALSE(i.name.starts_with("docker") || i.name.starts_with("virbr")) << i.name;
    EXPECT_EQ(i.address.family(), findInterfaces("").front().address.family()) << i.name;
  }
}

// ---- rendezvous ----

uint8_t pattern(int rank, size_t i) {
  return static_cast<uint8_t>((rank + 1) * 131 + i * 7 + (i >> 8) * 13);
}

class Rendezvous : public ::testing::TestWithParam<int> {};

TEST_P(Rendezvous, PublishesInfosAndGathersAndBarriers) {
  const int nranks = GetParam();
  BootstrapId id = startRootInThisProcess();
  auto infoOf = [](int rank) { return fmt::format("info-of-rank-{:05}", rank * 37); };
  expectAllSucceeded(runRanks(nranks, [&](int rank) {
    std::unique_ptr<Bootstrap> b = Bootstrap::join(id, rank, nranks, infoOf(rank), in(60));
    EXPECT_EQ(b->rank(), rank);
    EXPECT_EQ(b->nranks(), nranks);
    ASSERT_EQ(b->infos().size(), static_cast<size_t>(nranks));
    for (int k = 0; k < nranks; ++k) EXPECT_EQ(b->infos()[k], infoOf(k));
    for (size_t bytes : {size_t(0), size_t(1), size_t(24), size_t(1) << 20}) {
      std::vector<uint8_t> data(nranks * bytes, 0xEE);
      for (size_t i = 0; i < bytes; ++i) data[rank * bytes + i] = pattern(rank, i);
      b->allGather(data.data(), bytes, in(60));
      size_t wrong = 0;
      for (int k = 0; k < nranks; ++k)
        for (size_t i = 0; i < bytes; ++i) wrong += data[k * bytes + i] != pattern(k, i);
      EXPECT_EQ(wrong, 0u) << "rank " << rank << ", " << bytes << " bytes per rank";
      b->barrier(in(60));
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, Rendezvous, ::testing::Values(1, 2, 3, 8));

TEST(Bootstrap, RankZeroHostsTheRootOfAnEnvironmentId) {
  BootstrapId id = rendezvousId(fmt::format("127.0.0.1:{}", freePort()), "seed", "test");
  expectAllSucceeded(runRanks(3, [&](int rank) {
    auto b = Bootstrap::join(id, rank, 3, std::string(3, char('a' + rank)), in(60));
    EXPECT_EQ(b->infos()[2], "ccc");
    b->barrier(in(60));
  }));
}

TEST(Bootstrap, OneRankOfAnEnvironmentIdNeedsNoSockets) {
  BootstrapId id = rendezvousId("127.0.0.1:1", "seed", "test");  // port 1: nobody could bind it
  auto b = Bootstrap::join(id, 0, 1, "solo", in(10));
  ASSERT_EQ(b->infos().size(), 1u);
  EXPECT_EQ(b->infos()[0], "solo");
  uint32_t value = 42;
  b->allGather(&value, sizeof value, in(10));
  b->barrier(in(10));
  EXPECT_EQ(value, 42u);
}

TEST(Bootstrap, StrangersAtTheRootAreDroppedAndTheRendezvousCompletes) {
  BootstrapId id = startRootInThisProcess();
  SocketAddress root = SocketAddress::fromNumeric(id.host, id.port, "test");
  // Garbage is dropped at once; silence after the hello timeout. Both while the root still
  // waits for its ranks.
  for (bool sendGarbage : {true, false}) {
    Socket stranger = Socket::connect(root, "the root", in(10), "stranger");
    if (sendGarbage) {
      std::string junk(300, 'x');
      stranger.sendAll(junk.data(), junk.size(), in(10), "stranger");
    }
    char byte;
    Outcome o = outcomeOf([&] { stranger.recvAll(&byte, 1, in(30), "stranger"); });
    EXPECT_EQ(o.code, braidRemoteError) << o.message;
  }
  Socket silentDuringRendezvous = Socket::connect(root, "the root", in(10), "stranger");
  Socket truncated = Socket::connect(root, "the root", in(10), "stranger");
  truncated.sendAll("braid", 5, in(10), "stranger");
  expectAllSucceeded(
      runRanks(3, [&](int rank) { Bootstrap::join(id, rank, 3, "x", in(60))->barrier(in(60)); }));
}

TEST(Bootstrap, WrongSecretIsRefusedAndTheJobGoesOn) {
  BootstrapId id = startRootInThisProcess();
  BootstrapId forged = id;
  forged.secret[5] ^= 0x10;
  Outcome o = outcomeOf([&] { Bootstrap::join(forged, 1, 2, "x", in(10)); });
  EXPECT_EQ(o.code, braidRemoteError);
  EXPECT_TRUE(contains(o.message, "bootstrap rank 1 of 2")) << o.message;
  EXPECT_TRUE(contains(o.message, "secret")) << o.message;
  expectAllSucceeded(runRanks(2, [&](int rank) { Bootstrap::join(id, rank, 2, "x", in(60)); }));
}

TEST(Bootstrap, RankOfAnotherCommunicatorIsRefusedNamingBoth) {
  BootstrapId id = startRootInThisProcess();
  BootstrapId other = id;  // the job's secret, another communicator
  other.key[3] ^= 0x40;
  Outcome o = outcomeOf([&] { Bootstrap::join(other, 1, 3, "x", in(10)); });
  EXPECT_EQ(o.code, braidInvalidUsage);
  EXPECT_TRUE(contains(o.message, "rank 1 of communicator ")) << o.message;
  EXPECT_TRUE(contains(o.message, "which serves communicator ")) << o.message;
  EXPECT_TRUE(contains(o.message, "cannot meet")) << o.message;
  expectAllSucceeded(runRanks(2, [&](int rank) { Bootstrap::join(id, rank, 2, "x", in(60)); }));
}

// The job's service (an environment-given address) serves several communicators at once: each
// rank meets the ranks of its own communicator only, whatever the interleaving of arrivals.
TEST(Bootstrap, TheJobServiceKeepsConcurrentCommunicatorsApart) {
  const std::vector<int> sizes = {2, 3, 2};
  std::vector<BootstrapId> ids;
  const std::string address = fmt::format("127.0.0.1:{}", freePort());
  for (size_t c = 0; c < sizes.size(); ++c) {
    ids.push_back(rendezvousId(address, "job", "test"));
    ids.back().key[0] = static_cast<uint8_t>(c);
  }
  std::vector<std::pair<int, int>> members;  // (communicator, rank) per thread
  for (size_t c = 0; c < sizes.size(); ++c)
    for (int r = 0; r < sizes[c]; ++r) members.push_back({static_cast<int>(c), r});
  expectAllSucceeded(runRanks(static_cast<int>(members.size()), [&](int thread) {
    const auto [c, rank] = members[thread];
    auto b = Bootstrap::join(ids[c], rank, sizes[c], fmt::format("c{}r{}", c, rank), in(60));
    for (int k = 0; k < sizes[c]; ++k) EXPECT_EQ(b->infos()[k], fmt::format("c{}r{}", c, k));
    std::vector<int32_t> all(sizes[c]);
    all[rank] = 100 * c + rank;
    b->allGather(all.data(), sizeof(int32_t), in(60));
    for (int k = 0; k < sizes[c]; ++k) EXPECT_EQ(all[k], 100 * c + k);
  }));
}

TEST(Bootstrap, MissingRankIsNamedByTheOthersAtTheDeadline) {
  BootstrapId id = startRootInThisProcess();
  std::vector<Outcome> outcomes = runRanks(4, [&](int rank) {
    if (rank != 2) Bootstrap::join(id, rank, 4, "x", in(1.5));
  });
  for (int rank : {0, 1, 3}) {
    EXPECT_EQ(outcomes[rank].code, braidTimeout) << outcomes[rank].message;
    EXPECT_TRUE(contains(outcomes[rank].message, "never arrived")) << outcomes[rank].message;
    EXPECT_TRUE(contains(outcomes[rank].message, ": rank 2")) << outcomes[rank].message;
  }
}

TEST(Bootstrap, UnreachableRootIsATimeout) {
  BootstrapId id;
  id.host = "127.0.0.1";
  id.port = freePort();
  Outcome o = outcomeOf([&] { Bootstrap::join(id, 1, 2, "x", in(0.3)); });
  EXPECT_EQ(o.code, braidTimeout);
  EXPECT_TRUE(contains(o.message, "could not connect to the bootstrap root")) << o.message;
}

TEST(Bootstrap, RanksDisagreeingOnNranksAreAllTold) {
  BootstrapId id = startRootInThisProcess();
  std::vector<Outcome> outcomes =
      runRanks(2, [&](int rank) { Bootstrap::join(id, rank, rank == 0 ? 2 : 3, "x", in(30)); });
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.code, braidInvalidArgument) << o.message;
    EXPECT_TRUE(contains(o.message, "nranks=3")) << o.message;
  }
}

TEST(Bootstrap, RanksDisagreeingOnInfoSizeAreAllTold) {
  BootstrapId id = startRootInThisProcess();
  std::vector<Outcome> outcomes = runRanks(
      2, [&](int rank) { Bootstrap::join(id, rank, 2, std::string(rank + 1, 'i'), in(30)); });
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.code, braidInvalidArgument) << o.message;
    EXPECT_TRUE(contains(o.message, "bytes of info")) << o.message;
  }
}

TEST(Bootstrap, DuplicateRankIsRefusedAndTheFirstOneStays) {
  BootstrapId id = startRootInThisProcess();
  // Two rank 0s: the later one is refused at once; then rank 1 completes the job.
  std::promise<void> duplicateRefused;
  std::vector<Outcome> outcomes = runRanks(3, [&](int thread) {
    if (thread == 2) {
      duplicateRefused.get_future().wait();
      Bootstrap::join(id, 1, 2, "x", in(30));
      return;
    }
    try {
      Bootstrap::join(id, 0, 2, "x", in(30));
    } catch (const Error&) {
      duplicateRefused.set_value();
      throw;
    }
  });
  EXPECT_EQ(outcomes[2].code, braidSuccess) << outcomes[2].message;
  const Outcome& refused = outcomes[0].code == braidSuccess ? outcomes[1] : outcomes[0];
  const Outcome& kept = outcomes[0].code == braidSuccess ? outcomes[0] : outcomes[1];
  EXPECT_EQ(kept.code, braidSuccess) << kept.message;
  EXPECT_EQ(refused.code, braidInvalidArgument) << refused.message;
  EXPECT_TRUE(contains(refused.message, "rank 0 joined twice")) << refused.message;
}

TEST(Bootstrap, AllGatherSizeMismatchIsAnError) {
  BootstrapId id = startRootInThisProcess();
  std::vector<Outcome> outcomes = runRanks(2, [&](int rank) {
    auto b = Bootstrap::join(id, rank, 2, "x", in(30));
    std::vector<char> data(16);
    b->allGather(data.data(), rank == 0 ? 4 : 8, in(30));
  });
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.code, braidInvalidArgument) << o.message;
    EXPECT_TRUE(contains(o.message, "bytes per rank")) << o.message;
  }
}

TEST(Bootstrap, DepartedPeerIsARemoteError) {
  BootstrapId id = startRootInThisProcess();
  std::promise<void> rank1Gone;
  expectAllSucceeded(runRanks(2, [&](int rank) {
    auto b = Bootstrap::join(id, rank, 2, "x", in(30));
    if (rank == 1) {
      b.reset();
      rank1Gone.set_value();
      return;
    }
    rank1Gone.get_future().wait();
    std::vector<char> data(2);
    Outcome o = outcomeOf([&] { b->allGather(data.data(), 1, in(30)); });
    EXPECT_EQ(o.code, braidRemoteError) << o.message;
    EXPECT_TRUE(contains(o.message, "bootstrap rank 0 of 2")) << o.message;
    EXPECT_TRUE(contains(o.message, "rank 1 (")) << o.message;
  }));
}

TEST(Bootstrap, SilentPeerIsATimeoutNamingIt) {
  BootstrapId id = startRootInThisProcess();
  std::promise<void> gaveUp;
  std::shared_future<void> gaveUpFuture = gaveUp.get_future().share();
  expectAllSucceeded(runRanks(2, [&](int rank) {
    auto b = Bootstrap::join(id, rank, 2, "x", in(30));
    if (rank == 1) return gaveUpFuture.wait();  // alive, but never joins the barrier
    Outcome o = outcomeOf([&] { b->barrier(in(0.3)); });
    gaveUp.set_value();
    EXPECT_EQ(o.code, braidTimeout) << o.message;
    EXPECT_TRUE(contains(o.message, "timed out waiting for rank 1 (")) << o.message;
  }));
}

TEST(Bootstrap, JoinChecksItsArguments) {
  BootstrapId id = rendezvousId("127.0.0.1:1", "seed", "test");
  EXPECT_EQ(outcomeOf([&] { Bootstrap::join(id, 0, 0, "", in(1)); }).code, braidInvalidArgument);
  EXPECT_EQ(outcomeOf([&] { Bootstrap::join(id, 2, 2, "", in(1)); }).code, braidInvalidArgument);
  EXPECT_EQ(outcomeOf([&] { Bootstrap::join(id, 0, 1, std::string(1 << 17, 'x'), in(1)); }).code,
            braidInvalidArgument);
}

}  // namespace
}  // namespace braid
