// The public API around the collectives: argument errors and the sentences that explain them,
// result strings, version, communicator queries, host streams, group semantics, finalize/destroy
// and abort. Only braid.h is used.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "multirank/grid_common.h"
#include "multirank/rank_launcher.h"

namespace braid_test {
namespace {

constexpr std::chrono::seconds kStallLimit(2 * kOpTimeoutMs / 1000);

std::string lastError(braidComm_t comm) {
  const char* sentence = braidGetLastError(comm);
  return sentence ? sentence : "";
}

// True when `sentence` names rank (or peer) `rank`, as in "rank 1", "rank=1" or "peer 1".
bool namesRank(const std::string& sentence, int rank) {
  const std::regex pattern("(rank|peer)[ =:#]*" + std::to_string(rank) + "\\b", std::regex::icase);
  return std::regex_search(sentence, pattern);
}

// Expects braidInvalidArgument with a last-error sentence (of `comm`, or of this thread when comm
// is null) that names one of `argumentNames`, contains `found` (what was passed; may be empty)
// and, when rank >= 0, names the rank.
void expectInvalidArgument(braidResult_t result, braidComm_t comm,
                           std::vector<std::string> argumentNames, const std::string& found,
                           int rank) {
  EXPECT_EQ(result, braidInvalidArgument) << describeResult(result, comm);
  const std::string sentence = lastError(comm);
  bool named = false;
  for (const std::string& name : argumentNames) named |= sentence.find(name) != std::string::npos;
  EXPECT_TRUE(named) << "the sentence names none of " << testing::PrintToString(argumentNames)
                     << ": \"" << sentence << "\"";
  if (!found.empty()) {
    EXPECT_NE(sentence.find(found), std::string::npos) << found << " not in \"" << sentence << "\"";
  }
  if (rank >= 0) {
    EXPECT_TRUE(namesRank(sentence, rank))
        << "rank " << rank << " not named: \"" << sentence << "\"";
  }
}

// Two communicators of this thread (braidCommInitAll), for calls that fail before they talk to a
// peer. Calls that must succeed on both ranks go through one group.
class Arguments : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(braidCommInitAll(comms_, 2, nullptr), braidSuccess) << lastError(nullptr);
  }
  void TearDown() override {
    for (braidComm_t comm : comms_) {
      EXPECT_EQ(braidCommDestroy(comm), braidSuccess) << lastError(comm);
    }
  }

  braidComm_t comms_[2] = {};
  float send_[8] = {};
  float recv_[8] = {};
};

TEST_F(Arguments, NullCommunicator) {
  expectInvalidArgument(braidAllReduce(send_, recv_, 4, braidFloat32, braidSum, nullptr, nullptr),
                        nullptr, {"comm"}, "", -1);
  int count = 0;
  expectInvalidArgument(braidCommCount(nullptr, &count), nullptr, {"comm"}, "", -1);
}

TEST_F(Arguments, NullBufferWithElements) {
  braidComm_t rank1 = comms_[1];
  expectInvalidArgument(braidAllReduce(nullptr, recv_, 4, braidFloat32, braidSum, rank1, nullptr),
                        rank1, {"sendbuff"}, "", 1);
  expectInvalidArgument(braidAllReduce(send_, nullptr, 4, braidFloat32, braidSum, rank1, nullptr),
                        rank1, {"recvbuff"}, "", 1);
  expectInvalidArgument(
      braidReduceScatter(send_, nullptr, 4, braidFloat32, braidSum, rank1, nullptr), rank1,
      {"recvbuff"}, "", 1);
  expectInvalidArgument(braidAllGather(nullptr, recv_, 4, braidFloat32, rank1, nullptr), rank1,
                        {"sendbuff"}, "", 1);
  expectInvalidArgument(braidBroadcast(nullptr, recv_, 4, braidFloat32, 1, rank1, nullptr), rank1,
                        {"sendbuff"}, "", 1);
  expectInvalidArgument(braidSend(nullptr, 4, braidFloat32, 0, rank1, nullptr), rank1, {"sendbuff"},
                        "", 1);
  expectInvalidArgument(braidRecv(nullptr, 4, braidFloat32, 0, rank1, nullptr), rank1, {"recvbuff"},
                        "", 1);
}

TEST_F(Arguments, UnknownDatatypeAndOp) {
  braidComm_t rank1 = comms_[1];
  const auto badType = static_cast<braidDataType_t>(42);
  const auto badOp = static_cast<braidRedOp_t>(42);
  expectInvalidArgument(braidAllReduce(send_, recv_, 4, badType, braidSum, rank1, nullptr), rank1,
                        {"datatype", "dtype"}, "42", 1);
  expectInvalidArgument(braidSend(send_, 4, badType, 0, rank1, nullptr), rank1,
                        {"datatype", "dtype"}, "42", 1);
  expectInvalidArgument(braidAllReduce(send_, recv_, 4, braidFloat32, badOp, rank1, nullptr), rank1,
                        {"op"}, "42", 1);
  expectInvalidArgument(braidReduce(send_, recv_, 4, braidFloat32, badOp, 0, rank1, nullptr), rank1,
                        {"op"}, "42", 1);
}

TEST_F(Arguments, RootOutOfRange) {
  braidComm_t rank1 = comms_[1];
  expectInvalidArgument(braidBroadcast(send_, recv_, 4, braidFloat32, 2, rank1, nullptr), rank1,
                        {"root"}, "2", 1);
  expectInvalidArgument(braidBroadcast(send_, recv_, 4, braidFloat32, -1, rank1, nullptr), rank1,
                        {"root"}, "-1", 1);
  expectInvalidArgument(braidReduce(send_, recv_, 4, braidFloat32, braidSum, 2, rank1, nullptr),
                        rank1, {"root"}, "2", 1);
}

TEST_F(Arguments, PeerOutOfRange) {
  braidComm_t rank1 = comms_[1];
  expectInvalidArgument(braidSend(send_, 4, braidFloat32, 2, rank1, nullptr), rank1, {"peer"}, "2",
                        1);
  expectInvalidArgument(braidRecv(recv_, 4, braidFloat32, -1, rank1, nullptr), rank1, {"peer"},
                        "-1", 1);
}

