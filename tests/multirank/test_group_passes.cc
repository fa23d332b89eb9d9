// A group of many calls on one communicator, as threads and processes of 1-4 ranks, run now and on
// a host stream: small collectives that agree run as one fused pass (coll/group_plan.h), the rest
// alone or as sends and receives together; every output, poisoned first, is checked against a
// reference computed here. And what a fused pass means where a call reads another's output: the
// value from before the group (a large call, which runs alone, sees the earlier call's result).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "multirank/rank_launcher.h"

namespace braid_test {
namespace {

constexpr int32_t kPoison = -12345;

int32_t value(int rank, int member, size_t i) {
  return (rank + 1) * 1000 + member * 100 + static_cast<int32_t>(i % 97);
}

// One call of the group: its buffers and what every rank expects in its output.
struct Member {
  std::vector<int32_t> in, out, want;
};

struct Group {
  int rank, n;
  std::vector<Member> members;
  std::vector<std::string> failures;

  Member& add(size_t inCount, size_t outCount) {
    Member& m = members.emplace_back();
    const int index = static_cast<int>(members.size()) - 1;
    m.in.resize(inCount);
    for (size_t i = 0; i < inCount; ++i) m.in[i] = value(rank, index, i);
    m.out.assign(outCount, kPoison);
    m.want.assign(outCount, kPoison);
    return m;
  }
  int index(const Member& m) const { return static_cast<int>(&m - members.data()); }
};

// A gather to rank 0, a scatter from the last rank and an all-to-all, built of sends and receives
// behind a marker call each (which the group's planning once failed to price).
void issuePersonalized(Group& g, braidComm_t comm, braidStream_t stream,
                       std::vector<braidResult_t>& results) {
  const int n = g.n, rank = g.rank, scatterRoot = n - 1;
  constexpr size_t kCount = 5;
  {
    Member& m = g.add(kCount, kCount * n);
    const int k = g.index(m);
    if (rank == 0)
      for (size_t i = 0; i < kCount * n; ++i)
        m.want[i] = value(static_cast<int>(i / kCount), k, i % kCount);
    results.push_back(braidGather(m.in.data(), m.out.data(), kCount, braidInt32, 0, comm, stream));
  }
  {
    Member& m = g.add(kCount * n, kCount);
    const int k = g.index(m);
    for (size_t i = 0; i < kCount; ++i) m.want[i] = value(scatterRoot, k, rank * kCount + i);
    results.push_back(
        braidScatter(m.in.data(), m.out.data(), kCount, braidInt32, scatterRoot, comm, stream));
  }
  {
    Member& m = g.add(kCount * n, kCount * n);
    const int k = g.index(m);
    for (size_t i = 0; i < kCount * n; ++i)
      m.want[i] = value(static_cast<int>(i / kCount), k, rank * kCount + i % kCount);
    results.push_back(braidAlltoAll(m.in.data(), m.out.data(), kCount, braidInt32, comm, stream));
  }
}

// The calls, issued in one group: all-reduces (one in place, one too large to fuse), a gather, a
// scatter and an all-to-all, a ring of sends and receives, all-gathers (one in place),
// reduce-scatters, broadcasts and reduces (max, one without an output off its root). Reserve first:
// members are referred to by address.
void issue(Group& g, braidComm_t comm, braidStream_t stream, std::vector<braidResult_t>& results) {
  const int n = g.n, rank = g.rank;
  g.members.reserve(32);
  auto sumOver = [&](int member, size_t i) {
    int32_t sum = 0;
    for (int r = 0; r < n; ++r) sum += value(r, member, i);
    return sum;
  };
  for (size_t count : {7, 1000, 1, 512 * 1024, 3}) {
    Member& m = g.add(count, count);
    const int k = g.index(m);
    for (size_t i = 0; i < count; ++i) m.want[i] = sumOver(k, i);
    const bool inPlace = count == 1000;
    if (inPlace) m.out = m.in;
    results.push_back(braidAllReduce(inPlace ? m.out.data() : m.in.data(), m.out.data(), count,
                                     braidInt32, braidSum, comm, stream));
  }
  issuePersonalized(g, comm, stream, results);
  {
    Member& m = g.add(33, 33);
    const int k = g.index(m), from = (rank - 1 + n) % n;
    for (size_t i = 0; i < 33; ++i) m.want[i] = value(from, k, i);
    results.push_back(braidSend(m.in.data(), 33, braidInt32, (rank + 1) % n, comm, stream));
    results.push_back(braidRecv(m.out.data(), 33, braidInt32, from, comm, stream));
  }
  for (size_t count : {5, 17}) {
    Member& m = g.add(count, count * n);
    const int k = g.index(m);
    for (size_t i = 0; i < count * n; ++i)
      m.want[i] = value(static_cast<int>(i / count), k, i % count);
    const bool inPlace = count == 17;
    if (inPlace) std::copy(m.in.begin(), m.in.end(), m.out.begin() + rank * count);
    results.push_back(braidAllGather(inPlace ? m.out.data() + rank * count : m.in.data(),
                                     m.out.data(), count, braidInt32, comm, stream));
  }
  for (size_t count : {9, 2}) {
    Member& m = g.add(count * n, count);
    const int k = g.index(m);
    for (size_t i = 0; i < count; ++i) m.want[i] = sumOver(k, rank * count + i);
    results.push_back(
        braidReduceScatter(m.in.data(), m.out.data(), count, braidInt32, braidSum, comm, stream));
  }
  const int broadcastRoot = 1 % n, reduceRoot = n - 1;
  for (size_t count : {11, 3}) {
    Member& m = g.add(count, count);
    const int k = g.index(m);
    for (size_t i = 0; i < count; ++i) m.want[i] = value(broadcastRoot, k, i);
    results.push_back(
        braidBroadcast(m.in.data(), m.out.data(), count, braidInt32, broadcastRoot, comm, stream));
  }
  for (size_t count : {6, 4}) {
    Member& m = g.add(count, rank == reduceRoot || count == 6 ? count : 0);
    const int k = g.index(m);
    for (size_t i = 0; i < m.want.size(); ++i)
      m.want[i] = rank == reduceRoot ? value(n - 1, k, i) : kPoison;  // max: the last rank's
    results.push_back(braidReduce(m.in.data(), m.out.empty() ? nullptr : m.out.data(), count,
                                  braidInt32, braidMax, reduceRoot, comm, stream));
  }
}

Failures mixedGroup(const RankEnv& env, bool onStream) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  braidStream_t stream = nullptr;
  if (onStream && (r = braidStreamCreate(&stream)) != braidSuccess)
    return {"stream: " + describeResult(r, comm)};
  Failures failures;
  for (int round = 0; round < 3 && failures.empty(); ++round) {  // the staging buffer reused
    Group g{env.rank, env.nranks, {}, {}};
    std::vector<braidResult_t> results;
    braidGroupStart();
    issue(g, comm, stream, results);
    r = braidGroupEnd();
    if (r == braidSuccess && stream != nullptr) r = braidStreamSynchronize(stream);
    for (braidResult_t each : results)
      if (each != braidSuccess) failures.push_back("a call: " + describeResult(each, comm));
    if (r != braidSuccess) failures.push_back("group: " + describeResult(r, comm));
    for (const Member& m : g.members)
      if (failures.empty() && m.out != m.want)
        failures.push_back("round " + std::to_string(round) + ": call " +
                           std::to_string(g.index(m)) + " gave a wrong output");
  }
  if (stream != nullptr) braidStreamDestroy(stream);
  braidCommDestroy(comm);
  return failures;
}

// A second all-reduce reads the first's output: fused (small), it sees the value from before the
// group; alone (2 MiB, above BRAID_GROUP_FUSE_BYTES), the first's result.
Failures chainedGroup(const RankEnv& env) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  Failures failures;
  for (size_t count : {size_t{16}, size_t{512 * 1024}}) {
    std::vector<int32_t> a(count, env.rank + 1), b(count, 7), c(count, kPoison);
    braidGroupStart();
    braidAllReduce(a.data(), b.data(), count, braidInt32, braidSum, comm, nullptr);
    braidAllReduce(b.data(), c.data(), count, braidInt32, braidSum, comm, nullptr);
    if ((r = braidGroupEnd()) != braidSuccess) return {"group: " + describeResult(r, comm)};
    const int32_t sum = env.nranks * (env.nranks + 1) / 2;
    const int32_t want = count == 16 ? 7 * env.nranks : sum * env.nranks;
    if (b != std::vector<int32_t>(count, sum) || c != std::vector<int32_t>(count, want))
      failures.push_back(std::to_string(count) + " elements: b[0] " + std::to_string(b[0]) +
                         " c[0] " + std::to_string(c[0]) + ", expected " + std::to_string(sum) +
                         " and " + std::to_string(want));
  }
  braidCommDestroy(comm);
  return failures;
}

