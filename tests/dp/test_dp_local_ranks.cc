// examples/local_ranks.h, which the dp tests and examples/train_mlp launch ranks with: results
// come back from processes byte for byte, and a rank that fails or dies is reported as such while
// its peers fail instead of hanging.
#include <gtest/gtest.h>

#include <csignal>
#include <string>

#include "local_ranks.h"

namespace {

using local_ranks::Launch;

// One all-reduce; a failure is thrown as "all-reduce: <braid's message>".
std::string allReduceOne(braidComm_t comm) {
  float value = 1;
  if (braidAllReduce(&value, &value, 1, braidFloat32, braidSum, comm, nullptr) != braidSuccess)
    throw std::runtime_error(std::string("all-reduce: ") + braidGetLastError(nullptr));
  return "finished";
}

class LocalRanks : public testing::TestWithParam<Launch> {};

// Each rank returns its rank and the sum of all ranks, with a zero byte and a byte from every
// value in the middle, so a truncated or text-mangled result cannot pass.
TEST_P(LocalRanks, ResultsComeBackPerRank) {
  const int nranks = 3;
  const local_ranks::Outcome out =
      local_ranks::run(nranks, GetParam(), 10000, [](braidComm_t comm, int rank) {
        int sum = rank;
        if (braidAllReduce(&sum, &sum, 1, braidInt32, braidSum, comm, nullptr) != braidSuccess)
          throw std::runtime_error(braidGetLastError(nullptr));
        std::string bytes = "rank " + std::to_string(rank) + " sum " + std::to_string(sum);
        bytes += '\0';
        for (int b = 0; b < 256; ++b) bytes += static_cast<char>(b);
        return bytes;
      });
  ASSERT_EQ(out.joinedErrors(), "");
  for (int rank = 0; rank < nranks; ++rank) {
    std::string expected = "rank " + std::to_string(rank) + " sum 3";
    expected += '\0';
    for (int b = 0; b < 256; ++b) expected += static_cast<char>(b);
    EXPECT_EQ(out.results[rank], expected);
  }
}

// Rank 1 throws before the all-reduce its peers wait in: its own message is its error, and the
// peers' all-reduce fails (the thrower aborts its communicator) rather than hanging.
TEST_P(LocalRanks, AFailedRankFailsItsPeers) {
  const local_ranks::Outcome out =
      local_ranks::run(3, GetParam(), 10000, [](braidComm_t comm, int rank) {
        if (rank == 1) throw std::runtime_error("planted failure on rank 1");
        return allReduceOne(comm);
      });
  EXPECT_EQ(out.errors[1], "planted failure on rank 1");
  for (int rank : {0, 2}) {
    EXPECT_NE(out.errors[rank].find("all-reduce: "), std::string::npos) << out.errors[rank];
    EXPECT_EQ(out.results[rank], "");
  }
}

INSTANTIATE_TEST_SUITE_P(Launches, LocalRanks,
                         testing::Values(Launch::kThreads, Launch::kProcesses),
                         [](const testing::TestParamInfo<Launch>& info) {
                           return info.param == Launch::kThreads ? "threads" : "processes";
                         });

// A rank's process killed by a signal is named as such; its peers fail instead of hanging.
TEST(LocalRanksProcesses, AKilledRankIsReported) {
  const local_ranks::Outcome out =
      local_ranks::run(2, Launch::kProcesses, 10000, [](braidComm_t comm, int rank) {
        if (rank == 0) raise(SIGKILL);
        return allReduceOne(comm);
      });
  EXPECT_EQ(out.errors[0], "its process was killed by signal 9 (Killed)");
  EXPECT_NE(out.errors[1].find("all-reduce: "), std::string::npos) << out.errors[1];
}

}  // namespace