TEST_F(Arguments, CountOverflow) {
  braidComm_t rank1 = comms_[1];
  expectInvalidArgument(
      braidAllReduce(send_, recv_, SIZE_MAX, braidFloat32, braidSum, rank1, nullptr), rank1,
      {"count"}, "", 1);
  // nranks * count overflows although count * element size alone does not.
  constexpr size_t kHalfAddressSpace = SIZE_MAX / 2 + 1;
  expectInvalidArgument(braidAllGather(send_, recv_, kHalfAddressSpace, braidInt8, rank1, nullptr),
                        rank1, {"count"}, "", 1);
  expectInvalidArgument(
      braidReduceScatter(send_, recv_, kHalfAddressSpace, braidInt8, braidSum, rank1, nullptr),
      rank1, {"count"}, "", 1);
  expectInvalidArgument(braidSend(send_, SIZE_MAX, braidFloat64, 0, rank1, nullptr), rank1,
                        {"count"}, "", 1);
}

// In place means exactly nccl.h's position: recvbuff == sendbuff + rank * recvcount for
// reduce-scatter, sendbuff == recvbuff + rank * sendcount for all-gather. Other overlaps are
// errors.
TEST_F(Arguments, OverlapOutsideTheInPlacePosition) {
  braidComm_t rank1 = comms_[1];
  float buffer[8] = {};
  expectInvalidArgument(
      braidReduceScatter(buffer, buffer + 1, 4, braidFloat32, braidSum, rank1, nullptr), rank1,
      {"recvbuff", "sendbuff"}, "", 1);
  expectInvalidArgument(
      braidReduceScatter(buffer, buffer, 4, braidFloat32, braidSum, rank1, nullptr), rank1,
      {"recvbuff", "sendbuff"}, "", 1);  // rank 0's block
  expectInvalidArgument(braidAllGather(buffer + 1, buffer, 4, braidFloat32, rank1, nullptr), rank1,
                        {"recvbuff", "sendbuff"}, "", 1);
  expectInvalidArgument(braidAllGather(buffer, buffer, 4, braidFloat32, rank1, nullptr), rank1,
                        {"recvbuff", "sendbuff"}, "", 1);  // rank 0's block
}

TEST_F(Arguments, ZeroCountAcceptsNullBuffers) {
  auto bothRanks = [&](const char* what, auto call) {
    ASSERT_EQ(braidGroupStart(), braidSuccess);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(call(rank, comms_[rank]), braidSuccess)
          << what << " rank " << rank << ": " << lastError(comms_[rank]);
    }
    EXPECT_EQ(braidGroupEnd(), braidSuccess) << what << ": " << lastError(nullptr);
  };
  bothRanks("allreduce", [](int, braidComm_t comm) {
    return braidAllReduce(nullptr, nullptr, 0, braidFloat32, braidSum, comm, nullptr);
  });
  bothRanks("reducescatter", [](int, braidComm_t comm) {
    return braidReduceScatter(nullptr, nullptr, 0, braidFloat32, braidMax, comm, nullptr);
  });
  bothRanks("allgather", [](int, braidComm_t comm) {
    return braidAllGather(nullptr, nullptr, 0, braidInt8, comm, nullptr);
  });
  bothRanks("broadcast", [](int, braidComm_t comm) {
    return braidBroadcast(nullptr, nullptr, 0, braidFloat64, 1, comm, nullptr);
  });
  bothRanks("reduce", [](int, braidComm_t comm) {
    return braidReduce(nullptr, nullptr, 0, braidBfloat16, braidAvg, 0, comm, nullptr);
  });
  bothRanks("send/recv", [](int rank, braidComm_t comm) {
    const braidResult_t sent = braidSend(nullptr, 0, braidUint8, 1 - rank, comm, nullptr);
    return sent != braidSuccess ? sent : braidRecv(nullptr, 0, braidUint8, 1 - rank, comm, nullptr);
  });
}

TEST(Results, EveryCodeHasItsOwnString) {
  std::set<std::string> seen;
  for (int code = braidSuccess; code < braidNumResults; ++code) {
    const char* text = braidGetErrorString(static_cast<braidResult_t>(code));
    ASSERT_NE(text, nullptr) << "code " << code;
    EXPECT_STRNE(text, "") << "code " << code;
    EXPECT_TRUE(seen.insert(text).second) << "code " << code << " repeats \"" << text << "\"";
  }
  EXPECT_NE(braidGetErrorString(static_cast<braidResult_t>(1000)), nullptr);
}

TEST(Version, MatchesTheHeader) {
  int version = -1;
  ASSERT_EQ(braidGetVersion(&version), braidSuccess);
  EXPECT_EQ(version, BRAID_VERSION_CODE);
  EXPECT_EQ(braidGetVersion(nullptr), braidInvalidArgument);
}

TEST(CommQueries, CountAndRankOfInitAll) {
  braidComm_t comms[3] = {};
  ASSERT_EQ(braidCommInitAll(comms, 3, nullptr), braidSuccess) << lastError(nullptr);
  for (int rank = 0; rank < 3; ++rank) {
    int count = -1, userRank = -1;
    EXPECT_EQ(braidCommCount(comms[rank], &count), braidSuccess);
    EXPECT_EQ(braidCommUserRank(comms[rank], &userRank), braidSuccess);
    EXPECT_EQ(count, 3);
    EXPECT_EQ(userRank, rank);
  }
  EXPECT_EQ(braidCommCount(comms[0], nullptr), braidInvalidArgument);
  EXPECT_EQ(braidCommUserRank(comms[0], nullptr), braidInvalidArgument);
  for (braidComm_t comm : comms) EXPECT_EQ(braidCommDestroy(comm), braidSuccess);
}

// Runs `program` on nranks ranks in each launch mode and reports every failure.
void runAs(std::initializer_list<Launch> launches, int nranks, const RankProgram& program) {
  for (Launch how : launches) {
    for (const std::string& failure : launchRanks(how, nranks, program, kStallLimit)) {
      ADD_FAILURE() << (how == Launch::Threads ? "threads: " : "processes: ") << failure;
    }
  }
}

