// Ranks that call one collective with different arguments, or different collectives: every rank
// must either fail with an error that names the differing argument (and the ranks), or finish
// with the result its own call asks for; never a silently wrong result, never a timeout. Ranks as
// threads and as processes; small (one-shot) and large (ring, several FIFO slots) messages.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "multirank/rank_launcher.h"

namespace braid_test {
namespace {

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Send, Gather, Scatter };

struct Call {
  Coll coll = Coll::AllReduce;
  size_t count = 0;
  braidDataType_t type = braidInt32;
  braidRedOp_t op = braidSum;
  int root = 0;
  bool preMulSum = false;  // op: a PreMulSum operator scaling by 2, made for the call
};

struct Case {
  std::string name;
  std::function<Call(int rank)> call;  // what each rank calls
  std::string argument;                // what the error must name
  // Where every rank's result depends on every other's call (all-reduce), every rank must fail;
  // in a chain a rank whose neighbours agree with it may finish, with its own call's result.
  bool everyRankFails = true;
};

int32_t input(int rank, size_t i) {
  return rank + 1 + static_cast<int32_t>(i % 5);
}

// What `rank`'s output must hold if every rank had made `c`: the reference of its own call.
std::vector<int32_t> reference(const Call& c, int rank, int nranks) {
  auto reduce = [&](size_t i) {
    int32_t r = input(0, i);
    for (int k = 1; k < nranks; ++k)
      r = c.op == braidMax ? std::max(r, input(k, i)) : r + input(k, i);
    return r;
  };
  std::vector<int32_t> out;
  switch (c.coll) {
    case Coll::AllReduce:
      for (size_t i = 0; i < c.count; ++i) out.push_back(reduce(i));
      break;
    case Coll::Broadcast:
      for (size_t i = 0; i < c.count; ++i) out.push_back(input(c.root, i));
      break;
    case Coll::Reduce:
      for (size_t i = 0; i < c.count; ++i) out.push_back(rank == c.root ? reduce(i) : -7);
      break;
    case Coll::Gather:  // the root holds every rank's input in rank order
      for (int k = 0; k < nranks; ++k)
        for (size_t i = 0; i < c.count; ++i) out.push_back(rank == c.root ? input(k, i) : -7);
      break;
    case Coll::Scatter:  // each rank holds its block of the root's input
      for (size_t i = 0; i < c.count; ++i)
        out.push_back(input(c.root, static_cast<size_t>(rank) * c.count + i));
      break;
    default: break;
  }
  return out;
}

braidResult_t issue(const Call& c, const std::vector<int32_t>& send, std::vector<int32_t>& recv,
                    int rank, braidComm_t comm) {
  braidRedOp_t op = c.op;
  if (c.preMulSum) {
    int32_t two = 2;
    if (braidResult_t r =
            braidRedOpCreatePreMulSum(&op, &two, c.type, braidScalarHostImmediate, comm);
        r != braidSuccess)
      return r;
  }
  switch (c.coll) {
    case Coll::AllReduce:
      return braidAllReduce(send.data(), recv.data(), c.count, c.type, op, comm, nullptr);
    case Coll::Broadcast:
      return braidBroadcast(send.data(), recv.data(), c.count, c.type, c.root, comm, nullptr);
    case Coll::Reduce:
      return braidReduce(send.data(), recv.data(), c.count, c.type, c.op, c.root, comm, nullptr);
    case Coll::Gather:
      return braidGather(send.data(), recv.data(), c.count, c.type, c.root, comm, nullptr);
    case Coll::Scatter:
      return braidScatter(send.data(), recv.data(), c.count, c.type, c.root, comm, nullptr);
    case Coll::Send:
      return rank == 0 ? braidSend(send.data(), c.count, c.type, 1, comm, nullptr)
                       : braidRecv(recv.data(), c.count, c.type, 0, comm, nullptr);
    default: return braidInternalError;
  }
}

// Across hosts a rank that failed tells its peers why on the streams it sends, then exits; a peer
// may meet the reset, or a refused connection, before that reason arrives. Its error still stops
// it at once; and the rank that failed first named the argument, since a lost connection needs a
// peer that exited after failing, whose own error is checked here. On one host the reason is in
// shared memory and always arrives.
bool lostToExitedPeer(braidResult_t r, const std::string& sentence) {
#ifdef BRAID_MISMATCH_ACROSS_HOSTS
  return r == braidRemoteError && (sentence.find("(its process exited?)") != std::string::npos ||
                                   sentence.find("Connection refused") != std::string::npos);
#else
  return false;
#endif
}

Failures runCase(const RankEnv& env, const Case& test) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  const Call call = test.call(env.rank);
  // Room for the calls whose buffers hold a block per rank (Gather's output, Scatter's input).
  const size_t room = call.count * static_cast<size_t>(env.nranks) + 64;
  std::vector<int32_t> send(room), recv(room, -7);
  for (size_t i = 0; i < send.size(); ++i) send[i] = input(env.rank, i);
  r = issue(call, send, recv, env.rank, comm);
  Failures failures;
  if (r == braidSuccess && test.everyRankFails) {
    failures.push_back("succeeded, though the ranks made different calls");
  } else if (r == braidSuccess) {
    const std::vector<int32_t> expected = reference(call, env.rank, env.nranks);
    for (size_t i = 0; i < expected.size(); ++i)
      if (recv[i] != expected[i]) {
        failures.push_back("succeeded with a wrong result: element " + std::to_string(i) + " is " +
                           std::to_string(recv[i]) + ", expected " + std::to_string(expected[i]));
        break;
      }
  } else {
    const std::string sentence = braidGetLastError(comm);
    if (r != braidInvalidUsage && r != braidRemoteError)
      failures.push_back("expected braidInvalidUsage or braidRemoteError, got " +
                         describeResult(r, comm));
    else if (sentence.find(test.argument) == std::string::npos && !lostToExitedPeer(r, sentence))
      failures.push_back("the error does not name '" + test.argument + "': " + sentence);
  }
  braidCommAbort(comm);
  return failures;
}