// Sends and receives that only some ranks make, at different places among the same collectives:
// rank 0 sends between two small all-reduces, rank 1 receives after them, the others neither.
// Every rank still runs the same collective passes (the two small all-reduces as one: the send
// and its receive then fall between the same passes, as they must), and every output is right; a
// plan that let the sends split the run failed here with "groups hold different calls".
Failures sendsAmongCollectives(const RankEnv& env) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  const int n = env.nranks, rank = env.rank;
  std::vector<int32_t> x(16, rank + 1), y(16, 10 * (rank + 1));
  std::vector<int32_t> message(8, rank == 0 ? 77 : kPoison);
  braidGroupStart();
  braidAllReduce(x.data(), x.data(), x.size(), braidInt32, braidSum, comm, nullptr);
  if (rank == 0 && n > 1) braidSend(message.data(), message.size(), braidInt32, 1, comm, nullptr);
  braidAllReduce(y.data(), y.data(), y.size(), braidInt32, braidSum, comm, nullptr);
  if (rank == 1) braidRecv(message.data(), message.size(), braidInt32, 0, comm, nullptr);
  r = braidGroupEnd();
  Failures failures;
  const int32_t sum = n * (n + 1) / 2;
  if (r != braidSuccess)
    failures.push_back("group: " + describeResult(r, comm));
  else if (x != std::vector<int32_t>(16, sum) || y != std::vector<int32_t>(16, 10 * sum))
    failures.push_back("x[0] " + std::to_string(x[0]) + ", y[0] " + std::to_string(y[0]) +
                       ", expected " + std::to_string(sum) + " and " + std::to_string(10 * sum));
  else if (rank == 1 && message != std::vector<int32_t>(8, 77))
    failures.push_back("message[0] " + std::to_string(message[0]) + ", expected 77");
  braidCommDestroy(comm);
  return failures;
}