// Appends a failure unless `result` is braidSuccess.
bool succeeded(braidResult_t result, braidComm_t comm, const std::string& call,
               Failures& failures) {
  if (result == braidSuccess) return true;
  failures.push_back(call + " returned " + describeResult(result, comm));
  return false;
}

// Appends a failure naming the first element where `got` differs from expected(i).
template <typename T, typename Expected>
void expectElements(const std::vector<T>& got, Expected expected, const std::string& what,
                    Failures& failures) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == expected(i)) continue;
    failures.push_back(what + "[" + std::to_string(i) + "] = " + std::to_string(got[i]) +
                       ", expected " + std::to_string(expected(i)));
    return;
  }
}

// A program that makes each rank's communicator (initRank), runs body(comm, env, failures) as
// step `step`, then destroys it.
RankProgram onEachRank(std::string step,
                       std::function<void(braidComm_t, const RankEnv&, Failures&)> body) {
  RankProgram program;
  program.describeStep = [step](int64_t) { return step; };
  program.run = [body](const RankEnv& env) {
    Failures failures;
    braidComm_t comm = nullptr;
    if (!succeeded(initRank(&comm, env), nullptr, "init", failures)) return failures;
    env.at(0);
    body(comm, env, failures);
    succeeded(braidCommDestroy(comm), nullptr, "braidCommDestroy", failures);
    return failures;
  };
  return program;
}

TEST(CommQueries, CountAndRankOfInitRank) {
  auto queries = [](braidComm_t comm, const RankEnv& env, Failures& failures) {
    int count = -1, userRank = -1;
    succeeded(braidCommCount(comm, &count), comm, "braidCommCount", failures);
    succeeded(braidCommUserRank(comm, &userRank), comm, "braidCommUserRank", failures);
    if (count != env.nranks || userRank != env.rank) {
      failures.push_back("count " + std::to_string(count) + ", rank " + std::to_string(userRank));
    }
  };
  runAs({Launch::Threads, Launch::Processes}, 3, onEachRank("the queries", queries));
}