// Below the one-shot threshold, and several FIFO slots long (the ring).
constexpr size_t kSmall = 7;
constexpr size_t kLarge = (size_t{1} << 20) + 3;

std::vector<Case> cases() {
  std::vector<Case> all;
  for (size_t count : {kSmall, kLarge}) {
    const std::string size = count == kSmall ? "Small" : "Large";
    all.push_back(
        {"Op" + size,
         [count](int rank) {
           return Call{Coll::AllReduce, count, braidInt32, rank == 1 ? braidMax : braidSum};
         },
         "with op braid"});
    all.push_back({"PreMulSumAgainstSum" + size,
                   [count](int rank) {
                     Call c{Coll::AllReduce, count};
                     c.preMulSum = rank == 1;
                     return c;
                   },
                   "PreMulSum operator"});
    all.push_back({"Datatype" + size,
                   [count](int rank) {
                     return Call{Coll::AllReduce, count, rank == 1 ? braidFloat32 : braidInt32};
                   },
                   "with datatype braid"});
    all.push_back({"Count" + size,
                   [count](int rank) {
                     return Call{Coll::AllReduce, rank == 1 ? count + 1 : count};
                   },
                   "with count"});
    all.push_back({"BroadcastRoot" + size,
                   [count](int rank) {
                     return Call{Coll::Broadcast, count, braidInt32, braidSum, rank == 1 ? 1 : 0};
                   },
                   "with root", false});
    all.push_back({"ReduceRoot" + size,
                   [count](int rank) {
                     return Call{Coll::Reduce, count, braidInt32, braidSum, rank == 1 ? 1 : 0};
                   },
                   "with root", false});
    // Ranks that agree with their ring predecessor pass the check and may wait on a failed rank.
    all.push_back({"GatherRoot" + size,
                   [count](int rank) {
                     return Call{Coll::Gather, count, braidInt32, braidSum, rank == 1 ? 1 : 0};
                   },
                   "with root", false});
    all.push_back({"ScatterRoot" + size,
                   [count](int rank) {
                     return Call{Coll::Scatter, count, braidInt32, braidSum, rank == 1 ? 1 : 0};
                   },
                   "with root", false});
    all.push_back({"Collective" + size,
                   [count](int rank) {
                     return Call{rank == 1 ? Coll::Broadcast : Coll::AllReduce, count};
                   },
                   "called braid"});
  }
  all.push_back({"ZeroCountAgainstSome",
                 [](int rank) {
                   return Call{Coll::AllReduce, rank == 1 ? size_t{0} : kSmall};
                 },
                 "with count"});
  all.push_back({"CollectiveAgainstSend",
                 [](int rank) {
                   return Call{rank == 1 ? Coll::AllReduce : Coll::Send, kSmall};
                 },
                 "braidSend/braidRecv", false});
  return all;
}

struct Param {
  Launch how;
  int nranks;
  Case test;
};

class Mismatch : public testing::TestWithParam<Param> {};

TEST_P(Mismatch, EveryRankFailsNamingTheArgumentOrIsRight) {
  const Param& p = GetParam();
  Failures failures = launchRanks(
      p.how, p.nranks, {[&](const RankEnv& env) { return runCase(env, p.test); }, nullptr},
      std::chrono::seconds(2 * kOpTimeoutMs / 1000));
  EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
}

std::vector<Param> params() {
  std::vector<Param> all;
  for (Launch how : {Launch::Threads, Launch::Processes})
    for (int nranks : {2, 3})
      for (const Case& c : cases())
        if (c.name != "CollectiveAgainstSend" || nranks == 2) all.push_back({how, nranks, c});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Calls, Mismatch, testing::ValuesIn(params()),
                         [](const testing::TestParamInfo<Param>& info) {
                           return std::string(info.param.how == Launch::Threads ? "threads_"
                                                                                : "processes_") +
                                  std::to_string(info.param.nranks) + "ranks_" +
                                  info.param.test.name;
                         });

}  // namespace
}  // namespace braid_test