// Ranks whose groups differ though the fused calls' totals agree: rank 0 all-reduces 10 then 20
// elements, the others 20 then 10 (or, with `oneCall`, one call of 30). Every rank fails, none
// waits out its timeout, and the rank that sees the other's tag says the groups differ.
Failures differentGroups(const RankEnv& env, bool oneCall) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env, 20000);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  std::vector<int32_t> in(30, 1), out(30, kPoison);
  std::vector<size_t> counts = env.rank == 0 ? std::vector<size_t>{10, 20}
                               : oneCall     ? std::vector<size_t>{30}
                                             : std::vector<size_t>{20, 10};
  braidGroupStart();
  size_t at = 0;
  for (size_t count : counts) {
    braidAllReduce(in.data() + at, out.data() + at, count, braidInt32, braidSum, comm, nullptr);
    at += count;
  }
  r = braidGroupEnd();
  const std::string error = braidGetLastError(comm);
  braidCommDestroy(comm);
  if (r == braidSuccess) return {"the group succeeded (out[0] " + std::to_string(out[0]) + ")"};
  if (r == braidTimeout) return {"timed out: " + error};
  // The rank that saw the other's tag names the difference; the other may fail first, because its
  // peer failed.
  if (error.find("groups hold different calls") == std::string::npos &&
      error.find("failed") == std::string::npos)
    return {"an error that names neither the difference nor a peer's failure: " + error};
  return {};
}

std::string paramName(const testing::TestParamInfo<RanksParam>& info) {
  return ranksParamName(info.param);
}

class GroupPasses : public testing::TestWithParam<RanksParam> {
 protected:
  void expectNoFailures(std::function<Failures(const RankEnv&)> program) {
    const Failures failures = launchRanks(GetParam().how, GetParam().nranks, {program, nullptr},
                                          std::chrono::seconds(2 * kOpTimeoutMs / 1000));
    EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
  }
};

TEST_P(GroupPasses, EveryCallOfAMixedGroupGetsItsOwnResult) {
  expectNoFailures([](const RankEnv& env) { return mixedGroup(env, false); });
}

TEST_P(GroupPasses, EveryCallOfAMixedGroupOnAHostStreamGetsItsOwnResult) {
  expectNoFailures([](const RankEnv& env) { return mixedGroup(env, true); });
}

TEST_P(GroupPasses, AFusedCallReadsItsInputAsItWasBeforeTheGroup) {
  expectNoFailures(chainedGroup);
}

TEST_P(GroupPasses, SendsAndReceivesOfSomeRanksLeaveEveryRankTheSameCollectivePasses) {
  expectNoFailures(sendsAmongCollectives);
}

TEST_P(GroupPasses, RanksWhoseGroupsDifferFail) {
  if (GetParam().nranks == 1) GTEST_SKIP() << "one rank has no other to differ from";
  expectNoFailures([](const RankEnv& env) { return differentGroups(env, false); });
  expectNoFailures([](const RankEnv& env) { return differentGroups(env, true); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GroupPasses,
                         testing::Values(RanksParam{Launch::Threads, 1},
                                         RanksParam{Launch::Threads, 2},
                                         RanksParam{Launch::Threads, 3},
                                         RanksParam{Launch::Processes, 2},
                                         RanksParam{Launch::Processes, 4}),
                         paramName);

}  // namespace
}  // namespace braid_test