// Memory visible to threads and to children forked after it is made.
class SharedFlag {
 public:
  SharedFlag()
      : flag_(static_cast<std::atomic<int>*>(mmap(nullptr, sizeof(std::atomic<int>),
                                                  PROT_READ | PROT_WRITE,
                                                  MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    if (flag_ == MAP_FAILED) std::abort();
    new (flag_) std::atomic<int>(0);
  }
  ~SharedFlag() { munmap(flag_, sizeof(std::atomic<int>)); }
  SharedFlag(const SharedFlag&) = delete;
  SharedFlag& operator=(const SharedFlag&) = delete;

  void raise() const { flag_->store(1); }
  // True once raised; false if not raised within `limit`.
  bool waitRaised(std::chrono::milliseconds limit) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (flag_->load() == 0) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

 private:
  std::atomic<int>* flag_;
};

// Rank 0 queues three dependent all-reduces on a host stream; they must return while rank 1 has
// not even started (so they cannot have finished), and after braidStreamSynchronize show the
// results of running in order: y = sum(x), then y = sum(y) in place, then z = prod(y).
TEST(Streams, QueuedCallsReturnBeforeTheyFinishAndRunInOrder) {
  constexpr size_t kCount = (size_t{1} << 20) + 3;  // beyond the FIFO: every call takes a while
  SharedFlag rank0Queued;
  RankProgram program;
  program.describeStep = [](int64_t step) {
    return step == 0 ? std::string("queueing") : std::string("waiting for the results");
  };
  program.run = [&](const RankEnv& env) {
    Failures failures;
    braidComm_t comm = nullptr;
    if (!succeeded(initRank(&comm, env), nullptr, "init", failures)) return failures;
    std::vector<float> x(kCount), y(kCount, NAN), z(kCount, NAN);
    for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(env.rank + 1 + i % 5);
    braidStream_t stream = nullptr;
    if (env.rank == 0) {
      env.at(0);
      if (!succeeded(braidStreamCreate(&stream), nullptr, "braidStreamCreate", failures)) {
        return failures;
      }
      succeeded(braidAllReduce(x.data(), y.data(), kCount, braidFloat32, braidSum, comm, stream),
                comm, "queued all-reduce 1", failures);
      succeeded(braidAllReduce(y.data(), y.data(), kCount, braidFloat32, braidSum, comm, stream),
                comm, "queued all-reduce 2", failures);
      succeeded(braidAllReduce(y.data(), z.data(), kCount, braidFloat32, braidProd, comm, stream),
                comm, "queued all-reduce 3", failures);
      rank0Queued.raise();
      env.at(1);
      succeeded(braidStreamSynchronize(stream), comm, "braidStreamSynchronize", failures);
      succeeded(braidStreamSynchronize(stream), comm, "braidStreamSynchronize (nothing queued)",
                failures);
      succeeded(braidStreamDestroy(stream), nullptr, "braidStreamDestroy", failures);
    } else {
      env.at(0);
      if (!rank0Queued.waitRaised(std::chrono::milliseconds(kOpTimeoutMs))) {
        failures.push_back("rank 0's calls on its stream did not return before rank 1 joined them");
      }
      env.at(1);
      succeeded(braidAllReduce(x.data(), y.data(), kCount, braidFloat32, braidSum, comm, nullptr),
                comm, "all-reduce 1", failures);
      succeeded(braidAllReduce(y.data(), y.data(), kCount, braidFloat32, braidSum, comm, nullptr),
                comm, "all-reduce 2", failures);
      succeeded(braidAllReduce(y.data(), z.data(), kCount, braidFloat32, braidProd, comm, nullptr),
                comm, "all-reduce 3", failures);
    }
    auto twiceSum = [](size_t i) { return 2.0f * (3 + 2 * (i % 5)); };
    expectElements(y, twiceSum, "y", failures);
    expectElements(
        z, [&](size_t i) { return twiceSum(i) * twiceSum(i); }, "z", failures);
    succeeded(braidCommDestroy(comm), nullptr, "braidCommDestroy", failures);
    return failures;
  };
  runAs({Launch::Threads}, 2, program);
}

// Outside a group, rank 1's part of a collective queued on the host stream where rank 0's part of
// it waits (for rank 1's) could never run: it is refused at once, naming the other rank and the
// stream; the communicator is unharmed, so rank 1's part on a stream of its own completes the
// collective. Parts of different collectives of the ranks share a stream as before. (Before, the
// second part was queued, and both waited until the timeout.)
TEST(Streams, ARanksCollectiveBehindAnotherRanksPartOfItOnOneHostStreamIsRefused) {
  setenv("BRAID_TIMEOUT", "20000", 1);  // a hang fails within the test's limit
  braidComm_t comms[2] = {};
  ASSERT_EQ(braidCommInitAll(comms, 2, nullptr), braidSuccess) << lastError(nullptr);
  float send[4];
  braidStream_t shared = nullptr, own = nullptr;
  ASSERT_EQ(braidStreamCreate(&shared), braidSuccess) << lastError(nullptr);
  ASSERT_EQ(braidStreamCreate(&own), braidSuccess) << lastError(nullptr);
  for (bool grouped : {false, true}) {
    std::fill(std::begin(send), std::end(send), 3.0f);
    float sum[2][4] = {{-1, -1, -1, -1}, {-1, -1, -1, -1}};
    auto allReduce = [&](int rank, braidStream_t stream) {
      if (grouped) braidGroupStart();
      braidResult_t called =
          braidAllReduce(send, sum[rank], 4, braidFloat32, braidSum, comms[rank], stream);
      return grouped ? braidGroupEnd() : called;
    };
    EXPECT_EQ(allReduce(0, shared), braidSuccess) << lastError(comms[0]);
    EXPECT_EQ(allReduce(1, shared), braidInvalidUsage) << "grouped " << grouped;
    const std::string sentence = lastError(grouped ? nullptr : comms[1]);
    EXPECT_TRUE(namesRank(sentence, 1) && namesRank(sentence, 0)) << sentence;
    EXPECT_NE(sentence.find("host stream"), std::string::npos) << sentence;
    EXPECT_EQ(allReduce(1, own), braidSuccess) << lastError(comms[1]);
    EXPECT_EQ(braidStreamSynchronize(shared), braidSuccess) << lastError(comms[0]);
    EXPECT_EQ(braidStreamSynchronize(own), braidSuccess) << lastError(comms[1]);
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_EQ(std::vector<float>(sum[rank], sum[rank] + 4), std::vector<float>(4, 6.0f))
          << "rank " << rank << ", grouped " << grouped;
  }
  // Rank 0's next collective on the shared stream; rank 1's on this thread completes it. Then
  // rank 1's following one on the shared stream (rank 0's part there is of another collective, or
  // finished): accepted, and rank 0's part completes it from this thread.
  float first[2][4], second[2][4];
  EXPECT_EQ(braidAllReduce(send, first[0], 4, braidFloat32, braidSum, comms[0], shared),
            braidSuccess);
  EXPECT_EQ(braidAllReduce(send, first[1], 4, braidFloat32, braidSum, comms[1], nullptr),
            braidSuccess)
      << lastError(comms[1]);
  EXPECT_EQ(braidAllReduce(send, second[1], 4, braidFloat32, braidSum, comms[1], shared),
            braidSuccess)
      << lastError(comms[1]);
  EXPECT_EQ(braidAllReduce(send, second[0], 4, braidFloat32, braidSum, comms[0], nullptr),
            braidSuccess)
      << lastError(comms[0]);
  EXPECT_EQ(braidStreamSynchronize(shared), braidSuccess) << lastError(comms[0]);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(std::vector<float>(first[rank], first[rank] + 4), std::vector<float>(4, 6.0f));
    EXPECT_EQ(std::vector<float>(second[rank], second[rank] + 4), std::vector<float>(4, 6.0f));
  }
  EXPECT_EQ(braidStreamDestroy(shared), braidSuccess);
  EXPECT_EQ(braidStreamDestroy(own), braidSuccess);
  for (braidComm_t comm : comms) EXPECT_EQ(braidCommDestroy(comm), braidSuccess);
}

// Two threads, a rank each, queue an all-gather on one host stream: whichever comes second is
// refused (the first waits for it there), and completes the collective on a stream of its own.
TEST(Streams, TwoThreadsRanksOnOneHostStreamOneIsRefusedThenCompletesOnItsOwn) {
  braidStream_t shared = nullptr;
  ASSERT_EQ(braidStreamCreate(&shared), braidSuccess) << lastError(nullptr);
  std::atomic<int> refused{0};
  RankProgram program;
  program.run = [&](const RankEnv& env) {
    Failures failures;
    braidComm_t comm = nullptr;
    if (!succeeded(initRank(&comm, env), nullptr, "init", failures)) return failures;
    const std::vector<int32_t> in(5, 100 + env.rank);
    std::vector<int32_t> gathered(10, -1);
    braidResult_t queued = braidAllGather(in.data(), gathered.data(), 5, braidInt32, comm, shared);
    braidStream_t own = nullptr;
    if (queued == braidInvalidUsage) {
      refused.fetch_add(1);
      if (!namesRank(lastError(comm), 1 - env.rank))
        failures.push_back("the refusal names no other rank: " + lastError(comm));
      succeeded(braidStreamCreate(&own), nullptr, "braidStreamCreate", failures);
      succeeded(braidAllGather(in.data(), gathered.data(), 5, braidInt32, comm, own), comm,
                "the all-gather on its own stream", failures);
    } else {
      succeeded(queued, comm, "the all-gather on the shared stream", failures);
    }
    succeeded(braidStreamSynchronize(own != nullptr ? own : shared), comm, "synchronize", failures);
    if (own != nullptr) succeeded(braidStreamDestroy(own), nullptr, "destroy", failures);
    expectElements(
        gathered, [](size_t i) { return int32_t(100 + i / 5); }, "gathered", failures);
    succeeded(braidCommDestroy(comm), nullptr, "braidCommDestroy", failures);
    return failures;
  };
  runAs({Launch::Threads}, 2, program);
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(braidStreamDestroy(shared), braidSuccess);
}

// A message much larger than the FIFO, both ways at once: only completes if the group lets each
// rank's send and receive progress together.
constexpr size_t kBigMessage = size_t{4} << 20;  // floats: 16 MiB, sixteen times the FIFO

Failures exchangeInOneGroup(const std::vector<braidComm_t>& comms, const std::vector<int>& ranks) {
  Failures failures;
  const int nranks = 2;
  std::vector<std::vector<float>> sent(comms.size()), received(comms.size());
  for (size_t k = 0; k < comms.size(); ++k) {
    sent[k].resize(kBigMessage);
    received[k].assign(kBigMessage, NAN);
    for (size_t i = 0; i < kBigMessage; ++i) {
      sent[k][i] = inputValue<float, InputKind::Sum>(7, ranks[k], i);
    }
  }
  if (!succeeded(braidGroupStart(), nullptr, "braidGroupStart", failures)) return failures;
  for (size_t k = 0; k < comms.size(); ++k) {
    const int peer = (ranks[k] + 1) % nranks;
    succeeded(braidSend(sent[k].data(), kBigMessage, braidFloat32, peer, comms[k], nullptr),
              comms[k], "braidSend", failures);
    succeeded(braidRecv(received[k].data(), kBigMessage, braidFloat32, peer, comms[k], nullptr),
              comms[k], "braidRecv", failures);
  }
  succeeded(braidGroupEnd(), nullptr, "braidGroupEnd", failures);
  for (size_t k = 0; k < comms.size(); ++k) {
    const int peer = (ranks[k] + 1) % nranks;
    expectElements(
        received[k], [&](size_t i) { return inputValue<float, InputKind::Sum>(7, peer, i); },
        "rank " + std::to_string(ranks[k]) + " received", failures);
  }
  return failures;
}

TEST(Groups, SendRecvBeyondTheFifoBothWaysOnePerRank) {
  auto exchange = [](braidComm_t comm, const RankEnv& env, Failures& failures) {
    const Failures exchanged = exchangeInOneGroup({comm}, {env.rank});
    failures.insert(failures.end(), exchanged.begin(), exchanged.end());
  };
  runAs({Launch::Threads, Launch::Processes}, 2, onEachRank("the exchange", exchange));
}

// One thread drives both ranks in a group, every call on one host stream: the stream runs the
// group's calls of both ranks together (one after another, rank 0's all-reduce waited for rank
// 1's, queued behind it, until the timeout).
TEST(Groups, RanksDrivenFromOneThreadMayShareAHostStream) {
  setenv("BRAID_TIMEOUT", "20000", 1);  // a hang fails within the test's limit
  braidComm_t comms[2] = {};
  ASSERT_EQ(braidCommInitAll(comms, 2, nullptr), braidSuccess) << lastError(nullptr);
  braidStream_t stream = nullptr;
  ASSERT_EQ(braidStreamCreate(&stream), braidSuccess) << lastError(nullptr);
  std::vector<float> in[2] = {{1, 2, 3}, {10, 20, 30}}, sum[2], gathered[2];
  for (int round = 0; round < 2; ++round) {
    for (int r = 0; r < 2; ++r) {
      sum[r].assign(3, -1);
      gathered[r].assign(6, -1);
    }
    braidGroupStart();
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(
          braidAllReduce(in[r].data(), sum[r].data(), 3, braidFloat32, braidSum, comms[r], stream),
          braidSuccess);
      EXPECT_EQ(braidAllGather(in[r].data(), gathered[r].data(), 3, braidFloat32, comms[r], stream),
                braidSuccess);
    }
    ASSERT_EQ(braidGroupEnd(), braidSuccess) << lastError(comms[0]);
    ASSERT_EQ(braidStreamSynchronize(stream), braidSuccess) << lastError(comms[0]);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(sum[r], (std::vector<float>{11, 22, 33})) << "rank " << r << ", round " << round;
      EXPECT_EQ(gathered[r], (std::vector<float>{1, 2, 3, 10, 20, 30})) << "rank " << r;
    }
  }
  EXPECT_EQ(braidStreamDestroy(stream), braidSuccess);
  for (braidComm_t comm : comms) EXPECT_EQ(braidCommDestroy(comm), braidSuccess);
}

TEST(Groups, SendRecvBeyondTheFifoBothWaysFromOneThread) {
  braidComm_t comms[2] = {};
  ASSERT_EQ(braidCommInitAll(comms, 2, nullptr), braidSuccess) << lastError(nullptr);
  for (const std::string& failure : exchangeInOneGroup({comms[0], comms[1]}, {0, 1})) {
    ADD_FAILURE() << failure;
  }
  for (braidComm_t comm : comms) EXPECT_EQ(braidCommDestroy(comm), braidSuccess);
}

// Outside a group a send to self (or a receive from self) runs alone, so it can never meet its
// match: refused at once, on the NULL stream and on a host stream alike (on a host stream it was
// taken, then failed the communicator for good when the stream ran it). Inside a group it works.
TEST_F(Arguments, ASendToSelfOutsideAGroupIsRefusedOnEveryStream) {
  braidComm_t rank1 = comms_[1];
  braidStream_t hostStream = nullptr;
  ASSERT_EQ(braidStreamCreate(&hostStream), braidSuccess) << lastError(nullptr);
  for (braidStream_t stream : {braidStream_t{}, hostStream}) {
    EXPECT_EQ(braidSend(send_, 4, braidFloat32, 1, rank1, stream), braidInvalidUsage)
        << lastError(rank1);
    EXPECT_NE(lastError(rank1).find("self"), std::string::npos) << lastError(rank1);
    EXPECT_EQ(braidRecv(recv_, 4, braidFloat32, 1, rank1, stream), braidInvalidUsage)
        << lastError(rank1);
  }
  std::fill(std::begin(send_), std::end(send_), 7.0f);
  std::fill(std::begin(recv_), std::end(recv_), -1.0f);
  braidGroupStart();
  EXPECT_EQ(braidSend(send_, 4, braidFloat32, 1, rank1, hostStream), braidSuccess);
  EXPECT_EQ(braidRecv(recv_, 4, braidFloat32, 1, rank1, hostStream), braidSuccess);
  EXPECT_EQ(braidGroupEnd(), braidSuccess) << lastError(rank1);
  EXPECT_EQ(braidStreamSynchronize(hostStream), braidSuccess) << lastError(rank1);
  EXPECT_EQ(std::vector<float>(recv_, recv_ + 5), (std::vector<float>{7, 7, 7, 7, -1}));
  EXPECT_EQ(braidStreamDestroy(hostStream), braidSuccess);
}

// As NCCL: a call that fails inside a group fails braidGroupEnd too, which then runs none of the
// group's operations (rank 0's all-reduce alone would wait for rank 1's, refused, until the
// timeout), also from a nested group; the next group starts whole.
TEST_F(Arguments, ACallThatFailsInAGroupFailsTheGroupAndNoneOfItsOperationsRun) {
  const auto badType = static_cast<braidDataType_t>(42);
  float received[2][4];
  for (bool nested : {false, true}) {
    std::fill(&received[0][0], &received[0][0] + 8, -1.0f);
    ASSERT_EQ(braidGroupStart(), braidSuccess);
    if (nested) {
      ASSERT_EQ(braidGroupStart(), braidSuccess);
    }
    EXPECT_EQ(braidAllReduce(send_, received[0], 4, braidFloat32, braidSum, comms_[0], nullptr),
              braidSuccess);
    EXPECT_EQ(braidAllReduce(send_, received[1], 4, badType, braidSum, comms_[1], nullptr),
              braidInvalidArgument);
    if (nested) {
      EXPECT_EQ(braidGroupEnd(), braidSuccess);
    }
    EXPECT_EQ(braidGroupEnd(), braidInvalidArgument);
    const std::string sentence = lastError(nullptr);
    EXPECT_NE(sentence.find("braidGroupEnd: none of the group's 1 operations ran"),
              std::string::npos)
        << sentence;
    EXPECT_NE(sentence.find("datatype"), std::string::npos) << sentence;
    EXPECT_TRUE(namesRank(sentence, 1)) << sentence;
    EXPECT_EQ(received[0][0], -1.0f) << "rank 0's all-reduce ran";
  }
  std::fill(std::begin(send_), std::end(send_), 2.0f);
  ASSERT_EQ(braidGroupStart(), braidSuccess);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(
        braidAllReduce(send_, received[rank], 4, braidFloat32, braidSum, comms_[rank], nullptr),
        braidSuccess);
  EXPECT_EQ(braidGroupEnd(), braidSuccess) << lastError(nullptr);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(std::vector<float>(received[rank], received[rank] + 4), std::vector<float>(4, 4.0f));
}

// One rank's operations of a group on the NULL stream and on a host stream: refused as different
// streams (they were split between the two, so its calls ran out of the order its peers had).
TEST_F(Arguments, AGroupRankOnTheNullStreamAndAHostStreamIsRefused) {
  braidStream_t stream = nullptr;
  ASSERT_EQ(braidStreamCreate(&stream), braidSuccess) << lastError(nullptr);
  ASSERT_EQ(braidGroupStart(), braidSuccess);
  EXPECT_EQ(braidAllReduce(send_, recv_, 4, braidFloat32, braidSum, comms_[0], nullptr),
            braidSuccess);
  EXPECT_EQ(braidAllReduce(send_, recv_, 4, braidFloat32, braidSum, comms_[0], stream),
            braidSuccess);
  EXPECT_EQ(braidGroupEnd(), braidInvalidUsage);
  const std::string sentence = lastError(nullptr);
  EXPECT_NE(sentence.find("different streams"), std::string::npos) << sentence;
  EXPECT_TRUE(namesRank(sentence, 0)) << sentence;
  EXPECT_EQ(braidStreamDestroy(stream), braidSuccess);
}

TEST_F(Arguments, ProbeArgumentsAreNamed) {
  braidComm_t rank1 = comms_[1];
  int waiting = -1;
  expectInvalidArgument(braidProbe(2, rank1, &waiting, nullptr, nullptr), rank1, {"peer"}, "2", 1);
  expectInvalidArgument(braidProbe(0, rank1, nullptr, nullptr, nullptr), rank1, {"waiting"}, "", 1);
  expectInvalidArgument(braidProbe(0, nullptr, &waiting, nullptr, nullptr), nullptr, {"comm"}, "",
                        -1);
  size_t count = 99;
  EXPECT_EQ(braidProbe(1, rank1, &waiting, &count, nullptr), braidSuccess) << lastError(rank1);
  EXPECT_EQ(waiting, 0);  // itself: sends to self meet their receives inside one group
  EXPECT_EQ(count, 0u);
}

// What braidProbe says of `peer`, within `limit`: the first answer with waiting == `until`.
struct ProbeAnswer {
  int waiting = -1;
  size_t count = 0;
  braidDataType_t datatype = braidInt8;
};
bool probeUntil(braidComm_t comm, int peer, int until, ProbeAnswer& answer, Failures& failures) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    if (!succeeded(braidProbe(peer, comm, &answer.waiting, &answer.count, &answer.datatype), comm,
                   "braidProbe", failures))
      return false;
    if (answer.waiting == until) return true;
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < deadline);
  failures.push_back("braidProbe of rank " + std::to_string(peer) + " did not say " +
                     std::to_string(until) + " within 30 s");
  return false;
}

// Rank 0 probes ranks 1 and 2 before they send (nothing), then a small send from rank 2 (it
// returns once in the FIFO) and a send from rank 1 much larger than the FIFO (it waits for the
// receive): each seen with its count and datatype, and no longer once received.
void probeSenders(braidComm_t comm, const RankEnv& env, Failures& failures) {
  constexpr size_t kSmall = 5;
  std::vector<int32_t> small(kSmall, -1);
  std::vector<float> big(kBigMessage, NAN);
  ProbeAnswer answer;
  auto sourceValue = [](int rank, size_t i) { return static_cast<float>(rank * 1000 + i % 977); };
  if (env.rank == 0) {
    for (int peer : {1, 2}) {
      if (probeUntil(comm, peer, 0, answer, failures) && answer.count != 0)
        failures.push_back("nothing sent yet, but the count is " + std::to_string(answer.count));
    }
  }
  float token = 1;  // ranks 1 and 2 send once rank 0 has probed
  succeeded(braidAllReduce(&token, &token, 1, braidFloat32, braidSum, comm, nullptr), comm,
            "all-reduce", failures);
  if (env.rank == 2) {
    for (size_t i = 0; i < kSmall; ++i) small[i] = static_cast<int32_t>(sourceValue(2, i));
    succeeded(braidSend(small.data(), kSmall, braidInt32, 0, comm, nullptr), comm, "send",
              failures);
  } else if (env.rank == 1) {
    for (size_t i = 0; i < kBigMessage; ++i) big[i] = sourceValue(1, i);
    succeeded(braidSend(big.data(), kBigMessage, braidFloat32, 0, comm, nullptr), comm, "send",
              failures);
  } else {
    for (auto [peer, count, type] :
         {std::tuple{2, kSmall, braidInt32}, std::tuple{1, kBigMessage, braidFloat32}}) {
      if (!probeUntil(comm, peer, 1, answer, failures)) continue;
      if (answer.count != count || answer.datatype != type)
        failures.push_back("rank " + std::to_string(peer) + "'s send probed as " +
                           std::to_string(answer.count) + " of type " +
                           std::to_string(answer.datatype));
    }
    succeeded(braidRecv(small.data(), kSmall, braidInt32, 2, comm, nullptr), comm, "recv",
              failures);
    probeUntil(comm, 2, 0, answer, failures);
    succeeded(braidRecv(big.data(), kBigMessage, braidFloat32, 1, comm, nullptr), comm, "recv",
              failures);
    for (int peer : {1, 2}) probeUntil(comm, peer, 0, answer, failures);
    expectElements(
        small, [&](size_t i) { return sourceValue(2, i); }, "from rank 2", failures);
    expectElements(
        big, [&](size_t i) { return sourceValue(1, i); }, "from rank 1", failures);
  }
}

TEST(Probe, SeesASendWaitingWithItsCountUntilItIsReceived) {
  runAs({Launch::Threads, Launch::Processes}, 3, onEachRank("probing", probeSenders));
}

TEST(Lifecycle, FinalizeThenDestroy) {
  RankProgram program;
  program.describeStep = [](int64_t step) {
    return step == 0 ? std::string("all-reduce") : std::string("finalize");
  };
  program.run = [](const RankEnv& env) {
    Failures failures;
    braidComm_t comm = nullptr;
    if (!succeeded(initRank(&comm, env), nullptr, "init", failures)) return failures;
    env.at(0);
    std::vector<float> value(1031, static_cast<float>(env.rank + 1));
    succeeded(braidAllReduce(value.data(), value.data(), value.size(), braidFloat32, braidSum, comm,
                             nullptr),
              comm, "braidAllReduce", failures);
    expectElements(
        value, [](size_t) { return 3.0f; }, "sum", failures);
    env.at(1);
    succeeded(braidCommFinalize(comm), comm, "braidCommFinalize", failures);
    succeeded(braidCommDestroy(comm), nullptr, "braidCommDestroy", failures);
    return failures;
  };
  runAs({Launch::Threads, Launch::Processes}, 2, program);
}

// braidCommDestroy is local (as in NCCL): a rank that has done its part may destroy its
// communicator and exit while peers still finish theirs. Here rank 0 sends to rank 1 and exits;
// rank 1 receives only after that and forwards to rank 2, which waits meanwhile. Neither may
// take rank 0's clean exit for a failure.
TEST(Lifecycle, PeerThatDestroyedAndExitedIsNoFailure) {
  constexpr size_t kCount = 1031;
  SharedFlag rank0Gone;
  RankProgram program;
  program.describeStep = [](int64_t) { return std::string("the relay"); };
  program.run = [&](const RankEnv& env) {
    Failures failures;
    braidComm_t comm = nullptr;
    if (!succeeded(initRank(&comm, env), nullptr, "init", failures)) return failures;
    env.at(0);
    std::vector<float> message(kCount, 0.0f);
    if (env.rank == 0) {
      for (size_t i = 0; i < kCount; ++i) message[i] = static_cast<float>(i);
      succeeded(braidSend(message.data(), kCount, braidFloat32, 1, comm, nullptr), comm,
                "rank 0 send", failures);
      succeeded(braidCommDestroy(comm), nullptr, "braidCommDestroy", failures);
      rank0Gone.raise();  // the process exits right after this
      return failures;
    }
    if (env.rank == 1) {
      rank0Gone.waitRaised(std::chrono::milliseconds(kOpTimeoutMs));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 has exited
      succeeded(braidRecv(message.data(), kCount, braidFloat32, 0, comm, nullptr), comm,
                "rank 1 recv", failures);
      succeeded(braidSend(message.data(), kCount, braidFloat32, 2, comm, nullptr), comm,
                "rank 1 send", failures);
    } else {
      succeeded(braidRecv(message.data(), kCount, braidFloat32, 1, comm, nullptr), comm,
                "rank 2 recv", failures);
    }
    expectElements(
        message, [](size_t i) { return static_cast<float>(i); }, "received", failures);
    succeeded(braidCommDestroy(comm), nullptr, "braidCommDestroy", failures);
    return failures;
  };
  runAs({Launch::Processes}, 3, program);
}

// Rank 1 aborts while rank 0 waits for it in an all-reduce: rank 0 must get braidRemoteError
// naming rank 1 well before its own timeout would have given braidTimeout. Rank 1 aborts after
// rank 0 announced its call (whether the call is already waiting or not, the answer is the same)
// and stays alive until rank 0 has its answer, so the error comes from the abort, not an exit.
TEST(Lifecycle, AbortFailsThePeersPendingCollective) {
  constexpr int kAbortTestTimeoutMs = 30000;
  for (Launch how : {Launch::Threads, Launch::Processes}) {
    SharedFlag rank0Calling;
    SharedFlag rank0Answered;
    RankProgram program;
    program.describeStep = [](int64_t) { return std::string("the aborted all-reduce"); };
    program.run = [&](const RankEnv& env) {
      Failures failures;
      braidComm_t comm = nullptr;
      if (!succeeded(initRank(&comm, env, kAbortTestTimeoutMs), nullptr, "init", failures)) {
        return failures;
      }
      env.at(0);
      if (env.rank == 1) {
        if (!rank0Calling.waitRaised(std::chrono::milliseconds(kOpTimeoutMs))) {
          failures.push_back("rank 0 never reached its all-reduce");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let it start waiting
        succeeded(braidCommAbort(comm), nullptr, "braidCommAbort", failures);
        rank0Answered.waitRaised(std::chrono::milliseconds(kAbortTestTimeoutMs));
        return failures;
      }
      std::vector<float> value(1031, 1.0f);
      rank0Calling.raise();
      const braidResult_t result = braidAllReduce(value.data(), value.data(), value.size(),
                                                  braidFloat32, braidSum, comm, nullptr);
      const std::string sentence = lastError(comm);
      rank0Answered.raise();
      if (result != braidRemoteError) {
        failures.push_back("all-reduce with an aborted peer returned " +
                           describeResult(result, comm));
      } else if (!namesRank(sentence, 1)) {
        failures.push_back("the remote error does not name rank 1: \"" + sentence + "\"");
      }
      succeeded(braidCommAbort(comm), nullptr, "braidCommAbort of the survivor", failures);
      return failures;
    };
    runAs({how}, 2, program);
  }
}

// A rank's own abort, from another thread, while a call of that rank waits for its peer: rank 0
// sends more than the FIFO holds to rank 1, which probes the send waiting but never receives it.
// The send ends with the abort's error (not its timeout's), and the abort returns once the call
// has left the communicator it frees (it freed it under the call, which then recorded its error
// in freed memory: seen only by a sanitizer, and as a crash now and then).
TEST(Lifecycle, AnAbortFromAnotherThreadEndsTheRanksCallInside) {
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  braidComm_t comms[2] = {};
  std::vector<std::thread> inits;
  for (int r = 0; r < 2; ++r)
    inits.emplace_back([&, r] {
      braidConfig_t config = BRAID_CONFIG_INITIALIZER;
      config.device = "cpu";
      config.timeoutMs = 120000;  // far beyond the probe's 30 s
      EXPECT_EQ(braidCommInitRankConfig(&comms[r], 2, id, r, &config), braidSuccess);
    });
  for (std::thread& t : inits) t.join();
  ASSERT_TRUE(comms[0] != nullptr && comms[1] != nullptr);
  braidResult_t result = braidSuccess;
  std::string sentence;
  std::thread send([&] {
    std::vector<float> big(kBigMessage, 1.0f);
    result = braidSend(big.data(), big.size(), braidFloat32, 1, comms[0], nullptr);
    sentence = lastError(nullptr);
  });
  Failures failures;
  ProbeAnswer answer;
  if (probeUntil(comms[1], 0, 1, answer, failures)) {
    EXPECT_EQ(braidCommAbort(comms[0]), braidSuccess) << lastError(nullptr);
  }
  send.join();  // a failed probe: the send's timeout ends it
  for (const std::string& failure : failures) ADD_FAILURE() << failure;
  EXPECT_EQ(result, braidRemoteError) << sentence;
  EXPECT_NE(sentence.find("aborted: rank 0 called braidCommAbort"), std::string::npos) << sentence;
  EXPECT_EQ(braidCommAbort(comms[1]), braidSuccess) << lastError(nullptr);
}

// A rank whose split is refused (a negative color) says so in the split's first exchange: its
// peers fail at once naming it (they waited for it until their timeout), and no child is made.
TEST(Split, ARefusedSplitFailsThePeersSplitsNamingTheRank) {
  auto split = [](braidComm_t comm, const RankEnv& env, Failures& failures) {
    braidComm_t child = nullptr;
    const braidResult_t r = braidCommSplit(comm, env.rank == 1 ? -5 : 0, env.rank, &child, nullptr);
    const std::string sentence = lastError(comm);
    const braidResult_t expected = env.rank == 1 ? braidInvalidArgument : braidInvalidUsage;
    const std::string says =
        env.rank == 1 ? "color -5 is negative" : "rank 1 refused its own braidCommSplit";
    if (r != expected || sentence.find(says) == std::string::npos)
      failures.push_back("split returned " + describeResult(r, comm) + " (expected \"" + says +
                         "\")");
    if (child != nullptr) failures.push_back("a child communicator was made");
  };
  runAs({Launch::Threads, Launch::Processes}, 3, onEachRank("the split", split));
}

// Rank 1 destroys its communicator without making the all-reduce its peers make: a rank waiting
// for it sees it departed and fails naming it, and the other learns that from it (they waited
// until their timeout, and were told only "ranks that have not started this operation: 1").
TEST(Lifecycle, APeerThatDestroyedWithoutItsPartIsNamedAtOnce) {
  RankProgram program;
  program.describeStep = [](int64_t) { return std::string("the all-reduce"); };
  program.run = [](const RankEnv& env) {
    Failures failures;
    braidComm_t comm = nullptr;
    if (!succeeded(initRank(&comm, env), nullptr, "init", failures)) return failures;
    env.at(0);
    if (env.rank == 1) {
      succeeded(braidCommDestroy(comm), nullptr, "braidCommDestroy", failures);
      return failures;
    }
    std::vector<float> value(1031, 1.0f);
    const braidResult_t r = braidAllReduce(value.data(), value.data(), value.size(), braidFloat32,
                                           braidSum, comm, nullptr);
    const std::string sentence = lastError(comm);
    if (r != braidRemoteError ||
        sentence.find("rank 1 destroyed its communicator") == std::string::npos)
      failures.push_back("all-reduce returned " + describeResult(r, comm));
    succeeded(braidCommAbort(comm), nullptr, "braidCommAbort", failures);
    return failures;
  };
  runAs({Launch::Threads, Launch::Processes}, 3, program);
}

}  // namespace
}  // namespace braid_test
